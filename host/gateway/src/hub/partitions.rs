//! The hub of a host that serves its share of the sessions' partitions, not all of them: it
//! opens a session only while this host owns the session's partition (its events carry that
//! partition's epoch), takes a partition's sessions up when the partition is gained (a marker
//! on each one's transcript and inbox first, so that a late write of the last owner is refused
//! by the server, then their pending inputs and open turns, as at a start), and lets them go
//! when the partition is handed over or lost: their lanes stop where they stand and their runs
//! stay pending in the inboxes for the next owner. A session's followers follow its log, which
//! every owner writes in turn, so they follow it from any host, whoever serves it.

use std::sync::Arc;

use clawcage_agent::events::Epoch;
use clawcage_cluster::PartitionFences;
use clawcage_cluster::leases::partition_of;

use super::{Hub, SessionHub, lock};
use crate::protocol::{Code, GatewayError};

/// How an answer says that its session is served by another host: the host forwarding a
/// request recognises it and asks the host that serves the session now.
pub(crate) const SERVED_ELSEWHERE: &str = "is served by another host of the cluster";

/// How an answer says that its session's partition is being taken up by the host answering:
/// the request is asked again in a moment.
pub(crate) const TAKING_UP: &str = "is being taken up by this host";

/// Takes sessions up for this host before it reads them: appends the take-up markers to their
/// transcripts and inboxes (blocking: called on a blocking thread).
pub type TakeUp = Arc<dyn Fn(&[String]) -> std::io::Result<()> + Send + Sync>;

/// The partitions a host serves, as its partition keeper reports them.
#[derive(Clone)]
pub struct Partitions {
    /// The partitions held, with their fences and epochs.
    pub fences: PartitionFences,
    /// How a gained partition's sessions are taken up.
    pub take_up: TakeUp,
    /// How long a partition handed over lets its running turns end first (shorter than the
    /// keeper's grace, after which the partition's fence shuts anyway).
    pub hand_over_patience: std::time::Duration,
}

impl Hub {
    /// The epoch `key`'s events are written under: this host's, or its partition's while this
    /// host owns it (0 otherwise: a session only followed here, whose writes the partition's
    /// shut fence refuses anyway).
    pub(super) fn writer_epoch(&self, key: &str) -> Epoch {
        match &self.parts.partitions {
            None => self.parts.epoch,
            Some(partitions) => partitions.fences.epoch_of(key).unwrap_or(0),
        }
    }

    /// `Ok` when this host serves `key` now (runs its turns, takes its inputs); otherwise an
    /// error saying that another host does, or that its partition is being taken up here.
    pub fn check_served(&self, key: &str) -> Result<(), GatewayError> {
        let Some(partitions) = &self.parts.partitions else {
            return Ok(());
        };
        let partition = partition_of(key);
        if !partitions.fences.owns(key) {
            return Err(GatewayError::new(
                Code::Unavailable,
                format!(
                    "session {key} {SERVED_ELSEWHERE} (its partition {partition} is not this host's); send it there, or again once the partitions have settled"
                ),
            ));
        }
        if !lock(&self.served_partitions).contains(&partition) {
            return Err(GatewayError::new(
                Code::Unavailable,
                format!(
                    "session {key}'s partition {partition} {TAKING_UP}; send again in a moment"
                ),
            ));
        }
        Ok(())
    }

    /// Whether another host serves `key` (its partition is not this host's): what is asked of
    /// it is forwarded there.
    pub fn served_elsewhere(&self, key: &str) -> bool {
        self.parts
            .partitions
            .as_ref()
            .is_some_and(|partitions| !partitions.fences.owns(key))
    }

    /// Whether this host owns `key`'s partition but is still taking it up.
    pub fn taking_up(&self, key: &str) -> bool {
        self.parts.partitions.as_ref().is_some_and(|partitions| {
            partitions.fences.owns(key)
                && !lock(&self.served_partitions).contains(&partition_of(key))
        })
    }

    /// This host has just gained `partition`: takes its sessions up (markers first, then their
    /// pending inputs and open turns, resumed under their run ids), and serves them from then on.
    pub async fn take_up_partition(&self, partition: u32) {
        let (Some(partitions), Some(inbox)) =
            (&self.parts.partitions, self.parts.sessions.inbox().cloned())
        else {
            return;
        };
        let take_up = partitions.take_up.clone();
        let started = std::time::Instant::now();
        let listed = tokio::task::spawn_blocking(move || {
            let keys: Vec<String> = inbox
                .sessions()?
                .into_iter()
                .filter(|key| partition_of(key) == partition)
                .collect();
            take_up(&keys)?;
            Ok::<_, std::io::Error>(keys)
        })
        .await;
        let keys = match listed {
            Ok(Ok(keys)) => keys,
            Ok(Err(error)) => {
                tracing::error!(partition, %error, "cannot take the partition's sessions up: its runs are not resumed here");
                return;
            }
            Err(error) => {
                tracing::error!(partition, %error, "taking the partition's sessions up failed");
                return;
            }
        };
        // Sessions followed here while another host served them: written from now on under
        // this host's epoch, numbered on from what their log holds.
        let followed: Vec<Arc<SessionHub>> = lock(&self.sessions)
            .values()
            .filter(|session| partition_of(&session.key) == partition)
            .cloned()
            .collect();
        for session in followed {
            if let Err(error) = self.renew_writer(&session).await {
                tracing::error!(session = %session.key, ?error, "cannot read the session's events: it is not served here");
                return;
            }
        }
        let sessions = keys.len();
        self.take_up_sessions(keys).await;
        lock(&self.served_partitions).insert(partition);
        if sessions > 0 {
            tracing::info!(
                partition,
                sessions,
                ms = started.elapsed().as_millis() as u64,
                "took a partition's sessions up"
            );
        }
    }

    /// This host hands `partition` over to another host: it takes no new input for it, lets
    /// the turns running in its sessions go on to their end for up to `patience` (their lanes
    /// start nothing after them; what waits stays pending for the next holder), then lets the
    /// partition go ([`Hub::let_go_partition`]). A turn still running then is cut where it
    /// stands, as a crash would cut it, and the next holder resumes it.
    pub async fn hand_over_partition(&self, partition: u32, patience: std::time::Duration) {
        lock(&self.served_partitions).remove(&partition);
        let leaving: Vec<Arc<SessionHub>> = lock(&self.sessions)
            .values()
            .filter(|session| partition_of(&session.key) == partition)
            .cloned()
            .collect();
        for session in &leaving {
            self.parts.sessions.hold(&session.key);
        }
        let running = |session: &Arc<SessionHub>| {
            let mut state = session.lock();
            self.settle_current(&session.key, &mut state);
            state.current.is_some()
        };
        if leaving.iter().any(running) {
            tracing::info!(
                partition,
                "handing a partition over: its running turns may end first"
            );
            let deadline = std::time::Instant::now() + patience;
            while std::time::Instant::now() < deadline && leaving.iter().any(running) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        self.let_go_partition(partition).await;
    }

    /// This host no longer serves `partition` (handed over, or lost): its sessions' lanes stop
    /// where they stand, their runs left pending for the next owner, and their events written
    /// so far are stored before this returns (a hand-over is answered only then). Their
    /// followers here go on following: the next owner writes the same log.
    pub async fn let_go_partition(&self, partition: u32) {
        lock(&self.served_partitions).remove(&partition);
        let leaving: Vec<Arc<SessionHub>> = lock(&self.sessions)
            .values()
            .filter(|session| partition_of(&session.key) == partition)
            .cloned()
            .collect();
        for session in &leaving {
            let _admit = lock(&session.admit);
            {
                let mut state = session.lock();
                self.settle_current(&session.key, &mut state);
                // Their answers come from the next owner: nothing of them is settled here.
                state.tickets.clear();
                state.current = None;
            }
            self.parts.sessions.let_go(&session.key);
        }
        for session in &leaving {
            super::subscribers::written(session).await;
        }
        if !leaving.is_empty() {
            tracing::info!(
                partition,
                sessions = leaving.len(),
                "let a partition's sessions go"
            );
        }
    }
}
