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
