//! The small records every gateway host of a cluster shares, each kept whole under one key of the
//! `claw_state` bucket: the cron jobs ([`CRON_RECORD`]), the channel pairings
//! ([`PAIRING_RECORD`]), the Telegram journal ([`TELEGRAM_RECORD`]) and the allow-always
//! approvals ([`APPROVALS_RECORD`]), each a
//! [`RecordStore`]. A write names the revision it read, so of two hosts changing a record at
//! once the second is refused and reads again, and a host that lost the active gateway's lease
//! but writes on (the Telegram poller) is refused by the server.
//!
//! A cron slot is fired once across hosts: the host that fires delivers the firing into its
//! session's inbox under the slot's key (which the shared inbox recognises when it comes again)
//! before it moves the job on here, so a host that takes over after a crash between the two
//! fires the slot again and the inbox takes it once.
//!
//! The stores are called synchronously (the `cron` tool's import is synchronous), so the bucket
//! is reached through a runtime and connection of its own, like the transcripts: a caller blocks
//! on a channel, never on the runtime it may be running on.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use clawcage_core::records::{RecordStore, RecordWriteError, StoredRecord};

use crate::subject_log::{Worker, cluster_error, setup_limit};
use crate::{Cluster, ClusterError, ClusterOptions};

/// The bucket of the shared records.
pub const STATE_BUCKET: &str = "claw_state";

/// The key of the cron jobs.
pub const CRON_RECORD: &str = "cron";
/// The key of the channel pairings.
pub const PAIRING_RECORD: &str = "pairing";
/// The key of the Telegram journal (the poller's offset and the updates not yet answered).
pub const TELEGRAM_RECORD: &str = "telegram";
/// The key of the allow-always approvals.
pub const APPROVALS_RECORD: &str = "approvals";
/// The key of the day's token count (`[budget] daily_tokens`).
pub const BUDGET_RECORD: &str = "budget";

/// The bucket of keys taken once (a webhook's signature): an entry lives two days, longer than
/// any replay window can need (a timestamp at most a day either way of the clock).
pub const ONCE_BUCKET: &str = "claw_once";

/// How long a key taken once stays taken.
const ONCE_KEPT: Duration = Duration::from_secs(49 * 3600);

/// The largest record written: under the server's default largest message (1 MiB) with room
/// for the headers.
const MAX_RECORD: usize = 1_000_000;

/// The cluster's `claw_state` bucket, reached through a runtime of its own; hands out one
/// [`KvRecord`] per key.
#[derive(Clone)]
pub struct KvRecords {
    bucket: kv::Store,
    once: kv::Store,
    worker: Arc<Worker>,
    /// How long a caller waits for an answer.
    limit: Duration,
}

impl std::fmt::Debug for KvRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvRecords").finish_non_exhaustive()
    }
}

impl KvRecords {
    /// Connects to `url` with `options` on a runtime of its own and opens (creating it if
    /// needed) the bucket. Blocks: call it from a blocking thread.
    pub fn connect(url: &str, options: &ClusterOptions) -> Result<Self, ClusterError> {
        let what = format!("the key-value bucket {STATE_BUCKET}");
        let worker = Worker::start_for("clawcage-records", url, &what)?;
        let (url_owned, options_owned) = (url.to_string(), options.clone());
        let (bucket, once) = worker
            .run(setup_limit(options), async move {
                let cluster = Cluster::connect(&url_owned, &options_owned)
                    .await
                    .map_err(std::io::Error::other)?;
                let bucket = crate::open_bucket(
                    &cluster.context,
                    &options_owned,
                    STATE_BUCKET,
                    "clawcage: what every gateway host shares: cron jobs, pairings, the Telegram journal, approvals",
                    Duration::ZERO,
                )
                .await
                .map_err(|(_, reason)| std::io::Error::other(reason))?;
                let once = crate::open_bucket(
                    &cluster.context,
                    &options_owned,
                    ONCE_BUCKET,
                    "clawcage: keys taken once across hosts (webhook signatures against replays)",
                    ONCE_KEPT,
                )
                .await
                .map_err(|(_, reason)| std::io::Error::other(reason))?;
                Ok((bucket, once))
            })
            .map_err(|error| cluster_error(error, url, &what))?;
        Ok(Self {
            bucket,
            once,
            worker: Arc::new(worker),
            limit: options.request_timeout + Duration::from_secs(1),
        })
    }

    /// Takes `key` (letters, digits, `-`, `_`, `.`) for good: true for the first host that
    /// asks, false for every later ask, on any host, for two days. Blocks for one round trip.
    /// The key is created with a value of this ask's own, so a try whose answer was lost is
    /// recognised as this ask's when it is refused on the next try.
    pub fn take_once(&self, key: &str) -> Result<bool, String> {
        let (once, key_owned) = (self.once.clone(), key.to_string());
        let mine = bytes::Bytes::from(crate::subject_log::writer_nonce());
        let taken = self
            .worker
            .run(self.limit, async move {
                crate::subject_log::patiently(|| async {
                    match once.create(&key_owned, mine.clone()).await {
                        Ok(_) => Ok(true),
                        Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                            let stored = once
                                .get(&key_owned)
                                .await
                                .map_err(|error| error.to_string())?;
                            Ok(stored.as_ref() == Some(&mine))
                        }
                        Err(error) => Err(error.to_string()),
                    }
                })
                .await
                .map_err(std::io::Error::other)
            })
            .map_err(|error| format!("the cluster's {ONCE_BUCKET} bucket: {error}"))?;
        Ok(taken)
    }

    /// The record under `key`.
    pub fn record(&self, key: &str) -> KvRecord {
        KvRecord {
            records: self.clone(),
            key: key.to_string(),
        }
    }
}

/// One record of the `claw_state` bucket.
#[derive(Debug, Clone)]
pub struct KvRecord {
    records: KvRecords,
    key: String,
}

/// A revision given as a [`RecordStore`] version; anything else is no revision.
fn revision(version: Option<&str>) -> Option<u64> {
    version.and_then(|version| version.parse().ok())
}

impl RecordStore for KvRecord {
    fn describe(&self) -> String {
        format!("the cluster's {STATE_BUCKET} record {}", self.key)
    }

    fn hold(&self) -> Result<Option<Box<dyn Send>>, String> {
        Ok(None)
    }

    fn read(&self, known: Option<&str>) -> Result<StoredRecord, String> {
        let (bucket, key, known) = (
            self.records.bucket.clone(),
            self.key.clone(),
            revision(known),
        );
        self.records
            .worker
            .run(self.records.limit, async move {
                read(&bucket, &key, known).await
            })
            .map_err(|error| format!("{}: {error}", self.describe()))
    }

    fn write(&self, bytes: &[u8], expected: Option<&str>) -> Result<String, RecordWriteError> {
        if bytes.len() > MAX_RECORD {
            return Err(RecordWriteError::Failed(format!(
                "{} would take {} KB, more than one record holds ({} KB); remove entries from it",
                self.describe(),
                bytes.len() / 1000,
                MAX_RECORD / 1000
            )));
        }
        let (bucket, key, bytes, expected) = (
            self.records.bucket.clone(),
            self.key.clone(),
            bytes.to_vec(),
            revision(expected),
        );
        let written = self
            .records
            .worker
            .run(self.records.limit, async move {
                Ok(write(&bucket, &key, bytes, expected).await)
            })
            .map_err(|error| RecordWriteError::Failed(format!("{}: {error}", self.describe())))?;
        written.map_err(|error| match error {
            RecordWriteError::Failed(reason) => {
                RecordWriteError::Failed(format!("{}: {reason}", self.describe()))
            }
            changed => changed,
        })
    }
}

async fn read(bucket: &kv::Store, key: &str, known: Option<u64>) -> std::io::Result<StoredRecord> {
    let entry = crate::subject_log::patiently(|| async {
        bucket.entry(key).await.map_err(|error| error.to_string())
    })
    .await
    .map_err(|error| std::io::Error::other(format!("cannot read it: {error}")))?;
    Ok(match entry {
        Some(entry) if entry.operation == kv::Operation::Put => {
            if known == Some(entry.revision) {
                StoredRecord::Unchanged
            } else {
                StoredRecord::Found {
                    bytes: entry.value.to_vec(),
                    version: entry.revision.to_string(),
                }
            }
        }
        _ => StoredRecord::Missing,
    })
}

/// Writes `bytes` under `key` at revision `expected` (`None`: only if absent). A refusal that
/// follows a try whose answer was lost (a timeout while the servers elected a leader) may be this
/// very write, stored by that try: it is taken as this write's when the record now holds exactly
/// these bytes. A refusal at the first try is always another writer's.
async fn write(
    bucket: &kv::Store,
    key: &str,
    bytes: Vec<u8>,
    expected: Option<u64>,
) -> Result<String, RecordWriteError> {
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let written = crate::subject_log::patiently(|| async {
        tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match expected {
            Some(revision) => bucket
                .update(key, bytes.clone().into(), revision)
                .await
                .map(Some)
                .or_else(|error| match error.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                    _ => Err(error.to_string()),
                }),
            None => bucket
                .create(key, bytes.clone().into())
                .await
                .map(Some)
                .or_else(|error| match error.kind() {
                    kv::CreateErrorKind::AlreadyExists => Ok(None),
                    _ => Err(error.to_string()),
                }),
        }
    })
    .await
    .map_err(|reason| RecordWriteError::Failed(format!("cannot write it: {reason}")))?;
    if let Some(revision) = written {
        return Ok(revision.to_string());
    }
    if tries.load(std::sync::atomic::Ordering::Relaxed) == 1 {
        return Err(RecordWriteError::Changed);
    }
    // Refused after a lost answer: another writer's record, or this very write.
    match read(bucket, key, None).await {
        Ok(StoredRecord::Found {
            bytes: stored,
            version,
        }) if stored == bytes => Ok(version),
        _ => Err(RecordWriteError::Changed),
    }
}
