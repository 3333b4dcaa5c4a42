//! `<state-dir>/approvals.json`: the allow-always decisions a person made, read again at every
//! use and changed under a lock file.

use std::path::{Path, PathBuf};

use clawcage_core::approval::AllowEntry;
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
/// process may have revoked one), changed under a lock file and written atomically, mode 0600.
#[derive(Debug, Clone)]
pub struct ApprovalStore {
    path: PathBuf,
}

impl ApprovalStore {
    /// The store in `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> ApprovalStore {
        ApprovalStore {
            path: crate::StateDir::new(state_dir).approvals(),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every stored decision.
    pub fn list(&self) -> Result<Vec<StoredApproval>, ApprovalError> {
        Ok(self.read()?.approvals)
    }

    /// Adds decisions; an entry already stored is not added twice.
    pub fn add(&self, entries: Vec<StoredApproval>) -> Result<(), ApprovalError> {
        self.change(|file| {
            for entry in entries {
                if !file
                    .approvals
                    .iter()
                    .any(|stored| stored.kind == entry.kind && stored.entry == entry.entry)
                {
                    file.approvals.push(entry);
                }
            }
            Ok(())
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
            Ok(())
        })?;
        removed.ok_or_else(|| ApprovalError::Unknown(id.to_string()))
    }

    fn read(&self) -> Result<StoreFile, ApprovalError> {
        let text = match clawcage_core::files::read_regular_text(
            &self.path,
            MAX_STORE_BYTES,
            clawcage_core::files::Symlinks::Refuse,
        ) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StoreFile {
                    version: 1,
                    approvals: Vec::new(),
                });
            }
            Err(error) => {
                return Err(ApprovalError::Store(format!(
                    "cannot read {}: {error}",
                    self.path.display()
                )));
            }
        };
        serde_json::from_str(&text).map_err(|error| {
            ApprovalError::Store(format!(
                "{} is not a valid approvals file ({error}); fix or remove it",
                self.path.display()
            ))
        })
    }

    fn change(
        &self,
        edit: impl FnOnce(&mut StoreFile) -> Result<(), ApprovalError>,
    ) -> Result<(), ApprovalError> {
        let failed = |what: &str, error: std::io::Error| {
            ApprovalError::Store(format!("cannot {what} {}: {error}", self.path.display()))
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|error| failed("create the directory of", error))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("approvals.lock"))
            .map_err(|error| failed("lock", error))?;
        lock.lock().map_err(|error| failed("lock", error))?;
        let mut file = self.read()?;
        edit(&mut file)?;
        file.version = 1;
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|error| ApprovalError::Store(error.to_string()))?;
        clawcage_core::files::write_atomically(&self.path, &bytes, true)
            .map_err(|error| failed("write", error))
    }
}
