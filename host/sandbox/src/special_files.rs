//! Keeping special files out of reach of guests: `open(2)` of a FIFO blocks until its other end
//! is opened, and a device can stream forever, and because the WASI context runs file operations
//! on the calling thread (`allow_blocking_current_thread`), such an open would block a tokio worker
//! in a syscall where no time limit can reach it. [`refuse_special_files`] shadows
//! `[method]descriptor.open-at` of `wasi:filesystem/types` so that, before the real open runs, the
//! target is stat'ed through wasmtime-wasi's own implementation (so the sandbox's path rules
//! apply, and symlinks are followed or not exactly as the guest asked), and a FIFO, socket,
//! character or block device (or a file of unknown type) is refused with
//! [`ErrorCode::Unsupported`] — "not supported", which programs print as such: opening special
//! files is not something this sandbox offers, whatever the permissions, so the error does not
//! invite a retry with `chmod`. Anything else, a missing path included (`O_CREAT`), goes on to the
//! real open unchanged. The check and the open are two steps: between them the path could be
//! replaced by a FIFO. No tool can make one (WASI has no `mkfifo`, and the programs exec runs are
//! WASI programs too), so this needs a FIFO that a host process put in the workspace; a guest
//! with write access could then race a rename or a symlink swap onto the path it opens, and that
//! one open would block as before. Closing that gap needs a non-blocking open inside
//! wasmtime-wasi.
//!
//! The same shadow asks before an open for writing under a read-only workspace, when the call
//! may ask (`asked_writes`).

use std::future::Future;

use clawcage_core::approval::WriteOperation;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemView as _;
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
    AsksWrites, Cleared, Expect, clear, cleared_or_refused, never_a_writable_directory, one,
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

/// `open-at`, after a `stat-at` of the same path with the same path flags (a symbolic link is
/// only seen when the guest asked not to follow links, and then the real open refuses it
/// itself), and for writing under a read-only directory, after the operator's approval.
fn open_at<T: AsksWrites + 'static>(
    mut store: StoreContextMut<'_, T>,
    (fd, path_flags, path, open_flags, flags): OpenAtParams,
) -> Box<dyn Future<Output = wasmtime::Result<OpenAtResult>> + Send + '_> {
    Box::new(async move {
        let mut view = store.data_mut().filesystem();
        // `fd` is a borrow: a second handle to the same descriptor for the stat.
        let directory = Resource::<Descriptor>::new_borrow(fd.rep());
        if let Ok(stat) = view.stat_at(directory, path_flags, path.clone()).await
            && is_special(stat.type_)
        {
            tracing::debug!(path = %path, kind = ?stat.type_, "a guest's open of a special file refused");
            return Ok((Err(SPECIAL_FILE_ERROR),));
        }
        let cleared = if opens_for_writing(open_flags, flags) {
            let expect = if !open_flags.contains(OpenFlags::CREATE) {
                Expect::Exists
            } else if open_flags.contains(OpenFlags::EXCLUSIVE) {
                Expect::Absent
            } else {
                Expect::Any
            };
            cleared_or_refused!(store, &[(&fd, &path)], expect, one(WriteOperation::Write))
        } else {
            Cleared::own(&fd)
        };
        let elevated = cleared.elevated();
        let opened = store
            .data_mut()
            .filesystem()
            .open_at(cleared.fd(0), path_flags, path, open_flags, flags)
            .await;
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
