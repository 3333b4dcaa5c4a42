//! Small records kept whole — the cron jobs, the channel pairings, the Telegram journal: a
//! [`RecordStore`] holds one serialised record with a version, read again when its version
//! changed and written back whole after a change, at the version read. [`FileRecord`] is a file
//! of the state directory (replaced atomically, kept apart from other clawcage processes by a
//! lock file beside it); a cluster keeps each record in a key-value bucket whose writes compare
//! the version instead of taking a lock, so of two hosts changing a record at once the second is
//! refused and reads again.

use std::fmt;
use std::path::{Path, PathBuf};

/// What [`RecordStore::read`] found.
#[derive(Debug)]
pub enum StoredRecord {
    /// The record is still at the version the caller knows.
    Unchanged,
    /// Nothing is stored yet.
    Missing,
    /// The record, at `version`.
    Found {
        /// The serialised record.
        bytes: Vec<u8>,
        /// Its version, for [`RecordStore::write`] and the next [`RecordStore::read`].
        version: String,
    },
}

/// Why [`RecordStore::write`] stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum RecordWriteError {
    /// Another process changed the record since the version given was read.
    #[error("it was changed meanwhile by another process")]
    Changed,
    /// The store failed; the message says how.
    #[error("{0}")]
    Failed(String),
}

/// A place that keeps one record. Calls are synchronous and short: a file's read or write, or
/// one request to a server.
pub trait RecordStore: Send + Sync + fmt::Debug {
    /// Where the record is, for messages: a path, a bucket's key.
    fn describe(&self) -> String;
    /// A guard held while the record is read, changed and written, keeping other processes'
    /// changes out meanwhile, for a store that needs one (a file); `None` for a store whose
    /// writes compare the version (a bucket). An error says why the guard could not be taken.
    fn hold(&self) -> Result<Option<Box<dyn Send>>, String>;
    /// The record as stored, unless it is still at version `known`.
    fn read(&self, known: Option<&str>) -> Result<StoredRecord, String>;
    /// Stores `bytes` as the record, if it is still at version `expected` (`None`: nothing was
    /// stored); returns the new version.
    fn write(&self, bytes: &[u8], expected: Option<&str>) -> Result<String, RecordWriteError>;
}

/// A record in a file, kept apart from other processes by a lock file beside it.
#[derive(Debug, Clone)]
pub struct FileRecord {
    file: PathBuf,
    max_bytes: u64,
    private: bool,
}

impl FileRecord {
    /// The record in `file` (its directory is created when first written), read up to
    /// `max_bytes`; `private` files are written with mode 0600.
    pub fn new(file: PathBuf, max_bytes: u64, private: bool) -> Self {
        Self {
            file,
            max_bytes,
            private,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.file
    }
}

impl RecordStore for FileRecord {
    fn describe(&self) -> String {
        self.file.display().to_string()
    }

    fn hold(&self) -> Result<Option<Box<dyn Send>>, String> {
        let path = self.file.with_extension("lock");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|file| file.lock().map(|()| file))
            .map_err(|error| format!("cannot lock {}: {error}", path.display()))?;
        Ok(Some(Box::new(file)))
    }

    fn read(&self, known: Option<&str>) -> Result<StoredRecord, String> {
        let Some(stamp) = file_stamp(&self.file) else {
            return Ok(StoredRecord::Missing);
        };
        if known == Some(stamp.as_str()) {
            return Ok(StoredRecord::Unchanged);
        }
        match crate::files::read_regular_file(
            &self.file,
            self.max_bytes,
            crate::files::Symlinks::Refuse,
        ) {
            Ok(bytes) => Ok(StoredRecord::Found {
                bytes,
                version: stamp,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(StoredRecord::Missing),
            Err(error) => Err(format!("cannot read {}: {error}", self.file.display())),
        }
    }

    /// Writes atomically ([`crate::files::write_atomically`]); the lock of
    /// [`RecordStore::hold`] keeps other processes out, so `expected` is not compared.
    fn write(&self, bytes: &[u8], _expected: Option<&str>) -> Result<String, RecordWriteError> {
        crate::files::write_atomically(&self.file, bytes, self.private).map_err(|error| {
            RecordWriteError::Failed(format!("cannot write {}: {error}", self.file.display()))
        })?;
        file_stamp(&self.file).ok_or_else(|| {
            RecordWriteError::Failed(format!("{} is gone after writing it", self.file.display()))
        })
    }
}

/// What identifies one version of a file: its modified time, length and (on Unix) inode, which
/// every atomic replacement changes. `None` when it does not exist.
fn file_stamp(file: &Path) -> Option<String> {
    let metadata = std::fs::metadata(file).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    let modified = metadata
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{modified}:{}:{inode}", metadata.len()))
}

/// Reads `store`'s record, lets `change` change it, and writes it back when `change` says it
/// changed something, at the version read; when another process wrote meanwhile, reads and
/// decides again after a short pause (at most 20 times, a few hundred milliseconds in all). `parse` turns the stored bytes into the record (nothing
/// stored is `R::default()`), `encode` back.
pub fn read_change_write<R: Default, T>(
    store: &dyn RecordStore,
    parse: impl Fn(&[u8]) -> Result<R, String>,
    encode: impl Fn(&R) -> Result<Vec<u8>, String>,
    mut change: impl FnMut(&mut R) -> (T, bool),
) -> Result<T, String> {
    const TRIES: u32 = 20;
    for tried in 0..TRIES {
        if tried > 0 {
            // Writers that keep meeting each other step apart: a pause that grows, with jitter.
            let jitter = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| now.subsec_nanos() % 5_000_000);
            std::thread::sleep(std::time::Duration::from_nanos(
                u64::from(tried.min(10)) * 2_000_000 + u64::from(jitter),
            ));
        }
        let _guard = store.hold()?;
        let (mut record, version) = match store.read(None)? {
            StoredRecord::Found { bytes, version } => (parse(&bytes)?, Some(version)),
            StoredRecord::Missing | StoredRecord::Unchanged => (R::default(), None),
        };
        let (value, changed) = change(&mut record);
        if !changed {
            return Ok(value);
        }
        match store.write(&encode(&record)?, version.as_deref()) {
            Ok(_) => return Ok(value),
            Err(RecordWriteError::Changed) => continue,
            Err(RecordWriteError::Failed(reason)) => return Err(reason),
        }
    }
    Err(format!(
        "{} kept changing under this change ({TRIES} tries); try again",
        store.describe()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "tests fail by panicking"
    )]

    use super::*;

    #[test]
    fn a_file_record_is_read_again_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileRecord::new(dir.path().join("sub/record.json"), 1 << 20, true);
        assert!(matches!(store.read(None).unwrap(), StoredRecord::Missing));
        let version = store.write(b"one", None).unwrap();
        assert!(matches!(
            store.read(Some(&version)).unwrap(),
            StoredRecord::Unchanged
        ));
        std::thread::sleep(std::time::Duration::from_millis(5));
        let other = FileRecord::new(dir.path().join("sub/record.json"), 1 << 20, true);
        other.write(b"two", Some(&version)).unwrap();
        match store.read(Some(&version)).unwrap() {
            StoredRecord::Found { bytes, .. } => assert_eq!(bytes, b"two"),
            other => panic!("the change is seen: {other:?}"),
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(store.path())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn read_change_write_counts_from_nothing_and_keeps_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileRecord::new(dir.path().join("count"), 1 << 20, false);
        let parse = |bytes: &[u8]| {
            String::from_utf8_lossy(bytes)
                .parse::<u64>()
                .map_err(|error| error.to_string())
        };
        let encode = |count: &u64| Ok(count.to_string().into_bytes());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        read_change_write(&store, parse, encode, |count: &mut u64| {
                            *count += 1;
                            ((), true)
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let total = read_change_write(&store, parse, encode, |count: &mut u64| (*count, false));
        assert_eq!(total.unwrap(), 100, "no change lost under the lock");
    }
}
