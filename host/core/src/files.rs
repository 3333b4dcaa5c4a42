//! Host-side file helpers every crate shares, so each rule lives in one place: reading a file the
//! host must trust to be a plain file (configuration, manifests, state) without ever blocking on
//! a FIFO or a device and without reading more than a cap, and replacing a file atomically with
//! the file and its directory synced, so a crash leaves either the old or the new content.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How [`read_regular_file`] treats a symlink at `path` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Follow it (the operator named the file, e.g. `--config`).
    Follow,
    /// Refuse it: the file lies where a tool could have planted a link to a host file.
    Refuse,
}

/// Reads `path`, which must be a regular file of at most `max_bytes` bytes.
///
/// The file is opened non-blocking, so a FIFO (whose plain open waits for a writer forever) or a
/// device is refused at once instead of hanging the caller; anything but a regular file is an
/// error of kind `InvalidInput` naming what it is. With [`Symlinks::Refuse`] a symlink at `path`
/// is refused too. The error never contains the file's content.
pub fn read_regular_file(path: &Path, max_bytes: u64, symlinks: Symlinks) -> io::Result<Vec<u8>> {
    let (file, metadata) = open_regular_file(path, symlinks)?;
    read_opened(file, &metadata, path, max_bytes)
}

/// Opens `path` as [`read_regular_file`] does (non-blocking, no controlling terminal, a symlink
/// refused with [`Symlinks::Refuse`]) and returns it with its metadata, taken from the open file:
/// for a caller that must know that what it checks and what it reads are the same file.
pub fn open_regular_file(path: &Path, symlinks: Symlinks) -> io::Result<(File, std::fs::Metadata)> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
        if symlinks == Symlinks::Refuse {
            flags |= libc::O_NOFOLLOW;
        }
        options.custom_flags(flags);
    }
    let file = options.open(path).map_err(|error| {
        if symlinks == Symlinks::Refuse && error.raw_os_error() == Some(libc_eloop()) {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link; clawcage does not follow links here (a tool could have planted it): replace it with the file itself",
                    path.display()
                ),
            )
        } else {
            error
        }
    })?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file; clawcage reads only regular files here",
                path.display(),
                describe_file_type(&metadata.file_type())
            ),
        ));
    }
    Ok((file, metadata))
}

/// Reads the whole of `file`, opened by [`open_regular_file`] from `path`, if it holds at most
/// `max_bytes` bytes.
pub fn read_opened(
    file: File,
    metadata: &std::fs::Metadata,
    path: &Path,
    max_bytes: u64,
) -> io::Result<Vec<u8>> {
    if metadata.len() > max_bytes {
        return Err(too_large(path, max_bytes));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(path, max_bytes));
    }
    Ok(bytes)
}

/// [`read_regular_file`] decoded as UTF-8 (an error of kind `InvalidData` otherwise).
pub fn read_regular_text(path: &Path, max_bytes: u64, symlinks: Symlinks) -> io::Result<String> {
    let bytes = read_regular_file(path, max_bytes, symlinks)?;
    String::from_utf8(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

#[cfg(unix)]
fn libc_eloop() -> i32 {
    libc::ELOOP
}

#[cfg(not(unix))]
fn libc_eloop() -> i32 {
    -1
}

fn too_large(path: &Path, max_bytes: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is larger than {max_bytes} bytes, the most clawcage reads here",
            path.display()
        ),
    )
}

/// What kind of file `file_type` is, as a phrase ("a FIFO", "a directory").
pub fn describe_file_type(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// Append `bytes` to `path`, creating it readable by its owner only (0600 on Unix), and flush
/// them to the disk when `sync`. For files that only ever grow (transcripts, inboxes).
pub fn append_private(path: &Path, bytes: &[u8], sync: bool) -> io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    std::io::Write::write_all(&mut file, bytes)?;
    if sync {
        file.sync_data()?;
    }
    Ok(file)
}

/// Replaces `path` with `bytes` atomically: the bytes go to a new temporary file in the same
/// directory, which is synced, renamed over `path`, and then the directory is synced, so after a
/// crash `path` holds either its old content or the new one, never a mix. On Unix a new file is
/// readable by its owner only when `private` is set.
pub fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&directory)?;
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_string());
    let temporary = directory.join(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let written = (|| {
        let mut file = options.open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    sync_directory(&directory)
}

/// Makes a rename or creation in `directory` durable (a no-op where directories cannot be
/// opened for syncing).
pub fn sync_directory(directory: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(directory)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = directory;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_within_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.toml");
        std::fs::write(&path, "x = 1\n").unwrap();
        assert_eq!(
            read_regular_text(&path, 100, Symlinks::Refuse).unwrap(),
            "x = 1\n"
        );
        let error = read_regular_file(&path, 3, Symlinks::Follow).unwrap_err();
        assert!(error.to_string().contains("larger than 3 bytes"), "{error}");
        assert!(!error.to_string().contains("x = 1"));
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_at_once_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        let error = read_regular_file(&path, 100, Symlinks::Follow).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("FIFO"), "{error}");
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_is_refused_when_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("secret");
        std::fs::write(&target, "top secret").unwrap();
        let link = dir.path().join("clawcage.toml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let error = read_regular_file(&link, 100, Symlinks::Refuse).unwrap_err();
        assert!(error.to_string().contains("symbolic link"), "{error}");
        assert!(!error.to_string().contains("top secret"));
        assert_eq!(
            read_regular_file(&link, 100, Symlinks::Follow).unwrap(),
            b"top secret"
        );
        let directory = read_regular_file(dir.path(), 100, Symlinks::Follow).unwrap_err();
        assert!(directory.to_string().contains("a directory"), "{directory}");
    }

    #[test]
    fn atomic_writes_replace_the_whole_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("jobs.json");
        write_atomically(&path, b"first", true).unwrap();
        write_atomically(&path, b"second", true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
