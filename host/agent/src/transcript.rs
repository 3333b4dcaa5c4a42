//! Per-session JSONL transcripts in the state directory: one file per session key
//! (`sessions/<key>.jsonl`, the key percent-encoded so it can never name another path), one JSON
//! object per line. Lines are only ever appended: the messages of a turn and a `turn` line with
//! its token usage, written and flushed together when the turn ends; `/reset` appends a `reset`
//! line rather than deleting history. Loading replays the file from the last reset, keeps the
//! newest messages up to the history limit, and skips lines it cannot read (a crash mid-write
//! loses at most that line) with a warning.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use clawcage_core::{ChatMessage, Role, Usage};
use serde::{Deserialize, Serialize};

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
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of session `key`. Every byte outside `[A-Za-z0-9_-]` is written `%XX`, so a key
    /// cannot contain a separator, `..` or a leading dot.
    pub fn path(&self, key: &str) -> PathBuf {
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
        name.push_str(".jsonl");
        self.dir.join(name)
    }

    /// Append `entries` to `key`'s transcript, flushed to the disk before returning.
    pub fn append(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut text = String::new();
        for entry in entries {
            text.push_str(&serde_json::to_string(entry).map_err(std::io::Error::other)?);
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
        let path = self.path(key);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Loaded::default());
            }
            Err(error) => return Err(error),
        };
        let mut loaded = Loaded::default();
        for (number, line) in BufReader::new(file).split(b'\n').enumerate() {
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
    }

    #[test]
    fn trimming_never_starts_with_an_orphaned_tool_result() {
        let call = ChatMessage {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: "t".into(),
                name: "x".into(),
                input: serde_json::json!({}),
            }],
        };
        let result = ChatMessage {
            role: Role::User,
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
