//! Writes under a read-only workspace that ask the operator first (`[approvals] write = "ask"`).
//! The workspace stays a read-only preopen: wasmtime-wasi refuses every change through it. The
//! functions of `wasi:filesystem/types` that change something under a directory — `open-at`
//! for writing, `create-directory-at`, `remove-directory-at`, `unlink-file-at`, `rename-at`,
//! `symlink-at`, `link-at`, `set-times-at` — are shadowed here: when the directory is read-only
//! and the call has a [`WriteAsker`], the path is shown to the operator and, only on an
//! approval, that one operation runs through a read-write copy of the directory's descriptor
//! that lives for the operation and is never handed to the guest. A function not shadowed here
//! stays refused, so a missed one fails closed. A file opened for writing after an approval is
//! that file alone; a directory never comes back writable. Denials are kept to tell the model
//! why its write failed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clawcage_core::approval::{WriteOperation, WriteRequest, WriteReviewer};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::filesystem::{
    Descriptor as HostDescriptorValue, FsPerms, WasiFilesystemView as _,
};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorFlags, ErrorCode, Host as _, HostDescriptor as _, NewTimestamp,
    OpenFlags, PathFlags,
};

use crate::clock::CallClock;

/// The `wasi:filesystem/types` instance wasmtime-wasi defines.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Denials kept per call for the model.
const MAX_DENIALS: usize = 8;

/// Asks about the writes of one call (its tool and every program it runs).
pub(crate) struct WriteAsker {
    reviewer: WriteReviewer,
    /// The workspace's canonical path: a request names paths under it only.
    root: PathBuf,
    clock: CallClock,
    denials: Mutex<Vec<String>>,
}

impl WriteAsker {
    pub(crate) fn new(reviewer: WriteReviewer, root: &Path, clock: CallClock) -> Self {
        Self {
            reviewer,
            root: root.to_path_buf(),
            clock,
            denials: Mutex::new(Vec::new()),
        }
    }

    /// The workspace's canonical path.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The operator's decision on `request`; the call's clock stands still meanwhile.
    pub(crate) async fn ask(&self, request: WriteRequest) -> Result<(), String> {
        let described = request.describe();
        let decision = {
            let _paused = self.clock.pause();
            (self.reviewer)(request).await
        };
        match &decision {
            Ok(()) => {
                tracing::info!(write = %described, "a write under the read-only workspace was approved")
            }
            Err(reason) => {
                tracing::info!(write = %described, %reason, "a write under the read-only workspace was refused");
                let mut denials = self
                    .denials
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if denials.len() < MAX_DENIALS && !denials.contains(reason) {
                    denials.push(reason.clone());
                }
            }
        }
        decision
    }

    /// Why writes of this call were refused, one sentence each.
    pub(crate) fn denials(&self) -> Vec<String> {
        self.denials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A store whose guest may ask before writing.
pub(crate) trait AsksWrites: WasiView {
    /// The call's asker; `None` leaves a read-only workspace read-only.
    fn write_asker(&self) -> Option<Arc<WriteAsker>>;
}

/// What to do with a change under `fd`.
enum Route {
    /// Run the function as wasmtime-wasi defines it (a writable directory, a file, no asker).
    AsDefined,
    /// Ask about these paths first.
    Ask {
        asker: Arc<WriteAsker>,
        paths: Vec<String>,
    },
    /// Refuse without asking (a path outside the workspace, which would be refused anyway).
    Refuse,
}

/// A read-only directory descriptor's host path, when `fd` is one.
fn read_only_directory(table: &ResourceTable, fd: &Resource<Descriptor>) -> Option<PathBuf> {
    match table.get(fd).ok()? {
        HostDescriptorValue::Dir(dir) if dir.perms.write_not_permitted() => {
            Some(descriptor_path(&dir.dir).unwrap_or_default())
        }
        _ => None,
    }
}

/// Where an open directory is now, read from the kernel.
#[cfg(target_os = "linux")]
fn descriptor_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// Elsewhere the directory cannot be named, so nothing under it is asked (it is refused).
#[cfg(not(target_os = "linux"))]
fn descriptor_path(_file: &std::fs::File) -> Option<PathBuf> {
    None
}

/// `path` (as the guest gave it, relative to `directory`) as an absolute, lexically normalised
/// path inside `root`; `None` when it leaves `root` or cannot be named.
pub(crate) fn target_path(root: &Path, directory: &Path, path: &str) -> Option<String> {
    if directory.as_os_str().is_empty() || Path::new(path).is_absolute() {
        return None;
    }
    let mut target = PathBuf::new();
    for component in directory.join(path).components() {
        match component {
            std::path::Component::ParentDir => {
                target.pop();
            }
            std::path::Component::CurDir => {}
            other => target.push(other.as_os_str()),
        }
    }
    (target.starts_with(root) && target != root)
        .then(|| target.to_str().map(str::to_string))
        .flatten()
}

/// How a change of `paths` (each relative to the directory of the same index in `fds`) is routed.
fn route<T: AsksWrites>(state: &mut T, under: &[(&Resource<Descriptor>, &str)]) -> Route {
    let Some(asker) = state.write_asker() else {
        return Route::AsDefined;
    };
    let table = &*state.ctx().table;
    let mut paths = Vec::with_capacity(under.len());
    let mut any_read_only = false;
    for (fd, path) in under {
        let Some(directory) = read_only_directory(table, fd) else {
            continue;
        };
        any_read_only = true;
        match target_path(asker.root(), &directory, path) {
            Some(target) => paths.push(target),
            None => return Route::Refuse,
        }
    }
    if !any_read_only {
        return Route::AsDefined;
    }
    if paths.len() != under.len() {
        // One side writable and one not: wasmtime-wasi refuses that pair itself.
        return Route::AsDefined;
    }
    Route::Ask { asker, paths }
}

/// The descriptors one change runs on: the guest's own, or read-write copies pushed for this
/// one operation after an approval (then [`release`] removes them).
pub(crate) struct Cleared {
    pub(crate) fds: Vec<Resource<Descriptor>>,
    elevated: bool,
}

impl Cleared {
    /// The guest's own descriptor, unchanged.
    pub(crate) fn own(fd: &Resource<Descriptor>) -> Cleared {
        Cleared {
            fds: vec![Resource::new_borrow(fd.rep())],
            elevated: false,
        }
    }

    /// Whether the descriptors are read-write copies made after an approval.
    pub(crate) fn elevated(&self) -> bool {
        self.elevated
    }

    /// The descriptor at `index`, as a borrow for one call.
    pub(crate) fn fd(&self, index: usize) -> Resource<Descriptor> {
        Resource::new_borrow(self.fds[index].rep())
    }
}

/// What the first path of a change must be for the change to make sense: asking about creating
/// what exists, or removing what does not, would only trouble the operator (`create_dir_all`
/// creates every existing parent, for one). Checked only before asking; the answer is the error
/// the operation itself would give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// It must exist (remove, rename, set times, open without create).
    Exists,
    /// It must not exist (create a directory or a link, exclusive create).
    Absent,
    /// Either (create or replace).
    Any,
}

/// Decides whether a change of `under` (each path relative to its directory descriptor) may
/// run: as wasmtime-wasi defines it when nothing read-only is involved or no asker is set, else
/// after the operator approved the request `describe` makes of the absolute paths. `Err` is the
/// guest's error (not permitted).
pub(crate) async fn clear<T: AsksWrites>(
    state: &mut T,
    under: &[(&Resource<Descriptor>, &str)],
    expect: Expect,
    describe: impl FnOnce(Vec<String>) -> WriteRequest,
) -> wasmtime::Result<Result<Cleared, ErrorCode>> {
    let own = |fds: &[(&Resource<Descriptor>, &str)]| Cleared {
        fds: fds
            .iter()
            .map(|(fd, _)| Resource::new_borrow(fd.rep()))
            .collect(),
        elevated: false,
    };
    let asking = match route(state, under) {
        Route::AsDefined => return Ok(Ok(own(under))),
        Route::Refuse => None,
        Route::Ask { asker, paths } => Some((asker, paths)),
    };
    // Before a refusal too: `mkdir` of the workspace itself must say "exists", as the kernel
    // would (`create_dir_all` relies on it).
    if let (Some((fd, path)), false) = (under.first(), expect == Expect::Any) {
        let mut view = state.filesystem();
        let found = view
            .stat_at(
                Resource::new_borrow(fd.rep()),
                PathFlags::empty(),
                (*path).to_string(),
            )
            .await;
        match (expect, found) {
            (Expect::Absent, Ok(_)) => return Ok(Err(ErrorCode::Exist)),
            (Expect::Exists, Err(error)) => return Ok(Err(view.convert_error_code(error)?)),
            _ => {}
        }
    }
    let Some((asker, paths)) = asking else {
        return Ok(Err(ErrorCode::NotPermitted));
    };
    if asker.ask(describe(paths)).await.is_err() {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    let table = state.ctx().table;
    let mut fds = Vec::with_capacity(under.len());
    for (fd, _) in under {
        let HostDescriptorValue::Dir(dir) = table.get(*fd)? else {
            wasmtime::bail!("an approved write's descriptor is no longer a directory");
        };
        let mut writable = dir.clone();
        writable.perms = FsPerms::ReadWrite;
        let copy = table.push(HostDescriptorValue::Dir(writable))?;
        fds.push(Resource::new_own(copy.rep()));
    }
    Ok(Ok(Cleared {
        fds,
        elevated: true,
    }))
}

/// Removes the read-write copies of `cleared`, if any. (A call stopped before this leaves them
/// in a store that is dropped with the call; the guest never holds a handle to them.)
pub(crate) fn release<T: WasiView>(state: &mut T, cleared: Cleared) {
    if !cleared.elevated {
        return;
    }
    let table = state.ctx().table;
    for copy in cleared.fds {
        if let Err(error) = table.delete(copy) {
            tracing::warn!("an approved write's descriptor copy could not be removed: {error}");
        }
    }
}

/// Whether `open-at` with these flags changes the file system (creates, empties or writes).
/// `mutate-directory` alone is not: a directory opened under a read-only one stays read-only.
pub(crate) fn opens_for_writing(open_flags: OpenFlags, flags: DescriptorFlags) -> bool {
    open_flags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE)
        || flags.contains(DescriptorFlags::WRITE)
}

/// After an approved open: a directory never comes back writable (only the approved file may
/// be).
pub(crate) fn never_a_writable_directory<T: WasiView>(
    state: &mut T,
    opened: &Resource<Descriptor>,
) -> wasmtime::Result<()> {
    if let HostDescriptorValue::Dir(dir) = state.ctx().table.get_mut(opened)? {
        dir.perms = FsPerms::ReadOnly;
    }
    Ok(())
}

/// The guest's result of a wasmtime-wasi call: its error code, or a trap.
macro_rules! guest_result {
    ($store:expr, $call:expr) => {
        match $call {
            Ok(value) => Ok(value),
            Err(error) => Err($store.data_mut().filesystem().convert_error_code(error)?),
        }
    };
}

/// The descriptors a change may run on, or the guest's error returned from the enclosing
/// shadow (see [`clear`]).
macro_rules! cleared_or_refused {
    ($store:expr, $under:expr, $expect:expr, $describe:expr) => {
        match clear($store.data_mut(), $under, $expect, $describe).await? {
            Ok(cleared) => cleared,
            Err(code) => return Ok((Err(code),)),
        }
    };
}
pub(crate) use cleared_or_refused;

/// Shadows `$name`, a change of one path under a directory (`fd, path`), with one that runs
/// wasmtime-wasi's `$method` after [`clear`].
macro_rules! one_path_change {
    ($types:expr, $state:ty, $name:literal, $expect:expr, $operation:expr, $method:ident) => {
        $types.func_wrap_async(
            $name,
            |mut store: StoreContextMut<'_, $state>, (fd, path): (Resource<Descriptor>, String)| {
                Box::new(async move {
                    let cleared =
                        cleared_or_refused!(store, &[(&fd, &path)], $expect, one($operation));
                    let done = store
                        .data_mut()
                        .filesystem()
                        .$method(cleared.fd(0), path)
                        .await;
                    release(store.data_mut(), cleared);
                    Ok((guest_result!(store, done),))
                })
            },
        )?;
    };
}

/// A request of one path.
pub(crate) fn one(operation: WriteOperation) -> impl FnOnce(Vec<String>) -> WriteRequest {
    move |paths| WriteRequest {
        operation,
        paths,
        link_target: None,
    }
}

/// Replaces the directory-changing functions of `wasi:filesystem/types` in `linker` (WASI must
/// already be added) by ones that ask before a change under a read-only directory. `open-at` is
/// replaced in `special_files`, which asks through [`clear`] too. Leaves shadowing disallowed.
pub(crate) fn ask_before_writes<T: AsksWrites + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    one_path_change!(
        types,
        T,
        "[method]descriptor.create-directory-at",
        Expect::Absent,
        WriteOperation::CreateDirectory,
        create_directory_at
    );
    one_path_change!(
        types,
        T,
        "[method]descriptor.remove-directory-at",
        Expect::Exists,
        WriteOperation::RemoveDirectory,
        remove_directory_at
    );
    one_path_change!(
        types,
        T,
        "[method]descriptor.unlink-file-at",
        Expect::Exists,
        WriteOperation::Remove,
        unlink_file_at
    );
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store: StoreContextMut<'_, T>,
         (fd, target, path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let link_target = target.clone();
                let describe = move |paths| WriteRequest {
                    operation: WriteOperation::Symlink,
                    paths,
                    link_target: Some(link_target),
                };
                let cleared = cleared_or_refused!(store, &[(&fd, &path)], Expect::Absent, describe);
                let done = store
                    .data_mut()
                    .filesystem()
                    .symlink_at(cleared.fd(0), target, path)
                    .await;
                release(store.data_mut(), cleared);
                Ok((guest_result!(store, done),))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-times-at",
        |mut store: StoreContextMut<'_, T>,
         (fd, path_flags, path, accessed, modified): (
            Resource<Descriptor>,
            PathFlags,
            String,
            NewTimestamp,
            NewTimestamp,
        )| {
            Box::new(async move {
                let cleared = cleared_or_refused!(
                    store,
                    &[(&fd, &path)],
                    Expect::Exists,
                    one(WriteOperation::SetTimes)
                );
                let done = store
                    .data_mut()
                    .filesystem()
                    .set_times_at(cleared.fd(0), path_flags, path, accessed, modified)
                    .await;
                release(store.data_mut(), cleared);
                Ok((guest_result!(store, done),))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.rename-at",
        |mut store: StoreContextMut<'_, T>,
         (fd, old_path, new_fd, new_path): (
            Resource<Descriptor>,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let under = [(&fd, old_path.as_str()), (&new_fd, new_path.as_str())];
                let cleared =
                    cleared_or_refused!(store, &under, Expect::Exists, one(WriteOperation::Rename));
                let done = store
                    .data_mut()
                    .filesystem()
                    .rename_at(cleared.fd(0), old_path, cleared.fd(1), new_path)
                    .await;
                release(store.data_mut(), cleared);
                Ok((guest_result!(store, done),))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store: StoreContextMut<'_, T>,
         (fd, old_flags, old_path, new_fd, new_path): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let under = [(&fd, old_path.as_str()), (&new_fd, new_path.as_str())];
                let cleared = cleared_or_refused!(
                    store,
                    &under,
                    Expect::Exists,
                    one(WriteOperation::HardLink)
                );
                let done = store
                    .data_mut()
                    .filesystem()
                    .link_at(cleared.fd(0), old_flags, old_path, cleared.fd(1), new_path)
                    .await;
                release(store.data_mut(), cleared);
                Ok((guest_result!(store, done),))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_absolute_inside_the_workspace_or_refused() {
        let root = Path::new("/ws");
        assert_eq!(
            target_path(root, Path::new("/ws"), "a.txt").as_deref(),
            Some("/ws/a.txt")
        );
        assert_eq!(
            target_path(root, Path::new("/ws/sub"), "./x/../b").as_deref(),
            Some("/ws/sub/b")
        );
        // Leaving the workspace, naming the workspace itself, an unknown directory, an
        // absolute path: never asked.
        assert_eq!(target_path(root, Path::new("/ws"), "../etc/passwd"), None);
        assert_eq!(target_path(root, Path::new("/ws/sub"), ".."), None);
        assert_eq!(target_path(root, Path::new("/ws"), "."), None);
        assert_eq!(target_path(root, Path::new(""), "a"), None);
        assert_eq!(target_path(root, Path::new("/ws"), "/ws/a"), None);
        assert_eq!(target_path(root, Path::new("/wsx"), "a"), None);
    }

    #[test]
    fn only_opens_that_change_something_are_writes() {
        assert!(!opens_for_writing(
            OpenFlags::empty(),
            DescriptorFlags::READ
        ));
        assert!(!opens_for_writing(
            OpenFlags::DIRECTORY,
            DescriptorFlags::READ
        ));
        assert!(opens_for_writing(OpenFlags::CREATE, DescriptorFlags::READ));
        assert!(opens_for_writing(
            OpenFlags::TRUNCATE,
            DescriptorFlags::READ
        ));
        assert!(opens_for_writing(
            OpenFlags::empty(),
            DescriptorFlags::WRITE
        ));
        assert!(!opens_for_writing(
            OpenFlags::empty(),
            DescriptorFlags::MUTATE_DIRECTORY
        ));
    }
}
