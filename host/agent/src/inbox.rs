//! The durable lane inbox: every input to a session (a user's message, a notification, a reset
//! or a compaction) is appended to the session's inbox before the sender is told it was taken,
//! in one total order per session, and is marked done, with how it ended, only after the turn
//! that answers it is committed to the transcript. What is appended and not done when a process
//! starts is the work a stopped process left: the session's lane takes it up again
//! ([`crate::session`]), resuming the turn that was open and queueing the rest in its order. An
//! idempotency key given with an input is remembered with it, so a sender that retries after a
//! crash finds the input it sent (and its fate) instead of sending it twice. Controls that change
//! what becomes of inputs are recorded in the same order: a stop asked for an input (it is
//! stopped when its turn starts, also after a restart) and the session's own `/queue` settings. [`LaneInbox`] is
//! the seam a distributed backend implements; [`FileInbox`] keeps one JSONL file per session
//! (`inbox/<key>.jsonl`, the key escaped as for transcripts), rewritten to its live records when
//! it grows.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::session::queue::{QueueOverride, QueuedJob};
use crate::transcript::{key_file_stem, now_ms};

/// How long a finished input's idempotency key is remembered.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 600_000;

/// One input, as the inbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRecord {
    /// Its id: unique in the session (the gateway's run id).
    pub id: String,
    /// When it was appended, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The sender's idempotency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<String>,
    /// What it asks.
    pub job: QueuedJob,
    /// A stop was asked for it (`chat.abort`, Ctrl-C) before it was done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_requested: bool,
}

/// How an input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputStatus {
    /// Answered.
    Ok,
    /// Its turn failed.
    Error,
    /// Stopped by the operator or a shutdown.
    Aborted,
    /// The queue dropped it without running it, after taking it.
    Dropped,
    /// The queue refused it as it arrived (its sender heard so at once): it may be sent again
    /// with the same idempotency key.
    Refused,
}

impl InputStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InputStatus::Ok => "ok",
            InputStatus::Error => "error",
            InputStatus::Aborted => "aborted",
            InputStatus::Dropped => "dropped",
            InputStatus::Refused => "refused",
        }
    }
}

/// An input that is done, as long as its idempotency key is remembered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedInput {
    /// Its id.
    pub id: String,
    /// Its idempotency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<String>,
    /// How it ended.
    pub status: InputStatus,
    /// When it was done, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// What [`LaneInbox::append`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// The input is in the inbox now.
    New,
    /// An input with the same idempotency key is there already (pending, or done within the
    /// window): this id.
    Duplicate(String),
}

/// The per-session inboxes.
pub trait LaneInbox: Send + Sync + std::fmt::Debug {
    /// Append `record` to `key`'s inbox, durable before returning. With an idempotency key
    /// seen in the window, nothing is appended and the earlier input's id is returned.
    fn append(&self, key: &str, record: &InputRecord) -> std::io::Result<Appended>;
    /// Mark inputs `ids` of `key` done, with `status` (after the turn answering them is
    /// committed).
    fn done(&self, key: &str, ids: &[String], status: InputStatus) -> std::io::Result<()>;
    /// `key`'s inputs not done yet, in their order.
    fn pending(&self, key: &str) -> std::io::Result<Vec<InputRecord>>;
    /// `key`'s inputs done within the idempotency window.
    fn finished(&self, key: &str) -> std::io::Result<Vec<FinishedInput>>;
    /// Every session with an inbox.
    fn sessions(&self) -> std::io::Result<Vec<String>>;
    /// Forget `key`'s inbox (the session was deleted).
    fn remove(&self, key: &str) -> std::io::Result<()>;
    /// Make this process the owner of `key`'s lane while the session has inputs in flight:
    /// only the owner takes up what a stopped process left. False when another live process
    /// owns it. An append claims too; the last input done releases the claim.
    fn claim(&self, key: &str) -> std::io::Result<bool>;
    /// Give up the claim on `key` (nothing of it is in flight).
    fn release(&self, key: &str);
    /// Record that a stop was asked for input `id` of `key` (it stops when its turn starts, or
    /// at once if it runs; a restart keeps that).
    fn request_stop(&self, key: &str, id: &str) -> std::io::Result<()>;
    /// Record `key`'s own queue settings (`None`: back to the configuration's).
    fn set_queue_override(&self, key: &str, value: Option<QueueOverride>) -> std::io::Result<()>;
    /// `key`'s own queue settings, as last recorded.
    fn queue_override(&self, key: &str) -> std::io::Result<Option<QueueOverride>>;
}

/// One record of an inbox: a line of an inbox file, a message of a distributed one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Line {
    /// An input arrived.
    In(InputRecord),
    /// Inputs were done.
    Done {
        /// Their ids.
        ids: Vec<String>,
        /// How they ended.
        status: InputStatus,
        /// When, in milliseconds since the Unix epoch.
        at_ms: u64,
    },
    /// A finished input kept for its idempotency key (written when the file is rewritten).
    Finished(FinishedInput),
    /// A stop was asked for an input.
    Stop {
        /// The input.
        id: String,
    },
    /// The session's own queue settings.
    Queue {
        /// The settings (`None`: the configuration's).
        value: Option<QueueOverride>,
    },
    /// A host of a cluster took the session up (it became the session's writer): changes
    /// nothing of the inbox, but moves its end, so that a write its predecessor sent before
    /// and a stalled server stores only after is refused.
    Taken {
        /// The host, and the epoch it writes under.
        by: String,
    },
}

/// One session's inbox as its records replay: every store reads its inboxes through it, so
/// they agree on what is pending, finished, stopped and set.
#[derive(Debug, Default, Clone)]
pub struct SessionInbox {
    pending: Vec<InputRecord>,
    finished: Vec<FinishedInput>,
    queue_override: Option<QueueOverride>,
    /// Lines in the file.
    lines: usize,
}

impl SessionInbox {
    /// The inputs not done yet, in their order.
    pub fn pending(&self) -> &[InputRecord] {
        &self.pending
    }

    /// The inputs done within the idempotency window (as of the last [`SessionInbox::prune`]).
    pub fn finished(&self) -> &[FinishedInput] {
        &self.finished
    }

    /// The session's own queue settings.
    pub fn queue_override(&self) -> Option<QueueOverride> {
        self.queue_override
    }

    /// Records replayed so far.
    pub fn records(&self) -> usize {
        self.lines
    }

    /// The records that keep this state, and nothing dead: what a store rewrites to.
    pub fn live_lines(&self) -> Vec<Line> {
        let mut lines: Vec<Line> = self.finished.iter().cloned().map(Line::Finished).collect();
        lines.extend(self.pending.iter().cloned().map(Line::In));
        if self.queue_override.is_some() {
            lines.push(Line::Queue {
                value: self.queue_override,
            });
        }
        lines
    }

    /// Take in `line`.
    pub fn apply(&mut self, line: Line) {
        self.lines += 1;
        match line {
            Line::In(record) => {
                if !self.pending.iter().any(|known| known.id == record.id) {
                    self.pending.push(record);
                }
            }
            Line::Done { ids, status, at_ms } => {
                for id in ids {
                    if let Some(index) = self.pending.iter().position(|record| record.id == id) {
                        let record = self.pending.remove(index);
                        self.finished.push(FinishedInput {
                            id,
                            idempotency: record.idempotency,
                            status,
                            at_ms,
                        });
                    }
                }
            }
            Line::Finished(finished) => self.finished.push(finished),
            Line::Stop { id } => {
                if let Some(record) = self.pending.iter_mut().find(|record| record.id == id) {
                    record.stop_requested = true;
                }
            }
            Line::Queue { value } => self.queue_override = value,
            Line::Taken { .. } => {}
        }
    }

    /// Forget finished inputs older than the idempotency window at `now`.
    pub fn prune(&mut self, now: u64) {
        self.finished
            .retain(|finished| now.saturating_sub(finished.at_ms) < IDEMPOTENCY_WINDOW_MS);
    }

    /// The input (pending, or finished and taken) sent with `idempotency`.
    pub fn find_key(&self, idempotency: &str) -> Option<String> {
        self.pending
            .iter()
            .find(|record| record.idempotency.as_deref() == Some(idempotency))
            .map(|record| record.id.clone())
            .or_else(|| {
                // A refused input was never taken: sending it again is a new input.
                self.finished
                    .iter()
                    .filter(|finished| finished.status != InputStatus::Refused)
                    .find(|finished| finished.idempotency.as_deref() == Some(idempotency))
                    .map(|finished| finished.id.clone())
            })
    }
}

/// Inboxes as JSONL files in a directory.
#[derive(Debug)]
pub struct FileInbox {
    dir: PathBuf,
    /// Each session's inbox once read; the files are the truth, this saves reading them again.
    cache: Mutex<HashMap<String, SessionInbox>>,
    /// The lock files of the sessions this process owns, held open (and locked) until it ends.
    claimed: Mutex<HashMap<String, std::fs::File>>,
}

impl FileInbox {
    /// Inboxes in `dir` (created on the first append).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cache: Mutex::new(HashMap::new()),
            claimed: Mutex::new(HashMap::new()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.jsonl", key_file_stem(key)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, SessionInbox>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read(&self, key: &str) -> std::io::Result<SessionInbox> {
        let mut inbox = SessionInbox::default();
        let file = match std::fs::File::open(self.path(key)) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(inbox),
            Err(error) => return Err(error),
        };
        for (number, line) in BufReader::new(file).split(b'\n').enumerate() {
            let line = line?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Line>(&line) {
                Ok(line) => inbox.apply(line),
                // A process killed mid-write leaves at most its last line torn.
                Err(error) => tracing::warn!(
                    session = key,
                    line = number + 1,
                    "skipping an unreadable inbox line: {error}"
                ),
            }
        }
        inbox.prune(now_ms());
        Ok(inbox)
    }

    /// `key`'s inbox, read on first use.
    fn with_session<R>(
        &self,
        key: &str,
        work: impl FnOnce(&mut SessionInbox) -> std::io::Result<R>,
    ) -> std::io::Result<R> {
        let mut cache = self.lock();
        if !cache.contains_key(key) {
            let inbox = self.read(key)?;
            cache.insert(key.to_string(), inbox);
        }
        match cache.get_mut(key) {
            Some(inbox) => work(inbox),
            None => Err(std::io::Error::other("the inbox cache lost a session")),
        }
    }

    fn write_lines(&self, key: &str, lines: &[Line], sync: bool) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut text = String::new();
        for line in lines {
            text.push_str(&serde_json::to_string(line).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        clawcage_core::files::append_private(&self.path(key), text.as_bytes(), sync).map(drop)
    }

    /// Rewrite `key`'s file to its live records when dead lines outnumber them.
    fn rewrite_if_large(&self, key: &str, inbox: &mut SessionInbox) -> std::io::Result<()> {
        inbox.prune(now_ms());
        let live = inbox.pending.len() + inbox.finished.len();
        if inbox.lines <= live + 64 || inbox.lines * 2 < live * 3 {
            return Ok(());
        }
        let lines = inbox.live_lines();
        let mut text = String::new();
        for line in &lines {
            text.push_str(&serde_json::to_string(line).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        clawcage_core::files::write_atomically(&self.path(key), text.as_bytes(), true)?;
        inbox.lines = lines.len();
        Ok(())
    }
}

impl LaneInbox for FileInbox {
    fn append(&self, key: &str, record: &InputRecord) -> std::io::Result<Appended> {
        self.with_session(key, |inbox| {
            if let Some(idempotency) = &record.idempotency
                && let Some(id) = inbox.find_key(idempotency)
            {
                return Ok(Appended::Duplicate(id));
            }
            if inbox.pending.iter().any(|known| known.id == record.id) {
                return Ok(Appended::Duplicate(record.id.clone()));
            }
            self.write_lines(key, &[Line::In(record.clone())], true)?;
            inbox.apply(Line::In(record.clone()));
            if !self.claim(key)? {
                tracing::warn!(
                    session = key,
                    "another clawcage process has inputs in flight in this session"
                );
            }
            Ok(Appended::New)
        })
    }

    fn done(&self, key: &str, ids: &[String], status: InputStatus) -> std::io::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.with_session(key, |inbox| {
            let line = Line::Done {
                ids: ids.to_vec(),
                status,
                at_ms: now_ms(),
            };
            // Not flushed to the disk: an input found pending whose turn is committed is
            // marked done again at the next start.
            self.write_lines(key, std::slice::from_ref(&line), false)?;
            inbox.apply(line);
            if inbox.pending.is_empty() {
                // Nothing in flight: nothing a stopped process would leave. The lock (and its
                // descriptor) is not held for every session a long-running process ever served.
                self.release(key);
            }
            self.rewrite_if_large(key, inbox)
        })
    }

    fn pending(&self, key: &str) -> std::io::Result<Vec<InputRecord>> {
        self.with_session(key, |inbox| Ok(inbox.pending.clone()))
    }

    fn finished(&self, key: &str) -> std::io::Result<Vec<FinishedInput>> {
        self.with_session(key, |inbox| {
            inbox.prune(now_ms());
            Ok(inbox.finished.clone())
        })
    }

    fn sessions(&self) -> std::io::Result<Vec<String>> {
        crate::transcript::keys_in_dir(&self.dir)
    }

    fn claim(&self, key: &str) -> std::io::Result<bool> {
        let mut claimed = self
            .claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if claimed.contains_key(key) {
            return Ok(true);
        }
        std::fs::create_dir_all(&self.dir)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(format!("{}.lock", key_file_stem(key))))?;
        // The operating system releases the lock when the process ends, however it ends.
        match file.try_lock() {
            Ok(()) => {
                claimed.insert(key.to_string(), file);
                Ok(true)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(false),
            Err(std::fs::TryLockError::Error(error)) => Err(error),
        }
    }

    fn release(&self, key: &str) {
        self.claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key);
    }

    fn request_stop(&self, key: &str, id: &str) -> std::io::Result<()> {
        self.with_session(key, |inbox| {
            if !inbox.pending.iter().any(|record| record.id == id) {
                return Ok(());
            }
            let line = Line::Stop { id: id.to_string() };
            self.write_lines(key, std::slice::from_ref(&line), true)?;
            inbox.apply(line);
            Ok(())
        })
    }

    fn set_queue_override(&self, key: &str, value: Option<QueueOverride>) -> std::io::Result<()> {
        self.with_session(key, |inbox| {
            let line = Line::Queue { value };
            self.write_lines(key, std::slice::from_ref(&line), true)?;
            inbox.apply(line);
            Ok(())
        })
    }

    fn queue_override(&self, key: &str) -> std::io::Result<Option<QueueOverride>> {
        self.with_session(key, |inbox| Ok(inbox.queue_override))
    }

    fn remove(&self, key: &str) -> std::io::Result<()> {
        self.lock().remove(key);
        match std::fs::remove_file(self.path(key)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::queue::Origin;
    use std::io::Write;

    fn user(id: &str, text: &str, key: Option<&str>) -> InputRecord {
        InputRecord {
            id: id.to_string(),
            at_ms: now_ms(),
            idempotency: key.map(str::to_string),
            job: QueuedJob::User {
                text: text.to_string(),
                origin: Origin::of_key("s"),
            },
            stop_requested: false,
        }
    }

    #[test]
    fn stops_and_queue_settings_are_kept_across_processes_and_rewrites() {
        use crate::session::queue::QueueMode;
        let dir = tempfile::tempdir().unwrap();
        let inbox = FileInbox::new(dir.path());
        inbox.append("s", &user("r1", "one", None)).unwrap();
        inbox.request_stop("s", "r1").unwrap();
        inbox.request_stop("s", "unknown").unwrap();
        let collect = QueueOverride {
            mode: QueueMode::Collect,
            debounce_ms: Some(500),
            cap: None,
            drop: None,
        };
        inbox.set_queue_override("s", Some(collect)).unwrap();
        let again = FileInbox::new(dir.path());
        assert!(again.pending("s").unwrap()[0].stop_requested);
        assert_eq!(again.queue_override("s").unwrap(), Some(collect));
        // Many inputs later (the file rewritten), the settings are still there.
        for n in 0..200 {
            let id = format!("x{n}");
            again.append("s", &user(&id, "x", None)).unwrap();
            again.done("s", &[id], InputStatus::Ok).unwrap();
        }
        let third = FileInbox::new(dir.path());
        assert_eq!(third.queue_override("s").unwrap(), Some(collect));
        assert!(third.pending("s").unwrap()[0].stop_requested);
        third.set_queue_override("s", None).unwrap();
        assert_eq!(
            FileInbox::new(dir.path()).queue_override("s").unwrap(),
            None
        );
    }

    #[test]
    fn pending_inputs_survive_a_new_process_and_done_ones_keep_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = FileInbox::new(dir.path());
        assert_eq!(
            inbox.append("s", &user("r1", "one", Some("k1"))).unwrap(),
            Appended::New
        );
        assert_eq!(
            inbox.append("s", &user("r2", "two", None)).unwrap(),
            Appended::New
        );
        assert_eq!(
            inbox
                .append("s", &user("r9", "one again", Some("k1")))
                .unwrap(),
            Appended::Duplicate("r1".into())
        );
        inbox.done("s", &["r1".into()], InputStatus::Ok).unwrap();

        let again = FileInbox::new(dir.path());
        let pending = again.pending("s").unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].id, "r2");
        let finished = again.finished("s").unwrap();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0].status, InputStatus::Ok);
        assert_eq!(
            again
                .append("s", &user("r3", "one, third time", Some("k1")))
                .unwrap(),
            Appended::Duplicate("r1".into())
        );
        assert_eq!(again.sessions().unwrap(), ["s"]);
    }

    #[test]
    fn one_owner_per_session_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let first = FileInbox::new(dir.path());
        let second = FileInbox::new(dir.path());
        assert!(first.claim("s").unwrap());
        assert!(first.claim("s").unwrap(), "claiming again is fine");
        assert!(!second.claim("s").unwrap(), "another owner is refused");
        assert!(second.claim("t").unwrap());
        drop(first);
        assert!(
            second.claim("s").unwrap(),
            "an owner that ended leaves it free"
        );
        // An append claims; the last input done releases the claim.
        let third = FileInbox::new(dir.path());
        third.append("u", &user("r1", "one", None)).unwrap();
        assert!(!second.claim("u").unwrap(), "in flight: owned");
        third.done("u", &["r1".into()], InputStatus::Ok).unwrap();
        assert!(second.claim("u").unwrap(), "nothing in flight: free");
        assert_eq!(
            second.sessions().unwrap(),
            ["u"],
            "lock files (s, t) are no inboxes"
        );
    }

    #[test]
    fn a_torn_last_line_and_garbage_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = FileInbox::new(dir.path());
        inbox.append("s", &user("r1", "one", None)).unwrap();
        let path = inbox.path("s");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"not json\n{\"op\":\"in\",\"id\":\"r2\",\"at_")
            .unwrap();
        let again = FileInbox::new(dir.path());
        let pending = again.pending("s").unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].id, "r1");
    }

    #[test]
    fn a_long_inbox_is_rewritten_to_its_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = FileInbox::new(dir.path());
        for n in 0..200 {
            let id = format!("r{n}");
            inbox.append("s", &user(&id, "x", None)).unwrap();
            inbox.done("s", &[id], InputStatus::Ok).unwrap();
        }
        inbox.append("s", &user("last", "x", Some("k"))).unwrap();
        let lines = std::fs::read_to_string(inbox.path("s"))
            .unwrap()
            .lines()
            .count();
        // Without rewriting it would hold 401 lines (an `in` and a `done` per input).
        assert!(lines < 300, "{lines} lines");
        let again = FileInbox::new(dir.path());
        assert_eq!(again.pending("s").unwrap().len(), 1);
        assert_eq!(again.finished("s").unwrap().len(), 200);
    }
}
