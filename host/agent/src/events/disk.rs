//! [`DiskEventLog`]: each session's events as JSONL files in one directory, named by the session
//! key escaped as transcripts are (`<key>.jsonl` and the previous segment `<key>.old.jsonl`; an
//! escaped key never contains a dot, so the names cannot meet). Every event is one `write` of one
//! line on an unbuffered file, so a killed process loses nothing it appended; [`EventLog::sync`]
//! makes them durable against a machine crash. Each line carries the epoch of its writer, so the
//! fence holds across restarts. The window is bounded: when the current segment reaches its event
//! or byte limit it replaces the previous one, so between one and two segments are kept and
//! anything older is reported to readers as a gap. Followers are fed from memory (a broadcast per
//! followed session, made when the first follower comes) and catch up from the files when they
//! fall behind it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use clawcage_core::sync::lock;

use super::{AgentEvent, Epoch, EventFuture, EventLog, EventLogError, Follow, Replay};
use crate::transcript::key_file_stem;

/// Events per segment by default: between 5,000 and 10,000 events of a session are kept.
pub const DEFAULT_SEGMENT_EVENTS: usize = 5_000;

/// Bytes per segment by default (a segment ends at whichever limit comes first).
pub const DEFAULT_SEGMENT_BYTES: u64 = 4 << 20;

/// Events a follower may have waiting before it reads on from the files instead.
const LIVE_EVENTS: usize = 256;

/// Events a follower's receiver holds before the log waits for it.
const FOLLOWER_BUFFER: usize = 256;

/// Events read from the files at a time when a follower catches up.
const CATCH_UP_PAGE: usize = 512;

/// Bounded per-session event files in a directory. Cheap to clone: clones share the files.
#[derive(Debug, Clone)]
pub struct DiskEventLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    segment_events: usize,
    segment_bytes: u64,
    sessions: Mutex<HashMap<String, Arc<Mutex<SessionFiles>>>>,
}

#[derive(Debug)]
struct SessionFiles {
    current_path: PathBuf,
    old_path: PathBuf,
    /// Open for appending once the first event of this process was written.
    file: Option<File>,
    current_events: usize,
    current_bytes: u64,
    /// The first `seq` of the current segment (`last_seq + 1` while it is empty).
    current_first: u64,
    /// The first `seq` kept at all (old segment, else current).
    first_retained: u64,
    last_seq: u64,
    /// The newest epoch that wrote this session.
    epoch: Epoch,
    dirty: bool,
    /// The stored events, for followers (only while someone follows).
    live: Option<broadcast::Sender<AgentEvent>>,
}

/// An event as a line of the files: the event and the epoch of its writer.
#[derive(Serialize)]
struct StoredLine<'a> {
    #[serde(flatten)]
    event: &'a AgentEvent,
    #[serde(skip_serializing_if = "is_zero")]
    epoch: Epoch,
}

fn is_zero(epoch: &Epoch) -> bool {
    *epoch == 0
}

impl DiskEventLog {
    /// A log in `dir` (created on the first write) with the default segment limits.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_limits(dir, DEFAULT_SEGMENT_EVENTS, DEFAULT_SEGMENT_BYTES)
    }

    /// A log whose segments end after `events` events or `bytes` bytes.
    pub fn with_limits(dir: impl Into<PathBuf>, events: usize, bytes: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: dir.into(),
                segment_events: events.max(1),
                segment_bytes: bytes.max(1),
                sessions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The session keys that have events on disk.
    pub fn session_keys(&self) -> std::io::Result<Vec<String>> {
        crate::transcript::keys_in_dir(&self.inner.dir)
    }
}

impl Inner {
    fn session(&self, key: &str) -> std::io::Result<Arc<Mutex<SessionFiles>>> {
        let mut sessions = lock(&self.sessions);
        if let Some(files) = sessions.get(key) {
            return Ok(files.clone());
        }
        let stem = key_file_stem(key);
        let files = SessionFiles::open(
            self.dir.join(format!("{stem}.jsonl")),
            self.dir.join(format!("{stem}.old.jsonl")),
        )?;
        let files = Arc::new(Mutex::new(files));
        sessions.insert(key.to_string(), files.clone());
        Ok(files)
    }

    fn append(&self, event: AgentEvent, epoch: Epoch) -> Result<AgentEvent, EventLogError> {
        let files = self.session(&event.session_key)?;
        let mut files = lock(&files);
        if epoch < files.epoch {
            return Err(EventLogError::Fenced {
                session: event.session_key,
                epoch,
                current: files.epoch,
            });
        }
        if event.seq <= files.last_seq {
            return Err(EventLogError::OutOfOrder {
                session: event.session_key,
                seq: event.seq,
                last: files.last_seq,
            });
        }
        let mut line = serde_json::to_vec(&StoredLine {
            event: &event,
            epoch,
        })
        .map_err(std::io::Error::other)?;
        line.push(b'\n');
        files.writer(&self.dir)?.write_all(&line)?;
        files.last_seq = event.seq;
        files.epoch = epoch;
        if files.current_events == 0 {
            files.current_first = event.seq;
            if files.first_retained > event.seq || files.first_retained == 0 {
                files.first_retained = event.seq;
            }
        }
        files.current_events += 1;
        files.current_bytes += line.len() as u64;
        files.dirty = true;
        if files.current_events >= self.segment_events || files.current_bytes >= self.segment_bytes
        {
            if let Some(file) = files.file.take() {
                file.sync_data()?;
            }
            std::fs::rename(&files.current_path, &files.old_path)?;
            files.first_retained = files.current_first;
            files.current_first = event.seq + 1;
            files.current_events = 0;
            files.current_bytes = 0;
            files.dirty = false;
        }
        if let Some(live) = &files.live
            && live.send(event.clone()).is_err()
        {
            // Nobody follows any more.
            files.live = None;
        }
        Ok(event)
    }

    fn remove(&self, session_key: &str) -> std::io::Result<()> {
        let files = self.session(session_key)?;
        let mut files = lock(&files);
        files.file = None;
        for path in [&files.current_path, &files.old_path] {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        files.current_events = 0;
        files.current_bytes = 0;
        files.current_first = 1;
        files.first_retained = 1;
        files.last_seq = 0;
        files.dirty = false;
        // Its followers end.
        files.live = None;
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let sessions: Vec<Arc<Mutex<SessionFiles>>> =
            lock(&self.sessions).values().cloned().collect();
        for files in sessions {
            let mut files = lock(&files);
            if files.dirty {
                if let Some(file) = &files.file {
                    file.sync_data()?;
                }
                files.dirty = false;
            }
        }
        Ok(())
    }
}

impl SessionFiles {
    fn open(current_path: PathBuf, old_path: PathBuf) -> std::io::Result<Self> {
        let current = scan(&current_path)?;
        let old_first = scan(&old_path)?.and_then(|scan| scan.first);
        let (current_events, current_bytes, first, last) = match &current {
            Some(scan) => (scan.events, scan.bytes, scan.first, scan.last),
            None => (0, 0, None, None),
        };
        let last_seq = last.unwrap_or(0);
        let current_first = first.unwrap_or(last_seq + 1);
        let epoch = current.as_ref().map_or(0, |scan| scan.epoch);
        Ok(Self {
            current_path,
            old_path,
            file: None,
            current_events,
            current_bytes,
            current_first,
            first_retained: old_first.unwrap_or(current_first),
            last_seq,
            epoch,
            dirty: false,
            live: None,
        })
    }

    /// The stored events after `since`, at most `limit`, and the window they are in.
    fn read(&self, since: u64, limit: usize) -> std::io::Result<Replay> {
        let mut events = Vec::new();
        // Nothing is after the last event: the files are not read (a follower from the tail).
        if since >= self.last_seq {
            return Ok(Replay {
                events,
                first_retained: self.first_retained.min(self.last_seq + 1),
                last_seq: self.last_seq,
            });
        }
        if since + 1 < self.current_first {
            read_segment(&self.old_path, since, limit, &mut events)?;
        }
        read_segment(&self.current_path, since, limit, &mut events)?;
        Ok(Replay {
            events,
            first_retained: self.first_retained.min(self.last_seq + 1),
            last_seq: self.last_seq,
        })
    }

    fn writer(&mut self, dir: &Path) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            std::fs::create_dir_all(dir)?;
            let mut options = OpenOptions::new();
            options.create(true).append(true).read(true);
            // Events hold what the user and the tools said: only the owner reads them.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&self.current_path)?;
            // A line cut by a crash must not swallow the next one.
            let length = file.metadata()?.len();
            if length > 0 {
                let mut last = [0u8; 1];
                file.seek(SeekFrom::Start(length - 1))?;
                file.read_exact(&mut last)?;
                if last[0] != b'\n' {
                    file.write_all(b"\n")?;
                    self.current_bytes += 1;
                }
            }
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the event file is not open"))
    }
}

/// What a segment file holds.
struct Scan {
    events: usize,
    bytes: u64,
    first: Option<u64>,
    last: Option<u64>,
    /// The epoch of the last event.
    epoch: Epoch,
}

fn scan(path: &Path) -> std::io::Result<Option<Scan>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let bytes = file.metadata()?.len();
    let mut scan = Scan {
        events: 0,
        bytes,
        first: None,
        last: None,
        epoch: 0,
    };
    for line in BufReader::new(file).split(b'\n') {
        let line = line?;
        if let Some((seq, epoch)) = place_of(&line) {
            scan.events += 1;
            scan.first.get_or_insert(seq);
            scan.last = Some(seq);
            scan.epoch = epoch;
        }
    }
    Ok(Some(scan))
}

/// A line's `seq` and writer's epoch, if it is an event.
fn place_of(line: &[u8]) -> Option<(u64, Epoch)> {
    #[derive(serde::Deserialize)]
    struct Place {
        seq: u64,
        #[serde(default)]
        epoch: Epoch,
    }
    serde_json::from_slice::<Place>(line)
        .ok()
        .map(|place| (place.seq, place.epoch))
}

fn read_segment(
    path: &Path,
    since: u64,
    limit: usize,
    into: &mut Vec<AgentEvent>,
) -> std::io::Result<()> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for line in BufReader::new(file).split(b'\n') {
        if into.len() >= limit {
            break;
        }
        let line = line?;
        if place_of(&line).is_none_or(|(seq, _)| seq <= since) {
            continue;
        }
        match serde_json::from_slice::<AgentEvent>(&line) {
            Ok(event) => into.push(event),
            Err(error) => {
                tracing::warn!(path = %path.display(), "skipping an unreadable event line: {error}")
            }
        }
    }
    Ok(())
}

impl EventLog for DiskEventLog {
    fn append(&self, event: AgentEvent, epoch: Epoch) -> EventFuture<'_, AgentEvent> {
        // One write of one line: done at once, like the other calls of this log.
        Box::pin(std::future::ready(self.inner.append(event, epoch)))
    }

    fn read<'a>(
        &'a self,
        session_key: &'a str,
        since: u64,
        limit: usize,
    ) -> EventFuture<'a, Replay> {
        // A read may cover thousands of lines: off the async threads.
        let (inner, key) = (self.inner.clone(), session_key.to_string());
        Box::pin(async move {
            let read = tokio::task::spawn_blocking(move || {
                inner
                    .session(&key)
                    .and_then(|files| lock(&files).read(since, limit))
            })
            .await
            .map_err(std::io::Error::other)?;
            Ok(read?)
        })
    }

    fn last_seq<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, u64> {
        let last = self
            .inner
            .session(session_key)
            .map(|files| lock(&files).last_seq);
        Box::pin(std::future::ready(last.map_err(EventLogError::from)))
    }

    fn follow<'a>(&'a self, session_key: &'a str, since: u64) -> EventFuture<'a, Follow> {
        Box::pin(async move {
            let files = self.inner.session(session_key)?;
            let (live, first_retained, last_seq) = {
                let mut state = lock(&files);
                let live = state
                    .live
                    .get_or_insert_with(|| broadcast::channel(LIVE_EVENTS).0)
                    .subscribe();
                (
                    live,
                    state.first_retained.min(state.last_seq + 1),
                    state.last_seq,
                )
            };
            let (sender, events) = mpsc::channel(FOLLOWER_BUFFER);
            tokio::spawn(feed_follower(files, since, live, sender));
            Ok(Follow {
                first_retained,
                last_seq,
                events,
            })
        })
    }

    fn remove<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, ()> {
        Box::pin(std::future::ready(
            self.inner.remove(session_key).map_err(EventLogError::from),
        ))
    }

    fn sync(&self) -> EventFuture<'_, ()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.sync())
                .await
                .map_err(std::io::Error::other)??;
            Ok(())
        })
    }
}

/// Feeds one follower: the stored events after `since`, then the live ones, skipping what it
/// had; when it falls behind the live broadcast, it reads on from the files. Ends when the
/// follower goes away or the session is removed.
async fn feed_follower(
    files: Arc<Mutex<SessionFiles>>,
    since: u64,
    mut live: broadcast::Receiver<AgentEvent>,
    follower: mpsc::Sender<AgentEvent>,
) {
    let mut delivered = since;
    loop {
        // Catch up from the files.
        loop {
            let page = lock(&files).read(delivered, CATCH_UP_PAGE);
            let events = match page {
                Ok(replay) => replay.events,
                Err(error) => {
                    tracing::warn!(%error, "cannot read a followed session's events; the follower ends");
                    return;
                }
            };
            let full = events.len() >= CATCH_UP_PAGE;
            for event in events {
                delivered = event.seq;
                if follower.send(event).await.is_err() {
                    return;
                }
            }
            if !full {
                break;
            }
        }
        // Then live, until it falls behind.
        loop {
            let received = tokio::select! {
                () = follower.closed() => return,
                received = live.recv() => received,
            };
            match received {
                Ok(event) if event.seq <= delivered => {}
                Ok(event) => {
                    delivered = event.seq;
                    if follower.send(event).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Stream;
    use serde_json::json;

    /// Event `n` of `key`, numbered `n` as its owner would.
    fn event(key: &str, n: u64) -> AgentEvent {
        let mut event =
            AgentEvent::new(key, "r", Stream::Assistant, json!({"delta": n.to_string()}));
        event.seq = n;
        event
    }

    #[tokio::test]
    async fn seq_increases_per_session_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        for n in 1..=3 {
            assert_eq!(log.append(event("a", n), 1).await.unwrap().seq, n);
        }
        assert_eq!(log.append(event("b", 1), 1).await.unwrap().seq, 1);
        drop(log);
        let log = DiskEventLog::new(dir.path());
        assert_eq!(log.last_seq("a").await.unwrap(), 3);
        assert_eq!(log.append(event("a", 4), 1).await.unwrap().seq, 4);
        let replay = log.read("a", 1, 100).await.unwrap();
        let seqs: Vec<u64> = replay.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!((replay.first_retained, replay.last_seq), (1, 4));
        assert_eq!(log.session_keys().unwrap(), ["a", "b"]);
    }

    #[tokio::test]
    async fn the_window_is_bounded_and_reports_what_it_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::with_limits(dir.path(), 10, u64::MAX);
        for n in 1..=35 {
            log.append(event("k", n), 1).await.unwrap();
        }
        let replay = log.read("k", 0, 1000).await.unwrap();
        assert_eq!(replay.first_retained, 21);
        assert_eq!(replay.events.first().map(|e| e.seq), Some(21));
        assert_eq!(replay.events.len(), 15);
        let limited = log.read("k", 22, 5).await.unwrap();
        let seqs: Vec<u64> = limited.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [23, 24, 25, 26, 27]);
        // Reopened, the same window.
        let log = DiskEventLog::with_limits(dir.path(), 10, u64::MAX);
        let replay = log.read("k", 0, 1000).await.unwrap();
        assert_eq!((replay.first_retained, replay.last_seq), (21, 35));
    }

    #[tokio::test]
    async fn a_torn_last_line_is_skipped_and_not_glued_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        log.append(event("k", 1), 1).await.unwrap();
        drop(log);
        let path = dir.path().join("k.jsonl");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"runId":"r","seq":2,"str"#).unwrap();
        let log = DiskEventLog::new(dir.path());
        assert_eq!(log.append(event("k", 2), 1).await.unwrap().seq, 2);
        let seqs: Vec<u64> = log
            .read("k", 0, 10)
            .await
            .unwrap()
            .events
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2]);
    }

    #[tokio::test]
    async fn keys_never_become_paths() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path().join("events"));
        log.append(event("../../escape", 1), 1).await.unwrap();
        log.append(event("agent:main:webchat:x.y", 1), 1)
            .await
            .unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path().join("events"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!dir.path().join("escape.jsonl").exists());
        let mut keys = log.session_keys().unwrap();
        keys.sort();
        assert_eq!(keys, ["../../escape", "agent:main:webchat:x.y"]);
        log.remove("../../escape").await.unwrap();
        assert_eq!(log.last_seq("../../escape").await.unwrap(), 0);
        assert_eq!(log.session_keys().unwrap(), ["agent:main:webchat:x.y"]);
    }

    #[tokio::test]
    async fn the_fence_holds_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        log.append(event("k", 1), 3).await.unwrap();
        drop(log);
        let log = DiskEventLog::new(dir.path());
        let refused = log.append(event("k", 2), 2).await;
        assert!(
            matches!(
                refused,
                Err(EventLogError::Fenced {
                    epoch: 2,
                    current: 3,
                    ..
                })
            ),
            "{refused:?}"
        );
        let repeated = log.append(event("k", 1), 3).await;
        assert!(
            matches!(
                repeated,
                Err(EventLogError::OutOfOrder {
                    seq: 1,
                    last: 1,
                    ..
                })
            ),
            "{repeated:?}"
        );
        assert_eq!(log.append(event("k", 2), 4).await.unwrap().seq, 2);
        assert_eq!(log.last_seq("k").await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_follower_that_falls_behind_reads_on_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        log.append(event("k", 1), 1).await.unwrap();
        let mut follow = log.follow("k", 0).await.unwrap();
        assert_eq!((follow.first_retained, follow.last_seq), (1, 1));
        // Far more than the live broadcast holds, before the follower reads one.
        let total = (LIVE_EVENTS * 4 + FOLLOWER_BUFFER) as u64;
        for n in 2..=total {
            log.append(event("k", n), 1).await.unwrap();
        }
        let mut seen = Vec::new();
        while seen.len() < total as usize {
            let event =
                tokio::time::timeout(std::time::Duration::from_secs(10), follow.events.recv())
                    .await
                    .unwrap()
                    .unwrap();
            seen.push(event.seq);
        }
        assert_eq!(seen, (1..=total).collect::<Vec<_>>());
        log.remove("k").await.unwrap();
        let end = tokio::time::timeout(std::time::Duration::from_secs(10), follow.events.recv())
            .await
            .unwrap();
        assert!(end.is_none(), "a removed session's followers end: {end:?}");
    }
}
