//! The write fence of a lease holder: whether this process may still write the sessions' state
//! as their owner. The stores check it before every attempt to publish (a first try and each
//! retry), so a host whose lease has gone unrenewed for [`crate::leases::SELF_FENCE_FRACTION`] of
//! its time to live sends nothing more, whatever its tasks are waiting on: the next holder can
//! take the lease only once the whole time to live has passed since the last renewal reached the
//! server, and by then this host's writes have stopped. A fence that has been open and shut
//! stays shut, even when a late renewal comes back: a write it refused meanwhile was told that
//! another host may own the session, and whoever acts on that must not find the holder writing
//! on under the same epoch (the holder takes the lease again, under a new one). A fence nobody
//! holds open (the CLI, the tests, a process that owns no lease) never closes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
enum State {
    /// Writes are not tied to a lease.
    Unfenced,
    /// Not opened by a lease yet: nothing goes out.
    Waiting,
    /// Writes may go out until then (the lease's last renewal plus its fresh time).
    OpenUntil(Instant),
    /// The lease is lost: nothing more goes out.
    Closed,
}

/// Shared by a lease's keeper (which moves it on each renewal) and every store writing under the
/// lease. Cheap to clone; the clones are one fence.
#[derive(Debug, Clone)]
pub struct WriteFence {
    state: Arc<Mutex<State>>,
}

impl Default for WriteFence {
    fn default() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::Unfenced)),
        }
    }
}

impl WriteFence {
    /// A fence shut until a lease opens it ([`WriteFence::open_until`]): for a process whose
    /// every write of the sessions needs the lease (a gateway host, standby until it takes it).
    pub fn shut_until_held() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::Waiting)),
        }
    }

    /// A fence shut for good: the fence of a partition this host does not own.
    pub fn shut() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::Closed)),
        }
    }

    /// Writes may go out until `until`, and no longer unless it is moved on again before then;
    /// whether the fence is open. A fence whose time has passed shuts for good (a renewal that
    /// comes back too late does not reopen it); one not opened yet waits on.
    pub fn open_until(&self, until: Instant) -> bool {
        let mut state = clawcage_core::sync::lock(&self.state);
        let now = Instant::now();
        let (next, open) = match *state {
            State::Closed => (State::Closed, false),
            // It was open: past its time, or given one already past, it shuts for good.
            State::OpenUntil(was) if was <= now || until <= now => (State::Closed, false),
            _ if until > now => (State::OpenUntil(until), true),
            // Not opened yet, and the lease is stale already: it waits on.
            _ => (State::Waiting, false),
        };
        *state = next;
        open
    }

    /// Nothing more goes out, for good (the lease is lost).
    pub fn close(&self) {
        *clawcage_core::sync::lock(&self.state) = State::Closed;
    }

    /// Whether a write may go out now.
    pub fn is_open(&self) -> bool {
        match *clawcage_core::sync::lock(&self.state) {
            State::Unfenced => true,
            State::OpenUntil(until) => Instant::now() < until,
            State::Waiting | State::Closed => false,
        }
    }

    /// `Ok` when a write may go out now; otherwise why not, for the error of the write `what`
    /// describes (made only then: the check is on every write's path).
    pub fn check(&self, what: impl FnOnce() -> String) -> Result<(), String> {
        if self.is_open() {
            Ok(())
        } else {
            Err(format!(
                "{} was not sent: this host's lease on the session (the gateway's, or its partition's) is lost or was not renewed in time, so another host may own the session now; this host writes it no more, and the session's next owner takes its work up",
                what()
            ))
        }
    }
}

/// Which fence guards each session's writes: one for every session (the active gateway of an
/// active/standby cluster, the CLI, the tests), or the fence of the session's partition while
/// this host owns it, a shut one otherwise (a host serving its share of the partitions).
#[derive(Debug, Clone)]
pub enum SessionFences {
    /// Every session's writes pass this fence.
    One(WriteFence),
    /// Each session's writes pass its partition's fence ([`crate::leases::partition_of`]).
    ByPartition(PartitionFences),
}

impl Default for SessionFences {
    fn default() -> Self {
        Self::One(WriteFence::default())
    }
}

impl From<WriteFence> for SessionFences {
    fn from(fence: WriteFence) -> Self {
        Self::One(fence)
    }
}

impl From<PartitionFences> for SessionFences {
    fn from(fences: PartitionFences) -> Self {
        Self::ByPartition(fences)
    }
}

impl SessionFences {
    /// The fence `session`'s writes pass now.
    pub fn of(&self, session: &str) -> WriteFence {
        match self {
            Self::One(fence) => fence.clone(),
            Self::ByPartition(fences) => fences.of_partition(crate::leases::partition_of(session)),
        }
    }
}

/// The partitions this host owns, each with its fence and its epoch (the revision of the lease
/// it was taken under), as its partition keeper ([`crate::Ownership`]) reports them. Cheap to
/// clone; the clones are one table.
#[derive(Debug, Clone, Default)]
pub struct PartitionFences {
    held: Arc<Mutex<std::collections::HashMap<u32, (WriteFence, u64)>>>,
}

impl PartitionFences {
    /// An empty table: every session's writes are refused until its partition is held.
    pub fn new() -> Self {
        Self::default()
    }

    /// This host owns `partition` as writer `epoch`, writing while `fence` is open.
    pub fn hold(&self, partition: u32, fence: WriteFence, epoch: u64) {
        clawcage_core::sync::lock(&self.held).insert(partition, (fence, epoch));
    }

    /// This host no longer owns `partition`: writes to its sessions are refused from now on.
    pub fn let_go(&self, partition: u32) {
        if let Some((fence, _)) = clawcage_core::sync::lock(&self.held).remove(&partition) {
            fence.close();
        }
    }

    /// The fence of `partition`: its own while held, a shut one otherwise.
    pub fn of_partition(&self, partition: u32) -> WriteFence {
        clawcage_core::sync::lock(&self.held)
            .get(&partition)
            .map(|(fence, _)| fence.clone())
            .unwrap_or_else(WriteFence::shut)
    }

    /// The epoch `session` is written under, while this host owns its partition.
    pub fn epoch_of(&self, session: &str) -> Option<u64> {
        clawcage_core::sync::lock(&self.held)
            .get(&crate::leases::partition_of(session))
            .filter(|(fence, _)| fence.is_open())
            .map(|(_, epoch)| *epoch)
    }

    /// Whether this host owns `session`'s partition now (held, its fence open).
    pub fn owns(&self, session: &str) -> bool {
        self.epoch_of(session).is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "tests fail by panicking"
    )]

    use super::*;
    use std::time::Duration;

    #[test]
    fn an_unheld_fence_never_closes_by_time() {
        let fence = WriteFence::default();
        assert!(fence.is_open());
        assert!(fence.check(|| "an append".to_string()).is_ok());
    }

    #[test]
    fn a_fence_closes_when_its_time_passes_and_a_late_renewal_does_not_reopen_it() {
        let fence = WriteFence::shut_until_held();
        let shared = fence.clone();
        assert!(!shared.is_open(), "shut until a lease opens it");
        assert!(
            !fence.open_until(Instant::now() - Duration::from_millis(1)),
            "a lease stale when taken does not open it"
        );
        assert!(!shared.is_open());
        assert!(fence.open_until(Instant::now() + Duration::from_millis(30)));
        assert!(shared.is_open());
        assert!(fence.open_until(Instant::now() + Duration::from_millis(30)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!shared.is_open());
        let refused = shared.check(|| "an append".to_string()).unwrap_err();
        assert!(refused.contains("an append was not sent"), "{refused}");
        assert!(
            !fence.open_until(Instant::now() + Duration::from_secs(5)),
            "the renewal came back after the fence shut"
        );
        assert!(!shared.is_open(), "shut for good");
    }

    #[test]
    fn a_session_passes_its_partitions_fence_while_held_and_no_other() {
        let fences = PartitionFences::new();
        let by_partition = SessionFences::from(fences.clone());
        let (mine, other) = ("session-a", "session-b");
        let partition = crate::leases::partition_of(mine);
        let other = (0..1000)
            .map(|n| format!("{other}-{n}"))
            .find(|key| crate::leases::partition_of(key) != partition)
            .unwrap();
        assert!(!by_partition.of(mine).is_open(), "nothing held: shut");
        let fence = WriteFence::shut_until_held();
        fence.open_until(Instant::now() + Duration::from_secs(60));
        fences.hold(partition, fence.clone(), 42);
        assert!(by_partition.of(mine).is_open());
        assert_eq!(fences.epoch_of(mine), Some(42));
        assert!(
            !by_partition.of(&other).is_open(),
            "another partition: shut"
        );
        assert_eq!(fences.epoch_of(&other), None);
        let refused = by_partition
            .of(&other)
            .check(|| "an append".to_string())
            .unwrap_err();
        assert!(refused.contains("another host may own"), "{refused}");
        fences.let_go(partition);
        assert!(!by_partition.of(mine).is_open(), "let go: shut");
        assert!(!fence.is_open(), "the keeper's fence is shut with it");
        assert!(!fences.owns(mine));
    }

    #[test]
    fn a_closed_fence_stays_closed() {
        let fence = WriteFence::default();
        fence.open_until(Instant::now() + Duration::from_secs(60));
        fence.close();
        assert!(!fence.is_open());
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert!(
            !fence.is_open(),
            "a renewal racing the loss does not reopen it"
        );
    }
}
