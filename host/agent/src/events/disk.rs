//! [`DiskEventLog`]: each session's events as JSONL files in one directory, named by the session
//! key escaped as transcripts are (`<key>.jsonl` and the previous segment `<key>.old.jsonl`; an
//! escaped key never contains a dot, so the names cannot meet). Every event is one `write` of one
//! line on an unbuffered file, so a killed process loses nothing it appended; [`EventLog::sync`]
//! makes them durable against a machine crash. The window is bounded: when the current segment
//! reaches its event or byte limit it replaces the previous one, so between one and two
//! segments are kept and anything older is reported to readers as a gap.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AgentEvent, EventLog, Replay};
use crate::transcript::key_file_stem;

/// Events per segment by default: between 5,000 and 10,000 events of a session are kept.
pub const DEFAULT_SEGMENT_EVENTS: usize = 5_000;

/// Bytes per segment by default (a segment ends at whichever limit comes first).
pub const DEFAULT_SEGMENT_BYTES: u64 = 4 << 20;

/// Bounded per-session event files in a directory.
#[derive(Debug)]
pub struct DiskEventLog {
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
    dirty: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl DiskEventLog {
    /// A log in `dir` (created on the first write) with the default segment limits.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_limits(dir, DEFAULT_SEGMENT_EVENTS, DEFAULT_SEGMENT_BYTES)
    }

    /// A log whose segments end after `events` events or `bytes` bytes.
    pub fn with_limits(dir: impl Into<PathBuf>, events: usize, bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            segment_events: events.max(1),
            segment_bytes: bytes.max(1),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The session keys that have events on disk.
    pub fn session_keys(&self) -> std::io::Result<Vec<String>> {
        crate::transcript::keys_in_dir(&self.dir)
    }

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
        Ok(Self {
            current_path,
            old_path,
            file: None,
            current_events,
            current_bytes,
            current_first,
            first_retained: old_first.unwrap_or(current_first),
            last_seq,
            dirty: false,
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
    };
    for line in BufReader::new(file).split(b'\n') {
        let line = line?;
        if let Some(seq) = seq_of(&line) {
            scan.events += 1;
            scan.first.get_or_insert(seq);
            scan.last = Some(seq);
        }
    }
    Ok(Some(scan))
}

fn seq_of(line: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    serde_json::from_slice::<SeqOnly>(line)
        .ok()
        .map(|event| event.seq)
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
        if seq_of(&line).is_none_or(|seq| seq <= since) {
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
    fn append(&self, mut event: AgentEvent) -> std::io::Result<AgentEvent> {
        let files = self.session(&event.session_key)?;
        let mut files = lock(&files);
        event.seq = files.last_seq + 1;
        let mut line = serde_json::to_vec(&event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        files.writer(&self.dir)?.write_all(&line)?;
        files.last_seq = event.seq;
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
        Ok(event)
    }

    fn read(&self, session_key: &str, since: u64, limit: usize) -> std::io::Result<Replay> {
        let files = self.session(session_key)?;
        let files = lock(&files);
        let mut events = Vec::new();
        if since + 1 < files.current_first {
            read_segment(&files.old_path, since, limit, &mut events)?;
        }
        read_segment(&files.current_path, since, limit, &mut events)?;
        Ok(Replay {
            events,
            first_retained: files.first_retained.min(files.last_seq + 1),
            last_seq: files.last_seq,
        })
    }

    fn last_seq(&self, session_key: &str) -> std::io::Result<u64> {
        let files = self.session(session_key)?;
        let last = lock(&files).last_seq;
        Ok(last)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Stream;
    use serde_json::json;

    fn event(key: &str, n: u64) -> AgentEvent {
        AgentEvent::new(key, "r", Stream::Assistant, json!({"delta": n.to_string()}))
    }

    #[test]
    fn seq_increases_per_session_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        for n in 1..=3 {
            assert_eq!(log.append(event("a", n)).unwrap().seq, n);
        }
        assert_eq!(log.append(event("b", 1)).unwrap().seq, 1);
        drop(log);
        let log = DiskEventLog::new(dir.path());
        assert_eq!(log.last_seq("a").unwrap(), 3);
        assert_eq!(log.append(event("a", 4)).unwrap().seq, 4);
        let replay = log.read("a", 1, 100).unwrap();
        let seqs: Vec<u64> = replay.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!((replay.first_retained, replay.last_seq), (1, 4));
        assert_eq!(log.session_keys().unwrap(), ["a", "b"]);
    }

    #[test]
    fn the_window_is_bounded_and_reports_what_it_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::with_limits(dir.path(), 10, u64::MAX);
        for n in 1..=35 {
            log.append(event("k", n)).unwrap();
        }
        let replay = log.read("k", 0, 1000).unwrap();
        assert_eq!(replay.first_retained, 21);
        assert_eq!(replay.events.first().map(|e| e.seq), Some(21));
        assert_eq!(replay.events.len(), 15);
        let limited = log.read("k", 22, 5).unwrap();
        let seqs: Vec<u64> = limited.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [23, 24, 25, 26, 27]);
        // Reopened, the same window.
        let log = DiskEventLog::with_limits(dir.path(), 10, u64::MAX);
        let replay = log.read("k", 0, 1000).unwrap();
        assert_eq!((replay.first_retained, replay.last_seq), (21, 35));
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_not_glued_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path());
        log.append(event("k", 1)).unwrap();
        drop(log);
        let path = dir.path().join("k.jsonl");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"runId":"r","seq":2,"str"#).unwrap();
        let log = DiskEventLog::new(dir.path());
        assert_eq!(log.append(event("k", 2)).unwrap().seq, 2);
        let seqs: Vec<u64> = log
            .read("k", 0, 10)
            .unwrap()
            .events
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2]);
    }

    #[test]
    fn keys_never_become_paths() {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskEventLog::new(dir.path().join("events"));
        log.append(event("../../escape", 1)).unwrap();
        log.append(event("agent:main:webchat:x.y", 1)).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path().join("events"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!dir.path().join("escape.jsonl").exists());
        let mut keys = log.session_keys().unwrap();
        keys.sort();
        assert_eq!(keys, ["../../escape", "agent:main:webchat:x.y"]);
        log.remove("../../escape").unwrap();
        assert_eq!(log.last_seq("../../escape").unwrap(), 0);
        assert_eq!(log.session_keys().unwrap(), ["agent:main:webchat:x.y"]);
    }
}
