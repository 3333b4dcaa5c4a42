//! Keeping special files out of reach of guests: `open(2)` of a FIFO blocks until its other end
//! is opened, and a device can stream forever, and because the WASI context runs file operations
//! on the calling thread (`allow_blocking_current_thread`), such an open would block a tokio worker
//! in a syscall where no time limit can reach it. [`refuse_special_files`] shadows
//! `[method]descriptor.open-at` of `wasi:filesystem/types`: the path is opened as wasmtime-wasi
//! opens it (the same options and permissions, resolved beneath the directory by cap-primitives)
//! but with `O_NONBLOCK`, so a FIFO opens at once, and what was opened is judged by its own
//! metadata: a FIFO, socket, character or block device (or a file of unknown type) is closed and
//! refused with [`ErrorCode::Unsupported`] — "not supported", which programs print as such:
//! opening special files is not something this sandbox offers, whatever the permissions, so the
//! error does not invite a retry with `chmod`. There is no gap between a check and the open. When
//! that open fails (a missing file, a refusal, a FIFO opened for writing with no reader),
//! wasmtime-wasi's own `open-at` answers, after a `stat-at` of the path that keeps it away from
//! special files, so the guest gets wasmtime-wasi's own error codes; only there could a path
//! swapped for a FIFO between the two steps (by a host process: no tool can make one) still
//! block.
//!
//! The same shadow asks before an open for writing under a read-only workspace, when the call
//! may ask (`asked_writes`).

use std::future::Future;
use std::path::Path;

use clawcage_core::approval::WriteOperation;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};

use wasmtime_wasi::filesystem::{
    Descriptor as HostDescriptorValue, Dir as HostDir, File as HostFile, OpenMode,
    WasiFilesystemView as _,
};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorType, ErrorCode, Host as _, HostDescriptor as _,
    OpenFlags, PathFlags,
};

/// The `wasi:filesystem/types` instance wasmtime-wasi defines (the version programs.rs shadows).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// The function shadowed.
const OPEN_AT: &str = "[method]descriptor.open-at";

/// What opening a special file fails with.
pub(crate) const SPECIAL_FILE_ERROR: ErrorCode = ErrorCode::Unsupported;

/// The arguments of `open-at`: the directory, path flags, path, open flags, descriptor flags.
type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);

/// What `open-at` returns.
type OpenAtResult = (Result<Resource<Descriptor>, ErrorCode>,);

use crate::asked_writes::{
    AsksWrites, Cleared, Expect, Needs, clear, cleared_or_refused, never_a_writable_directory, one,
    opens_for_writing, release,
};

/// Replaces `open-at` in `linker`, to which WASI p2 must already have been added, by one that
/// refuses special files (see the module documentation). Fails when `linker` has no `open-at`
/// of [`FILESYSTEM_TYPES`] to replace (a wasmtime-wasi with another WASI version: update the
/// constant), so the guard can never silently be absent. Leaves name shadowing disallowed.
pub(crate) fn refuse_special_files<T: AsksWrites + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(false);
    let defined_before = linker
        .instance(FILESYSTEM_TYPES)?
        .func_wrap_async(OPEN_AT, open_at::<T>)
        .is_err();
    if !defined_before {
        wasmtime::bail!(
            "`{FILESYSTEM_TYPES}#{OPEN_AT}` is not defined by wasmtime-wasi, so special files cannot be guarded; add WASI to the linker first, or update FILESYSTEM_TYPES in special_files.rs to the wasi:filesystem version wasmtime-wasi provides"
        );
    }
    linker.allow_shadowing(true);
    let defined = linker
        .instance(FILESYSTEM_TYPES)?
        .func_wrap_async(OPEN_AT, open_at::<T>);
    linker.allow_shadowing(false);
    defined
}

/// Whether a descriptor type is one the guest may not open.
fn is_special(kind: DescriptorType) -> bool {
    match kind {
        DescriptorType::RegularFile | DescriptorType::Directory | DescriptorType::SymbolicLink => {
            false
        }
        DescriptorType::Fifo
        | DescriptorType::Socket
        | DescriptorType::CharacterDevice
        | DescriptorType::BlockDevice
        | DescriptorType::Unknown => true,
    }
}

/// `open-at`. The file is opened without blocking (`O_NONBLOCK`, which changes nothing for a
/// regular file or a directory) and what was opened is then judged by its own metadata: a FIFO,
/// socket or device is closed again and refused, with no gap between a check and the open. Only
/// when that open fails (a missing file, a refusal, a FIFO opened for writing with no reader)
/// does wasmtime-wasi's own `open-at` run, after a `stat-at` of the path that keeps special files
/// away from it, so the guest gets wasmtime-wasi's error code. A write under a read-only
/// directory is asked first (see `asked_writes`).
fn open_at<T: AsksWrites + 'static>(
    mut store: StoreContextMut<'_, T>,
    (fd, path_flags, path, open_flags, flags): OpenAtParams,
) -> Box<dyn Future<Output = wasmtime::Result<OpenAtResult>> + Send + '_> {
    Box::new(async move {
        let writing = opens_for_writing(open_flags, flags);
        // A person is never asked about a special file.
        if writing
            && store.data().write_asker().is_some()
            && refuse_if_special(&mut store, &fd, path_flags, &path).await
        {
            return Ok((Err(SPECIAL_FILE_ERROR),));
        }
        let cleared = if writing {
            let expect = if !open_flags.contains(OpenFlags::CREATE) {
                Expect::Exists
            } else if open_flags.contains(OpenFlags::EXCLUSIVE) {
                Expect::Absent
            } else {
                Expect::Any
            };
            let needs = Needs {
                expect,
                follows_last: path_flags.contains(PathFlags::SYMLINK_FOLLOW),
            };
            cleared_or_refused!(store, &[(&fd, &path)], needs, one(WriteOperation::Write))
        } else {
            Cleared::own(&fd)
        };
        let elevated = cleared.elevated();
        // After an approval: the bound directory and name, a last link not followed.
        let request = OpenRequest {
            path_flags: cleared.path_flags(path_flags),
            path: cleared.path(0, &path),
            open_flags,
            flags,
        };
        let fast = open_without_blocking(store.data_mut(), &cleared.fd(0), &request)?;
        let opened = match fast {
            Fast::Opened(opened) => Ok(opened),
            Fast::Refused(code) => {
                release(store.data_mut(), cleared);
                return Ok((Err(code),));
            }
            Fast::Failed => {
                let (path_flags, path) = (request.path_flags, request.path);
                if refuse_if_special(&mut store, &cleared.fd(0), path_flags, path).await {
                    release(store.data_mut(), cleared);
                    return Ok((Err(SPECIAL_FILE_ERROR),));
                }
                store
                    .data_mut()
                    .filesystem()
                    .open_at(
                        cleared.fd(0),
                        path_flags,
                        path.to_string(),
                        open_flags,
                        flags,
                    )
                    .await
            }
        };
        release(store.data_mut(), cleared);
        match opened {
            Ok(opened) => {
                if elevated {
                    never_a_writable_directory(store.data_mut(), &opened)?;
                }
                Ok((Ok(opened),))
            }
            Err(error) => Ok((Err(store
                .data_mut()
                .filesystem()
                .convert_error_code(error)?),)),
        }
    })
}

/// Whether `path` under `fd` is a special file, by a `stat-at` with the guest's path flags (a
/// symbolic link is only seen when the guest asked not to follow links, and then the open
/// refuses it itself).
async fn refuse_if_special<T: AsksWrites + 'static>(
    store: &mut StoreContextMut<'_, T>,
    fd: &Resource<Descriptor>,
    path_flags: PathFlags,
    path: &str,
) -> bool {
    let directory = Resource::<Descriptor>::new_borrow(fd.rep());
    let stat = store
        .data_mut()
        .filesystem()
        .stat_at(directory, path_flags, path.to_string())
        .await;
    match stat {
        Ok(stat) if is_special(stat.type_) => {
            tracing::debug!(path = %path, kind = ?stat.type_, "a guest's open of a special file refused");
            true
        }
        _ => false,
    }
}

/// The arguments of one `open-at` besides its directory.
struct OpenRequest<'a> {
    path_flags: PathFlags,
    path: &'a str,
    open_flags: OpenFlags,
    flags: DescriptorFlags,
}

/// What the open without blocking came to.
enum Fast {
    /// A regular file or directory, pushed for the guest.
    Opened(Resource<Descriptor>),
    /// Opened and refused for what it is.
    Refused(ErrorCode),
    /// Not opened (or not attempted): wasmtime-wasi's own open decides, and words the error.
    Failed,
}

/// Opens `request` under the directory `fd` as wasmtime-wasi's `open-at` does (the same
/// options, permissions and open mode, through the same beneath-the-directory resolution), but
/// with `O_NONBLOCK`, then refuses what is neither a regular file nor a directory. The guest's
/// WASI context lets file operations block the calling thread (`wasi_context::denied`), as the
/// descriptors made here record.
fn open_without_blocking<T: AsksWrites>(
    state: &mut T,
    fd: &Resource<Descriptor>,
    request: &OpenRequest<'_>,
) -> wasmtime::Result<Fast> {
    let table = state.ctx().table;
    let HostDescriptorValue::Dir(directory) = table.get(fd)? else {
        return Ok(Fast::Failed);
    };
    let (open_flags, flags) = (request.open_flags, request.flags);
    // What wasmtime-wasi refuses before any system call: it answers those itself.
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) || (open_flags.contains(OpenFlags::DIRECTORY)
        && open_flags.intersects(OpenFlags::CREATE | OpenFlags::EXCLUSIVE | OpenFlags::TRUNCATE))
    {
        return Ok(Fast::Failed);
    }
    let mut options = cap_primitives::fs::OpenOptions::new();
    let mut open_mode = OpenMode::empty();
    let mut create = false;
    if open_flags.contains(OpenFlags::CREATE) {
        if open_flags.contains(OpenFlags::EXCLUSIVE) {
            options.create_new(true);
        } else {
            options.create(true);
        }
        create = true;
        options.write(true);
        open_mode |= OpenMode::WRITE;
    }
    if open_flags.contains(OpenFlags::TRUNCATE) {
        options.truncate(true).write(true);
        open_mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::READ) {
        options.read(true);
        open_mode |= OpenMode::READ;
    }
    if flags.contains(DescriptorFlags::WRITE) {
        options.write(true);
        open_mode |= OpenMode::WRITE;
    } else {
        options.read(true);
        open_mode |= OpenMode::READ;
    }
    if directory.perms.write_not_permitted() && (create || open_mode.contains(OpenMode::WRITE)) {
        return Ok(Fast::Failed);
    }
    // Set as cap-fs-ext sets them (cap-primitives has no other setters): the guest's choice
    // about symbolic links, and O_NONBLOCK.
    options._cap_fs_ext_follow(if request.path_flags.contains(PathFlags::SYMLINK_FOLLOW) {
        cap_primitives::fs::FollowSymlinks::Yes
    } else {
        cap_primitives::fs::FollowSymlinks::No
    });
    options._cap_fs_ext_nonblock(true);
    let Ok(file) = cap_primitives::fs::open(&directory.dir, Path::new(request.path), &options)
    else {
        return Ok(Fast::Failed);
    };
    let Ok(metadata) = file.metadata() else {
        return Ok(Fast::Failed);
    };
    let kind = metadata.file_type();
    let perms = directory.perms;
    let opened = if kind.is_dir() {
        HostDescriptorValue::Dir(HostDir::new(file, perms, open_mode, true))
    } else if kind.is_file() {
        if open_flags.contains(OpenFlags::DIRECTORY) {
            return Ok(Fast::Refused(ErrorCode::NotDirectory));
        }
        HostDescriptorValue::File(HostFile::new(file, perms, open_mode, true))
    } else {
        tracing::debug!(path = %request.path, "a guest's open of a special file refused");
        return Ok(Fast::Refused(SPECIAL_FILE_ERROR));
    };
    let pushed = table.push(opened)?;
    Ok(Fast::Opened(Resource::new_own(pushed.rep())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Engine;
    use wasmtime::component::ResourceTable;
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

    struct State {
        wasi: WasiCtx,
        table: ResourceTable,
    }

    impl WasiView for State {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    impl AsksWrites for State {
        fn write_asker(&self) -> Option<std::sync::Arc<crate::asked_writes::WriteAsker>> {
            None
        }
    }

    #[test]
    fn the_guard_replaces_the_open_wasi_defines() {
        let engine = Engine::default();
        let mut linker: Linker<State> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        refuse_special_files(&mut linker).unwrap();
        // Shadowing is off again afterwards: a second definition is an error, not a silent swap.
        assert!(
            linker
                .instance(FILESYSTEM_TYPES)
                .unwrap()
                .func_wrap_async(OPEN_AT, open_at::<State>)
                .is_err()
        );
    }

    #[test]
    fn without_wasi_the_guard_refuses_to_pretend() {
        let engine = Engine::default();
        let mut linker: Linker<State> = Linker::new(&engine);
        let error = refuse_special_files(&mut linker).unwrap_err();
        assert!(error.to_string().contains("not defined"), "{error}");
    }

    #[test]
    fn only_regular_files_directories_and_links_pass() {
        assert!(!is_special(DescriptorType::RegularFile));
        assert!(!is_special(DescriptorType::Directory));
        assert!(!is_special(DescriptorType::SymbolicLink));
        assert!(is_special(DescriptorType::Fifo));
        assert!(is_special(DescriptorType::Socket));
        assert!(is_special(DescriptorType::CharacterDevice));
        assert!(is_special(DescriptorType::BlockDevice));
        assert!(is_special(DescriptorType::Unknown));
    }
}
