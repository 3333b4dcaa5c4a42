//! The workspace: the one directory the operator granted to the tools.
//!
//! The host's convention: it preopens the workspace inside the guest at the
//! same absolute path it has on the host, sets [`WORKSPACE_ENV`] to that path
//! and [`MODE_ENV`] to `rw` or `ro`. Before each call the SDK makes the
//! workspace the current directory ([`enter`]), so wasi-libc resolves
//! relative paths inside it.
//!
//! The sandbox is what enforces the boundary: nothing else is preopened, and
//! the host refuses `..` escapes and symlinks that point out. The checks here
//! exist to give the model a clear message instead of a bare errno:
//! [`resolve`] refuses a path that lies outside the workspace, and
//! [`io_error`] explains a failed file operation.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::ToolError;

/// Environment variable holding the workspace's absolute path.
pub const WORKSPACE_ENV: &str = "CLAWCAGE_WORKSPACE";

/// Environment variable holding the workspace's mode: `rw`, `ro`, or `ro-ask` (read-only, each
/// write asked of the operator by the host).
pub const MODE_ENV: &str = "CLAWCAGE_WORKSPACE_MODE";

/// wasi-libc's errno values (`libc` crate, `src/wasi/mod.rs`; they differ from
/// Linux's). Only meaningful for errors raised inside a wasm32-wasip2 guest.
mod errno {
    /// Permission denied by the host file system (mode bits).
    pub const EACCES: i32 = 2;
    /// Operation not permitted: what wasmtime reports for a write to a
    /// read-only preopen and for a path or symlink leading outside a preopen.
    pub const EPERM: i32 = 63;
    /// Read-only file system.
    pub const EROFS: i32 = 69;
    /// No preopen covers the path (wasi-libc found no capability for it).
    pub const ENOTCAPABLE: i32 = 76;
}

/// Whether the tools may change the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Files may be read and written.
    ReadWrite,
    /// Files may only be read.
    ReadOnly,
    /// Read-only, but the host asks the operator about each write: a tool tries the write and
    /// the host answers it (refused unless approved).
    AskToWrite,
}

/// What a file operation was trying to do, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading a file or listing a directory.
    Read,
    /// Creating, changing, renaming or removing something.
    Write,
}

/// The workspace's absolute path, lexically normalised; `None` when the host
/// granted no workspace (the variable is unset, empty or not absolute).
pub fn root() -> Option<PathBuf> {
    let raw = std::env::var_os(WORKSPACE_ENV)?;
    let path = Path::new(&raw);
    path.is_absolute().then(|| normalize(path))
}

/// The workspace's mode from [`MODE_ENV`]: `rw` is read-write, absent means
/// read-write (the sandbox enforces the real permission anyway), `ro-ask` is
/// read-only with writes asked, and any other value is read-only.
pub fn mode() -> Mode {
    match std::env::var(MODE_ENV) {
        Err(std::env::VarError::NotPresent) => Mode::ReadWrite,
        Ok(v) if v.trim().eq_ignore_ascii_case("rw") => Mode::ReadWrite,
        Ok(v) if v.trim().eq_ignore_ascii_case("ro-ask") => Mode::AskToWrite,
        _ => Mode::ReadOnly,
    }
}

/// Make the workspace the current directory, so relative paths resolve
/// inside it. Does nothing when no workspace is granted. The SDK calls this
/// before every call; tools need not.
pub fn enter() -> Result<(), ToolError> {
    let Some(root) = root() else {
        return Ok(());
    };
    std::env::set_current_dir(&root).map_err(|e| {
        ToolError::Failed(format!(
            "cannot enter the workspace {}: {e}; the host did not give this tool access to it",
            root.display()
        ))
    })
}

/// The absolute, normalised path that `path` names inside the workspace.
///
/// A relative path resolves from the workspace; an absolute path is taken as
/// it is. `.` and `..` are removed lexically. A result outside the workspace
/// is refused with [`ToolError::Denied`]; with no workspace granted every
/// path is refused.
pub fn resolve(path: &str) -> Result<PathBuf, ToolError> {
    match root() {
        Some(root) => resolve_in(&root, path),
        None => Err(ToolError::Denied(format!(
            "cannot reach '{path}': no workspace was granted to this tool, so it can reach no files"
        ))),
    }
}

/// [`resolve`] against an explicit workspace `root` (absolute and
/// normalised).
pub fn resolve_in(root: &Path, path: &str) -> Result<PathBuf, ToolError> {
    if path.is_empty() {
        return Err(ToolError::InvalidArgs(
            "the path is empty; use \".\" for the workspace itself".to_string(),
        ));
    }
    if path.contains('\0') {
        return Err(ToolError::InvalidArgs(
            "the path contains a NUL character".to_string(),
        ));
    }
    let given = Path::new(path);
    let full = if given.is_absolute() {
        normalize(given)
    } else {
        normalize(&root.join(given))
    };
    if full.starts_with(root) {
        Ok(full)
    } else {
        Err(ToolError::Denied(format!(
            "'{path}' is outside the workspace ({}); tools can reach only files inside the workspace",
            root.display()
        )))
    }
}

/// Remove `.` and `..` components lexically, without touching the file
/// system. `..` at the root stays at the root; leading `..` of a relative
/// path are kept.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(".."),
            },
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// Refuse a write up front when the workspace is read-only, with the message
/// [`io_error`] would give after the sandbox refused it.
pub fn ensure_writable(path: &str) -> Result<(), ToolError> {
    match mode() {
        Mode::ReadWrite | Mode::AskToWrite => Ok(()),
        Mode::ReadOnly => Err(read_only(path)),
    }
}

fn read_only(path: &str) -> ToolError {
    ToolError::Denied(format!(
        "the workspace is read-only for this tool: cannot write {path}"
    ))
}

/// Turn a failed file operation on `path` (as the model wrote it) into a
/// [`ToolError`] the model can act on:
///
/// - not found: `Failed("no such file or directory: PATH")`;
/// - refused while writing a read-only workspace: `Denied("the workspace is
///   read-only for this tool: cannot write PATH")`;
/// - refused by the host's file permissions: `Denied("permission denied: ...")`;
/// - other refusals (a symlink or path leading out of the workspace):
///   `Denied("PATH leads outside the workspace (a symlink pointing out?); refused")`;
/// - anything else: `Failed` with the error text and the path.
pub fn io_error(err: &io::Error, path: &str, access: Access) -> ToolError {
    io_error_with_mode(err, path, access, mode())
}

/// [`io_error`] for an explicit workspace `mode`.
pub fn io_error_with_mode(err: &io::Error, path: &str, access: Access, mode: Mode) -> ToolError {
    // Raw codes are wasi-libc's only inside the guest; natively they mean
    // something else, so they are ignored there.
    let raw = if cfg!(target_os = "wasi") {
        err.raw_os_error()
    } else {
        None
    };
    classify(err.kind(), raw, &err.to_string(), path, access, mode)
}

fn classify(
    kind: io::ErrorKind,
    wasi_errno: Option<i32>,
    text: &str,
    path: &str,
    access: Access,
    mode: Mode,
) -> ToolError {
    use io::ErrorKind as K;

    let refused = kind == K::PermissionDenied
        || kind == K::ReadOnlyFilesystem
        || matches!(
            wasi_errno,
            Some(errno::EACCES | errno::EPERM | errno::EROFS | errno::ENOTCAPABLE)
        );
    if kind == K::NotFound {
        ToolError::Failed(format!("no such file or directory: {path}"))
    } else if refused {
        if kind == K::ReadOnlyFilesystem
            || wasi_errno == Some(errno::EROFS)
            || (access == Access::Write && mode == Mode::ReadOnly)
        {
            read_only(path)
        } else if access == Access::Write && mode == Mode::AskToWrite {
            ToolError::Denied(format!(
                "the workspace is read-only for this tool and writing {path} was not approved"
            ))
        } else if wasi_errno == Some(errno::EACCES) {
            ToolError::Denied(format!(
                "permission denied: the host's file permissions do not allow this on {path}"
            ))
        } else {
            ToolError::Denied(format!(
                "{path} leads outside the workspace (a symlink pointing out?); refused"
            ))
        }
    } else if kind == K::IsADirectory {
        ToolError::Failed(format!("{path} is a directory, not a file"))
    } else if kind == K::NotADirectory {
        ToolError::Failed(format!(
            "{path}: a part of the path is a file where a directory is needed"
        ))
    } else {
        let verb = match access {
            Access::Read => "read",
            Access::Write => "write",
        };
        ToolError::Failed(format!("cannot {verb} {path}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn normalize_removes_dots() {
        assert_eq!(normalize(Path::new("/tmp/ws/./a/../b")), p("/tmp/ws/b"));
        assert_eq!(normalize(Path::new("/../../etc")), p("/etc"));
        assert_eq!(normalize(Path::new("/tmp/ws/")), p("/tmp/ws"));
        assert_eq!(normalize(Path::new("a/../../b")), p("../b"));
        assert_eq!(normalize(Path::new("./")), p("."));
        assert_eq!(normalize(Path::new("/")), p("/"));
    }

    #[test]
    fn resolve_inside() {
        let root = p("/tmp/ws");
        assert_eq!(resolve_in(&root, "a/b.txt"), Ok(p("/tmp/ws/a/b.txt")));
        assert_eq!(resolve_in(&root, "."), Ok(p("/tmp/ws")));
        assert_eq!(resolve_in(&root, "./a/../c"), Ok(p("/tmp/ws/c")));
        assert_eq!(resolve_in(&root, "/tmp/ws/x"), Ok(p("/tmp/ws/x")));
        assert_eq!(resolve_in(&root, "/tmp/ws/../ws/x"), Ok(p("/tmp/ws/x")));
        assert_eq!(resolve_in(&root, "/tmp/ws"), Ok(p("/tmp/ws")));
    }

    #[test]
    fn resolve_outside_is_denied() {
        let root = p("/tmp/ws");
        assert_eq!(
            resolve_in(&root, "/etc/passwd"),
            Err(ToolError::Denied(
                "'/etc/passwd' is outside the workspace (/tmp/ws); tools can reach only files inside the workspace"
                    .to_string()
            ))
        );
        assert!(matches!(
            resolve_in(&root, "../x"),
            Err(ToolError::Denied(_))
        ));
        assert!(matches!(
            resolve_in(&root, "a/../../x"),
            Err(ToolError::Denied(_))
        ));
        // A sibling whose name merely starts with the workspace's name.
        assert!(matches!(
            resolve_in(&root, "/tmp/wsx/a"),
            Err(ToolError::Denied(_))
        ));
        assert!(matches!(
            resolve_in(&root, "../ws2"),
            Err(ToolError::Denied(_))
        ));
    }

    #[test]
    fn resolve_bad_input() {
        let root = p("/tmp/ws");
        assert!(matches!(
            resolve_in(&root, ""),
            Err(ToolError::InvalidArgs(_))
        ));
        assert!(matches!(
            resolve_in(&root, "a\0b"),
            Err(ToolError::InvalidArgs(_))
        ));
    }

    #[test]
    fn error_mapping() {
        use io::ErrorKind as K;
        let rw = Mode::ReadWrite;
        let ro = Mode::ReadOnly;
        let r = Access::Read;
        let w = Access::Write;
        assert_eq!(
            classify(K::NotFound, Some(44), "", "a.txt", r, rw),
            ToolError::Failed("no such file or directory: a.txt".to_string())
        );
        assert_eq!(
            classify(K::PermissionDenied, Some(errno::EPERM), "", "a.txt", w, ro),
            ToolError::Denied(
                "the workspace is read-only for this tool: cannot write a.txt".to_string()
            )
        );
        // Asked and refused: the host adds the operator's reason.
        assert_eq!(
            classify(
                K::PermissionDenied,
                Some(errno::EPERM),
                "",
                "a.txt",
                w,
                Mode::AskToWrite
            ),
            ToolError::Denied(
                "the workspace is read-only for this tool and writing a.txt was not approved"
                    .to_string()
            )
        );
        assert_eq!(
            classify(K::Other, Some(errno::EROFS), "", "a.txt", w, rw),
            ToolError::Denied(
                "the workspace is read-only for this tool: cannot write a.txt".to_string()
            )
        );
        assert_eq!(
            classify(K::PermissionDenied, Some(errno::EPERM), "", "link", r, rw),
            ToolError::Denied(
                "link leads outside the workspace (a symlink pointing out?); refused".to_string()
            )
        );
        assert_eq!(
            classify(K::Other, Some(errno::ENOTCAPABLE), "", "link", r, ro),
            ToolError::Denied(
                "link leads outside the workspace (a symlink pointing out?); refused".to_string()
            )
        );
        assert!(matches!(
            classify(K::PermissionDenied, Some(errno::EACCES), "", "x", r, rw),
            ToolError::Denied(m) if m.starts_with("permission denied")
        ));
        assert_eq!(
            classify(K::Other, Some(51), "No space left on device", "x", w, rw),
            ToolError::Failed("cannot write x: No space left on device".to_string())
        );
    }
}
