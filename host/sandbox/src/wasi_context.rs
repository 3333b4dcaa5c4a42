//! The one place a WASI context starts, for a tool call, an exec program stage and a program's
//! `--list` alike: everything denied (no sockets, no name lookup, no environment, arguments,
//! streams or directories of the host), to which the caller adds exactly what its grants name —
//! the workspace preopen, the environment variables granted, its own streams.

use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::grants::{FsMode, WorkspaceGrant};

/// A builder with nothing granted. `WasiCtxBuilder::new` already inherits no environment,
/// arguments, streams or directories; sockets and name lookup are denied here explicitly, since
/// the builder's own default allows them (outbound HTTP goes through the network policy).
pub(crate) fn denied() -> WasiCtxBuilder {
    let mut builder = WasiCtxBuilder::new();
    builder
        .allow_blocking_current_thread(true)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    builder
}

/// Preopen `workspace` at its own path, read-only or read-write as granted: the only directory
/// a component or one of its programs ever sees.
pub(crate) fn preopen_workspace(
    builder: &mut WasiCtxBuilder,
    workspace: &WorkspaceGrant,
) -> wasmtime::Result<()> {
    let perms = match workspace.mode() {
        FsMode::ReadOnly => FsPerms::ReadOnly,
        FsMode::ReadWrite => FsPerms::ReadWrite,
    };
    builder.preopened_dir(workspace.path(), workspace.guest_path(), perms)?;
    Ok(())
}

/// Most ancestors of the working directory preopened as `..`, `../..`, ...: deeper relative
/// climbs fail as paths outside the workspace do.
const MAX_PREOPENED_ANCESTORS: usize = 32;

/// Preopen a program's working directory `cwd` (a path inside `workspace`, as the shell names
/// it) as `.`, and each of its ancestors up to the workspace root as `..`, `../..`, and so on.
///
/// A WASI program starts with no current directory: wasi-libc resolves a relative path by the
/// preopen whose name is the longest prefix of it, `.` (the empty prefix) for a plain relative
/// path and `..` for one that climbs. With these names a program of any origin — a p1 module, a
/// p2 component, one that never reads `$PWD` — opens `data.csv` in the shell's directory and
/// `../tools/gen.py` beside it, unchanged, while the workspace's own preopen still serves
/// absolute paths. Nothing beyond the workspace is reachable: each directory is opened beneath
/// the workspace root (symbolic links resolved inside it, never out of it) and handed over by
/// its open descriptor, so a directory swapped for a link in between cannot redirect it. A `cwd`
/// outside the workspace, or one that cannot be opened, adds nothing.
pub(crate) fn preopen_working_directory(
    builder: &mut WasiCtxBuilder,
    workspace: &WorkspaceGrant,
    cwd: &str,
) {
    let Some(components) = components_beneath(workspace.guest_path(), cwd) else {
        return;
    };
    let perms = match workspace.mode() {
        FsMode::ReadOnly => FsPerms::ReadOnly,
        FsMode::ReadWrite => FsPerms::ReadWrite,
    };
    let Ok(root) =
        cap_primitives::fs::open_ambient_dir(workspace.path(), cap_primitives::ambient_authority())
    else {
        return;
    };
    let climbs = components.len().min(MAX_PREOPENED_ANCESTORS);
    for up in 0..=climbs {
        let relative: std::path::PathBuf = components[..components.len() - up].iter().collect();
        let guest_name = if up == 0 {
            ".".to_string()
        } else {
            vec![".."; up].join("/")
        };
        let opened = if relative.as_os_str().is_empty() {
            root.try_clone()
        } else {
            cap_primitives::fs::open_dir(&root, &relative)
        };
        // The directory stays open until the preopen has opened it again by its descriptor.
        let Ok(directory) = opened else {
            return;
        };
        let Some(path) = descriptor_path(&directory) else {
            return;
        };
        if builder.preopened_dir(path, &guest_name, perms).is_err() {
            return;
        }
    }
}

/// The components of `cwd` below `root` (empty for the root itself), or `None` when `cwd` is not
/// a plain path inside `root` (outside it, or naming `..`).
fn components_beneath(root: &str, cwd: &str) -> Option<Vec<String>> {
    let rest = cwd.strip_prefix(root.trim_end_matches('/'))?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let mut components = Vec::new();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." => return None,
            name => components.push(name.to_string()),
        }
    }
    Some(components)
}

/// A path that opens exactly the directory `directory` is open on: its descriptor's entry in
/// `/proc/self/fd`, which no rename or link in the workspace can change.
#[cfg(target_os = "linux")]
fn descriptor_path(directory: &std::fs::File) -> Option<std::path::PathBuf> {
    use std::os::fd::AsRawFd as _;
    Some(std::path::PathBuf::from(format!(
        "/proc/self/fd/{}",
        directory.as_raw_fd()
    )))
}

/// Elsewhere no such name is certain, so the working directory is not preopened (relative
/// paths of programs that do not enter `$PWD` themselves then fail, as paths outside do).
#[cfg(not(target_os = "linux"))]
fn descriptor_path(_directory: &std::fs::File) -> Option<std::path::PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::components_beneath;

    #[test]
    fn a_working_directory_is_named_by_its_components_below_the_workspace() {
        assert_eq!(components_beneath("/w", "/w"), Some(vec![]));
        assert_eq!(components_beneath("/w/", "/w/"), Some(vec![]));
        assert_eq!(
            components_beneath("/w", "/w/src/./lib/"),
            Some(vec!["src".to_string(), "lib".to_string()])
        );
        assert_eq!(components_beneath("/w", "/work"), None);
        assert_eq!(components_beneath("/w", "/elsewhere"), None);
        assert_eq!(components_beneath("/w", "/w/src/../.."), None);
    }
}
