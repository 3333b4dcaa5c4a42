//! The Telegram journal, `<state-dir>/channels/telegram.json` (written atomically, mode 0600) or,
//! in a cluster, the shared `telegram` record: the next `getUpdates` offset and a record of every
//! update taken and not yet answered. A batch is written, with the offset after it, before any of
//! it is handled, so Telegram forgets the batch only once it is stored; a record stays until its
//! reply is delivered, and the reply is recorded before it is sent. So a restart, or another
//! host taking the poller over, neither loses an update nor handles one twice. Each write names
//! the version it follows: a poller whose journal another host has written since (it lost the
//! active gateway's lease) is refused and handles nothing more.

use std::sync::{Arc, Mutex};

use clawcage_core::records::{RecordStore, RecordWriteError, StoredRecord};
use clawcage_core::sync::lock;
use clawcage_runtime::Error;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// The approved person who wrote it (the approval requests of the session's turns are
    /// posted to the conversation, by whichever host serves the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) approved_by: Option<String>,
    /// The text is a conversation command (`/queue …`, `/approve …`) for the host serving the
    /// session, which another host served when it came.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) command: bool,
}

/// Conversations remembered as ones an approved person wrote in, at most.
const MAX_APPROVAL_CONVERSATIONS: usize = 4096;

/// What the journal file holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Saved {
    /// The next `getUpdates` offset.
    offset: u64,
    #[serde(default)]
    pending: Vec<Pending>,
    /// The conversations (session keys) an approved person wrote in, the latest last: their
    /// turns' approval requests are posted to their chat by whichever host serves them, also
    /// after a restart or a takeover, before anyone writes there again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    approval_conversations: Vec<String>,
}

impl Saved {
    /// `key` is a conversation an approved person wrote in (now its latest).
    fn remember_approval_conversation(&mut self, key: &str) {
        let conversations = &mut self.approval_conversations;
        conversations.retain(|kept| kept != key);
        conversations.push(key.to_string());
        let over = conversations
            .len()
            .saturating_sub(MAX_APPROVAL_CONVERSATIONS);
        conversations.drain(..over);
    }
}

/// Whether an approved person wrote in conversation `key`, as the journal `store` keeps it now
/// (whichever host polls). Blocks on the store: call it from a blocking thread.
pub(super) fn approved_person_wrote_in(store: &dyn RecordStore, key: &str) -> bool {
    match store.read(None) {
        Ok(StoredRecord::Found { bytes, .. }) => serde_json::from_slice::<Saved>(&bytes)
            .is_ok_and(|saved| saved.approval_conversations.iter().any(|kept| kept == key)),
        Ok(StoredRecord::Missing | StoredRecord::Unchanged) => false,
        Err(error) => {
            tracing::warn!("cannot read the Telegram journal: {error}");
            false
        }
    }
}

/// What was last written, and its version.
struct Written {
    saved: Saved,
    version: Option<String>,
}

/// The journal: its store and what was last written to it.
pub(super) struct Journal {
    store: Arc<dyn RecordStore>,
    written: Mutex<Written>,
}

impl Journal {
    /// Reads the journal `store` keeps; there being none yet is an empty one.
    pub(super) fn open(store: Arc<dyn RecordStore>) -> Result<Journal, Error> {
        let (saved, version) = match store.read(None) {
            Ok(StoredRecord::Found { bytes, version }) => {
                let saved = serde_json::from_slice::<Saved>(&bytes).map_err(|error| {
                    Error::Failed(format!(
                        "the Telegram journal {} is not valid ({error}); move it away to start over (updates it held are then lost)",
                        store.describe()
                    ))
                })?;
                (saved, Some(version))
            }
            Ok(StoredRecord::Missing | StoredRecord::Unchanged) => (Saved::default(), None),
            Err(error) => {
                return Err(Error::Failed(format!(
                    "cannot read the Telegram journal: {error}"
                )));
            }
        };
        Ok(Journal {
            store,
            written: Mutex::new(Written { saved, version }),
        })
    }

    /// The next `getUpdates` offset.
    pub(super) fn offset(&self) -> u64 {
        lock(&self.written).saved.offset
    }

    /// The records kept, in update order (at start: what the last process left).
    pub(super) fn pending(&self) -> Vec<Pending> {
        lock(&self.written).saved.pending.clone()
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
        let mut written = lock(&self.written);
        let mut next = written.saved.clone();
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
                if let (Some(_), Some(key)) = (&pending.approved_by, &pending.session_key) {
                    next.remember_approval_conversation(key);
                }
                next.pending.push(pending.clone());
                taken.push(pending);
            }
        }
        if next.offset == written.saved.offset && taken.is_empty() {
            return Ok(taken);
        }
        self.save(&mut written, next)?;
        Ok(taken)
    }

    /// Changes the record of `update_id` (or drops it when `change` says `None`).
    pub(super) fn update(&self, update_id: u64, change: impl FnOnce(Pending) -> Option<Pending>) {
        let mut written = lock(&self.written);
        let mut next = written.saved.clone();
        let Some(index) = next
            .pending
            .iter()
            .position(|pending| pending.update_id == update_id)
        else {
            return;
        };
        let pending = next.pending.remove(index);
        if let Some(changed) = change(pending) {
            next.pending.insert(index, changed);
        }
        if let Err(error) = self.save(&mut written, next) {
            tracing::error!("{error}");
        }
    }

    /// Stores `next` after the version last written; it becomes what was written.
    fn save(&self, written: &mut Written, next: Saved) -> Result<(), String> {
        let text = serde_json::to_vec(&next).map_err(|error| error.to_string())?;
        match self.store.write(&text, written.version.as_deref()) {
            Ok(version) => {
                *written = Written {
                    saved: next,
                    version: Some(version),
                };
                Ok(())
            }
            Err(RecordWriteError::Changed) => Err(format!(
                "the Telegram journal {} was written by another gateway meanwhile (it polls Telegram now); this one stops taking updates",
                self.store.describe()
            )),
            Err(RecordWriteError::Failed(reason)) => {
                Err(format!("cannot write the Telegram journal: {reason}"))
            }
        }
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
            approved_by: None,
            command: false,
        })
    }

    fn file_of(dir: &std::path::Path) -> Arc<dyn RecordStore> {
        Arc::new(clawcage_core::records::FileRecord::new(
            dir.join("channels/telegram.json"),
            16 << 20,
            true,
        ))
    }

    #[test]
    fn a_batch_is_on_disk_before_it_is_handled_and_a_restart_neither_loses_nor_repeats_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("channels")).unwrap();
        let journal = Journal::open(file_of(dir.path())).unwrap();
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

        let reopened = Journal::open(file_of(dir.path())).unwrap();
        assert_eq!(reopened.offset(), 13);
        let left = reopened.pending();
        assert_eq!(left.len(), 1);
        assert_eq!(
            (left[0].update_id, left[0].reply.as_deref()),
            (10, Some("answer"))
        );
    }

    /// A record that compares versions on write, as a cluster's bucket does.
    #[derive(Debug, Default)]
    struct Compared(Mutex<Option<(Vec<u8>, u64)>>);

    impl RecordStore for Compared {
        fn describe(&self) -> String {
            "the test's record".to_string()
        }
        fn hold(&self) -> Result<Option<Box<dyn Send>>, String> {
            Ok(None)
        }
        fn read(&self, known: Option<&str>) -> Result<StoredRecord, String> {
            Ok(match &*lock(&self.0) {
                None => StoredRecord::Missing,
                Some((_, version)) if known == Some(version.to_string().as_str()) => {
                    StoredRecord::Unchanged
                }
                Some((bytes, version)) => StoredRecord::Found {
                    bytes: bytes.clone(),
                    version: version.to_string(),
                },
            })
        }
        fn write(&self, bytes: &[u8], expected: Option<&str>) -> Result<String, RecordWriteError> {
            let mut stored = lock(&self.0);
            let now = stored.as_ref().map(|(_, version)| version.to_string());
            if now.as_deref() != expected {
                return Err(RecordWriteError::Changed);
            }
            let next = stored.as_ref().map_or(1, |(_, version)| version + 1);
            *stored = Some((bytes.to_vec(), next));
            Ok(next.to_string())
        }
    }

    #[test]
    fn the_conversations_approved_people_wrote_in_are_remembered_the_latest_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("channels")).unwrap();
        let store = file_of(dir.path());
        let journal = Journal::open(store.clone()).unwrap();
        let by_approved = |chat: i64| {
            move |update_id: u64, update: &Value| {
                let pending = kept(update_id, update)?;
                Some(Pending {
                    session_key: Some(format!("agent:main:telegram:{chat}")),
                    approved_by: (chat != 3).then(|| "telegram:42".to_string()),
                    ..pending
                })
            }
        };
        journal
            .record(&[json!({"update_id": 1, "text": "hi"})], by_approved(-1))
            .unwrap();
        journal
            .record(&[json!({"update_id": 2, "text": "hi"})], by_approved(3))
            .unwrap();
        assert!(approved_person_wrote_in(
            store.as_ref(),
            "agent:main:telegram:-1"
        ));
        assert!(
            !approved_person_wrote_in(store.as_ref(), "agent:main:telegram:3"),
            "nobody approved wrote there"
        );

        let mut saved = Saved::default();
        for n in 0..MAX_APPROVAL_CONVERSATIONS + 10 {
            saved.remember_approval_conversation(&format!("k{n}"));
        }
        saved.remember_approval_conversation("k20");
        let kept = &saved.approval_conversations;
        assert_eq!(kept.len(), MAX_APPROVAL_CONVERSATIONS);
        assert_eq!(kept.last().map(String::as_str), Some("k20"));
        assert_eq!(kept.first().map(String::as_str), Some("k10"));
        assert!(!kept.contains(&"k9".to_string()), "the oldest went");
    }

    #[test]
    fn a_poller_whose_journal_another_host_wrote_since_is_refused() {
        let shared: Arc<dyn RecordStore> = Arc::new(Compared::default());
        let old_host = Journal::open(shared.clone()).unwrap();
        old_host
            .record(&[json!({"update_id": 5, "text": "hello"})], kept)
            .unwrap();
        // Another host takes the poller over: it reads the journal and goes on from there.
        let new_host = Journal::open(shared.clone()).unwrap();
        assert_eq!(new_host.offset(), 6);
        assert_eq!(new_host.pending().len(), 1, "the update not answered yet");
        new_host
            .record(&[json!({"update_id": 6, "text": "again"})], kept)
            .unwrap();
        // The old host, still polling, is refused: nothing it takes is recorded or handled.
        let error = old_host
            .record(&[json!({"update_id": 6, "text": "again"})], kept)
            .unwrap_err();
        assert!(error.contains("another gateway"), "{error}");
        assert_eq!(Journal::open(shared).unwrap().offset(), 7);
    }

    #[test]
    fn a_broken_journal_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("channels")).unwrap();
        std::fs::write(dir.path().join("channels/telegram.json"), "{not json").unwrap();
        let error = Journal::open(file_of(dir.path()))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("move it away to start over"), "{error}");
    }
}
