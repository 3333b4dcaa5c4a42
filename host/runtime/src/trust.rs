//! Where grants may come from. Tools can write to a read-write workspace, so a configuration file
//! inside the workspace could have been written by a tool during an earlier run — granting the
//! next run the network, or moving the audit log onto a host file. Such a file is used only when
//! the operator trusted exactly its content: `clawcage trust` records the file's SHA-256 in the
//! state directory, and any later change needs a new `clawcage trust`. The state directory itself
//! (compiled code, trust records, cron jobs, transcripts, the audit log) and the plugins directory
//! must lie outside the workspace altogether, since no digest protects them.

use std::path::{Path, PathBuf};

use clawcage_core::files::{Symlinks, read_regular_file, write_atomically};
use serde::{Deserialize, Serialize};

use crate::config::ConfigSource;

/// The trust records' file name in the state directory.
pub const TRUST_FILE: &str = "trusted-configs.json";

/// The largest trust file read.
const MAX_TRUST_BYTES: u64 = 4 << 20;

/// The trusted configuration files of one state directory.
#[derive(Debug, Clone)]
pub struct TrustStore {
    path: PathBuf,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    trusted: Vec<TrustRecord>,
}

/// One trusted file: its path and the digest of the content that was trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustRecord {
    path: PathBuf,
    sha256: String,
}

impl TrustStore {
    /// The records of the state directory `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(TRUST_FILE),
        }
    }

    /// The file the records are kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `source` is trusted as it is now.
    pub fn is_trusted(&self, source: &ConfigSource) -> std::io::Result<bool> {
        Ok(self.read()?.trusted.iter().any(|record| {
            record.path == source.path && record.sha256.eq_ignore_ascii_case(&source.sha256)
        }))
    }

    /// Trusts `source` as it is now, replacing what was trusted for its path before.
    pub fn trust(&self, source: &ConfigSource) -> std::io::Result<()> {
        // Several clawcage processes may trust at once: the read-change-write runs under a lock.
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path.with_extension("lock"))?;
        lock.lock()?;
        let mut file = self.read()?;
        file.trusted.retain(|record| record.path != source.path);
        file.trusted.push(TrustRecord {
            path: source.path.clone(),
            sha256: source.sha256.clone(),
        });
        let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        write_atomically(&self.path, &json, true)
    }

    fn read(&self) -> std::io::Result<TrustFile> {
        match read_regular_file(&self.path, MAX_TRUST_BYTES, Symlinks::Refuse) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} is damaged ({error}); remove it and trust your configuration again",
                        self.path.display()
                    ),
                )
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(TrustFile::default()),
            Err(error) => Err(error),
        }
    }
}

/// Whether `path` lies inside `directory` (both canonical, or made so when they exist).
pub fn is_inside(path: &Path, directory: &Path) -> bool {
    let resolve = |path: &Path| {
        path.canonicalize().unwrap_or_else(|_| {
            // A path that does not exist yet: resolve its deepest existing ancestor.
            let mut missing = Vec::new();
            let mut existing = path;
            while let Some(parent) = existing.parent() {
                if let Some(name) = existing.file_name() {
                    missing.push(name.to_os_string());
                }
                existing = parent;
                if let Ok(found) = existing.canonicalize() {
                    let mut resolved = found;
                    for name in missing.iter().rev() {
                        resolved.push(name);
                    }
                    return resolved;
                }
            }
            path.to_path_buf()
        })
    };
    resolve(path).starts_with(resolve(directory))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(path: &Path, sha256: &str) -> ConfigSource {
        ConfigSource {
            path: path.to_path_buf(),
            sha256: sha256.to_string(),
            explicit: false,
        }
    }

    #[test]
    fn a_trusted_file_stays_trusted_until_its_content_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrustStore::in_state_dir(&dir.path().join("state"));
        let config = dir.path().join("clawcage.toml");
        assert!(!store.is_trusted(&source(&config, "aa")).unwrap());
        store.trust(&source(&config, "aa")).unwrap();
        assert!(store.is_trusted(&source(&config, "aa")).unwrap());
        assert!(!store.is_trusted(&source(&config, "bb")).unwrap());
        assert!(
            !store
                .is_trusted(&source(&dir.path().join("other.toml"), "aa"))
                .unwrap()
        );
        store.trust(&source(&config, "bb")).unwrap();
        assert!(!store.is_trusted(&source(&config, "aa")).unwrap());
        assert!(store.is_trusted(&source(&config, "bb")).unwrap());
    }

    #[test]
    fn a_damaged_trust_file_is_an_error_that_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TRUST_FILE), "{").unwrap();
        let store = TrustStore::in_state_dir(dir.path());
        let error = store
            .is_trusted(&source(&dir.path().join("c.toml"), "aa"))
            .unwrap_err();
        assert!(error.to_string().contains("remove it"), "{error}");
    }

    #[test]
    fn inside_resolves_paths_that_do_not_exist_yet() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        assert!(is_inside(&workspace.join("a/b/state"), &workspace));
        assert!(is_inside(&workspace, &workspace));
        assert!(!is_inside(&dir.path().join("state"), &workspace));
        assert!(!is_inside(&dir.path().join("ws-other"), &workspace));
        #[cfg(unix)]
        {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&workspace, &link).unwrap();
            assert!(is_inside(&link.join("state"), &workspace));
        }
    }
}
