//! `<state-dir>/approvals.json` (or a cluster's shared record): the allow-always decisions a
//! person made, read again at every use and changed under a lock file (or at the revision read).

use std::path::Path;
use std::sync::{Arc, RwLock};

use clawcage_core::approval::AllowEntry;
use clawcage_core::records::{FileRecord, RecordStore, StoredRecord, read_change_write};
use serde::{Deserialize, Serialize};

use super::{ApprovalError, MAX_STORE_BYTES, NETWORK_KIND, WRITE_KIND};

/// An allow-always decision kept in `approvals.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredApproval {
    /// Its id (`apv-…`), used to revoke it.
    pub id: String,
    /// `exec`.
    pub kind: String,
    /// The program and the glob over its arguments.
    #[serde(flatten)]
    pub entry: AllowEntry,
    /// When it was decided, RFC 3339.
    pub created: String,
    /// The session it was decided for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl StoredApproval {
    /// What it allows, as listings show it: `rm -r build` for a command, the allow-list entry
    /// (`docs.example:8443`) for a host.
    pub fn rule(&self) -> String {
        if self.kind == NETWORK_KIND || self.kind == WRITE_KIND {
            self.entry.program.clone()
        } else {
            self.entry.to_string()
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StoreFile {
    version: u32,
    approvals: Vec<StoredApproval>,
}

/// `<state-dir>/approvals.json`: allow-always decisions, read again at every use (another
/// process may have revoked one), changed under a lock file and written atomically, mode 0600 —
/// or, once [`ApprovalStore::share_in`] moved it, one record every gateway host of a cluster
/// shares, changed at the revision read. Clones share where the decisions are.
#[derive(Debug, Clone)]
pub struct ApprovalStore {
    record: Arc<RwLock<Arc<dyn RecordStore>>>,
}

impl ApprovalStore {
    /// The store in `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> ApprovalStore {
        let file = FileRecord::new(
            crate::StateDir::new(state_dir).approvals(),
            MAX_STORE_BYTES,
            true,
        );
        ApprovalStore {
            record: Arc::new(RwLock::new(Arc::new(file))),
        }
    }

    /// From now on this store, and every clone of it (the broker's), keeps its decisions in
    /// `record` (a cluster's shared record) instead.
    pub fn share_in(&self, record: Arc<dyn RecordStore>) {
        *self
            .record
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = record;
    }

    fn record(&self) -> Arc<dyn RecordStore> {
        self.record
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Where the decisions are, for messages (a path, a cluster's record).
    pub fn describe(&self) -> String {
        self.record().describe()
    }

    /// Every stored decision.
    pub fn list(&self) -> Result<Vec<StoredApproval>, ApprovalError> {
        let record = self.record();
        match record.read(None).map_err(ApprovalError::Store)? {
            StoredRecord::Found { bytes, .. } => Ok(parse(&record.describe(), &bytes)
                .map_err(ApprovalError::Store)?
                .approvals),
            StoredRecord::Missing | StoredRecord::Unchanged => Ok(Vec::new()),
        }
    }

    /// Adds decisions; an entry already stored is not added twice.
    pub fn add(&self, entries: Vec<StoredApproval>) -> Result<(), ApprovalError> {
        self.change(|file| {
            let mut changed = false;
            for entry in &entries {
                if !file
                    .approvals
                    .iter()
                    .any(|stored| stored.kind == entry.kind && stored.entry == entry.entry)
                {
                    file.approvals.push(entry.clone());
                    changed = true;
                }
            }
            Ok(changed)
        })
    }

    /// Removes the decision `id` and returns it.
    pub fn revoke(&self, id: &str) -> Result<StoredApproval, ApprovalError> {
        let mut removed = None;
        self.change(|file| {
            let position = file
                .approvals
                .iter()
                .position(|stored| stored.id == id)
                .ok_or_else(|| {
                    ApprovalError::Store(format!(
                        "no stored approval `{id}`; `clawcage approvals list` shows the ids"
                    ))
                })?;
            removed = Some(file.approvals.remove(position));
            Ok(true)
        })?;
        removed.ok_or_else(|| ApprovalError::Unknown(id.to_string()))
    }

    /// Runs `edit` on the decisions and writes them back when it says it changed them (read
    /// again and run again when another process wrote meanwhile).
    fn change(
        &self,
        mut edit: impl FnMut(&mut StoreFile) -> Result<bool, ApprovalError>,
    ) -> Result<(), ApprovalError> {
        let record = self.record();
        let place = record.describe();
        let mut refused = None;
        read_change_write(
            record.as_ref(),
            |bytes| parse(&place, bytes),
            |file: &StoreFile| {
                serde_json::to_vec_pretty(&StoreFile {
                    version: 1,
                    approvals: file.approvals.clone(),
                })
                .map_err(|error| error.to_string())
            },
            |file| match edit(file) {
                Ok(changed) => ((), changed),
                Err(error) => {
                    refused = Some(error);
                    ((), false)
                }
            },
        )
        .map_err(ApprovalError::Store)?;
        refused.map_or(Ok(()), Err)
    }
}

/// The decisions of a stored record; `place` names it in errors.
fn parse(place: &str, bytes: &[u8]) -> Result<StoreFile, String> {
    serde_json::from_slice(bytes).map_err(|error| {
        format!("{place} is not a valid approvals file ({error}); fix or remove it")
    })
}
