//! The cron jobs of a cluster: one record (`jobs`) in the `claw_cron` key-value bucket, the
//! agent's [`JobsStore`] over it. Every gateway host reads the same jobs; a write names the
//! revision it read, so of two hosts changing the jobs at once the second is refused and reads
//! again. A slot is fired once across hosts: the host that fires delivers the firing into its
//! session's inbox under the slot's key (which the shared inbox recognises when it comes
//! again) before it moves the job on here, so a host that takes over after a crash between the
//! two fires the slot again and the inbox takes it once.
//!
//! The cron service calls its store synchronously (the `cron` tool's import is synchronous), so
//! the bucket is reached through a runtime and connection of its own, like the transcripts: a
//! caller blocks on a channel, never on the runtime it may be running on.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use clawcage_agent::cron::{JobsStore, JobsWriteError, StoredJobs};

use crate::subject_log::{Worker, cluster_error, setup_limit};
use crate::{Cluster, ClusterError, ClusterOptions};

/// The bucket of the cron jobs.
pub const CRON_BUCKET: &str = "claw_cron";

/// The record that holds every job.
const JOBS_KEY: &str = "jobs";

/// The largest record written: under the server's default largest message (1 MiB) with room
/// for the headers.
const MAX_RECORD: usize = 1_000_000;

/// The cron jobs in the cluster's `claw_cron` bucket.
pub struct KvJobs {
    bucket: kv::Store,
    worker: Arc<Worker>,
    /// Where, for messages.
    place: String,
    /// How long a caller waits for an answer.
    limit: Duration,
}

impl KvJobs {
    /// Connects to `url` with `options` on a runtime of its own and opens (creating it if
    /// needed) the cron bucket. Blocks: call it from a blocking thread.
    pub fn connect(url: &str, options: &ClusterOptions) -> Result<Self, ClusterError> {
        let what = format!("the key-value bucket {CRON_BUCKET}");
        let worker = Worker::start("clawcage-cron").map_err(|error| {
            cluster_error(
                std::io::Error::other(format!("cannot start its runtime: {error}")),
                url,
                &what,
            )
        })?;
        let (url_owned, options_owned) = (url.to_string(), options.clone());
        let bucket = worker
            .run(setup_limit(options), async move {
                let cluster = Cluster::connect(&url_owned, &options_owned)
                    .await
                    .map_err(std::io::Error::other)?;
                crate::open_bucket(
                    &cluster.context,
                    &options_owned,
                    CRON_BUCKET,
                    "clawcage: the cron jobs the active gateway fires",
                    Duration::ZERO,
                )
                .await
                .map_err(|(_, reason)| std::io::Error::other(reason))
            })
            .map_err(|error| cluster_error(error, url, &what))?;
        Ok(Self {
            bucket,
            worker: Arc::new(worker),
            place: format!("the cluster's {CRON_BUCKET} bucket"),
            limit: options.request_timeout + Duration::from_secs(1),
        })
    }
}

impl std::fmt::Debug for KvJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvJobs")
            .field("place", &self.place)
            .finish()
    }
}

/// A revision given as a [`JobsStore`] version; anything else is no revision.
fn revision(version: Option<&str>) -> Option<u64> {
    version.and_then(|version| version.parse().ok())
}

impl JobsStore for KvJobs {
    fn describe(&self) -> String {
        self.place.clone()
    }

    fn hold(&self) -> Option<Box<dyn Send>> {
        None
    }

    fn read(&self, known: Option<&str>) -> Result<StoredJobs, String> {
        let (bucket, known) = (self.bucket.clone(), revision(known));
        self.worker
            .run(self.limit, async move { read(&bucket, known).await })
            .map_err(|error| error.to_string())
    }

    fn write(&self, bytes: &[u8], expected: Option<&str>) -> Result<String, JobsWriteError> {
        if bytes.len() > MAX_RECORD {
            return Err(JobsWriteError::Failed(format!(
                "the jobs take {} KB, more than one record of {} holds ({} KB); remove jobs or shorten their messages",
                bytes.len() / 1000,
                self.place,
                MAX_RECORD / 1000
            )));
        }
        let (bucket, bytes, expected) = (self.bucket.clone(), bytes.to_vec(), revision(expected));
        self.worker
            .run(self.limit, async move {
                Ok(write(&bucket, bytes, expected).await)
            })
            .map_err(|error| JobsWriteError::Failed(error.to_string()))?
    }
}

async fn read(bucket: &kv::Store, known: Option<u64>) -> std::io::Result<StoredJobs> {
    let entry = bucket
        .entry(JOBS_KEY)
        .await
        .map_err(|error| std::io::Error::other(format!("cannot read the cron jobs: {error}")))?;
    Ok(match entry {
        Some(entry) if entry.operation == kv::Operation::Put => {
            if known == Some(entry.revision) {
                StoredJobs::Unchanged
            } else {
                StoredJobs::Found {
                    bytes: entry.value.to_vec(),
                    version: entry.revision.to_string(),
                }
            }
        }
        _ => StoredJobs::Missing,
    })
}

async fn write(
    bucket: &kv::Store,
    bytes: Vec<u8>,
    expected: Option<u64>,
) -> Result<String, JobsWriteError> {
    let written = match expected {
        Some(revision) => bucket
            .update(JOBS_KEY, bytes.into(), revision)
            .await
            .map_err(|error| match error.kind() {
                kv::UpdateErrorKind::WrongLastRevision => JobsWriteError::Changed,
                _ => JobsWriteError::Failed(format!("cannot write the cron jobs: {error}")),
            }),
        None => bucket
            .create(JOBS_KEY, bytes.into())
            .await
            .map_err(|error| match error.kind() {
                kv::CreateErrorKind::AlreadyExists => JobsWriteError::Changed,
                _ => JobsWriteError::Failed(format!("cannot write the cron jobs: {error}")),
            }),
    };
    written.map(|revision| revision.to_string())
}
