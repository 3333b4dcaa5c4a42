//! Redirections: each file a pipeline reads or writes, opened beneath the workspace's directory
//! handle (cap-std, never a joined path), refused when special (a FIFO, socket or device) or
//! outside the grant, and under a read-only workspace asked of a person first.

use super::*;

/// A file opened for a redirection.
pub(super) enum Opened {
    Read(std::fs::File),
    Write(FileSink),
}

/// Opens `request` inside the workspace: its path must lie under the workspace's guest path; the
/// rest is opened relative to the workspace directory handle, which refuses `..` and symlinks
/// that lead out.
pub(super) fn open_redirect(
    workspace: Option<&WorkspaceGrant>,
    directory: Option<&std::fs::File>,
    request: &FileOpen,
    budget: &Arc<WriteBudget>,
    approved: Option<&(std::fs::File, String)>,
) -> Result<Opened, String> {
    let shown = &request.path;
    let (Some(workspace), Some(directory)) = (workspace, directory) else {
        return Err(format!(
            "{shown}: no files are reachable (no workspace granted)"
        ));
    };
    let path = Path::new(&request.path);
    let Ok(relative) = path.strip_prefix(workspace.guest_path()) else {
        return Err(format!(
            "{shown}: outside the workspace ({}); only files inside it can be read or written",
            workspace.guest_path()
        ));
    };
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    // An approved write opens exactly the file asked about: its bound directory and name.
    let (directory, relative) = match approved {
        Some((parent, name)) => (parent, Path::new(name.as_str())),
        None => (directory, relative),
    };
    let writing = request.mode != OpenMode::Read;
    if writing && workspace.mode() == FsMode::ReadOnly && approved.is_none() {
        return Err(format!(
            "{shown}: the workspace is read-only for this tool; nothing can be written"
        ));
    }
    let mut options = cap_primitives::fs::OpenOptions::new();
    match request.mode {
        OpenMode::Read => options.read(true),
        OpenMode::Truncate => options.write(true).create(true).truncate(true),
        OpenMode::Append => options.append(true).create(true),
    };
    // Non-blocking, so that a FIFO (whose plain open waits for its other end) opens or fails at
    // once and is then refused below by its type; there is no gap between a check and the open.
    // For a regular file the flag changes nothing. (`_cap_fs_ext_nonblock` is how cap-fs-ext's
    // `nonblock` sets O_NONBLOCK; cap-primitives has no other setter and this crate no libc.)
    options._cap_fs_ext_nonblock(true);
    if approved.is_some() {
        options._cap_fs_ext_follow(cap_primitives::fs::FollowSymlinks::No);
    }
    let not_regular = |kind: &str| {
        format!("{shown}: not a regular file ({kind}); redirections work with regular files only")
    };
    let file = cap_primitives::fs::open(directory, relative, &options).map_err(|error| {
        // Opening a FIFO without a reader for writing fails (ENXIO): say what it is.
        let found =
            cap_primitives::fs::stat(directory, relative, cap_primitives::fs::FollowSymlinks::Yes);
        match found
            .ok()
            .and_then(|metadata| special_kind(&metadata.file_type()))
        {
            Some(kind) if error.kind() != std::io::ErrorKind::NotFound => not_regular(kind),
            _ => describe_open_error(shown, &error),
        }
    })?;
    let metadata = cap_primitives::fs::Metadata::from_file(&file)
        .map_err(|error| describe_open_error(shown, &error))?;
    if metadata.is_dir() {
        return Err(format!("{shown}: Is a directory"));
    }
    if let Some(kind) = special_kind(&metadata.file_type()) {
        return Err(not_regular(kind));
    }
    Ok(if writing {
        Opened::Write(FileSink {
            file: Arc::new(Mutex::new(file)),
            budget: budget.clone(),
        })
    } else {
        Opened::Read(file)
    })
}

/// For a redirection that writes under a read-only workspace whose writes are asked: the
/// operator's decision, and on a yes the file's directory (opened beneath `directory`) and
/// name, which the redirection then opens without following a last link, so what is written is
/// what was asked about. `None` when nothing needs asking (reading, a writable workspace, or no
/// asker: then `open_redirect` refuses as before).
pub(super) async fn ask_to_redirect(
    exec: &ExecContext,
    directory: Option<&std::fs::File>,
    request: &FileOpen,
) -> Result<Option<(std::fs::File, String)>, String> {
    let (Some(writes), Some(workspace), Some(directory)) =
        (&exec.writes, &exec.workspace, directory)
    else {
        return Ok(None);
    };
    if request.mode == OpenMode::Read || workspace.mode() == FsMode::ReadWrite {
        return Ok(None);
    }
    let shown = &request.path;
    let Some(relative) = Path::new(shown)
        .strip_prefix(workspace.guest_path())
        .ok()
        .and_then(Path::to_str)
    else {
        return Err(format!(
            "{shown}: outside the workspace ({}); only files inside it can be written",
            workspace.guest_path()
        ));
    };
    let (parent, name, target) =
        crate::asked_writes::bind_for_change(writes.root(), directory, relative)
            .map_err(|why| format!("{shown}: {why}"))?;
    let request = clawcage_core::approval::WriteRequest {
        operation: clawcage_core::approval::WriteOperation::Write,
        paths: vec![target],
        link_target: None,
    };
    writes
        .ask(request)
        .await
        .map(|()| Some((parent, name)))
        .map_err(|reason| format!("{shown}: {reason}"))
}

/// What a file that is neither a regular file nor a directory is ("a FIFO"), or `None`.
pub(super) fn special_kind(file_type: &cap_primitives::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use cap_primitives::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return Some("a FIFO");
        }
        if file_type.is_socket() {
            return Some("a socket");
        }
        if file_type.is_char_device() {
            return Some("a character device");
        }
        if file_type.is_block_device() {
            return Some("a block device");
        }
    }
    (!file_type.is_file() && !file_type.is_dir()).then_some("a special file")
}

pub(super) fn describe_open_error(shown: &str, error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: No such file or directory"),
        std::io::ErrorKind::IsADirectory => format!("{shown}: Is a directory"),
        std::io::ErrorKind::PermissionDenied => format!(
            "{shown}: refused (it leads outside the workspace, e.g. through a symlink, or the file is not accessible)"
        ),
        _ => format!("{shown}: {error}"),
    }
}
