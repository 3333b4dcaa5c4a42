//! The lane partitions one host owns when several hosts serve at once: an [`Ownership`] keeps,
//! on a thread and runtime of its own (a busy gateway cannot delay a renewal), the partitions
//! this host wins by rendezvous placement among the live hosts, and tells its owner each change
//! ([`PartitionChange`]). A host is live while it holds its own `host.<id>` lease in
//! `claw_leases`, renewed beside its partitions (neither renewal waits for the other), so a host
//! that dies drops out of the placement after one lease time to live, the moment its partition
//! leases expire too, and the hosts left take those partitions at their next tick. Each
//! partition is taken with a revision-checked create (its revision is the partition's epoch,
//! larger than any earlier owner's) and carries a [`WriteFence`] that the keeper holds open
//! while the lease is renewed in time and shuts when it is lost or given up. A partition this
//! host holds but another live host wins (a host joined) is handed over gracefully: the owner
//! is told to stop serving it ([`PartitionChange::Release`]), and once it says it has (or a grace passed) the fence shuts
//! and the lease is deleted, so the winner takes it at once instead of after a time to live.
//! Design: the scale-out notes, §2.5.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot, watch};

use crate::WriteFence;
use crate::leases::{Lease, LeaseError, Leases, partition_lease, partitions_won};

/// The prefix of the leases that say a host is live (`host.<id>`).
pub const HOST_LEASE_PREFIX: &str = "host.";

/// The lease that says host `host` is live.
pub fn host_lease(host: &str) -> String {
    format!("{HOST_LEASE_PREFIX}{host}")
}

/// How an [`Ownership`] works.
#[derive(Debug, Clone)]
pub struct OwnershipOptions {
    /// The partitions shared (`leases::PARTITIONS` in a gateway).
    pub partitions: u32,
    /// How often the leases are renewed and the placement looked at again: a quarter of the
    /// leases' time to live is right (three renewals may fail before the lease goes stale).
    pub tick: Duration,
    /// How long a partition being handed over waits for its owner to stop serving it before
    /// its fence shuts anyway.
    pub release_grace: Duration,
}

impl OwnershipOptions {
    /// The options for leases living `ttl`: a tick of a quarter of it, a grace of half of it.
    pub fn for_ttl(partitions: u32, ttl: Duration) -> Self {
        Self {
            partitions,
            tick: (ttl / 4).max(Duration::from_millis(100)),
            release_grace: ttl / 2,
        }
    }
}

/// What changed in this host's partitions.
#[derive(Debug)]
pub enum PartitionChange {
    /// This host owns `partition` now, as writer `epoch`; its writes go out while `fence` is
    /// open.
    Gained {
        /// The partition.
        partition: u32,
        /// The lease's epoch: larger than any earlier owner's.
        epoch: u64,
        /// Open while the lease is renewed in time.
        fence: WriteFence,
    },
    /// Another host wins `partition` now: stop serving it and say so on `done` (or drop it).
    /// The lease is given up after that, or after the grace.
    Release {
        /// The partition.
        partition: u32,
        /// Answered (or dropped) once nothing of the partition runs here any more.
        done: oneshot::Sender<()>,
    },
    /// `partition` is no longer this host's, at once (its lease expired, was taken, or could
    /// not be renewed in time); its fence is shut already.
    Lost {
        /// The partition.
        partition: u32,
        /// Why.
        why: String,
    },
}

/// The keeper of this host's partitions (see the module's doc). Stop it with
/// [`Ownership::stop`]: dropping it stops the keeper too, giving its leases back.
pub struct Ownership {
    owned: watch::Receiver<BTreeMap<u32, u64>>,
    stop: Option<oneshot::Sender<bool>>,
    stopped: Option<oneshot::Receiver<()>>,
}

impl Ownership {
    /// Starts keeping this host's partitions (the holder `leases` opened with). The changes
    /// come on the returned receiver, in the order they happened.
    pub fn start(
        leases: Leases,
        options: OwnershipOptions,
    ) -> std::io::Result<(Self, mpsc::UnboundedReceiver<PartitionChange>)> {
        let (changes, changed) = mpsc::unbounded_channel();
        let (tell_owned, owned) = watch::channel(BTreeMap::new());
        let (stop, stop_asked) = oneshot::channel();
        let (say_stopped, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("clawcage-partitions".to_string())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(
                        Keeper {
                            leases,
                            options,
                            held: BTreeMap::new(),
                            host: None,
                            changes,
                            owned: tell_owned,
                        }
                        .run(stop_asked),
                    ),
                    Err(error) => {
                        tracing::error!("cannot keep this host's partitions: {error}");
                    }
                }
                let _ = say_stopped.send(());
            })?;
        Ok((
            Self {
                owned,
                stop: Some(stop),
                stopped: Some(stopped),
            },
            changed,
        ))
    }

    /// The partitions this host owns now, each with its epoch.
    pub fn owned(&self) -> BTreeMap<u32, u64> {
        self.owned.borrow().clone()
    }

    /// Follows [`Ownership::owned`] as it changes.
    pub fn watch(&self) -> watch::Receiver<BTreeMap<u32, u64>> {
        self.owned.clone()
    }

    /// Stops keeping the partitions: their fences shut, and their leases (and this host's
    /// liveness lease) are given back so other hosts take them at once. Returns once done.
    pub async fn stop(mut self) {
        self.stop_with(true).await;
    }

    /// Stops keeping the partitions without giving anything back, as a host that dies does:
    /// the leases expire after their time to live. For a host that must stop at once, and for
    /// tests of what a dead host leaves.
    pub async fn abandon(mut self) {
        self.stop_with(false).await;
    }

    async fn stop_with(&mut self, give_back: bool) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(give_back);
        }
        if let Some(stopped) = self.stopped.take() {
            let _ = stopped.await;
        }
    }
}

impl Drop for Ownership {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

/// A partition this host holds.
struct Held {
    lease: Lease,
    fence: WriteFence,
    /// Being handed over: answered when its owner has stopped serving it, and the latest time
    /// to give it up anyway.
    releasing: Option<(oneshot::Receiver<()>, Instant)>,
}

struct Keeper {
    leases: Leases,
    options: OwnershipOptions,
    held: BTreeMap<u32, Held>,
    /// This host's liveness lease.
    host: Option<Lease>,
    changes: mpsc::UnboundedSender<PartitionChange>,
    owned: watch::Sender<BTreeMap<u32, u64>>,
}

impl Keeper {
    async fn run(mut self, mut stop: oneshot::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.options.tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let give_back = loop {
            tokio::select! {
                asked = &mut stop => break asked.unwrap_or(true),
                _ = ticks.tick() => {}
            }
            if let Err(error) = self.tick().await {
                tracing::warn!("cannot look after this host's partitions: {error}");
            }
            self.publish();
        };
        for (partition, held) in std::mem::take(&mut self.held) {
            held.fence.close();
            if give_back && let Err(error) = self.leases.release(held.lease).await {
                tracing::warn!("cannot give partition {partition} back: {error}");
            }
        }
        if give_back && let Some(host) = self.host.take() {
            let _ = self.leases.release(host).await;
        }
        self.publish();
    }

    fn publish(&self) {
        let now: BTreeMap<u32, u64> = self
            .held
            .iter()
            .map(|(partition, held)| (*partition, held.lease.epoch()))
            .collect();
        self.owned.send_if_modified(|owned| {
            let changed = *owned != now;
            *owned = now;
            changed
        });
    }

    fn tell(&self, change: PartitionChange) {
        // Nobody listening (the owner stopped): the keeper still holds its leases correctly.
        let _ = self.changes.send(change);
    }

    async fn tick(&mut self) -> Result<(), LeaseError> {
        // The partitions' renewals do not wait for the liveness lease's: a request the servers
        // hold for long (while they elect leaders) must not carry them past their fences.
        let (kept, lost) = tokio::join!(
            keep_host_lease(&self.leases, &mut self.host),
            renew_partitions(&self.leases, &mut self.held),
        );
        self.let_go(lost);
        kept?;
        let Some(_) = &self.host else {
            return Ok(());
        };
        let live = self.live_hosts().await?;
        let me = self.leases.me().host.clone();
        let wanted: BTreeSet<u32> = partitions_won(&me, &live, self.options.partitions)
            .into_iter()
            .collect();
        self.hand_over(&wanted).await;
        self.take(&wanted).await;
        Ok(())
    }

    /// Lets go of the partitions `lost` (their renewal failed or came back late): their fences
    /// shut, the owner told, their leases given back so they are taken again at once under new
    /// epochs, not after their time to live.
    fn let_go(&mut self, lost: Vec<(u32, String)>) {
        for (partition, why) in lost {
            if let Some(held) = self.held.remove(&partition) {
                held.fence.close();
                tracing::warn!("this host lost partition {partition}: {why}");
                self.tell(PartitionChange::Lost { partition, why });
                self.give_back_apart(held.lease);
            }
        }
    }

    /// The hosts holding a liveness lease, by id.
    async fn live_hosts(&self) -> Result<Vec<String>, LeaseError> {
        let mut live: Vec<String> = self
            .leases
            .all()
            .await?
            .into_iter()
            .filter_map(|(name, holder, _)| {
                name.strip_prefix(HOST_LEASE_PREFIX)
                    .filter(|host| *host == holder.host)
                    .map(str::to_string)
            })
            .collect();
        let me = &self.leases.me().host;
        if !live.contains(me) {
            live.push(me.clone());
        }
        Ok(live)
    }

    /// Gives `lease` back in a task of its own (a server that is slow to answer does not hold
    /// up the renewals of the other partitions), at whatever revision a late renewal left it.
    /// A lease another host holds by now is not touched.
    fn give_back_apart(&self, lease: Lease) {
        let leases = self.leases.clone();
        tokio::spawn(async move {
            let name = lease.name().to_string();
            if let Err(error) = leases.release_own(&name).await {
                tracing::debug!("cannot give {name} back: {error}");
            }
        });
    }

    /// Starts handing over the partitions held that another host wins now, and gives up those
    /// whose owner has stopped serving them (or whose grace passed).
    async fn hand_over(&mut self, wanted: &BTreeSet<u32>) {
        let now = Instant::now();
        let mut give_up = Vec::new();
        let mut to_release = Vec::new();
        for (partition, held) in &mut self.held {
            match &mut held.releasing {
                None if !wanted.contains(partition) => {
                    let (done, stopped) = oneshot::channel();
                    held.releasing = Some((stopped, now + self.options.release_grace));
                    to_release.push((*partition, done));
                }
                None => {}
                Some((stopped, deadline)) => {
                    let answered =
                        !matches!(stopped.try_recv(), Err(oneshot::error::TryRecvError::Empty));
                    if answered || now >= *deadline {
                        give_up.push(*partition);
                    }
                }
            }
        }
        for (partition, done) in to_release {
            self.tell(PartitionChange::Release { partition, done });
        }
        for partition in give_up {
            if let Some(held) = self.held.remove(&partition) {
                held.fence.close();
                if let Err(error) = self.leases.release(held.lease).await {
                    tracing::warn!("cannot give partition {partition} back: {error}");
                }
            }
        }
    }

    /// Takes the partitions this host wins and does not hold yet, where they are free (or held
    /// by an earlier start of this host).
    async fn take(&mut self, wanted: &BTreeSet<u32>) {
        let missing: Vec<u32> = wanted
            .iter()
            .filter(|partition| !self.held.contains_key(partition))
            .copied()
            .collect();
        let leases = self.leases.clone();
        let attempts = missing.into_iter().map(|partition| {
            let leases = leases.clone();
            async move {
                let name = partition_lease(partition);
                let taken = match leases.acquire(&name).await {
                    Ok(Some(lease)) => Ok(Some(lease)),
                    Ok(None) => leases.take_over_from_earlier_self(&name).await,
                    Err(error) => Err(error),
                };
                (partition, taken)
            }
        });
        for (partition, taken) in join_all(attempts).await {
            match taken {
                Ok(Some(lease)) => {
                    let fence = WriteFence::shut_until_held();
                    if !fence.open_until(lease.fresh_until()) {
                        tracing::warn!(
                            "partition {partition} was taken too late to act on; it is given back and taken again"
                        );
                        self.give_back_apart(lease);
                        continue;
                    }
                    let epoch = lease.epoch();
                    self.held.insert(
                        partition,
                        Held {
                            lease,
                            fence: fence.clone(),
                            releasing: None,
                        },
                    );
                    self.tell(PartitionChange::Gained {
                        partition,
                        epoch,
                        fence,
                    });
                }
                // Held by another host still (it hands it over, or it expires).
                Ok(None) => {}
                Err(error) => tracing::warn!("cannot take partition {partition}: {error}"),
            }
        }
    }
}

/// Takes, renews or takes back this host's liveness lease `host`.
async fn keep_host_lease(leases: &Leases, host: &mut Option<Lease>) -> Result<(), LeaseError> {
    let name = host_lease(&leases.me().host);
    if let Some(lease) = host {
        match leases.renew(lease).await {
            Ok(()) => return Ok(()),
            Err(LeaseError::Lost { .. }) => *host = None,
            Err(error) => {
                if !lease.is_fresh() {
                    *host = None;
                }
                return Err(error);
            }
        }
    }
    *host = match leases.acquire(&name).await? {
        Some(lease) => Some(lease),
        None => leases.take_over_from_earlier_self(&name).await?,
    };
    Ok(())
}

/// Renews every partition `held`, all at once: those lost, gone stale or renewed too late to
/// count, with why.
async fn renew_partitions(leases: &Leases, held: &mut BTreeMap<u32, Held>) -> Vec<(u32, String)> {
    let renewals = held.iter_mut().map(|(partition, held)| async move {
        let fresh_until = tokio::time::Instant::from_std(held.lease.fresh_until());
        let outcome = tokio::time::timeout_at(fresh_until, leases.renew(&mut held.lease)).await;
        match outcome {
            // One being handed over has its fence shut by its owner already.
            Ok(Ok(()))
                if held.fence.open_until(held.lease.fresh_until()) || held.releasing.is_some() =>
            {
                None
            }
            Ok(Ok(())) => Some((
                *partition,
                "its renewal came back after its fence had shut".to_string(),
            )),
            Ok(Err(error @ LeaseError::Lost { .. })) => Some((*partition, error.to_string())),
            Ok(Err(error)) if !held.lease.is_fresh() => Some((*partition, error.to_string())),
            Err(_) if !held.lease.is_fresh() => Some((
                *partition,
                "its renewal did not come back in time".to_string(),
            )),
            Ok(Err(_)) | Err(_) => None,
        }
    });
    join_all(renewals).await.into_iter().flatten().collect()
}
