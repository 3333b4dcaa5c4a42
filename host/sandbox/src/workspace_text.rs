//! The exact text of a workspace file, read on the host for a client that must get the file as
//! it is (an external ACP agent's `fs/read_text_file`, which it may write back whole): the
//! `read_file` tool's answer is written for a model and is cut, noted and lossily decoded. The
//! path is resolved beneath the workspace by cap-std, as a guest's path is (no `..` or symbolic
//! link out of it), the file is opened without blocking and must be a regular file, its text
//! must be UTF-8, and what is returned is bounded; a bigger file is refused whole, never cut.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;

use crate::asked_writes::lexical_names;
use crate::grants::WorkspaceGrant;

/// Which lines to read: from `first_line` (counted from 1), at most `limit` of them (all when
/// `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    /// The first line returned, counted from 1.
    pub first_line: u64,
    /// The most lines returned; `None` reads to the end.
    pub limit: Option<u64>,
}

impl LineRange {
    /// The whole file.
    pub const ALL: LineRange = LineRange {
        first_line: 1,
        limit: None,
    };
}

/// Why a workspace file's text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceTextError {
    /// The path leaves the workspace by name or through a symbolic link.
    #[error("{path} is outside the workspace {workspace}; only files inside it can be read")]
    Outside {
        /// The path as given.
        path: String,
        /// The workspace's directory.
        workspace: PathBuf,
    },
    /// A directory, FIFO, socket or device.
    #[error("{0} is not a regular file; only regular files can be read as text")]
    NotAFile(String),
    /// The selected bytes are not UTF-8.
    #[error("{0} is not UTF-8 text; it cannot be read as text")]
    NotText(String),
    /// The selected lines are more than the bound.
    #[error(
        "the text asked for from {path} is larger than {max_bytes} bytes; ask for fewer lines with `line` and `limit`"
    )]
    TooLarge {
        /// The path as given.
        path: String,
        /// The bound.
        max_bytes: usize,
    },
    /// The path or the range is malformed.
    #[error("{0}")]
    Invalid(String),
    /// What the operating system said.
    #[error("{path}: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The error.
        source: io::Error,
    },
}

impl WorkspaceGrant {
    /// The text of `lines` of the file at `path` (absolute, or relative to the workspace), at most
    /// `max_bytes` of it, line terminators included; lines past the end give nothing.
    pub fn read_text(
        &self,
        path: &str,
        lines: LineRange,
        max_bytes: usize,
    ) -> Result<String, WorkspaceTextError> {
        if lines.first_line == 0 {
            return Err(WorkspaceTextError::Invalid(
                "`line` counts from 1".to_string(),
            ));
        }
        if lines.limit == Some(0) {
            return Err(WorkspaceTextError::Invalid(
                "`limit` must be at least 1".to_string(),
            ));
        }
        let relative = self.relative(path)?;
        let io_error = |source: io::Error| match source.kind() {
            // cap-std's word for a path whose resolution would leave the directory.
            io::ErrorKind::PermissionDenied if is_escape(&source) => WorkspaceTextError::Outside {
                path: path.to_string(),
                workspace: self.path().to_path_buf(),
            },
            _ => WorkspaceTextError::Io {
                path: path.to_string(),
                source,
            },
        };
        let directory =
            cap_primitives::fs::open_ambient_dir(self.path(), cap_primitives::ambient_authority())
                .map_err(io_error)?;
        let mut options = cap_primitives::fs::OpenOptions::new();
        options.read(true);
        options._cap_fs_ext_follow(cap_primitives::fs::FollowSymlinks::Yes);
        // A FIFO would wait for a writer: opened without blocking, then judged.
        options._cap_fs_ext_nonblock(true);
        let file = cap_primitives::fs::open(&directory, &relative, &options).map_err(io_error)?;
        if !file.metadata().map_err(io_error)?.is_file() {
            return Err(WorkspaceTextError::NotAFile(path.to_string()));
        }
        let bytes = select_lines(file, lines, max_bytes)
            .map_err(io_error)?
            .ok_or_else(|| WorkspaceTextError::TooLarge {
                path: path.to_string(),
                max_bytes,
            })?;
        String::from_utf8(bytes).map_err(|_| WorkspaceTextError::NotText(path.to_string()))
    }

    /// `path` relative to the workspace; refused when it leaves.
    fn relative(&self, path: &str) -> Result<PathBuf, WorkspaceTextError> {
        if path.is_empty() || path.contains('\0') {
            return Err(WorkspaceTextError::Invalid(format!(
                "{path:?} is not a file's path"
            )));
        }
        let outside = || WorkspaceTextError::Outside {
            path: path.to_string(),
            workspace: self.path().to_path_buf(),
        };
        // `.` and `..` taken by name, as an asked write's path is; an absolute path must then
        // begin with the workspace's own names.
        let names = match path.strip_prefix('/') {
            Some(from_root) => {
                let names = lexical_names(from_root).ok_or_else(outside)?;
                let workspace =
                    lexical_names(self.guest_path().trim_start_matches('/')).ok_or_else(outside)?;
                if !names.starts_with(&workspace) {
                    return Err(outside());
                }
                names[workspace.len()..].to_vec()
            }
            None => lexical_names(path).ok_or_else(outside)?,
        };
        if names.is_empty() {
            return Err(WorkspaceTextError::NotAFile(path.to_string()));
        }
        Ok(names.iter().collect())
    }
}

/// Whether cap-std refused a path for leaving its directory (its only word for that is the
/// message of its `escape_attempt` error).
fn is_escape(error: &io::Error) -> bool {
    error
        .to_string()
        .contains("a path led outside of the filesystem")
}

/// The bytes of `lines` of `file`, or `None` when they are more than `max_bytes`. Memory stays
/// bounded by `max_bytes` plus the read buffer, however long a skipped line is.
fn select_lines(file: File, lines: LineRange, max_bytes: usize) -> io::Result<Option<Vec<u8>>> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut selected = Vec::new();
    let mut line_number: u64 = 1;
    let past_last = lines
        .limit
        .map(|limit| lines.first_line.saturating_add(limit));
    loop {
        if past_last.is_some_and(|past| line_number >= past) {
            break;
        }
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            break;
        }
        let (length, ends_line) = match buffer.iter().position(|byte| *byte == b'\n') {
            Some(index) => (index + 1, true),
            None => (buffer.len(), false),
        };
        if line_number >= lines.first_line {
            if selected.len() + length > max_bytes {
                return Ok(None);
            }
            selected.extend_from_slice(&buffer[..length]);
        }
        reader.consume(length);
        if ends_line {
            line_number += 1;
        }
    }
    Ok(Some(selected))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::FsMode;

    fn workspace() -> (tempfile::TempDir, WorkspaceGrant) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ws")).unwrap();
        let grant = WorkspaceGrant::new(root.path().join("ws"), FsMode::ReadOnly).unwrap();
        (root, grant)
    }

    #[test]
    fn the_text_comes_back_exactly() {
        let (_root, grant) = workspace();
        let text = "one\ntwo\r\n\nthree without end";
        std::fs::write(grant.path().join("a.txt"), text).unwrap();
        std::fs::write(grant.path().join("empty.txt"), "").unwrap();
        let all = |path: &str| grant.read_text(path, LineRange::ALL, 1 << 20).unwrap();
        assert_eq!(all("a.txt"), text);
        assert_eq!(all("./a.txt"), text);
        assert_eq!(all(&grant.path().join("a.txt").display().to_string()), text);
        assert_eq!(all("empty.txt"), "");
        let range = |first_line, limit| {
            grant
                .read_text("a.txt", LineRange { first_line, limit }, 1 << 20)
                .unwrap()
        };
        assert_eq!(range(2, Some(2)), "two\r\n\n");
        assert_eq!(range(4, None), "three without end");
        assert_eq!(range(1, Some(1)), "one\n");
        assert_eq!(range(9, None), "");
    }

    #[test]
    fn a_large_file_is_refused_whole_and_a_range_of_it_reads() {
        let (_root, grant) = workspace();
        let line = "x".repeat(99) + "\n";
        std::fs::write(grant.path().join("big.txt"), line.repeat(1000)).unwrap();
        let error = grant
            .read_text("big.txt", LineRange::ALL, 10_000)
            .unwrap_err();
        assert!(
            matches!(error, WorkspaceTextError::TooLarge { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("`line` and `limit`"), "{error}");
        let range = LineRange {
            first_line: 500,
            limit: Some(100),
        };
        assert_eq!(
            grant.read_text("big.txt", range, 10_000).unwrap(),
            line.repeat(100)
        );
        // One line longer than the bound, skipped, costs nothing; selected, it is refused.
        std::fs::write(
            grant.path().join("long.txt"),
            "y".repeat(1 << 20) + "\nshort\n",
        )
        .unwrap();
        let second = LineRange {
            first_line: 2,
            limit: None,
        };
        assert_eq!(grant.read_text("long.txt", second, 100).unwrap(), "short\n");
        assert!(grant.read_text("long.txt", LineRange::ALL, 100).is_err());
    }

    #[test]
    fn nothing_outside_the_workspace_is_read() {
        let (root, grant) = workspace();
        std::fs::write(root.path().join("secret.txt"), "outside").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.txt"), grant.path().join("link"))
            .unwrap();
        std::os::unix::fs::symlink(root.path(), grant.path().join("up")).unwrap();
        let outside = root.path().join("secret.txt").display().to_string();
        let dotted = format!("{}/../secret.txt", grant.path().display());
        for path in [
            "../secret.txt",
            "a/../../secret.txt",
            outside.as_str(),
            dotted.as_str(),
            "link",
            "up/secret.txt",
        ] {
            let error = grant.read_text(path, LineRange::ALL, 1 << 20).unwrap_err();
            assert!(
                matches!(error, WorkspaceTextError::Outside { .. }),
                "{path}: {error}"
            );
        }
    }

    #[test]
    fn special_files_directories_and_other_encodings_are_refused() {
        let (_root, grant) = workspace();
        std::fs::create_dir(grant.path().join("dir")).unwrap();
        std::fs::write(grant.path().join("latin1.txt"), b"caf\xe9\n").unwrap();
        let fifo = grant.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let read = |path: &str| grant.read_text(path, LineRange::ALL, 1 << 20).unwrap_err();
        assert!(matches!(read("dir"), WorkspaceTextError::NotAFile(_)));
        assert!(matches!(read("."), WorkspaceTextError::NotAFile(_)));
        // Returns at once: the FIFO is opened without waiting for a writer.
        assert!(matches!(read("pipe"), WorkspaceTextError::NotAFile(_)));
        assert!(matches!(read("latin1.txt"), WorkspaceTextError::NotText(_)));
        assert!(matches!(read("missing.txt"), WorkspaceTextError::Io { .. }));
        assert!(matches!(read(""), WorkspaceTextError::Invalid(_)));
        let zero = LineRange {
            first_line: 0,
            limit: None,
        };
        assert!(grant.read_text("latin1.txt", zero, 10).is_err());
    }
}
