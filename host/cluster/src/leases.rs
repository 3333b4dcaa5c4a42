//! Who owns what across gateway hosts. A lease is a key of the `claw_leases` key-value bucket
//! (`part.<p>` for lane partition `p`, `cron`, `telegram`) whose value names its holder (host id
//! and incarnation). It is taken with a revision-checked `create` (of racing hosts exactly one
//! wins), renewed with an `update` expecting the revision the holder last wrote, and given back
//! with a delete expecting it too. The bucket's `max_age` is the lease's time to live: a holder
//! that stops renewing loses its key after [`ClusterOptions::lease_ttl`], and the next `create`
//! succeeds. The revision `create` returned is the lease's **epoch**: key-value revisions grow
//! across the whole bucket, so a later holder always has a larger epoch, which the writes it
//! makes carry as their fencing token. A renewal after the key expired or was taken fails on the
//! server (the expected revision no longer matches), so a stale holder learns it lost the lease
//! rather than believing it still holds it; and a holder that could not renew within
//! [`SELF_FENCE_FRACTION`] of the time to live ([`Lease::is_fresh`]) stops on its own before anyone
//! else can take over. Placement is rendezvous hashing ([`placement`]): each partition goes to
//! the live host with the highest hash of (host, partition), so a host leaving moves only its own
//! partitions. Live hosts announce themselves in `claw_hosts` ([`Leases::announce`]), a bucket
//! whose entries expire after three times the lease's time to live. Design: the scale-out notes,
//! §2.3 and §2.5.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ClusterOptions;
use crate::keys::{token, unescape};

/// The bucket of leases.
pub const LEASES_BUCKET: &str = "claw_leases";

/// The bucket of live hosts.
pub const HOSTS_BUCKET: &str = "claw_hosts";

/// The lease the active gateway of an active/standby cluster holds (it serves every partition).
pub const GATEWAY_LEASE: &str = "gateway";

/// Lane partitions of a cluster: sessions are spread over this many leases.
pub const PARTITIONS: u32 = 64;

/// A holder that has not renewed within this fraction of the time to live treats its lease as
/// lost (7 s of the default 10 s), so it stops before another host can take the lease over.
pub const SELF_FENCE_FRACTION: f64 = 0.7;

/// How many times [`Leases::release_own`] reads a lease again when a late renewal moved it on.
const RELEASE_OWN_ATTEMPTS: usize = 4;

/// The lane partition `session_key` belongs to: the first four bytes of its SHA-256, big-endian,
/// modulo [`PARTITIONS`]; every host computes the same.
pub fn partition_of(session_key: &str) -> u32 {
    let digest = Sha256::digest(session_key.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % PARTITIONS
}

/// The key of partition `partition`'s lease.
pub fn partition_lease(partition: u32) -> String {
    format!("part.{partition}")
}

/// Who holds a lease: a host and the incarnation of its process (a restarted host is another
/// holder, so it never mistakes its predecessor's lease for its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The host's id (`[cluster] host_id`).
    pub host: String,
    /// Unique to one start of that host.
    pub incarnation: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.host, self.incarnation)
    }
}

/// A live host as `claw_hosts` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRecord {
    /// Who it is.
    pub holder: Holder,
    /// Where its clients connect (its gateway's URL), if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When this start of it began, in milliseconds since the Unix epoch.
    pub started_ms: u64,
}

/// A lease this host holds.
#[derive(Debug, Clone)]
pub struct Lease {
    name: String,
    epoch: u64,
    revision: u64,
    renewed: Instant,
    fresh_for: Duration,
}

impl Lease {
    /// The lease's key (`part.7`, `cron`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token: the revision the lease was taken at. A later holder's is larger.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether it was renewed recently enough to act on: false once [`SELF_FENCE_FRACTION`] of
    /// the time to live has passed since the last renewal (the holder must stop working under
    /// it, and take it again to go on).
    pub fn is_fresh(&self) -> bool {
        self.renewed.elapsed() < self.fresh_for
    }

    /// When it stops being fresh unless renewed before: [`SELF_FENCE_FRACTION`] of the time to
    /// live after the last renewal was sent. The holder's writes must stop by then.
    pub fn fresh_until(&self) -> Instant {
        self.renewed + self.fresh_for
    }
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The lease is no longer this host's: it expired, or another host holds it now.
    #[error(
        "the lease {name} is lost{}; stop working under it and take it again",
        holder.as_ref().map(|holder| format!(" (held by {holder} now)")).unwrap_or_default()
    )]
    Lost {
        /// The lease.
        name: String,
        /// Who holds it now, if anyone.
        holder: Option<Holder>,
    },
    /// The store did not answer.
    #[error(
        "the lease {name}: the NATS key-value store did not answer: {reason}; check that the NATS servers run and are reachable"
    )]
    Store {
        /// The lease.
        name: String,
        /// Why.
        reason: String,
    },
}

/// The leases and the live hosts of a cluster, as one host sees them. Cheap to clone.
#[derive(Clone)]
pub struct Leases {
    leases: kv::Store,
    hosts: kv::Store,
    me: Holder,
    fresh_for: Duration,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("bucket", &LEASES_BUCKET)
            .field("me", &self.me)
            .finish()
    }
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and numbers always serialise.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

impl Leases {
    /// Creates or updates both buckets and opens them for holder `me`.
    pub(crate) async fn open(
        context: &jetstream::Context,
        options: &ClusterOptions,
        me: Holder,
    ) -> Result<Self, (String, String)> {
        let leases = crate::open_bucket(
            context,
            options,
            LEASES_BUCKET,
            "clawcage: who holds each lane partition, cron and the Telegram poller",
            options.lease_ttl,
        )
        .await?;
        let hosts = crate::open_bucket(
            context,
            options,
            HOSTS_BUCKET,
            "clawcage: the live gateway hosts",
            options.lease_ttl * 3,
        )
        .await?;
        Ok(Self {
            leases,
            hosts,
            me,
            fresh_for: options.lease_ttl.mul_f64(SELF_FENCE_FRACTION),
        })
    }

    /// This host, as its leases name it.
    pub fn me(&self) -> &Holder {
        &self.me
    }

    fn store_error(name: &str, error: impl std::fmt::Display) -> LeaseError {
        LeaseError::Store {
            name: name.to_string(),
            reason: error.to_string(),
        }
    }

    /// Takes lease `name` if nobody holds it: `None` when another host (or this one, under an
    /// earlier handle) does. Of hosts racing for a free lease exactly one gets it.
    pub async fn acquire(&self, name: &str) -> Result<Option<Lease>, LeaseError> {
        // Counted from before the request: the server's time to live runs from its write, later.
        let sent = Instant::now();
        match self.leases.create(token(name), encode(&self.me)).await {
            Ok(revision) => Ok(Some(Lease {
                name: name.to_string(),
                epoch: revision,
                revision,
                renewed: sent,
                fresh_for: self.fresh_for,
            })),
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
            Err(error) => Err(Self::store_error(name, error)),
        }
    }

    /// Takes lease `name` over from an earlier incarnation of this same host (a host id is one
    /// live process, so a lease its previous start holds is a dead process's): `None` when
    /// nobody holds it that way (free leases are taken with [`Leases::acquire`]).
    pub async fn take_over_from_earlier_self(
        &self,
        name: &str,
    ) -> Result<Option<Lease>, LeaseError> {
        let Some((holder, revision)) = self.holder(name).await? else {
            return Ok(None);
        };
        if holder.host != self.me.host || holder.incarnation == self.me.incarnation {
            return Ok(None);
        }
        let sent = Instant::now();
        match self
            .leases
            .update(token(name), encode(&self.me), revision)
            .await
        {
            Ok(taken) => Ok(Some(Lease {
                name: name.to_string(),
                epoch: taken,
                revision: taken,
                renewed: sent,
                fresh_for: self.fresh_for,
            })),
            // Changed meanwhile: whoever holds it now, it is not ours to take.
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(error) => Err(Self::store_error(name, error)),
        }
    }

    /// Renews `lease` for another time to live. Fails with [`LeaseError::Lost`] when the lease
    /// expired or another host took it meanwhile: the server refuses the write.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), LeaseError> {
        let started = Instant::now();
        match self
            .leases
            .update(token(&lease.name), encode(&self.me), lease.revision)
            .await
        {
            Ok(revision) => {
                lease.revision = revision;
                lease.renewed = started;
                Ok(())
            }
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(LeaseError::Lost {
                    name: lease.name.clone(),
                    holder: self.holder(&lease.name).await?.map(|(holder, _)| holder),
                })
            }
            Err(error) => Err(Self::store_error(&lease.name, error)),
        }
    }

    /// Gives `lease` back, so another host may take it at once. A lease already lost is not an
    /// error: there is nothing to give back.
    pub async fn release(&self, lease: Lease) -> Result<(), LeaseError> {
        match self
            .leases
            .delete_expect_revision(token(&lease.name), Some(lease.revision))
            .await
        {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(()),
            Err(error) => Err(Self::store_error(&lease.name, error)),
        }
    }

    /// Gives lease `name` back if this process holds it, at whatever revision it is now (a
    /// renewal that came back too late to be counted may have moved it on), so that it can be
    /// taken again at once. A lease another process holds is not touched.
    ///
    /// A renewal still in flight may land between the read and the delete: the lease is read
    /// again and the delete tried again, a few times, while this process holds it.
    pub async fn release_own(&self, name: &str) -> Result<(), LeaseError> {
        for _ in 0..RELEASE_OWN_ATTEMPTS {
            let Some((holder, revision)) = self.holder(name).await? else {
                return Ok(());
            };
            if holder.host != self.me.host || holder.incarnation != self.me.incarnation {
                return Ok(());
            }
            match self
                .leases
                .delete_expect_revision(token(name), Some(revision))
                .await
            {
                Ok(()) => return Ok(()),
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
                Err(error) => return Err(Self::store_error(name, error)),
            }
        }
        tracing::debug!(
            "the lease {name} moved on {RELEASE_OWN_ATTEMPTS} times while being given back; it expires after its time to live"
        );
        Ok(())
    }

    /// Who holds lease `name` now, with the epoch of their lease's current revision.
    pub async fn holder(&self, name: &str) -> Result<Option<(Holder, u64)>, LeaseError> {
        let entry = self
            .leases
            .entry(token(name))
            .await
            .map_err(|error| Self::store_error(name, error))?;
        Ok(entry
            .filter(|entry| entry.operation == kv::Operation::Put)
            .and_then(|entry| {
                serde_json::from_slice::<Holder>(&entry.value)
                    .ok()
                    .map(|holder| (holder, entry.revision))
            }))
    }

    /// Every lease held now: its key, its holder and its current revision.
    pub async fn all(&self) -> Result<Vec<(String, Holder, u64)>, LeaseError> {
        let names = self.keys(&self.leases, LEASES_BUCKET).await?;
        let mut held = Vec::with_capacity(names.len());
        for key in names {
            if let Some((holder, revision)) = self.holder(&unescape(&key)).await? {
                held.push((unescape(&key), holder, revision));
            }
        }
        Ok(held)
    }

    /// Says this host is alive (with its clients' `url`); repeated more often than the hosts
    /// bucket forgets (three times the lease's time to live).
    pub async fn announce(&self, url: Option<String>, started_ms: u64) -> Result<(), LeaseError> {
        let record = HostRecord {
            holder: self.me.clone(),
            url,
            started_ms,
        };
        self.hosts
            .put(token(&self.me.host), encode(&record))
            .await
            .map(drop)
            .map_err(|error| Self::store_error(HOSTS_BUCKET, error))
    }

    /// The hosts that announced themselves recently, by id.
    pub async fn live_hosts(&self) -> Result<Vec<HostRecord>, LeaseError> {
        let mut hosts = Vec::new();
        for key in self.keys(&self.hosts, HOSTS_BUCKET).await? {
            let entry = self
                .hosts
                .entry(key.clone())
                .await
                .map_err(|error| Self::store_error(HOSTS_BUCKET, error))?;
            if let Some(record) = entry
                .filter(|entry| entry.operation == kv::Operation::Put)
                .and_then(|entry| serde_json::from_slice::<HostRecord>(&entry.value).ok())
            {
                hosts.push(record);
            }
        }
        hosts.sort_by(|a, b| a.holder.host.cmp(&b.holder.host));
        Ok(hosts)
    }

    async fn keys(&self, store: &kv::Store, bucket: &str) -> Result<Vec<String>, LeaseError> {
        let mut keys = store
            .keys()
            .await
            .map_err(|error| Self::store_error(bucket, error))?;
        let mut names = Vec::new();
        while let Some(key) = keys.next().await {
            names.push(key.map_err(|error| Self::store_error(bucket, error))?);
        }
        Ok(names)
    }
}

/// The rendezvous score of `host` for `partition`.
fn score(host: &str, partition: u32) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(host.as_bytes());
    hash.update([0]);
    hash.update(partition.to_be_bytes());
    hash.finalize().into()
}

/// The host of `hosts` that partition `partition` belongs to: the highest rendezvous score
/// (`None` without hosts). Every host computes the same answer from the same list, and a host
/// leaving the list moves only the partitions it had.
pub fn placement(partition: u32, hosts: &[String]) -> Option<&String> {
    hosts.iter().max_by_key(|host| score(host, partition))
}

/// The partitions of `0..partitions` that `host` wins among `hosts`.
pub fn partitions_won(host: &str, hosts: &[String], partitions: u32) -> Vec<u32> {
    (0..partitions)
        .filter(|partition| placement(*partition, hosts).is_some_and(|won| won == host))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_partition_has_one_host_and_the_hosts_share_them() {
        let three = hosts(&["a", "b", "c"]);
        let won: Vec<Vec<u32>> = three
            .iter()
            .map(|host| partitions_won(host, &three, PARTITIONS))
            .collect();
        assert_eq!(won.iter().map(Vec::len).sum::<usize>(), PARTITIONS as usize);
        for share in &won {
            // 64 over 3 is about 21 each; hashing keeps every host well above nothing.
            assert!((10..=35).contains(&share.len()), "{won:?}");
        }
        assert_eq!(placement(3, &[]), None);
        // The same answer from any order of the list.
        let shuffled = hosts(&["c", "a", "b"]);
        for partition in 0..PARTITIONS {
            assert_eq!(
                placement(partition, &three),
                placement(partition, &shuffled)
            );
        }
    }

    #[test]
    fn a_host_leaving_moves_only_its_own_partitions() {
        let three = hosts(&["a", "b", "c"]);
        let two = hosts(&["a", "c"]);
        for partition in 0..PARTITIONS {
            let before = placement(partition, &three).cloned();
            let after = placement(partition, &two).cloned();
            if before.as_deref() != Some("b") {
                assert_eq!(before, after, "partition {partition} moved");
            }
        }
        // And a host joining takes partitions only for itself.
        let four = hosts(&["a", "b", "c", "d"]);
        for partition in 0..PARTITIONS {
            let after = placement(partition, &four).cloned();
            if after.as_deref() != Some("d") {
                assert_eq!(placement(partition, &three).cloned(), after);
            }
        }
    }

    #[test]
    fn keys_come_back_to_the_names_they_escape() {
        for name in ["part.7", "cron", "telegram", "a:b c.d"] {
            assert_eq!(unescape(&token(name)), name);
        }
    }
}
