//! The clock a call's time limit runs on: wall time, less the time the call spent waiting for an
//! operator's answer (a write under a read-only workspace asked mid-call). A person may take
//! minutes to answer; the call's own limit is for its work, so it is paused while a question is
//! open. [`CallClock::run`] bounds a future by a deadline that moves by every pause, and
//! [`GuestMonotonicClock`] shows the same paused time to the guest, so a program that measures
//! its own budget (the exec shell gives each pipeline what is left of the call) sees a clock
//! that stood still while the question was open. The clock of the call running in a task is
//! also reachable from there ([`pause_current_call`]), for questions asked deep inside a host
//! function (a host off the network allow-list).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The pauses of one call, shared by its store, its programs and its timers.
#[derive(Clone, Default)]
pub(crate) struct CallClock(Arc<ClockState>);

#[derive(Default)]
struct ClockState {
    pauses: Mutex<Pauses>,
    resumed: Notify,
}

#[derive(Default)]
struct Pauses {
    /// Questions open now.
    open: u32,
    /// When the first of the open questions was asked.
    since: Option<Instant>,
    /// Time paused by questions already answered.
    total: Duration,
}

impl Pauses {
    fn paused_until(&self, now: Instant) -> Duration {
        self.total + self.since.map_or(Duration::ZERO, |since| now - since)
    }
}

tokio::task_local! {
    /// The clock of the tool call this task runs.
    static CURRENT: CallClock;
}

/// Stops the clock of the tool call running in this task, if any, while the guard lives.
pub(crate) fn pause_current_call() -> Option<Paused> {
    CURRENT.try_with(CallClock::pause).ok()
}

/// Stops the clock until dropped.
pub(crate) struct Paused(CallClock);

impl Drop for Paused {
    fn drop(&mut self) {
        let mut pauses = self.0.lock();
        pauses.open = pauses.open.saturating_sub(1);
        if pauses.open == 0
            && let Some(since) = pauses.since.take()
        {
            pauses.total += since.elapsed();
        }
        drop(pauses);
        self.0.0.resumed.notify_waiters();
    }
}

/// A deadline passed on a [`CallClock`].
#[derive(Debug)]
pub(crate) struct Elapsed;

impl CallClock {
    fn lock(&self) -> MutexGuard<'_, Pauses> {
        self.0
            .pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the clock while the returned guard lives (questions may overlap).
    pub(crate) fn pause(&self) -> Paused {
        let mut pauses = self.lock();
        pauses.open += 1;
        if pauses.since.is_none() {
            pauses.since = Some(Instant::now());
        }
        Paused(self.clone())
    }

    /// Time paused so far, the open pause included: a mark for [`CallClock::moved_since`].
    pub(crate) fn mark(&self) -> Duration {
        self.lock().paused_until(Instant::now())
    }

    /// How far the pauses since `mark` moved a deadline set then.
    pub(crate) fn moved_since(&self, mark: Duration) -> Duration {
        self.mark().saturating_sub(mark)
    }

    /// Time that counted since `start` (wall time less pauses after `paused_at_start`).
    fn counted_since(&self, start: Instant, paused_at_start: Duration) -> Duration {
        let pauses = self.lock();
        let now = Instant::now();
        (now - start).saturating_sub(pauses.paused_until(now).saturating_sub(paused_at_start))
    }

    /// `future`, or [`Elapsed`] once `deadline` has passed on this clock: every pause from now
    /// on moves the deadline by its length, and while a question is open it never passes.
    pub(crate) async fn run<F: Future>(
        &self,
        deadline: Instant,
        future: F,
    ) -> Result<F::Output, Elapsed> {
        let paused_at_start = self.mark();
        let expired = async {
            loop {
                let resumed = self.0.resumed.notified();
                let (open, moved) = {
                    let pauses = self.lock();
                    let moved = pauses
                        .paused_until(Instant::now())
                        .saturating_sub(paused_at_start);
                    (pauses.open > 0, moved)
                };
                if open {
                    resumed.await;
                    continue;
                }
                let effective = deadline + moved;
                if Instant::now() >= effective {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(effective.into()) => {}
                    // A pause that starts meanwhile is seen at the next turn.
                    () = resumed => {}
                }
            }
        };
        tokio::select! {
            output = future => Ok(output),
            () = expired => Err(Elapsed),
        }
    }

    /// `future` run as this call's work: [`pause_current_call`] inside it pauses this clock.
    pub(crate) async fn scope<F: Future>(&self, future: F) -> F::Output {
        CURRENT.scope(self.clone(), future).await
    }

    /// The monotonic clock a guest of this call sees.
    pub(crate) fn guest_clock(&self) -> GuestMonotonicClock {
        GuestMonotonicClock {
            clock: self.clone(),
            start: Instant::now(),
            paused_at_start: self.mark(),
        }
    }
}

/// `wasi:clocks/monotonic-clock` for a guest of a call: nanoseconds since the store began, less
/// the call's pauses (it stands still while a question is open).
pub(crate) struct GuestMonotonicClock {
    clock: CallClock,
    start: Instant,
    paused_at_start: Duration,
}

impl wasmtime_wasi::HostMonotonicClock for GuestMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        let counted = self.clock.counted_since(self.start, self.paused_at_start);
        u64::try_from(counted.as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi::HostMonotonicClock as _;

    #[tokio::test]
    async fn a_deadline_passes_without_pauses() {
        let clock = CallClock::default();
        let deadline = Instant::now() + Duration::from_millis(50);
        let outcome = clock.run(deadline, std::future::pending::<()>()).await;
        assert!(outcome.is_err());
    }

    #[tokio::test]
    async fn an_open_question_holds_the_deadline() {
        let clock = CallClock::default();
        let question = clock.pause();
        let deadline = Instant::now() + Duration::from_millis(20);
        // Far past the deadline, but a question is open all along.
        let outcome = clock
            .run(deadline, tokio::time::sleep(Duration::from_millis(300)))
            .await;
        drop(question);
        assert!(outcome.is_ok());
    }

    #[tokio::test]
    async fn a_pause_moves_the_deadline_by_its_length_and_no_more() {
        let clock = CallClock::default();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        let question = clock.pause();
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(question);
        });
        let outcome = clock.run(deadline, std::future::pending::<()>()).await;
        assert!(outcome.is_err(), "the rest of the limit still holds");
        assert!(started.elapsed() >= Duration::from_millis(290));
        answer.await.expect("joined");
    }

    #[tokio::test]
    async fn a_question_deep_in_a_call_pauses_that_calls_clock_only() {
        let clock = CallClock::default();
        assert!(pause_current_call().is_none(), "no call runs here");
        let inside = clock
            .scope(async {
                let _question = pause_current_call().expect("the call's clock");
                tokio::time::sleep(Duration::from_millis(50)).await;
            })
            .await;
        let () = inside;
        assert!(clock.mark() >= Duration::from_millis(50));
    }

    #[test]
    fn the_guest_clock_stands_still_while_a_question_is_open() {
        let clock = CallClock::default();
        let guest = clock.guest_clock();
        let question = clock.pause();
        let first = guest.now();
        std::thread::sleep(Duration::from_millis(30));
        let during = guest.now();
        assert_eq!(during, first);
        drop(question);
        std::thread::sleep(Duration::from_millis(30));
        assert!(guest.now() >= during + 25_000_000);
    }
}
