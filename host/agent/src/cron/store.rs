//! Where a cron service keeps its jobs: a [`JobsStore`] holds the whole set of jobs as one
//! serialised record with a version, read again when its version changed and written back after
//! every change. [`FileJobs`] is the state directory's `jobs.json` (rewritten atomically, kept
//! apart from other clawcage processes by a lock file beside it); a cluster keeps the record in
//! a key-value bucket whose writes compare the version instead of taking a lock.

use std::fmt;
use std::path::{Path, PathBuf};

/// What [`JobsStore::read`] found.
#[derive(Debug)]
pub enum StoredJobs {
    /// The record is still at the version the caller knows.
    Unchanged,
    /// Nothing is stored (no job was ever added).
    Missing,
    /// The record, at `version`.
    Found {
        /// The serialised jobs.
        bytes: Vec<u8>,
        /// Its version, for [`JobsStore::write`] and the next [`JobsStore::read`].
        version: String,
    },
}

/// Why [`JobsStore::write`] stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum JobsWriteError {
    /// Another process changed the jobs since the version given was read.
    #[error("the jobs were changed meanwhile by another process")]
    Changed,
    /// The store failed; the message says how.
    #[error("{0}")]
    Failed(String),
}

/// A place that keeps a cron service's jobs. Calls are synchronous (the `cron` tool's import is)
/// and short: a file's read or write, or one request to a server.
pub trait JobsStore: Send + Sync + fmt::Debug {
    /// Where the jobs are, for messages: a path, a bucket.
    fn describe(&self) -> String;
    /// A guard held while the jobs are read, changed and written, keeping other processes'
    /// changes out meanwhile, for a store that needs one (a file); `None` for a store whose
    /// writes compare the version (a bucket).
    fn hold(&self) -> Option<Box<dyn Send>>;
    /// The jobs as stored, unless they are still at version `known`.
    fn read(&self, known: Option<&str>) -> Result<StoredJobs, String>;
    /// Stores `bytes` as the jobs, if they are still at version `expected` (`None`: nothing was
    /// stored); returns the new version.
    fn write(&self, bytes: &[u8], expected: Option<&str>) -> Result<String, JobsWriteError>;
}

/// The file the jobs are kept in, inside the cron directory.
pub const JOBS_FILE: &str = "jobs.json";

/// The largest jobs file read (100 jobs of 4,000 characters are well under it).
const MAX_JOBS_FILE: u64 = 64 << 20;

/// The jobs in a directory's `jobs.json`, kept apart from other processes by `jobs.lock`.
#[derive(Debug, Clone)]
pub struct FileJobs {
    file: PathBuf,
}

impl FileJobs {
    /// The jobs of `dir` (which must exist).
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            file: dir.join(JOBS_FILE),
        }
    }
}

impl JobsStore for FileJobs {
    fn describe(&self) -> String {
        self.file.display().to_string()
    }

    fn hold(&self) -> Option<Box<dyn Send>> {
        let path = self.file.with_extension("lock");
        let locked = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|file| file.lock().map(|()| file));
        match locked {
            Ok(file) => Some(Box::new(file)),
            Err(error) => {
                // This process's own mutex still orders its own changes.
                tracing::warn!(path = %path.display(), %error, "cannot lock the cron jobs file");
                None
            }
        }
    }

    fn read(&self, known: Option<&str>) -> Result<StoredJobs, String> {
        let Some(stamp) = file_stamp(&self.file) else {
            return Ok(StoredJobs::Missing);
        };
        if known == Some(stamp.as_str()) {
            return Ok(StoredJobs::Unchanged);
        }
        match clawcage_core::files::read_regular_file(
            &self.file,
            MAX_JOBS_FILE,
            clawcage_core::files::Symlinks::Refuse,
        ) {
            Ok(bytes) => Ok(StoredJobs::Found {
                bytes,
                version: stamp,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(StoredJobs::Missing),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Writes atomically (`clawcage_core::files::write_atomically`: a synced temporary file
    /// renamed over the old one, the directory synced); the lock of [`JobsStore::hold`] keeps
    /// other processes out, so `expected` is not compared.
    fn write(&self, bytes: &[u8], _expected: Option<&str>) -> Result<String, JobsWriteError> {
        clawcage_core::files::write_atomically(&self.file, bytes, false)
            .map_err(|error| JobsWriteError::Failed(error.to_string()))?;
        file_stamp(&self.file).ok_or_else(|| {
            JobsWriteError::Failed(format!("{} is gone after writing it", self.file.display()))
        })
    }
}

/// What identifies one version of the jobs file: its modified time, length and (on Unix) inode,
/// which every atomic replacement changes. `None` when it does not exist.
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
