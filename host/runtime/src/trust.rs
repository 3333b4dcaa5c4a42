//! Where grants may come from. Tools can write to a read-write workspace, so a configuration file
//! inside the workspace could have been written by a tool during an earlier run — granting the
//! next run the network, or moving the audit log onto a host file. Such a file is used only when
//! the operator trusted exactly its content: `clawcage trust` records the file's SHA-256 in the
//! state directory, and any later change needs a new `clawcage trust`. No digest protects the
//! state directory (compiled code, trust records, approvals, channel pairings, cron jobs,
//! transcripts, the audit log), the plugins directory or clawcage's user configuration directory
//! (whose `config.toml` a run without `--config` reads from any workspace), so a workspace may
//! not contain them, be them or lie inside them: [`check_workspace`], after resolving links, for
//! every workspace a front end, an ACP session or an external agent is given.

use std::path::{Component, Path, PathBuf};

use clawcage_core::files::{Symlinks, read_regular_file, write_atomically};
use serde::{Deserialize, Serialize};

use crate::config::ConfigSource;

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
            path: clawcage_agent::StateDir::new(state_dir).trusted_configs(),
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

/// `path` as the kernel would reach it: made absolute, its deepest existing ancestor resolved
/// through every link (`canonicalize`), and the rest — which does not exist yet, so holds no
/// link — applied by name (`..` removes the name before it). Two spellings of one directory
/// resolve to the same path.
pub fn resolve(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut missing = Vec::new();
    let mut existing = absolute.as_path();
    loop {
        if let Ok(found) = existing.canonicalize() {
            let mut resolved = found;
            for part in missing.iter().rev() {
                match part {
                    Component::ParentDir => {
                        resolved.pop();
                    }
                    Component::Normal(name) => resolved.push(name),
                    _ => {}
                }
            }
            return resolved;
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                missing.push(last);
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// Whether `path` lies inside `directory` or is it, both [`resolve`]d.
pub fn is_inside(path: &Path, directory: &Path) -> bool {
    resolve(path).starts_with(resolve(directory))
}

/// A directory no workspace may overlap: what it is, what a tool could change there, and how
/// the operator moves it out of the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    /// Its name in a message, e.g. "the state directory".
    pub name: &'static str,
    /// The directory.
    pub path: PathBuf,
    /// What is kept there that decides what a run grants or believes.
    pub holds: &'static str,
    /// What else the operator can do than choose another workspace.
    pub fix: &'static str,
}

/// How a workspace overlaps a protected directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// The workspace is the directory.
    Equal,
    /// The directory lies inside the workspace.
    Contains,
    /// The workspace lies inside the directory.
    Inside,
}

/// A workspace refused because tools writing in it could change a protected directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceConflict {
    /// The workspace, resolved.
    pub workspace: PathBuf,
    /// The directory it overlaps, with `path` resolved.
    pub protected: Protected,
    /// How.
    pub overlap: Overlap,
}

impl std::fmt::Display for WorkspaceConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Protected {
            name,
            path,
            holds,
            fix,
        } = &self.protected;
        let (workspace, directory) = (self.workspace.display(), path.display());
        match self.overlap {
            Overlap::Equal => write!(f, "the workspace {workspace} is {name}"),
            Overlap::Contains => {
                write!(f, "the workspace {workspace} contains {name} {directory}")
            }
            Overlap::Inside => write!(
                f,
                "the workspace {workspace} lies inside {name} {directory}"
            ),
        }?;
        write!(
            f,
            ", which holds {holds}. Tools write in their workspace, so a tool could change what decides the next run's grants or what the model is told. Choose a workspace that neither contains nor lies inside {directory}, or {fix}"
        )
    }
}

impl std::error::Error for WorkspaceConflict {}

/// Refuses a workspace that contains, equals or lies inside one of the `protected`
/// directories, compared after both are [`resolve`]d (so a link or `..` changes nothing). Every
/// place that chooses a workspace — a front end's `--workspace`, an ACP session's `cwd`, an
/// external agent's directory — asks this one function.
pub fn check_workspace(workspace: &Path, protected: &[Protected]) -> Result<(), WorkspaceConflict> {
    let resolved = resolve(workspace);
    for entry in protected {
        let directory = resolve(&entry.path);
        let overlap = if resolved == directory {
            Overlap::Equal
        } else if directory.starts_with(&resolved) {
            Overlap::Contains
        } else if resolved.starts_with(&directory) {
            Overlap::Inside
        } else {
            continue;
        };
        return Err(WorkspaceConflict {
            workspace: resolved,
            protected: Protected {
                path: directory,
                ..entry.clone()
            },
            overlap,
        });
    }
    Ok(())
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
        std::fs::write(
            clawcage_agent::StateDir::new(dir.path()).trusted_configs(),
            "{",
        )
        .unwrap();
        let store = TrustStore::in_state_dir(dir.path());
        let error = store
            .is_trusted(&source(&dir.path().join("c.toml"), "aa"))
            .unwrap_err();
        assert!(error.to_string().contains("remove it"), "{error}");
    }

    fn protected(path: &Path) -> Vec<Protected> {
        vec![Protected {
            name: "the state directory",
            path: path.to_path_buf(),
            holds: "the pairings",
            fix: "pass --state-dir",
        }]
    }

    fn overlap(workspace: &Path, directory: &Path) -> Option<Overlap> {
        check_workspace(workspace, &protected(directory))
            .err()
            .map(|conflict| conflict.overlap)
    }

    #[test]
    fn a_workspace_may_neither_be_contain_nor_lie_inside_a_protected_directory() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(state.join("channels")).unwrap();
        std::fs::create_dir_all(dir.path().join("state2")).unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        assert_eq!(overlap(&state, &state), Some(Overlap::Equal));
        assert_eq!(
            overlap(&state.join("channels"), &state),
            Some(Overlap::Inside)
        );
        assert_eq!(overlap(dir.path(), &state), Some(Overlap::Contains));
        // A protected directory that does not exist yet is judged where it will be.
        assert_eq!(
            overlap(dir.path(), &dir.path().join("ws/not/yet")),
            Some(Overlap::Contains)
        );
        // Siblings, also with a common prefix, are apart.
        assert_eq!(overlap(&dir.path().join("state2"), &state), None);
        assert_eq!(overlap(&dir.path().join("ws"), &state), None);
        assert_eq!(overlap(&state, &dir.path().join("state2")), None);
        // Another spelling of the same place is the same place.
        assert_eq!(
            overlap(&dir.path().join("ws/../state/./channels"), &state),
            Some(Overlap::Inside)
        );
        assert_eq!(
            overlap(&state, &dir.path().join("ws/missing/../../state")),
            Some(Overlap::Equal)
        );
        let conflict = check_workspace(&state.join("channels"), &protected(&state)).unwrap_err();
        let message = conflict.to_string();
        assert!(
            message.contains("lies inside the state directory")
                && message.contains("the pairings")
                && message.contains("pass --state-dir"),
            "{message}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn links_are_resolved_on_both_sides() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(state.join("sessions")).unwrap();
        std::fs::create_dir_all(dir.path().join("projects")).unwrap();
        // A workspace reached through a link into the state directory.
        let into = dir.path().join("projects/innocent");
        std::os::unix::fs::symlink(state.join("sessions"), &into).unwrap();
        assert_eq!(overlap(&into, &state), Some(Overlap::Inside));
        // A state directory named through a link that points into the workspace.
        let workspace = dir.path().join("projects");
        let real = workspace.join("hidden-state");
        std::fs::create_dir(&real).unwrap();
        let named = dir.path().join("state-link");
        std::os::unix::fs::symlink(&real, &named).unwrap();
        assert_eq!(overlap(&workspace, &named), Some(Overlap::Contains));
        // A link to the state directory itself.
        let same = dir.path().join("same");
        std::os::unix::fs::symlink(&state, &same).unwrap();
        assert_eq!(overlap(&same, &state), Some(Overlap::Equal));
    }

    #[test]
    fn a_relative_directory_that_does_not_exist_yet_is_judged_from_the_current_directory() {
        let current = std::env::current_dir().unwrap();
        let name = "clawcage-not-created-state-dir";
        assert_eq!(resolve(Path::new(name)), resolve(&current).join(name));
        assert_eq!(overlap(&current, Path::new(name)), Some(Overlap::Contains));
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
