//! The write fence of a lease holder: whether this process may still write the sessions' state
//! as their owner. The stores check it before every attempt to publish (a first try and each
//! retry), so a host whose lease has gone unrenewed for [`crate::leases::SELF_FENCE_FRACTION`] of
//! its time to live sends nothing more, whatever its tasks are waiting on: the next holder can
//! take the lease only once the whole time to live has passed since the last renewal reached the
//! server, and by then this host's writes have stopped. A fence nobody holds open (the CLI, the
//! tests, a process that owns no lease) never closes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
enum State {
    /// Writes are not tied to a lease.
    Unfenced,
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
            state: Arc::new(Mutex::new(State::OpenUntil(Instant::now()))),
        }
    }

    /// Writes may go out until `until`, and no longer unless it is moved on again.
    pub fn open_until(&self, until: Instant) {
        let mut state = clawcage_core::sync::lock(&self.state);
        if !matches!(*state, State::Closed) {
            *state = State::OpenUntil(until);
        }
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
            State::Closed => false,
        }
    }

    /// `Ok` when a write may go out now; otherwise why not, for the error of the write `what`
    /// describes (made only then: the check is on every write's path).
    pub fn check(&self, what: impl FnOnce() -> String) -> Result<(), String> {
        if self.is_open() {
            Ok(())
        } else {
            Err(format!(
                "{} was not sent: this host's lease is lost or could not be renewed in time, so another host may own the session now; this host stops writing (start it again to wait as a standby)",
                what()
            ))
        }
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
    fn a_fence_closes_when_its_time_passes_and_reopens_when_moved_on() {
        let fence = WriteFence::default();
        let shared = fence.clone();
        fence.open_until(Instant::now() + Duration::from_millis(30));
        assert!(shared.is_open());
        std::thread::sleep(Duration::from_millis(40));
        assert!(!shared.is_open());
        let refused = shared.check(|| "an append".to_string()).unwrap_err();
        assert!(refused.contains("an append was not sent"), "{refused}");
        fence.open_until(Instant::now() + Duration::from_secs(5));
        assert!(shared.is_open());
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
