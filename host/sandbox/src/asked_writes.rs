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

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use clawcage_core::approval::{WriteOperation, WriteRequest, WriteReviewer};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::filesystem::{
    Descriptor as HostDescriptorValue, Dir as HostDir, FsPerms, OpenMode, WasiFilesystemView as _,
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

/// What to do with a change under read-only directories.
enum Route {
    /// Run the function as wasmtime-wasi defines it (a writable directory, a file, no asker).
    AsDefined,
    /// Ask about these paths first.
    Ask {
        asker: Arc<WriteAsker>,
        targets: Vec<Bound>,
    },
    /// Refuse without asking, with the error the operation would have met (or "not
    /// permitted" for a path outside the workspace).
    Refuse(ErrorCode),
}

/// One path of an asked change, bound to what it names now: the directory it is in, opened
/// beneath the guest's directory (symbolic links on the way followed, as the kernel would),
/// and its last component. The person is shown the directory's real path, and an approved
/// operation runs on that open directory and that name, so a link re-pointed after the
/// question cannot send the change anywhere else.
struct Bound {
    parent: std::fs::File,
    name: String,
    shown: String,
}

/// Why a path could not be bound.
enum Unbound {
    /// The path is the directory itself (`.`): there is nothing to name in it.
    NoName,
    /// The operation would fail with this error anyway.
    Error(ErrorCode),
}

/// A read-only directory descriptor's open directory, when `fd` is one.
fn read_only_directory(
    table: &ResourceTable,
    fd: &Resource<Descriptor>,
) -> Option<Arc<std::fs::File>> {
    match table.get(fd).ok()? {
        HostDescriptorValue::Dir(dir) if dir.perms.write_not_permitted() => Some(dir.dir.clone()),
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

/// The names of `path` (relative, as the guest gave it) with `.` and `..` resolved by name;
/// `None` when it is absolute or climbs above its directory (which the sandbox refuses anyway).
pub(crate) fn lexical_names(path: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => names.push(name.to_str()?.to_string()),
            Component::CurDir => {}
            Component::ParentDir => {
                names.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(names)
}

/// Binds `path` under `directory` (see [`Bound`]); the parent must lie inside `root`.
fn bind(root: &Path, directory: &std::fs::File, path: &str) -> Result<Bound, Unbound> {
    let refused = Unbound::Error(ErrorCode::NotPermitted);
    let mut names = lexical_names(path).ok_or(Unbound::Error(ErrorCode::NotPermitted))?;
    let name = names.pop().ok_or(Unbound::NoName)?;
    let parent_path: PathBuf = if names.is_empty() {
        PathBuf::from(".")
    } else {
        names.iter().collect()
    };
    let mut options = cap_primitives::fs::OpenOptions::new();
    options.read(true);
    let parent = cap_primitives::fs::open(directory, &parent_path, &options).map_err(|error| {
        Unbound::Error(match error.kind() {
            std::io::ErrorKind::NotFound => ErrorCode::NoEntry,
            std::io::ErrorKind::NotADirectory => ErrorCode::NotDirectory,
            _ => ErrorCode::NotPermitted,
        })
    })?;
    if !parent.metadata().is_ok_and(|metadata| metadata.is_dir()) {
        return Err(Unbound::Error(ErrorCode::NotDirectory));
    }
    let real = descriptor_path(&parent).ok_or(Unbound::Error(ErrorCode::NotPermitted))?;
    if !real.starts_with(root) {
        return Err(refused);
    }
    let shown = real
        .join(&name)
        .to_str()
        .map(str::to_string)
        .ok_or(Unbound::Error(ErrorCode::IllegalByteSequence))?;
    Ok(Bound {
        parent,
        name,
        shown,
    })
}

/// A path bound for a change made outside `wasi:filesystem` (an exec redirection): the open
/// directory it is in, its last component and the path a person is shown; the error is the
/// sentence for the program. A last component that is a symbolic link is refused (a
/// redirection follows it, so the person would be asked about the link's name).
pub(crate) fn bind_for_change(
    root: &Path,
    directory: &std::fs::File,
    path: &str,
) -> Result<(std::fs::File, String, String), String> {
    let bound = match bind(root, directory, path) {
        Ok(bound) => bound,
        Err(Unbound::NoName) => return Err("Is a directory".to_string()),
        Err(Unbound::Error(ErrorCode::NoEntry)) => {
            return Err("No such file or directory".to_string());
        }
        Err(Unbound::Error(_)) => {
            return Err("refused (it leads outside the workspace, or cannot be named)".to_string());
        }
    };
    let last = cap_primitives::fs::stat(
        &bound.parent,
        Path::new(&bound.name),
        cap_primitives::fs::FollowSymlinks::No,
    );
    if last.is_ok_and(|metadata| metadata.file_type().is_symlink()) {
        return Err(
            "a symbolic link; under a read-only workspace write the file it points to".to_string(),
        );
    }
    Ok((bound.parent, bound.name, bound.shown))
}

/// What an asked change needs of its paths before a person is troubled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// What the first path must be.
    pub(crate) expect: Expect,
    /// Whether the operation follows a symbolic link in the last component of the first path:
    /// such a change is refused under a read-only workspace (the person would be asked about
    /// the link's name, not the file it reaches).
    pub(crate) follows_last: bool,
}

impl Needs {
    /// A change that does not follow a last symbolic link.
    pub(crate) fn expecting(expect: Expect) -> Needs {
        Needs {
            expect,
            follows_last: false,
        }
    }
}

/// How a change of `under` (each path relative to its directory descriptor) is routed.
fn route<T: AsksWrites>(
    state: &mut T,
    under: &[(&Resource<Descriptor>, &str)],
    needs: Needs,
) -> Route {
    let Some(asker) = state.write_asker() else {
        return Route::AsDefined;
    };
    let table = &*state.ctx().table;
    let directories: Vec<Arc<std::fs::File>> = under
        .iter()
        .filter_map(|(fd, _)| read_only_directory(table, fd))
        .collect();
    if directories.len() != under.len() {
        // Nothing read-only (wasmtime-wasi decides), or one side writable and one not
        // (wasmtime-wasi refuses that pair itself).
        return Route::AsDefined;
    }
    let mut targets = Vec::with_capacity(under.len());
    for (directory, (_, path)) in directories.iter().zip(under) {
        match bind(asker.root(), directory, path) {
            Ok(bound) => targets.push(bound),
            Err(Unbound::NoName) if matches!(needs.expect, Expect::Absent) => {
                return Route::Refuse(ErrorCode::Exist);
            }
            Err(Unbound::NoName) => return Route::Refuse(ErrorCode::NotPermitted),
            Err(Unbound::Error(code)) => return Route::Refuse(code),
        }
    }
    if let Some(first) = targets.first() {
        let found = cap_primitives::fs::stat(
            &first.parent,
            Path::new(&first.name),
            cap_primitives::fs::FollowSymlinks::No,
        );
        match (&found, needs.expect) {
            (Ok(_), Expect::Absent) => return Route::Refuse(ErrorCode::Exist),
            (Err(_), Expect::Exists) => return Route::Refuse(ErrorCode::NoEntry),
            _ => {}
        }
        if needs.follows_last && found.is_ok_and(|metadata| metadata.file_type().is_symlink()) {
            return Route::Refuse(ErrorCode::NotPermitted);
        }
    }
    Route::Ask { asker, targets }
}

/// The descriptors one change runs on, with the paths under them: the guest's own, or, after
/// an approval, read-write descriptors of the bound directories pushed for this one operation
/// (then [`release`] removes them) with the bound names.
pub(crate) struct Cleared {
    pub(crate) fds: Vec<Resource<Descriptor>>,
    /// The bound names, when the descriptors are the bound directories.
    names: Option<Vec<String>>,
}

impl Cleared {
    /// The guest's own descriptor, unchanged.
    pub(crate) fn own(fd: &Resource<Descriptor>) -> Cleared {
        Cleared {
            fds: vec![Resource::new_borrow(fd.rep())],
            names: None,
        }
    }

    /// Whether the descriptors are read-write ones made after an approval.
    pub(crate) fn elevated(&self) -> bool {
        self.names.is_some()
    }

    /// The descriptor at `index`, as a borrow for one call.
    pub(crate) fn fd(&self, index: usize) -> Resource<Descriptor> {
        Resource::new_borrow(self.fds[index].rep())
    }

    /// The path at `index` under [`Cleared::fd`]: the bound name after an approval, else the
    /// guest's own `path`.
    pub(crate) fn path<'a>(&'a self, index: usize, path: &'a str) -> &'a str {
        match &self.names {
            Some(names) => &names[index],
            None => path,
        }
    }

    /// [`Cleared::path`] for a function that takes the path by value: the guest's own is moved,
    /// not copied.
    pub(crate) fn take_path(&self, index: usize, path: String) -> String {
        match &self.names {
            Some(names) => names[index].clone(),
            None => path,
        }
    }

    /// The path flags for the operation: after an approval a last symbolic link is never
    /// followed (it was not one when asked; if it became one, the operation fails).
    pub(crate) fn path_flags(&self, flags: PathFlags) -> PathFlags {
        if self.elevated() {
            flags & !PathFlags::SYMLINK_FOLLOW
        } else {
            flags
        }
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
/// after the operator approved the request `describe` makes of the bound paths. `Err` is the
/// guest's error.
pub(crate) async fn clear<T: AsksWrites>(
    state: &mut T,
    under: &[(&Resource<Descriptor>, &str)],
    needs: Needs,
    describe: impl FnOnce(Vec<String>) -> WriteRequest,
) -> wasmtime::Result<Result<Cleared, ErrorCode>> {
    let (asker, targets) = match route(state, under, needs) {
        Route::AsDefined => {
            return Ok(Ok(Cleared {
                fds: under
                    .iter()
                    .map(|(fd, _)| Resource::new_borrow(fd.rep()))
                    .collect(),
                names: None,
            }));
        }
        Route::Refuse(code) => return Ok(Err(code)),
        Route::Ask { asker, targets } => (asker, targets),
    };
    let shown = targets.iter().map(|target| target.shown.clone()).collect();
    if asker.ask(describe(shown)).await.is_err() {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    let table = state.ctx().table;
    let mut fds = Vec::with_capacity(targets.len());
    let mut names = Vec::with_capacity(targets.len());
    for target in targets {
        let writable = HostDir::new(target.parent, FsPerms::ReadWrite, OpenMode::READ, true);
        let pushed = table.push(HostDescriptorValue::Dir(writable))?;
        fds.push(Resource::new_own(pushed.rep()));
        names.push(target.name);
    }
    Ok(Ok(Cleared {
        fds,
        names: Some(names),
    }))
}

/// Removes the read-write descriptors of `cleared`, if any. (A call stopped before this leaves
/// them in a store that is dropped with the call; the guest never holds a handle to them.)
pub(crate) fn release<T: WasiView>(state: &mut T, cleared: Cleared) {
    if !cleared.elevated() {
        return;
    }
    let table = state.ctx().table;
    for descriptor in cleared.fds {
        if let Err(error) = table.delete(descriptor) {
            tracing::warn!("an approved write's descriptor could not be removed: {error}");
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
    ($store:expr, $under:expr, $needs:expr, $describe:expr) => {
        match clear($store.data_mut(), $under, $needs, $describe).await? {
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
                    let cleared = cleared_or_refused!(
                        store,
                        &[(&fd, &path)],
                        Needs::expecting($expect),
                        one($operation)
                    );
                    let done = store
                        .data_mut()
                        .filesystem()
                        .$method(cleared.fd(0), cleared.take_path(0, path))
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
                let cleared = cleared_or_refused!(
                    store,
                    &[(&fd, &path)],
                    Needs::expecting(Expect::Absent),
                    describe
                );
                let done = store
                    .data_mut()
                    .filesystem()
                    .symlink_at(cleared.fd(0), target, cleared.take_path(0, path))
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
                let needs = Needs {
                    expect: Expect::Exists,
                    follows_last: path_flags.contains(PathFlags::SYMLINK_FOLLOW),
                };
                let cleared = cleared_or_refused!(
                    store,
                    &[(&fd, &path)],
                    needs,
                    one(WriteOperation::SetTimes)
                );
                let (flags, path) = (cleared.path_flags(path_flags), cleared.take_path(0, path));
                let done = store
                    .data_mut()
                    .filesystem()
                    .set_times_at(cleared.fd(0), flags, path, accessed, modified)
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
                let cleared = cleared_or_refused!(
                    store,
                    &under,
                    Needs::expecting(Expect::Exists),
                    one(WriteOperation::Rename)
                );
                let (from, to) = (
                    cleared.take_path(0, old_path),
                    cleared.take_path(1, new_path),
                );
                let done = store
                    .data_mut()
                    .filesystem()
                    .rename_at(cleared.fd(0), from, cleared.fd(1), to)
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
                    Needs::expecting(Expect::Exists),
                    one(WriteOperation::HardLink)
                );
                let (from, to) = (
                    cleared.take_path(0, old_path),
                    cleared.take_path(1, new_path),
                );
                let done = store
                    .data_mut()
                    .filesystem()
                    .link_at(cleared.fd(0), old_flags, from, cleared.fd(1), to)
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
    fn paths_are_named_by_their_components_and_may_not_climb_out() {
        let names = |path: &str| lexical_names(path);
        assert_eq!(names("a.txt"), Some(vec!["a.txt".to_string()]));
        assert_eq!(
            names("./x/../sub/b"),
            Some(vec!["sub".to_string(), "b".to_string()])
        );
        assert_eq!(names("."), Some(Vec::new()));
        assert_eq!(names(".."), None);
        assert_eq!(names("a/../../b"), None);
        assert_eq!(names("/ws/a"), None);
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
