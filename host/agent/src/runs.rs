//! The runs a long-running front end (the gateway) serves: each run in flight or finished within
//! the idempotency window, its status and result (what `agent.wait` waits for), and the
//! idempotency keys of the sends that made them. [`RunRegistry`] is the seam a shared registry (a
//! key-value store across gateway hosts) implements, asynchronous like any store across a
//! network; [`InMemoryRuns`] is the in-process implementation, rebuilt at each start from the
//! sessions' inboxes (pending inputs are runs in flight, done ones keep their keys).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

/// How long an idempotency key is remembered, and a finished run kept for `agent.wait`.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(600);

/// What a run is, as `agent.wait` and idempotent sends report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Queued or running.
    InFlight,
    /// Answered (or stopped by a guard with an explanation).
    Ok,
    /// Failed.
    Error,
    /// Stopped by `chat.abort` or a shutdown.
    Aborted,
    /// Cut off by a killed gateway of an older version (found at the next start).
    Interrupted,
    /// Left the session's queue without running (its cap and drop policy, or a newer message
    /// in `interrupt` mode).
    Dropped,
}

impl RunStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::InFlight => "in_flight",
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Aborted => "aborted",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Dropped => "dropped",
        }
    }
}

/// A run's result: its status and the payload `agent` and `agent.wait` answer with.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The status.
    pub status: RunStatus,
    /// `{runId, status, sessionKey, text?, usage?, error?}`.
    pub payload: Value,
}

/// What the calls of a [`RunRegistry`] return: futures that own what they need, so a caller
/// may hand them to a task of their own.
pub type RunFuture<T> = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send + 'static>>;

/// What [`RunRegistry::register`] made of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// Registered, in flight.
    New,
    /// Its idempotency key was sent before within the window: this is that run.
    Duplicate {
        /// The earlier run's id.
        run_id: String,
        /// Its status now.
        status: RunStatus,
    },
}

/// The runs a gateway knows. A change may take effect when the call is made (in memory) or
/// only when its future completes (over a network): a caller that depends on it awaits it.
pub trait RunRegistry: Send + Sync {
    /// Register run `run_id` of `session`, in flight. With an `idempotency` key already known
    /// in `session` within the window, nothing is registered: the earlier run is returned.
    fn register(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
    ) -> RunFuture<Registered>;
    /// Record a run that ended before this process started, `age` ago (a restart): its key
    /// (unless `None`) and status stay known for the rest of the window.
    fn remember(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
        status: RunStatus,
        age: Duration,
    ) -> RunFuture<()>;
    /// Forget `session`'s key `idempotency`: its send was refused, so it may be sent again.
    fn forget_key(&self, session: &str, idempotency: &str) -> RunFuture<()>;
    /// End `run_id` with `status`; `payload` gains `runId`, `status` and `sessionKey`.
    fn finish(&self, run_id: &str, status: RunStatus, payload: Value) -> RunFuture<()>;
    /// `run_id`'s session and status, if known.
    fn status(&self, run_id: &str) -> RunFuture<Option<(String, RunStatus)>>;
    /// Waits at most `timeout` for `run_id`'s result: `None` if the run is unknown, `Some(None)`
    /// if it is still in flight when the time is up.
    fn wait(&self, run_id: &str, timeout: Duration) -> RunFuture<Option<Option<RunResult>>>;
}

struct RunEntry {
    session: String,
    result: watch::Sender<Option<RunResult>>,
    finished: Option<Instant>,
}

#[derive(Default)]
struct Runs {
    entries: HashMap<String, RunEntry>,
    /// `(session, idempotency key)` → run id and when it was first sent.
    idempotency: HashMap<(String, String), (String, Instant)>,
}

impl Runs {
    fn prune(&mut self) {
        let now = Instant::now();
        self.entries.retain(|_, entry| {
            entry
                .finished
                .is_none_or(|at| now.duration_since(at) < IDEMPOTENCY_WINDOW)
        });
        self.idempotency
            .retain(|_, (_, at)| now.duration_since(*at) < IDEMPOTENCY_WINDOW);
    }

    fn status_of(&self, run_id: &str) -> RunStatus {
        self.entries.get(run_id).map_or(RunStatus::Ok, |entry| {
            entry
                .result
                .borrow()
                .as_ref()
                .map_or(RunStatus::InFlight, |result| result.status)
        })
    }
}

/// The runs in this process's memory. Every change takes effect when its call is made.
#[derive(Default, Clone)]
pub struct InMemoryRuns {
    runs: Arc<Mutex<Runs>>,
}

fn done<T: Send + 'static>(value: T) -> RunFuture<T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl InMemoryRuns {
    fn lock(&self) -> MutexGuard<'_, Runs> {
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl RunRegistry for InMemoryRuns {
    fn register(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
    ) -> RunFuture<Registered> {
        let mut runs = self.lock();
        if let Some(idempotency) = idempotency
            && let Some((earlier, at)) = runs
                .idempotency
                .get(&(session.to_string(), idempotency.to_string()))
            && at.elapsed() < IDEMPOTENCY_WINDOW
        {
            let earlier = earlier.clone();
            let status = runs.status_of(&earlier);
            return done(Registered::Duplicate {
                run_id: earlier,
                status,
            });
        }
        runs.prune();
        if let Some(idempotency) = idempotency {
            runs.idempotency.insert(
                (session.to_string(), idempotency.to_string()),
                (run_id.to_string(), Instant::now()),
            );
        }
        runs.entries.insert(
            run_id.to_string(),
            RunEntry {
                session: session.to_string(),
                result: watch::channel(None).0,
                finished: None,
            },
        );
        done(Registered::New)
    }

    fn remember(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
        status: RunStatus,
        age: Duration,
    ) -> RunFuture<()> {
        let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let mut runs = self.lock();
        if let Some(idempotency) = idempotency {
            runs.idempotency.insert(
                (session.to_string(), idempotency.to_string()),
                (run_id.to_string(), at),
            );
        }
        let (result, _) = watch::channel(Some(RunResult {
            status,
            payload: json!({"runId": run_id, "status": status.as_str(), "sessionKey": session}),
        }));
        runs.entries.insert(
            run_id.to_string(),
            RunEntry {
                session: session.to_string(),
                result,
                finished: Some(at),
            },
        );
        done(())
    }

    fn forget_key(&self, session: &str, idempotency: &str) -> RunFuture<()> {
        self.lock()
            .idempotency
            .remove(&(session.to_string(), idempotency.to_string()));
        done(())
    }

    fn finish(&self, run_id: &str, status: RunStatus, mut payload: Value) -> RunFuture<()> {
        let mut runs = self.lock();
        if let Some(entry) = runs.entries.get_mut(run_id) {
            payload["runId"] = json!(run_id);
            payload["status"] = json!(status.as_str());
            payload["sessionKey"] = json!(entry.session);
            entry.finished = Some(Instant::now());
            entry
                .result
                .send_replace(Some(RunResult { status, payload }));
        }
        done(())
    }

    fn status(&self, run_id: &str) -> RunFuture<Option<(String, RunStatus)>> {
        let runs = self.lock();
        let status = runs
            .entries
            .get(run_id)
            .map(|entry| (entry.session.clone(), runs.status_of(run_id)));
        done(status)
    }

    fn wait(&self, run_id: &str, timeout: Duration) -> RunFuture<Option<Option<RunResult>>> {
        let receiver = self
            .lock()
            .entries
            .get(run_id)
            .map(|entry| entry.result.subscribe());
        Box::pin(async move {
            let Some(mut receiver) = receiver else {
                return Ok(None);
            };
            let waited = tokio::time::timeout(timeout, receiver.wait_for(Option::is_some)).await;
            Ok(Some(match waited {
                Ok(Ok(result)) => result.clone(),
                _ => None,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_find_their_run_until_forgotten_and_results_are_seen() {
        let runs = InMemoryRuns::default();
        let new = Registered::New;
        let duplicate = |run_id: &str, status| Registered::Duplicate {
            run_id: run_id.to_string(),
            status,
        };
        assert_eq!(runs.register("s", "r1", Some("k")).await.unwrap(), new);
        assert_eq!(
            runs.register("s", "r2", Some("k")).await.unwrap(),
            duplicate("r1", RunStatus::InFlight)
        );
        assert_eq!(
            runs.register("other", "r3", Some("k")).await.unwrap(),
            new,
            "keys are per session"
        );
        assert!(
            matches!(
                runs.wait("r1", Duration::from_millis(10)).await.unwrap(),
                Some(None)
            ),
            "in flight when the time is up"
        );
        let waiting = tokio::spawn(runs.wait("r1", Duration::from_secs(30)));
        runs.finish("r1", RunStatus::Ok, json!({"text": "hi"}))
            .await
            .unwrap();
        let seen = waiting.await.unwrap().unwrap().unwrap().unwrap();
        assert_eq!(seen.payload["status"], "ok");
        assert_eq!(seen.payload["sessionKey"], "s");
        assert_eq!(
            runs.status("r1").await.unwrap(),
            Some(("s".to_string(), RunStatus::Ok))
        );
        runs.forget_key("s", "k").await.unwrap();
        assert_eq!(runs.register("s", "r4", Some("k")).await.unwrap(), new);
        runs.remember(
            "s",
            "old",
            Some("ko"),
            RunStatus::Aborted,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            runs.register("s", "r5", Some("ko")).await.unwrap(),
            duplicate("old", RunStatus::Aborted)
        );
        runs.remember(
            "s",
            "ancient",
            Some("ka"),
            RunStatus::Ok,
            IDEMPOTENCY_WINDOW,
        )
        .await
        .unwrap();
        assert_eq!(
            runs.register("s", "r6", Some("ka")).await.unwrap(),
            new,
            "a key older than the window is forgotten"
        );
        assert!(runs.status("nope").await.unwrap().is_none());
        assert!(
            runs.wait("nope", Duration::ZERO).await.unwrap().is_none(),
            "an unknown run"
        );
    }
}
