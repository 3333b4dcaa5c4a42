//! Per-session JSONL transcripts in the state directory: one file per session key
//! (`sessions/<key>.jsonl`, the key percent-encoded so it can never name another path), one JSON
//! object per line. Lines are only ever appended: the messages of a turn and a `turn` line with
//! its token usage, written and flushed together when the turn ends; `/reset` appends a `reset`
//! line rather than deleting history. Loading replays the file from the last reset, keeps the
//! newest messages up to the history limit, and skips lines it cannot read (a crash mid-write
//! loses at most that line) with a warning. A `compaction` line records a summary that replaced
//! the older messages: loading replays it the same way, so a resumed session gets the summary
//! and the recent messages, while the file keeps every message.
//!
//! A store given the runtime's redactor ([`TranscriptStore::with_redactor`]) writes every text of
//! every line with the secret values replaced: model output arrives scrubbed already (the
//! provider chain is wrapped in [`Redacting`](crate::provider::Redacting)), so this catches what
//! a person typed or pasted, and anything else that would put a value on the disk.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use clawcage_core::redact::Redactor;
use clawcage_core::{ChatMessage, Role, Usage};
use serde::{Deserialize, Serialize};

use crate::compaction::{Compaction, CompactionReason, apply_compaction};
use crate::provider::redacting::redact_message;

/// One line of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A message of the conversation.
    Message {
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
        /// The message.
        message: ChatMessage,
    },
    /// The end of a turn.
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
    fn redacted(&self, redactor: &Redactor) -> Entry {
        match self {
            Entry::Message { at_ms, message } => Entry::Message {
                at_ms: *at_ms,
                message: redact_message(redactor, message),
            },
            Entry::Turn {
                at_ms,
                usage,
                outcome,
            } => Entry::Turn {
                at_ms: *at_ms,
                usage: *usage,
                outcome: redactor.redact(outcome),
            },
            Entry::Reset { at_ms } => Entry::Reset { at_ms: *at_ms },
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
        }
    }
}

/// A loaded session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// The newest messages since the last reset, within the history limit.
    pub messages: Vec<ChatMessage>,
    /// Tokens used since the last reset.
    pub usage: Usage,
    /// Lines that could not be read.
    pub skipped_lines: usize,
}

/// Where the transcripts live.
#[derive(Debug, Clone)]
pub struct TranscriptStore {
    dir: PathBuf,
    redactor: Redactor,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

impl TranscriptStore {
    /// Transcripts in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            redactor: Redactor::default(),
        }
    }

    /// This store writing every line with the values `redactor` knows replaced.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
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

    /// Every session with a transcript, with when it was last written and its size, newest
    /// first. Files whose names are not escaped keys are left out.
    pub fn sessions(&self) -> std::io::Result<Vec<SessionFile>> {
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

    /// The size of `key`'s transcript in bytes (0 when it has none).
    pub fn file_len(&self, key: &str) -> std::io::Result<u64> {
        match std::fs::metadata(self.path(key)) {
            Ok(metadata) => Ok(metadata.len()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(error),
        }
    }

    /// As [`TranscriptStore::load`], reading only the first `max_bytes` bytes of the file: the
    /// transcript as it was when it had that size (a front end pairs it with the events that
    /// came after).
    pub fn load_prefix(&self, key: &str, limit: usize, max_bytes: u64) -> std::io::Result<Loaded> {
        self.load_from(key, limit, max_bytes)
    }

    /// Append `entries` to `key`'s transcript, flushed to the disk before returning.
    pub fn append(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
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
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        // A conversation can hold anything the user or a tool said: only its owner reads it.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(self.path(key))?;
        file.write_all(text.as_bytes())?;
        file.flush()?;
        file.sync_data()
    }

    /// Load `key`'s transcript, keeping at most `limit` messages. A missing file is an empty
    /// session.
    pub fn load(&self, key: &str, limit: usize) -> std::io::Result<Loaded> {
        self.load_from(key, limit, u64::MAX)
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
        let mut loaded = Loaded::default();
        for (number, line) in BufReader::new(file.take(max_bytes))
            .split(b'\n')
            .enumerate()
        {
            let line = line?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Entry>(&line) {
                Ok(Entry::Message { message, .. }) => {
                    push_message(&mut loaded.messages, message);
                    if loaded.messages.len() > limit.saturating_mul(2).max(64) {
                        trim_history(&mut loaded.messages, limit);
                    }
                }
                Ok(Entry::Turn { usage, .. }) => loaded.usage.add(usage),
                Ok(Entry::Reset { .. }) => {
                    loaded.messages.clear();
                    loaded.usage = Usage::default();
                }
                Ok(Entry::Compaction {
                    summary,
                    kept,
                    usage,
                    ..
                }) => {
                    let cut = loaded.messages.len().saturating_sub(kept);
                    apply_compaction(&mut loaded.messages, cut, &summary);
                    loaded.usage.add(usage);
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), line = number + 1, "skipping an unreadable transcript line: {error}");
                    loaded.skipped_lines += 1;
                }
            }
        }
        trim_history(&mut loaded.messages, limit);
        Ok(loaded)
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
        let store = TranscriptStore::new("/state/sessions");
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
        let store = TranscriptStore::new(dir.path())
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
        let store = TranscriptStore::new(dir.path());
        let message = |text: &str| Entry::Message {
            at_ms: 1,
            message: ChatMessage::user(text),
        };
        store.append("agent:main:cli:a", &[message("one")]).unwrap();
        let before = store.file_len("agent:main:cli:a").unwrap();
        store.append("agent:main:cli:a", &[message("two")]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let keys: Vec<String> = store
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(keys, ["agent:main:cli:a"]);
        let loaded = store.load_prefix("agent:main:cli:a", 10, before).unwrap();
        assert_eq!(loaded.messages, vec![ChatMessage::user("one")]);
        assert_eq!(
            store.load("agent:main:cli:a", 10).unwrap().messages.len(),
            1
        );
        assert_eq!(store.file_len("missing").unwrap(), 0);
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
