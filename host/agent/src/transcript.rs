//! Per-session transcripts behind [`TranscriptStore`], and its JSONL implementation
//! [`JsonlTranscripts`]: one file per session key in the state directory (`sessions/<key>.jsonl`,
//! the key percent-encoded so it can never name another path), one JSON object per line, only
//! ever appended. A turn is journaled as it happens: a `start` line naming the inputs it answers,
//! then each step (the model's message, `tool_started` before a call runs, `tool_result` as each
//! call ends, steered messages after a `joined` line, compactions, the tokens used) as it is
//! taken, and a `turn` line that commits it. Steps are written through to the operating system
//! (they survive a killed process); the commit, a `/reset` and a `/compact` are also flushed to
//! the disk. A trailing `start` without its `turn` is an *open* turn: [`Loaded::open`] says so,
//! and the session's lane resumes it ([`crate::session`]). Loading replays the file from the last
//! reset, keeps the newest messages up to the history limit, and skips lines it cannot read (a
//! crash mid-write loses at most that line) with a warning. A `compaction` line records a summary
//! that replaced the older messages: loading replays it the same way, so a resumed session gets
//! the summary and the recent messages, while the file keeps every message. Callers never see a
//! file length: a [`Position`] is the store's own cursor, and [`TranscriptStore::committed_position`]
//! is where the committed part of a session ends (a front end pairs it with the events after it).
//!
//! A store given the runtime's redactor ([`JsonlTranscripts::with_redactor`]) writes every text of
//! every line with the secret values replaced: model output arrives scrubbed already (the
//! provider chain is wrapped in [`Redacting`](crate::provider::Redacting)), so this catches what
//! a person typed or pasted, and anything else that would put a value on the disk. It is one file
//! (over 700 lines) because the line format ([`Entry`]), its writing and its replay are one file
//! format and change together.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clawcage_core::redact::Redactor;
use clawcage_core::{ChatMessage, ContentBlock, Role, Usage};
use serde::{Deserialize, Serialize};

use crate::compaction::{Compaction, CompactionReason, apply_compaction};
use crate::provider::redacting::redact_message;

/// One line of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A turn begins: it answers the inputs named (their ids in the session's inbox).
    Start {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The inputs it answers.
        #[serde(default)]
        inputs: Vec<String>,
    },
    /// Inputs steered into the running turn (their message follows).
    Joined {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// Their ids.
        inputs: Vec<String>,
    },
    /// The open turn was resumed after its process stopped.
    Resumed {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
    },
    /// A message of the conversation.
    Message {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The message.
        message: ChatMessage,
    },
    /// A tool call of the running turn is about to run.
    ToolStarted {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The `tool_use` id.
        tool_use_id: String,
    },
    /// A tool call's result: it joins the user message answering the model's calls.
    ToolResult {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The `tool_result` block.
        result: ContentBlock,
    },
    /// A model call of the running turn used these tokens (the `turn` line carries the sum).
    Used {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The tokens.
        usage: Usage,
    },
    /// The end of a turn: it commits the lines since its `start`.
    Turn {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// Tokens the turn used.
        usage: Usage,
        /// `provider/model` that answered, or the error that ended the turn.
        outcome: String,
    },
    /// The history was cleared here (`/reset`); loading starts after the last one.
    Reset {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
    },
    /// The history was compacted here: everything before its last `kept` messages is replaced
    /// by `summary`.
    Compaction {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// Why: `threshold`, `overflow` or `requested`.
        reason: CompactionReason,
        /// The summary.
        summary: String,
        /// Messages replaced by it.
        summarised: usize,
        /// Messages kept after it.
        kept: usize,
        /// Tokens the summary cost when they are not part of a turn's (`/compact`).
        #[serde(default, skip_serializing_if = "is_default_usage")]
        usage: Usage,
    },
}

fn is_default_usage(usage: &Usage) -> bool {
    *usage == Usage::default()
}

impl Entry {
    /// The line recording `compaction`; `own_usage` when its cost belongs to no turn.
    pub fn compaction(at_ms: u64, compaction: &Compaction, own_usage: bool) -> Self {
        Entry::Compaction {
            at_ms,
            reason: compaction.reason,
            summary: compaction.summary.clone(),
            summarised: compaction.summarised,
            kept: compaction.kept,
            usage: if own_usage {
                compaction.usage
            } else {
                Usage::default()
            },
        }
    }

    /// This line with every value `redactor` knows replaced in its texts.
    pub fn redacted(&self, redactor: &Redactor) -> Entry {
        match self {
            Entry::Message { at_ms, message } => Entry::Message {
                at_ms: *at_ms,
                message: redact_message(redactor, message),
            },
            Entry::ToolResult { at_ms, result } => {
                let wrapped = ChatMessage {
                    role: Role::User,
                    cut: None,
                    content: vec![result.clone()],
                };
                let mut scrubbed = redact_message(redactor, &wrapped);
                Entry::ToolResult {
                    at_ms: *at_ms,
                    result: scrubbed.content.pop().unwrap_or_else(|| result.clone()),
                }
            }
            Entry::Turn {
                at_ms,
                usage,
                outcome,
            } => Entry::Turn {
                at_ms: *at_ms,
                usage: *usage,
                outcome: redactor.redact(outcome),
            },
            Entry::Compaction {
                at_ms,
                reason,
                summary,
                summarised,
                kept,
                usage,
            } => Entry::Compaction {
                at_ms: *at_ms,
                reason: *reason,
                summary: redactor.redact(summary),
                summarised: *summarised,
                kept: *kept,
                usage: *usage,
            },
            other => other.clone(),
        }
    }
}

/// A turn that started and was not committed: its process stopped part-way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpenTurn {
    /// The inputs it answers (from its `start` and `joined` lines), oldest first.
    pub inputs: Vec<String>,
    /// Tool calls that started; those without a result may have partly run.
    pub started_calls: Vec<String>,
    /// Tokens its steps used so far.
    pub usage: Usage,
    /// How often it was resumed before.
    pub resumed: u32,
}

/// What a committed turn answered an input with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answered {
    /// The turn's last assistant text.
    pub text: String,
    /// `provider/model`, or the error that ended the turn (`error: …`).
    pub outcome: String,
    /// Tokens the turn used.
    pub usage: Usage,
}

/// Where a committed turn ended among the loaded messages, and how.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnMark {
    /// The messages before its end: it ended after `messages[after_messages - 1]`.
    pub after_messages: usize,
    /// When it ended, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Tokens it used.
    pub usage: Usage,
    /// `provider/model` that answered, or the error that ended it (`error: …`).
    pub outcome: String,
}

/// A loaded session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// The newest messages since the last reset, within the history limit (an open turn's
    /// included).
    pub messages: Vec<ChatMessage>,
    /// Tokens used since the last reset (by committed turns).
    pub usage: Usage,
    /// Lines that could not be read.
    pub skipped_lines: usize,
    /// The turn left open by a stopped process, if the last one is.
    pub open: Option<OpenTurn>,
    /// Every input a committed turn answered, by id.
    pub answered: HashMap<String, Answered>,
    /// The committed turns since the last reset whose end is among `messages`, oldest first.
    pub turns: Vec<TurnMark>,
}

/// A place in one session's transcript, as its store counts. Positions of one session only
/// grow; `Position::default()` is the beginning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64);

/// Where transcripts are kept: one ordered log of [`Entry`] per session. The lanes append a
/// turn's steps as they happen and commit it with its `turn` line; front ends read from it.
/// The JSONL files of [`JsonlTranscripts`] are the one implementation today; a distributed
/// backend implements the same calls.
pub trait TranscriptStore: Send + Sync + std::fmt::Debug {
    /// Append steps of a running turn: they must survive a killed process.
    fn append_steps(&self, key: &str, entries: &[Entry]) -> std::io::Result<()>;
    /// Append entries that commit (a turn's `turn` line, a reset, a compaction), durable on
    /// the disk before returning.
    fn commit(&self, key: &str, entries: &[Entry]) -> std::io::Result<()>;
    /// Load `key`'s transcript, keeping at most `limit` messages (a missing one is empty).
    fn load(&self, key: &str, limit: usize) -> std::io::Result<Loaded>;
    /// As [`TranscriptStore::load`], reading only up to `until`: the transcript as it was there.
    fn load_until(&self, key: &str, limit: usize, until: Position) -> std::io::Result<Loaded>;
    /// Where the committed part of `key`'s transcript ends (before an open turn; the
    /// beginning for a session without one).
    fn committed_position(&self, key: &str) -> std::io::Result<Position>;
    /// Whether `key` has a transcript with anything in it.
    fn exists(&self, key: &str) -> std::io::Result<bool>;
    /// Remove `key`'s transcript (a missing one is not an error).
    fn remove(&self, key: &str) -> std::io::Result<()>;
    /// Every session with a transcript, newest first.
    fn sessions(&self) -> std::io::Result<Vec<SessionFile>>;
    /// Where `key`'s transcript is, for messages.
    fn describe(&self, key: &str) -> String;
    /// What to look at when a write fails, for messages.
    fn remedy(&self) -> &'static str {
        "check the --state-dir permissions and free space"
    }
}

/// JSONL transcripts in a directory.
#[derive(Debug, Clone)]
pub struct JsonlTranscripts {
    dir: PathBuf,
    redactor: Redactor,
    /// Per session: where its committed part ends, once known.
    committed: Arc<Mutex<HashMap<String, Committed>>>,
}

/// Where a session's committed lines end, and whether a turn is open after them.
#[derive(Debug, Clone, Copy)]
struct Committed {
    end: u64,
    open: bool,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

impl JsonlTranscripts {
    /// Transcripts in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            redactor: Redactor::default(),
            committed: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// This store writing every line with the values `redactor` knows replaced.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// This store, shared as a [`TranscriptStore`].
    pub fn shared(self) -> Arc<dyn TranscriptStore> {
        Arc::new(self)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of session `key`. Every byte outside `[A-Za-z0-9_-]` is written `%XX`, so a key
    /// cannot contain a separator, `..` or a leading dot.
    pub fn path(&self, key: &str) -> PathBuf {
        let mut name = key_file_stem(key);
        name.push_str(".jsonl");
        self.dir.join(name)
    }

    /// Append `entries` to `key`'s transcript as committed lines (flushed to the disk).
    pub fn append(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.write(key, entries, true)
    }

    fn committed_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Committed>> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self, key: &str, entries: &[Entry], commit: bool) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut text = String::new();
        for entry in entries {
            let line = if self.redactor.is_empty() {
                serde_json::to_string(entry)
            } else {
                serde_json::to_string(&entry.redacted(&self.redactor))
            };
            text.push_str(&line.map_err(std::io::Error::other)?);
            text.push('\n');
        }
        // A conversation can hold anything the user or a tool said: only its owner reads it.
        let file = clawcage_core::files::append_private(&self.path(key), text.as_bytes(), commit)?;
        let end = file.metadata()?.len();
        let mut cache = self.committed_cache();
        let mut offset = end - text.len() as u64;
        let mut state = cache.get(key).copied();
        for (entry, line) in entries.iter().zip(text.split_inclusive('\n')) {
            let line_end = offset + line.len() as u64;
            state = match (entry, state) {
                // A turn opens: the committed part ends before it.
                (Entry::Start { .. }, _) => Some(Committed {
                    end: offset,
                    open: true,
                }),
                (Entry::Turn { .. }, _) => Some(Committed {
                    end: line_end,
                    open: false,
                }),
                (_, Some(Committed { open: false, .. })) => Some(Committed {
                    end: line_end,
                    open: false,
                }),
                (_, other) => other,
            };
            offset = line_end;
        }
        match state {
            Some(state) => {
                cache.insert(key.to_string(), state);
            }
            // Unknown until the file is read.
            None => {
                cache.remove(key);
            }
        }
        Ok(())
    }

    fn load_from(&self, key: &str, limit: usize, max_bytes: u64) -> std::io::Result<Loaded> {
        let path = self.path(key);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded::default());
            }
            Err(error) => return Err(error),
        };
        let mut replay = TranscriptReplay::new(limit);
        let mut offset = 0u64;
        for (number, line) in BufReader::new(file.take(max_bytes))
            .split(b'\n')
            .enumerate()
        {
            let line = line?;
            let at = offset;
            offset += line.len() as u64 + 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Entry>(&line) {
                Ok(entry) => replay.apply(entry, at, offset),
                Err(error) => {
                    tracing::warn!(path = %path.display(), line = number + 1, "skipping an unreadable transcript line: {error}");
                    replay.skip();
                }
            }
        }
        if max_bytes == u64::MAX {
            let state = Committed {
                end: replay.committed_end,
                open: replay.open.is_some(),
            };
            self.committed_cache().insert(key.to_string(), state);
        }
        Ok(replay.finish())
    }
}

/// Replays a session's entries, in order, into a [`Loaded`]: every store reads its transcripts
/// through it, so they agree on what the history, the open turn and the committed part are.
/// Each entry comes with its place: `at`, a position before it, and `end`, one after it
/// ([`TranscriptStore::load_until`] of `at` reads everything before the entry).
pub struct TranscriptReplay {
    loaded: Loaded,
    limit: usize,
    /// The open turn's inputs, started calls and usage, while one is open.
    open: Option<OpenTurn>,
    /// Where the last committed line ends.
    committed_end: u64,
    /// The last assistant text since the current turn's start.
    last_text: String,
}

impl TranscriptReplay {
    /// A replay keeping at most `limit` messages.
    pub fn new(limit: usize) -> Self {
        Self {
            loaded: Loaded::default(),
            limit,
            open: None,
            committed_end: 0,
            last_text: String::new(),
        }
    }

    fn push(&mut self, message: ChatMessage) {
        if message.role == Role::Assistant {
            let text = message.text();
            if !text.trim().is_empty() {
                self.last_text = text;
            }
        }
        push_message(&mut self.loaded.messages, message);
        if self.loaded.messages.len() > self.limit.saturating_mul(2).max(64) {
            self.trim();
        }
    }

    /// Keep the history within the limit; turn marks follow the messages they count.
    fn trim(&mut self) {
        let before = self.loaded.messages.len();
        trim_history(&mut self.loaded.messages, self.limit);
        let removed = before - self.loaded.messages.len();
        self.loaded.turns.retain_mut(|mark| {
            mark.after_messages = mark.after_messages.saturating_sub(removed);
            mark.after_messages > 0
        });
    }

    /// Where the committed part ends so far: before an open turn's start, else after the last
    /// entry.
    pub fn committed_end(&self) -> u64 {
        self.committed_end
    }

    /// Count one entry that could not be read.
    pub fn skip(&mut self) {
        self.loaded.skipped_lines += 1;
    }

    /// Take in `entry`, found between positions `at` and `end`.
    pub fn apply(&mut self, entry: Entry, at: u64, end: u64) {
        let in_turn = self.open.is_some();
        match entry {
            Entry::Start { inputs, .. } => {
                // A turn left open by an older process that was not resumed ends here.
                self.open = Some(OpenTurn {
                    inputs,
                    ..OpenTurn::default()
                });
                self.last_text.clear();
                self.committed_end = at;
                return;
            }
            Entry::Joined { inputs, .. } => {
                if let Some(open) = self.open.as_mut() {
                    open.inputs.extend(inputs);
                }
            }
            Entry::Resumed { .. } => {
                if let Some(open) = self.open.as_mut() {
                    open.resumed += 1;
                }
            }
            Entry::Message { message, .. } => self.push(message),
            Entry::ToolStarted { tool_use_id, .. } => {
                if let Some(open) = self.open.as_mut() {
                    open.started_calls.push(tool_use_id);
                }
            }
            Entry::ToolResult { result, .. } => self.push(ChatMessage {
                role: Role::User,
                cut: None,
                content: vec![result],
            }),
            Entry::Used { usage, .. } => {
                if let Some(open) = self.open.as_mut() {
                    open.usage.add(usage);
                }
            }
            Entry::Turn {
                at_ms,
                usage,
                outcome,
            } => {
                self.loaded.usage.add(usage);
                self.loaded.turns.push(TurnMark {
                    after_messages: self.loaded.messages.len(),
                    at_ms,
                    usage,
                    outcome: outcome.clone(),
                });
                if let Some(open) = self.open.take() {
                    let answered = Answered {
                        text: std::mem::take(&mut self.last_text),
                        outcome,
                        usage,
                    };
                    for input in open.inputs {
                        self.loaded.answered.insert(input, answered.clone());
                    }
                }
            }
            Entry::Reset { .. } => {
                self.loaded.messages.clear();
                self.loaded.turns.clear();
                self.loaded.usage = Usage::default();
            }
            Entry::Compaction {
                summary,
                kept,
                usage,
                ..
            } => {
                let before = self.loaded.messages.len();
                let cut = before.saturating_sub(kept);
                apply_compaction(&mut self.loaded.messages, cut, &summary);
                // Turns that ended in the summarised part are gone with it.
                let added = self.loaded.messages.len() + cut - before;
                self.loaded.turns.retain_mut(|mark| {
                    let kept_mark = mark.after_messages > cut;
                    mark.after_messages = (mark.after_messages + added).saturating_sub(cut);
                    kept_mark
                });
                self.loaded.usage.add(usage);
            }
        }
        if !in_turn || self.open.is_none() {
            self.committed_end = end;
        }
    }

    /// The transcript as replayed.
    pub fn finish(mut self) -> Loaded {
        self.trim();
        self.loaded.open = self.open;
        self.loaded
    }
}

impl TranscriptStore for JsonlTranscripts {
    fn append_steps(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.write(key, entries, false)
    }

    fn commit(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.write(key, entries, true)
    }

    fn load(&self, key: &str, limit: usize) -> std::io::Result<Loaded> {
        self.load_from(key, limit, u64::MAX)
    }

    fn load_until(&self, key: &str, limit: usize, until: Position) -> std::io::Result<Loaded> {
        self.load_from(key, limit, until.0)
    }

    fn committed_position(&self, key: &str) -> std::io::Result<Position> {
        if let Some(state) = self.committed_cache().get(key) {
            return Ok(Position(state.end));
        }
        if !self.exists(key)? {
            return Ok(Position(0));
        }
        self.load_from(key, 1, u64::MAX)?;
        Ok(Position(
            self.committed_cache().get(key).map_or(0, |state| state.end),
        ))
    }

    fn exists(&self, key: &str) -> std::io::Result<bool> {
        match std::fs::metadata(self.path(key)) {
            Ok(metadata) => Ok(metadata.len() > 0),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }

    fn remove(&self, key: &str) -> std::io::Result<()> {
        self.committed_cache().remove(key);
        match std::fs::remove_file(self.path(key)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn sessions(&self) -> std::io::Result<Vec<SessionFile>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut sessions = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(key) = name
                .to_str()
                .and_then(|name| name.strip_suffix(".jsonl"))
                .and_then(key_from_file_stem)
            else {
                continue;
            };
            let metadata = entry.metadata()?;
            if !metadata.is_file() {
                continue;
            }
            let modified_ms = metadata
                .modified()
                .ok()
                .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |elapsed| elapsed.as_millis() as u64);
            sessions.push(SessionFile {
                key,
                modified_ms,
                bytes: metadata.len(),
            });
        }
        sessions.sort_by(|a, b| b.modified_ms.cmp(&a.modified_ms).then(a.key.cmp(&b.key)));
        Ok(sessions)
    }

    fn describe(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }
}

/// A session that has a transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFile {
    /// The session key.
    pub key: String,
    /// When the transcript was last written, in milliseconds since the Unix epoch.
    pub modified_ms: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The file name (without extension) of session `key`: every byte outside `[A-Za-z0-9_-]`
/// written `%XX`, so the name has no separator, no dot and cannot be empty. Anything that keeps
/// per-session files (transcripts, event logs) names them this way.
pub fn key_file_stem(key: &str) -> String {
    let mut name = String::with_capacity(key.len() + 6);
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            name.push(byte as char);
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    if name.is_empty() {
        name.push_str("%00");
    }
    name
}

/// The session keys of the `<stem>.jsonl` files in `dir`, sorted (names a key cannot have
/// produced are left out; a missing directory has none).
pub fn keys_in_dir(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut keys = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(key) = name
            .to_str()
            .and_then(|name| name.strip_suffix(".jsonl"))
            .and_then(key_from_file_stem)
        {
            keys.push(key);
        }
    }
    keys.sort();
    Ok(keys)
}

/// The session key a [`key_file_stem`] came from; `None` for a name it cannot have produced.
pub fn key_from_file_stem(stem: &str) -> Option<String> {
    if stem == "%00" {
        return Some(String::new());
    }
    let mut bytes = Vec::with_capacity(stem.len());
    let mut rest = stem.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = tail.get(..2)?;
            let text = std::str::from_utf8(hex).ok()?;
            if text.bytes().any(|b| b.is_ascii_lowercase()) {
                return None;
            }
            bytes.push(u8::from_str_radix(text, 16).ok()?);
            rest = &tail[2..];
        } else if first.is_ascii_alphanumeric() || first == b'_' || first == b'-' {
            bytes.push(first);
            rest = tail;
        } else {
            return None;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Append `message`, merging it into the previous message when both are the user's (a turn that
/// was stopped ends with tool results, and the next input joins them: providers want the roles to
/// alternate).
pub fn push_message(history: &mut Vec<ChatMessage>, message: ChatMessage) {
    match history.last_mut() {
        Some(last) if last.role == Role::User && message.role == Role::User => {
            last.content.extend(message.content);
        }
        _ => history.push(message),
    }
}

/// Keep at most `limit` messages, cutting from the front so that the history starts with a user
/// message that is not a tool result (a result without its call is refused by providers).
pub fn trim_history(history: &mut Vec<ChatMessage>, limit: usize) {
    if history.len() > limit {
        history.drain(..history.len() - limit);
    }
    let start = history
        .iter()
        .position(|message| message.role == Role::User && !message.has_tool_results())
        .unwrap_or(history.len());
    history.drain(..start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_core::ContentBlock;

    #[test]
    fn keys_cannot_escape_the_directory() {
        let store = JsonlTranscripts::new("/state/sessions");
        for key in [
            "../../etc/passwd",
            "/abs",
            "..",
            ".hidden",
            "a\\b",
            "",
            "a\0b",
        ] {
            let path = store.path(key);
            assert_eq!(path.parent(), Some(Path::new("/state/sessions")), "{key:?}");
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(
                !name.starts_with('.') && !name.contains('/'),
                "{key:?} -> {name}"
            );
        }
        assert_ne!(store.path("a/b"), store.path("a%2Fb"));
        assert!(store.path("cli:default").ends_with("cli%3Adefault.jsonl"));
        for key in ["agent:main:webchat:a.b", "../x", "", "é/%"] {
            assert_eq!(
                key_from_file_stem(&key_file_stem(key)).as_deref(),
                Some(key)
            );
        }
        assert_eq!(key_from_file_stem("a.old"), None);
        assert_eq!(key_from_file_stem("a%2f"), None);
    }

    #[test]
    fn a_store_with_a_redactor_writes_no_secret_value() {
        let secret = "hook-secret-0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let store = JsonlTranscripts::new(dir.path())
            .with_redactor(Redactor::new([("CLAWCAGE_HOOK_SECRET", secret)]));
        let tool_call = ChatMessage {
            role: Role::Assistant,
            cut: None,
            content: vec![ContentBlock::ToolUse {
                id: "c1".into(),
                name: "message".into(),
                input: serde_json::json!({"text": format!("say {secret}")}),
            }],
        };
        store
            .append(
                "k",
                &[
                    Entry::Message {
                        at_ms: 1,
                        message: ChatMessage::user(format!("pasted: {secret}")),
                    },
                    Entry::Message {
                        at_ms: 2,
                        message: tool_call,
                    },
                    Entry::Turn {
                        at_ms: 3,
                        usage: Usage::default(),
                        outcome: format!("error: {secret}"),
                    },
                    Entry::Compaction {
                        at_ms: 4,
                        reason: CompactionReason::Requested,
                        summary: format!("the user pasted {secret}"),
                        summarised: 1,
                        kept: 1,
                        usage: Usage::default(),
                    },
                ],
            )
            .unwrap();
        let written = std::fs::read_to_string(store.path("k")).unwrap();
        assert!(!written.contains(secret), "{written}");
        assert_eq!(
            written.matches("[redacted: CLAWCAGE_HOOK_SECRET]").count(),
            4
        );
        let loaded = store.load("k", 100).unwrap();
        assert_eq!(loaded.skipped_lines, 0);
        let messages = serde_json::to_string(&loaded.messages).unwrap();
        assert!(
            !messages.contains(secret) && messages.contains("[redacted:"),
            "{messages}"
        );
    }

    #[test]
    fn sessions_are_listed_and_a_prefix_loads_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let store = JsonlTranscripts::new(dir.path());
        let message = |text: &str| Entry::Message {
            at_ms: 1,
            message: ChatMessage::user(text),
        };
        store.append("agent:main:cli:a", &[message("one")]).unwrap();
        let before = store.committed_position("agent:main:cli:a").unwrap();
        store.append("agent:main:cli:a", &[message("two")]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let keys: Vec<String> = store
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(keys, ["agent:main:cli:a"]);
        let loaded = store.load_until("agent:main:cli:a", 10, before).unwrap();
        assert_eq!(loaded.messages, vec![ChatMessage::user("one")]);
        assert_eq!(
            store.load("agent:main:cli:a", 10).unwrap().messages.len(),
            1
        );
        assert_eq!(store.committed_position("missing").unwrap(), Position(0));
    }

    #[test]
    fn trimming_never_starts_with_an_orphaned_tool_result() {
        let call = ChatMessage {
            role: Role::Assistant,
            cut: None,
            content: vec![ContentBlock::ToolUse {
                id: "t".into(),
                name: "x".into(),
                input: serde_json::json!({}),
            }],
        };
        let result = ChatMessage {
            role: Role::User,
            cut: None,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "t".into(),
                content: "r".into(),
                is_error: false,
            }],
        };
        let mut history = vec![
            ChatMessage::user("one"),
            call.clone(),
            result.clone(),
            ChatMessage::assistant("done"),
            ChatMessage::user("two"),
            ChatMessage::assistant("ok"),
        ];
        trim_history(&mut history, 4);
        assert_eq!(
            history,
            vec![ChatMessage::user("two"), ChatMessage::assistant("ok")]
        );
    }
}
