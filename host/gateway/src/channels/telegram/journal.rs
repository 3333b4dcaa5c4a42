//! The Telegram journal, `<state-dir>/channels/telegram.json` (written atomically, mode 0600):
//! the next `getUpdates` offset and a record of every update taken and not yet answered. A batch
//! is written, with the offset after it, before any of it is handled, so Telegram forgets the
//! batch only once it is on disk; a record stays until its reply is delivered, and the reply is
//! recorded before it is sent. So a restart neither loses an update nor handles one twice.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clawcage_core::sync::lock;
use clawcage_runtime::Error;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest journal read.
const MAX_JOURNAL_BYTES: u64 = 16 << 20;

/// One update kept until its reply is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Pending {
    pub(super) update_id: u64,
    pub(super) chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) thread_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) message_id: Option<i64>,
    /// The session the text goes to (absent: a reply only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) session_key: Option<String>,
    /// The text for the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) text: Option<String>,
    /// The reply, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) reply: Option<String>,
}

/// What the journal file holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Saved {
    /// The next `getUpdates` offset.
    offset: u64,
    #[serde(default)]
    pending: Vec<Pending>,
}

/// The journal: its file and what was last written to it.
pub(super) struct Journal {
    file: PathBuf,
    saved: Mutex<Saved>,
}

impl Journal {
    /// Reads the journal of `state_dir`; there being none yet is an empty one.
    pub(super) fn open(state_dir: &Path) -> Result<Journal, Error> {
        let file = state_dir.join("channels").join("telegram.json");
        let saved = match clawcage_core::files::read_regular_file(
            &file,
            MAX_JOURNAL_BYTES,
            clawcage_core::files::Symlinks::Refuse,
        ) {
            Ok(bytes) => serde_json::from_slice::<Saved>(&bytes).map_err(|error| {
                Error::Failed(format!(
                    "the Telegram journal {} is not valid ({error}); move it away to start over (updates it held are then lost)",
                    file.display()
                ))
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Saved::default(),
            Err(error) => {
                return Err(Error::Failed(format!(
                    "cannot read the Telegram journal {}: {error}",
                    file.display()
                )));
            }
        };
        Ok(Journal {
            file,
            saved: Mutex::new(saved),
        })
    }

    /// The next `getUpdates` offset.
    pub(super) fn offset(&self) -> u64 {
        lock(&self.saved).offset
    }

    /// The records kept, in update order (at start: what the last process left).
    pub(super) fn pending(&self) -> Vec<Pending> {
        lock(&self.saved).pending.clone()
    }

    /// Records a batch: the offset after it, and a record of each new update `judge` makes one
    /// of (`None`: ignored), written before any of it is handled. Returns the new records to
    /// handle. Updates below the offset (already taken) are skipped; a batch that changes
    /// nothing writes nothing.
    pub(super) fn record(
        &self,
        updates: &[Value],
        mut judge: impl FnMut(u64, &Value) -> Option<Pending>,
    ) -> Result<Vec<Pending>, String> {
        let mut taken = Vec::new();
        let mut saved = lock(&self.saved);
        let mut next = saved.clone();
        for update in updates {
            let Some(id) = update.get("update_id").and_then(Value::as_u64) else {
                tracing::warn!("a Telegram update without an update_id was ignored");
                continue;
            };
            if id < next.offset {
                continue;
            }
            next.offset = id + 1;
            if let Some(pending) = judge(id, update) {
                next.pending.push(pending.clone());
                taken.push(pending);
            }
        }
        if next.offset == saved.offset && taken.is_empty() {
            return Ok(taken);
        }
        self.save(&next)?;
        *saved = next;
        Ok(taken)
    }

    /// Changes the record of `update_id` (or drops it when `change` says `None`).
    pub(super) fn update(&self, update_id: u64, change: impl FnOnce(Pending) -> Option<Pending>) {
        let mut saved = lock(&self.saved);
        let Some(index) = saved
            .pending
            .iter()
            .position(|pending| pending.update_id == update_id)
        else {
            return;
        };
        let pending = saved.pending.remove(index);
        if let Some(changed) = change(pending) {
            saved.pending.insert(index, changed);
        }
        if let Err(error) = self.save(&saved) {
            tracing::error!("{error}");
        }
    }

    fn save(&self, saved: &Saved) -> Result<(), String> {
        let text = serde_json::to_vec(saved).map_err(|error| error.to_string())?;
        clawcage_core::files::write_atomically(&self.file, &text, true).map_err(|error| {
            format!(
                "cannot write the Telegram journal {}: {error}",
                self.file.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kept(update_id: u64, update: &Value) -> Option<Pending> {
        let text = update.get("text").and_then(Value::as_str)?;
        Some(Pending {
            update_id,
            chat_id: 7,
            thread_id: None,
            message_id: None,
            session_key: Some("agent:main:telegram:7".to_string()),
            text: Some(text.to_string()),
            reply: None,
        })
    }

    #[test]
    fn a_batch_is_on_disk_before_it_is_handled_and_a_restart_neither_loses_nor_repeats_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("channels")).unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!((journal.offset(), journal.pending()), (0, vec![]));

        let batch = [
            json!({"update_id": 10, "text": "one"}),
            json!({"update_id": 11}),
            json!({"text": "no id"}),
            json!({"update_id": 12, "text": "two"}),
        ];
        let taken = journal.record(&batch, kept).unwrap();
        assert_eq!(
            taken.iter().map(|p| p.update_id).collect::<Vec<_>>(),
            [10, 12]
        );
        journal.update(10, |mut pending| {
            pending.reply = Some("answer".to_string());
            Some(pending)
        });
        journal.update(12, |_| None);

        // The same batch again (Telegram resent it): nothing new is taken.
        assert!(journal.record(&batch, kept).unwrap().is_empty());

        let reopened = Journal::open(dir.path()).unwrap();
        assert_eq!(reopened.offset(), 13);
        let left = reopened.pending();
        assert_eq!(left.len(), 1);
        assert_eq!(
            (left[0].update_id, left[0].reply.as_deref()),
            (10, Some("answer"))
        );
    }

    #[test]
    fn a_broken_journal_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("channels")).unwrap();
        std::fs::write(dir.path().join("channels/telegram.json"), "{not json").unwrap();
        let error = Journal::open(dir.path()).err().unwrap().to_string();
        assert!(error.contains("move it away to start over"), "{error}");
    }
}
