//! Listing a directory without a `stat` per entry. wasmtime-wasi's `read-directory` asks the
//! file system for each entry's metadata only to learn its type, one `statx` per entry, although
//! the listing (`getdents`) already gives the type: for `find` or `grep -r` over a source tree
//! that was about 40% of the walk. [`list_without_stat`] shadows
//! `[method]descriptor.read-directory`, `[method]directory-entry-stream.read-directory-entry` and
//! the `directory-entry-stream` resource of `wasi:filesystem/types` (wasmtime-wasi's own stream
//! cannot be made from outside it) with a listing that takes each entry's type from the listing,
//! as cap-primitives gives it (it stats an entry only where the file system does not say). The
//! entries, their order, the refusal of a name that is not UTF-8 (`illegal-byte-sequence` for
//! that entry) and every error code are what wasmtime-wasi answers; the listing reads the
//! directory through the descriptor the guest holds, beneath which nothing else is reachable.

use std::sync::Mutex;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime_wasi::filesystem::Descriptor as HostDescriptorValue;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorType, DirectoryEntry, ErrorCode,
};

use crate::asked_writes::AsksWrites;

/// The `wasi:filesystem/types` instance wasmtime-wasi defines.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// A directory's entries, read when the guest asked for the listing, handed out one by one.
pub(crate) struct DirectoryListing(Mutex<std::vec::IntoIter<Result<DirectoryEntry, ErrorCode>>>);

/// Replaces the listing of directories in `linker`, to which WASI p2 must already have been
/// added (see the module documentation). Leaves name shadowing disallowed.
pub(crate) fn list_without_stat<T: AsksWrites + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let defined = define(linker);
    linker.allow_shadowing(false);
    defined
}

fn define<T: AsksWrites + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut instance = linker.instance(FILESYSTEM_TYPES)?;
    instance.resource(
        "directory-entry-stream",
        ResourceType::host::<DirectoryListing>(),
        |mut store: StoreContextMut<'_, T>, rep| {
            store
                .data_mut()
                .ctx()
                .table
                .delete(Resource::<DirectoryListing>::new_own(rep))?;
            Ok(())
        },
    )?;
    instance.func_wrap(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, T>, (fd,): (Resource<Descriptor>,)| {
            let table = store.data_mut().ctx().table;
            let listed = match table.get(&fd)? {
                HostDescriptorValue::Dir(directory) => list(&directory.dir),
                HostDescriptorValue::File(_) => Err(ErrorCode::NotDirectory),
            };
            Ok((match listed {
                Ok(entries) => Ok(table.push(DirectoryListing(Mutex::new(entries.into_iter())))?),
                Err(code) => Err(code),
            },))
        },
    )?;
    instance.func_wrap(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store: StoreContextMut<'_, T>, (stream,): (Resource<DirectoryListing>,)| {
            let listing = store.data_mut().ctx().table.get(&stream)?;
            let next = listing
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .next();
            Ok((next.transpose(),))
        },
    )?;
    Ok(())
}

/// The entries of `directory`, each with the type the listing gives.
fn list(directory: &std::fs::File) -> Result<Vec<Result<DirectoryEntry, ErrorCode>>, ErrorCode> {
    let entries = cap_primitives::fs::read_base_dir(directory).map_err(ErrorCode::from)?;
    Ok(entries
        .map(|entry| {
            let entry = entry.map_err(ErrorCode::from)?;
            let type_ = descriptor_type(entry.file_type().map_err(ErrorCode::from)?);
            let name = entry
                .file_name()
                .into_string()
                .map_err(|_| ErrorCode::IllegalByteSequence)?;
            Ok(DirectoryEntry { type_, name })
        })
        .collect())
}

/// The WASI type of a file type.
fn descriptor_type(kind: cap_primitives::fs::FileType) -> DescriptorType {
    use cap_primitives::fs::FileTypeExt as _;
    if kind.is_dir() {
        DescriptorType::Directory
    } else if kind.is_file() {
        DescriptorType::RegularFile
    } else if kind.is_symlink() {
        DescriptorType::SymbolicLink
    } else if kind.is_fifo() {
        DescriptorType::Fifo
    } else if kind.is_socket() {
        DescriptorType::Socket
    } else if kind.is_char_device() {
        DescriptorType::CharacterDevice
    } else if kind.is_block_device() {
        DescriptorType::BlockDevice
    } else {
        DescriptorType::Unknown
    }
}
