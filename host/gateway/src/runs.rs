//! The gateway's runs: each run in flight or finished within the idempotency window, its
//! status and result (what `agent.wait` waits for), and the idempotency keys of the sends that
//! made them. [`RunRegistry`] is the seam a shared registry (a key-value store across gateway
//! hosts) implements; [`InMemoryRuns`] is the one implementation today, rebuilt at each start
//! from the sessions' inboxes (pending inputs are runs in flight, done ones keep their keys).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
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

/// The runs a gateway knows.
pub trait RunRegistry: Send + Sync {
    /// Register run `run_id` of `session`, in flight. With an `idempotency` key already known
    /// in `session` within the window, nothing is registered: the earlier run's id and status
    /// are returned instead.
    fn register(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
    ) -> Result<(), (String, RunStatus)>;
    /// Record a run that ended before this process started, `age` ago (a restart): its key
    /// (unless `None`) and status stay known for the rest of the window.
    fn remember(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
        status: RunStatus,
        age: Duration,
    );
    /// Forget `session`'s key `idempotency`: its send was refused, so it may be sent again.
    fn forget_key(&self, session: &str, idempotency: &str);
    /// End `run_id` with `status`; `payload` gains `runId`, `status` and `sessionKey`.
    fn finish(&self, run_id: &str, status: RunStatus, payload: Value);
    /// `run_id`'s session and status, if known.
    fn status(&self, run_id: &str) -> Option<(String, RunStatus)>;
    /// Sees `run_id`'s result once it has one (`None` while in flight); `None` if unknown.
    fn watch(&self, run_id: &str) -> Option<watch::Receiver<Option<RunResult>>>;
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

/// The runs in this process's memory.
#[derive(Default)]
pub struct InMemoryRuns {
    runs: Mutex<Runs>,
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
    ) -> Result<(), (String, RunStatus)> {
        let mut runs = self.lock();
        if let Some(idempotency) = idempotency
            && let Some((earlier, at)) = runs
                .idempotency
                .get(&(session.to_string(), idempotency.to_string()))
            && at.elapsed() < IDEMPOTENCY_WINDOW
        {
            let earlier = earlier.clone();
            let status = runs.status_of(&earlier);
            return Err((earlier, status));
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
        Ok(())
    }

    fn remember(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
        status: RunStatus,
        age: Duration,
    ) {
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
    }

    fn forget_key(&self, session: &str, idempotency: &str) {
        self.lock()
            .idempotency
            .remove(&(session.to_string(), idempotency.to_string()));
    }

    fn finish(&self, run_id: &str, status: RunStatus, mut payload: Value) {
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
    }

    fn status(&self, run_id: &str) -> Option<(String, RunStatus)> {
        let runs = self.lock();
        let entry = runs.entries.get(run_id)?;
        Some((entry.session.clone(), runs.status_of(run_id)))
    }

    fn watch(&self, run_id: &str) -> Option<watch::Receiver<Option<RunResult>>> {
        Some(self.lock().entries.get(run_id)?.result.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_find_their_run_until_forgotten_and_results_are_seen() {
        let runs = InMemoryRuns::default();
        assert!(runs.register("s", "r1", Some("k")).is_ok());
        assert_eq!(
            runs.register("s", "r2", Some("k")),
            Err(("r1".to_string(), RunStatus::InFlight))
        );
        assert!(
            runs.register("other", "r3", Some("k")).is_ok(),
            "keys are per session"
        );
        let mut watching = runs.watch("r1").unwrap();
        runs.finish("r1", RunStatus::Ok, json!({"text": "hi"}));
        let seen = watching.borrow_and_update().clone().unwrap();
        assert_eq!(seen.payload["status"], "ok");
        assert_eq!(seen.payload["sessionKey"], "s");
        assert_eq!(runs.status("r1"), Some(("s".to_string(), RunStatus::Ok)));
        runs.forget_key("s", "k");
        assert!(runs.register("s", "r4", Some("k")).is_ok());
        runs.remember(
            "s",
            "old",
            Some("ko"),
            RunStatus::Aborted,
            Duration::from_secs(5),
        );
        assert_eq!(
            runs.register("s", "r5", Some("ko")),
            Err(("old".to_string(), RunStatus::Aborted))
        );
        runs.remember(
            "s",
            "ancient",
            Some("ka"),
            RunStatus::Ok,
            IDEMPOTENCY_WINDOW,
        );
        assert!(
            runs.register("s", "r6", Some("ka")).is_ok(),
            "a key older than the window is forgotten"
        );
        assert!(runs.status("nope").is_none());
    }
}
