//! The walk's file system inside WASI: `wasi:filesystem` descriptors, called directly.
//!
//! A starting path is resolved as wasi-libc resolves every path of the standard library (its
//! `__wasilibc_find_relpath` with `chdir` linked, which every program using this crate links
//! through [`crate::enter_working_directory`]): a relative path is joined on the current
//! directory, then the preopen whose name (without leading `/` and `./`, `.` being the empty
//! name) is the longest prefix of it, in whole components, is the directory it is opened
//! beneath, the rest of the path relative to it (`.` when nothing is left). Among preopens of
//! the same length the one listed last wins. Errors carry the errno wasi-libc would have set, so
//! the standard library words them as it words its own.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use wasip2::filesystem::preopens::get_directories;
use wasip2::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorStat, DescriptorType, ErrorCode, OpenFlags, PathFlags,
};

use super::resolve::{find_preopen, make_absolute};
use super::{Kind, Listing, Metadata};

/// The first read of a file: a typical source file fits, and a file shorter than a read is read
/// whole with it.
const FIRST_READ_BYTES: u64 = 8 << 10;

/// The largest read asked for at once: the host prepares a zeroed buffer of the size asked, and
/// wasmtime-wasi answers at most 64 KiB per read (`MAX_READ_SIZE_ALLOC`), so that a read shorter
/// than asked is always the end of the file.
const LARGEST_READ_BYTES: u64 = 64 << 10;

/// Most errors in a row a directory listing is read through before it is given up.
const MOST_LISTING_ERRORS_IN_A_ROW: usize = 1024;

/// The starting path: the preopen it lies beneath and the rest of it.
pub(super) struct Root {
    preopen: Descriptor,
    relative: String,
}

/// An open directory.
pub(super) struct Dir(Descriptor);

impl Root {
    pub(super) fn resolve(path: &Path) -> io::Result<Root> {
        // An empty path is the working directory, as wasi-libc makes it.
        let path = utf8(path.as_os_str())?;
        let cwd = std::env::current_dir()?;
        let absolute = make_absolute(path, utf8(cwd.as_os_str())?);
        let preopens = get_directories();
        let names: Vec<&str> = preopens.iter().map(|(_, name)| name.as_str()).collect();
        let Some((index, relative)) = find_preopen(&names, &absolute) else {
            return Err(io::Error::other(format!(
                "failed to find a pre-opened file descriptor through which {path:?} could be opened"
            )));
        };
        let relative = relative.to_string();
        let preopen = preopens
            .into_iter()
            .nth(index)
            .map(|(descriptor, _)| descriptor)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Root { preopen, relative })
    }

    pub(super) fn stat(&self, follow: bool) -> io::Result<Metadata> {
        let flags = if follow {
            PathFlags::SYMLINK_FOLLOW
        } else {
            PathFlags::empty()
        };
        self.preopen
            .stat_at(flags, &self.relative)
            .map(|stat| convert(&stat))
            .map_err(io_error)
    }

    /// Opens the starting directory, following links as `opendir` does.
    pub(super) fn open_dir(&self) -> io::Result<Dir> {
        self.preopen
            .open_at(
                PathFlags::SYMLINK_FOLLOW,
                &self.relative,
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ,
            )
            .map(Dir)
            .map_err(io_error)
    }
}

impl Dir {
    pub(super) fn list(&self) -> io::Result<Listing> {
        let stream = self.0.read_directory().map_err(io_error)?;
        let mut listing = Listing {
            entries: Vec::new(),
            errors: Vec::new(),
        };
        let mut errors_in_a_row = 0;
        loop {
            match stream.read_directory_entry() {
                Ok(Some(entry)) => {
                    errors_in_a_row = 0;
                    if entry.name != "." && entry.name != ".." {
                        listing.entries.push((entry.name.into(), kind(entry.type_)));
                    }
                }
                Ok(None) => break,
                Err(code) => {
                    listing.errors.push(io_error(code));
                    errors_in_a_row += 1;
                    if errors_in_a_row >= MOST_LISTING_ERRORS_IN_A_ROW {
                        break;
                    }
                }
            }
        }
        Ok(listing)
    }

    /// Opens the directory `path` below this one, its last component not followed if a link.
    pub(super) fn open_dir(&self, path: &OsStr) -> io::Result<Dir> {
        self.0
            .open_at(
                PathFlags::empty(),
                utf8(path)?,
                OpenFlags::DIRECTORY,
                DescriptorFlags::READ,
            )
            .map(Dir)
            .map_err(io_error)
    }

    /// Reads the file `name` in this directory to its end; a link is not followed. A read that
    /// returns less than it asked for is the end of a regular file.
    pub(super) fn read_file(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        let file = self
            .0
            .open_at(
                PathFlags::empty(),
                utf8(name)?,
                OpenFlags::empty(),
                DescriptorFlags::READ,
            )
            .map_err(io_error)?;
        let mut asked = FIRST_READ_BYTES;
        let (mut data, end) = file.read(asked, 0).map_err(io_error)?;
        let mut ended = end || (data.len() as u64) < asked;
        while !ended {
            asked = (asked * 2).min(LARGEST_READ_BYTES);
            let (more, end) = file.read(asked, data.len() as u64).map_err(io_error)?;
            ended = end || (more.len() as u64) < asked;
            data.extend_from_slice(&more);
        }
        Ok(data)
    }

    pub(super) fn stat(&self, name: &OsStr) -> io::Result<Metadata> {
        self.0
            .stat_at(PathFlags::empty(), utf8(name)?)
            .map(|stat| convert(&stat))
            .map_err(io_error)
    }

    pub(super) fn is_empty(&self) -> io::Result<bool> {
        let stream = self.0.read_directory().map_err(io_error)?;
        loop {
            match stream.read_directory_entry().map_err(io_error)? {
                Some(entry) if entry.name == "." || entry.name == ".." => {}
                Some(_) => return Ok(false),
                None => return Ok(true),
            }
        }
    }
}

/// The metadata of `path` itself, a link not followed, through the standard library.
pub(super) fn metadata_of_path(path: &Path) -> io::Result<Metadata> {
    let metadata = std::fs::symlink_metadata(path)?;
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        Kind::Symlink
    } else if file_type.is_dir() {
        Kind::Directory
    } else if file_type.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    Ok(Metadata {
        kind,
        len: metadata.len(),
        modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
    })
}

/// Whether the directory at `path` has no entries, through the standard library.
pub(super) fn is_empty_dir_at_path(path: &Path) -> io::Result<bool> {
    Ok(std::fs::read_dir(path)?.next().is_none())
}

fn utf8(text: &OsStr) -> io::Result<&str> {
    text.to_str()
        .ok_or_else(|| io::Error::from_raw_os_error(errno(ErrorCode::IllegalByteSequence)))
}

fn kind(type_: DescriptorType) -> Kind {
    match type_ {
        DescriptorType::RegularFile => Kind::File,
        DescriptorType::Directory => Kind::Directory,
        DescriptorType::SymbolicLink => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn convert(stat: &DescriptorStat) -> Metadata {
    let modified = stat
        .data_modification_timestamp
        .map(|time| SystemTime::UNIX_EPOCH + Duration::new(time.seconds, time.nanoseconds))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    Metadata {
        kind: kind(stat.type_),
        len: stat.size,
        modified,
    }
}

/// `code` as the error the standard library makes of wasi-libc's errno for it.
fn io_error(code: ErrorCode) -> io::Error {
    io::Error::from_raw_os_error(errno(code))
}

/// wasi-libc's errno for `code`, as the preview 1 adapter maps them.
fn errno(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::Access => 2,
        ErrorCode::WouldBlock => 6,
        ErrorCode::Already => 7,
        ErrorCode::BadDescriptor => 8,
        ErrorCode::Busy => 10,
        ErrorCode::Deadlock => 16,
        ErrorCode::Quota => 19,
        ErrorCode::Exist => 20,
        ErrorCode::FileTooLarge => 22,
        ErrorCode::IllegalByteSequence => 25,
        ErrorCode::InProgress => 26,
        ErrorCode::Interrupted => 27,
        ErrorCode::Invalid => 28,
        ErrorCode::Io => 29,
        ErrorCode::IsDirectory => 31,
        ErrorCode::Loop => 32,
        ErrorCode::TooManyLinks => 34,
        ErrorCode::MessageSize => 35,
        ErrorCode::NameTooLong => 37,
        ErrorCode::NoDevice => 43,
        ErrorCode::NoEntry => 44,
        ErrorCode::NoLock => 46,
        ErrorCode::InsufficientMemory => 48,
        ErrorCode::InsufficientSpace => 51,
        ErrorCode::NotDirectory => 54,
        ErrorCode::NotEmpty => 55,
        ErrorCode::NotRecoverable => 56,
        ErrorCode::Unsupported => 58,
        ErrorCode::NoTty => 59,
        ErrorCode::NoSuchDevice => 60,
        ErrorCode::Overflow => 61,
        ErrorCode::NotPermitted => 63,
        ErrorCode::Pipe => 64,
        ErrorCode::ReadOnly => 69,
        ErrorCode::InvalidSeek => 70,
        ErrorCode::TextFileBusy => 74,
        ErrorCode::CrossDevice => 75,
    }
}
