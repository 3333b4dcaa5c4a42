//! The walk's file system outside WASI, where only the unit tests run it: directories are
//! their paths, and every operation goes through `std::fs`.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{Kind, Listing, Metadata};

/// The starting path.
pub(super) struct Root(PathBuf);

/// A directory, by its path.
pub(super) struct Dir(PathBuf);

impl Root {
    pub(super) fn resolve(path: &Path) -> io::Result<Root> {
        Ok(Root(path.to_path_buf()))
    }

    pub(super) fn stat(&self, follow: bool) -> io::Result<Metadata> {
        let metadata = if follow {
            fs::metadata(&self.0)?
        } else {
            fs::symlink_metadata(&self.0)?
        };
        Ok(convert(&metadata))
    }

    pub(super) fn open_dir(&self) -> io::Result<Dir> {
        fs::read_dir(&self.0)?;
        Ok(Dir(self.0.clone()))
    }
}

impl Dir {
    pub(super) fn list(&self) -> io::Result<Listing> {
        let mut listing = Listing {
            entries: Vec::new(),
            errors: Vec::new(),
        };
        for entry in fs::read_dir(&self.0)? {
            let listed = entry.and_then(|entry| Ok((entry.file_name(), entry.file_type()?)));
            match listed {
                Ok((name, file_type)) => listing.entries.push((name, kind(file_type))),
                Err(error) => listing.errors.push(error),
            }
        }
        Ok(listing)
    }

    /// Opens the directory `path` below this one; its last component must not be a link.
    pub(super) fn open_dir(&self, path: &OsStr) -> io::Result<Dir> {
        let joined = self.0.join(path);
        if !fs::symlink_metadata(&joined)?.is_dir() {
            return Err(io::Error::from(io::ErrorKind::NotADirectory));
        }
        Ok(Dir(joined))
    }

    pub(super) fn read_file(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        let path = self.0.join(name);
        if fs::symlink_metadata(&path)?.file_type().is_symlink() {
            return Err(io::Error::other("a symbolic link is not followed"));
        }
        fs::read(path)
    }

    pub(super) fn stat(&self, name: &OsStr) -> io::Result<Metadata> {
        Ok(convert(&fs::symlink_metadata(self.0.join(name))?))
    }

    pub(super) fn is_empty(&self) -> io::Result<bool> {
        Ok(fs::read_dir(&self.0)?.next().is_none())
    }
}

/// The metadata of `path` itself, a link not followed.
pub(super) fn metadata_of_path(path: &Path) -> io::Result<Metadata> {
    Ok(convert(&fs::symlink_metadata(path)?))
}

/// Whether the directory at `path` has no entries.
pub(super) fn is_empty_dir_at_path(path: &Path) -> io::Result<bool> {
    Ok(fs::read_dir(path)?.next().is_none())
}

fn kind(file_type: fs::FileType) -> Kind {
    if file_type.is_symlink() {
        Kind::Symlink
    } else if file_type.is_dir() {
        Kind::Directory
    } else if file_type.is_file() {
        Kind::File
    } else {
        Kind::Other
    }
}

fn convert(metadata: &fs::Metadata) -> Metadata {
    Metadata {
        kind: kind(metadata.file_type()),
        len: metadata.len(),
        modified: metadata.modified().unwrap_or(std::time::UNIX_EPOCH),
    }
}
