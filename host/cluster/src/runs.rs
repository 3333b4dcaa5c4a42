//! [`KvRuns`]: the runs every gateway host sees, in two JetStream key-value buckets. `claw_runs`
//! maps a run id (escaped as a key) to `{session, status, payload?, finishedAtMs?}`;
//! `claw_idem` maps a session and the SHA-256 of an idempotency key to `{runId, atMs}`, written
//! with `create`, so of racing sends with one key, on any hosts, exactly one registers its run
//! and the others are told that run. The idempotency window is kept by the times in the values
//! (a key older than [`IDEMPOTENCY_WINDOW`] counts as absent and is replaced by a revision-checked
//! update, a run finished longer ago is unknown), so `remember` can record a run that ended
//! before this process started; the buckets' `max_age` only clears what nobody reads any more
//! (10 minutes for keys, [`RUNS_KEPT`] for runs, which bounds how long a run may stay in flight).
//! `wait` watches the run's key until it is finished or the time is up.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use clawcage_agent::runs::{
    IDEMPOTENCY_WINDOW, Registered, RunFuture, RunRegistry, RunResult, RunStatus,
};
use clawcage_agent::transcript::now_ms;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ClusterOptions;
use crate::keys::{idempotency_key, token};

/// The bucket of runs.
pub const RUNS_BUCKET: &str = "claw_runs";

/// The bucket of idempotency keys.
pub const IDEMPOTENCY_BUCKET: &str = "claw_idem";

/// How long the runs bucket keeps an entry after its last write: a run still in flight after a
/// week is forgotten.
pub const RUNS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Tries of a register whose key changes under it (each lost race reads the winner).
const REGISTER_TRIES: usize = 8;

/// The runs on JetStream key-value buckets. Cheap to clone.
#[derive(Clone)]
pub struct KvRuns {
    runs: kv::Store,
    keys: kv::Store,
}

impl std::fmt::Debug for KvRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvRuns")
            .field("runs", &RUNS_BUCKET)
            .field("keys", &IDEMPOTENCY_BUCKET)
            .finish()
    }
}

/// A run as the runs bucket holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredRun {
    session: String,
    status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payload: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_at_ms: Option<u64>,
}

impl StoredRun {
    fn status(&self) -> RunStatus {
        status_named(&self.status)
    }

    /// Finished longer ago than the window: as good as gone.
    fn expired(&self, now: u64) -> bool {
        self.finished_at_ms
            .is_some_and(|at| now.saturating_sub(at) >= window_ms())
    }

    fn result(&self, run_id: &str) -> RunResult {
        let status = self.status();
        let payload = self.payload.clone().unwrap_or_else(
            || json!({"runId": run_id, "status": status.as_str(), "sessionKey": self.session}),
        );
        RunResult { status, payload }
    }
}

/// An idempotency key as its bucket holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredKey {
    run_id: String,
    at_ms: u64,
}

fn window_ms() -> u64 {
    IDEMPOTENCY_WINDOW.as_millis() as u64
}

fn status_named(name: &str) -> RunStatus {
    [
        RunStatus::InFlight,
        RunStatus::Ok,
        RunStatus::Error,
        RunStatus::Aborted,
        RunStatus::Interrupted,
        RunStatus::Dropped,
    ]
    .into_iter()
    .find(|status| status.as_str() == name)
    .unwrap_or(RunStatus::Error)
}

/// Runs the key-value `call` until it answers, trying again for a while when the error is one
/// that passes (the servers electing a new leader for the bucket after one of them died); every
/// call made through it may be made twice, so each is one a second time cannot change: a put of
/// the same value, a read, a create or update whose refusal is checked against what it wrote.
async fn patient<T, E, F, Fut>(what: &str, mut call: F) -> std::io::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    crate::subject_log::patiently(|| {
        let answered = call();
        async move { answered.await.map_err(|error| error.to_string()) }
    })
    .await
    .map_err(|error| io_error(what, error))
}

fn io_error(what: &str, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!(
        "{what}: the NATS key-value store did not answer: {error}; check that the NATS servers run and are reachable"
    ))
}

fn encode<T: Serialize>(value: &T) -> std::io::Result<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(std::io::Error::other)
}

impl KvRuns {
    /// Creates or updates both buckets and opens the registry on them. An error names the
    /// bucket and says why.
    pub(crate) async fn open(
        context: &jetstream::Context,
        options: &ClusterOptions,
    ) -> Result<Self, (String, String)> {
        let runs = crate::open_bucket(
            context,
            options,
            RUNS_BUCKET,
            "clawcage: runs by id, their status and result",
            RUNS_KEPT,
        )
        .await?;
        let keys = crate::open_bucket(
            context,
            options,
            IDEMPOTENCY_BUCKET,
            "clawcage: the idempotency keys of sends, each naming its run",
            IDEMPOTENCY_WINDOW,
        )
        .await?;
        Ok(Self { runs, keys })
    }
}

/// A run's stored form and its revision, if it is known (and not finished too long ago).
async fn load_run(runs: &kv::Store, run_id: &str) -> std::io::Result<Option<(StoredRun, u64)>> {
    let entry = patient(&format!("run {run_id}"), || runs.entry(token(run_id))).await?;
    let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else {
        return Ok(None);
    };
    let Ok(run) = serde_json::from_slice::<StoredRun>(&entry.value) else {
        tracing::warn!(run_id, "an unreadable run record is ignored");
        return Ok(None);
    };
    if run.expired(now_ms()) {
        return Ok(None);
    }
    Ok(Some((run, entry.revision)))
}

async fn register(
    runs: kv::Store,
    keys: kv::Store,
    session: String,
    run_id: String,
    idempotency: Option<String>,
) -> std::io::Result<Registered> {
    let what = format!("registering run {run_id} of session {session}");
    // The run first: whoever reads the key it is about to win finds the run in flight.
    let run = StoredRun {
        session: session.clone(),
        status: RunStatus::InFlight.as_str().to_string(),
        payload: None,
        finished_at_ms: None,
    };
    let record = encode(&run)?;
    patient(&what, || runs.put(token(&run_id), record.clone())).await?;
    let Some(idempotency) = idempotency else {
        return Ok(Registered::New);
    };
    let key = idempotency_key(&session, &idempotency);
    let mine = encode(&StoredKey {
        run_id: run_id.clone(),
        at_ms: now_ms(),
    })?;
    for _ in 0..REGISTER_TRIES {
        let created = patient(&what, || async {
            match keys.create(&key, mine.clone()).await {
                Ok(_) => Ok(true),
                Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(error) => Err(error),
            }
        })
        .await?;
        if created {
            return Ok(Registered::New);
        }
        let entry = patient(&what, || keys.entry(key.clone())).await?;
        let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else {
            // Forgotten meanwhile: create it again.
            continue;
        };
        if entry.value == mine {
            // What this call wrote, in a try whose acknowledgement was lost.
            return Ok(Registered::New);
        }
        let earlier = serde_json::from_slice::<StoredKey>(&entry.value).ok();
        match earlier {
            // This same run, registered again (a host taking over a session registers the
            // runs it resumes): a duplicate of itself, as in memory, and it stays as it is.
            Some(earlier) if earlier.run_id == run_id => {
                let status = load_run(&runs, &run_id)
                    .await?
                    .map_or(RunStatus::InFlight, |(run, _)| run.status());
                return Ok(Registered::Duplicate { run_id, status });
            }
            Some(earlier) if now_ms().saturating_sub(earlier.at_ms) < window_ms() => {
                // A duplicate: this run never existed.
                if let Err(error) = runs.purge(token(&run_id)).await {
                    tracing::warn!(run_id, "cannot drop a duplicate run's record: {error}");
                }
                let status = load_run(&runs, &earlier.run_id)
                    .await?
                    .map_or(RunStatus::Ok, |(run, _)| run.status());
                return Ok(Registered::Duplicate {
                    run_id: earlier.run_id,
                    status,
                });
            }
            // Older than the window (or unreadable): take its place, unless another send does.
            _ => {
                let updated = patient(&what, || async {
                    match keys.update(&key, mine.clone(), entry.revision).await {
                        Ok(_) => Ok(true),
                        Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                            Ok(false)
                        }
                        Err(error) => Err(error),
                    }
                })
                .await?;
                if updated {
                    return Ok(Registered::New);
                }
            }
        }
    }
    Err(std::io::Error::other(format!(
        "{what}: its idempotency key kept changing under it; send it again"
    )))
}

async fn wait(
    runs: kv::Store,
    run_id: String,
    timeout: Duration,
) -> std::io::Result<Option<Option<RunResult>>> {
    let Some((run, _)) = load_run(&runs, &run_id).await? else {
        return Ok(None);
    };
    if run.status() != RunStatus::InFlight {
        return Ok(Some(Some(run.result(&run_id))));
    }
    let what = format!("waiting for run {run_id}");
    let watched = async {
        // The last value first, then every change: a finish between the load above and the
        // watch is not missed.
        let mut watch = runs
            .watch_with_history(token(&run_id))
            .await
            .map_err(|error| io_error(&what, error))?;
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|error| io_error(&what, error))?;
            if entry.operation != kv::Operation::Put {
                return Ok(None);
            }
            if let Ok(run) = serde_json::from_slice::<StoredRun>(&entry.value)
                && run.status() != RunStatus::InFlight
            {
                return Ok(Some(run.result(&run_id)));
            }
        }
        Ok(None)
    };
    match tokio::time::timeout(timeout, watched).await {
        Ok(result) => result.map(Some),
        Err(_) => Ok(Some(None)),
    }
}

impl RunRegistry for KvRuns {
    fn register(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
    ) -> RunFuture<Registered> {
        Box::pin(register(
            self.runs.clone(),
            self.keys.clone(),
            session.to_string(),
            run_id.to_string(),
            idempotency.map(str::to_string),
        ))
    }

    fn remember(
        &self,
        session: &str,
        run_id: &str,
        idempotency: Option<&str>,
        status: RunStatus,
        age: Duration,
    ) -> RunFuture<()> {
        let (runs, keys) = (self.runs.clone(), self.keys.clone());
        let (session, run_id) = (session.to_string(), run_id.to_string());
        let idempotency = idempotency.map(str::to_string);
        Box::pin(async move {
            let what = format!("recording run {run_id} of session {session}");
            let at_ms = now_ms().saturating_sub(age.as_millis() as u64);
            let run = StoredRun {
                session: session.clone(),
                status: status.as_str().to_string(),
                payload: Some(
                    json!({"runId": run_id, "status": status.as_str(), "sessionKey": session}),
                ),
                finished_at_ms: Some(at_ms),
            };
            let record = encode(&run)?;
            patient(&what, || runs.put(token(&run_id), record.clone())).await?;
            if let Some(idempotency) = idempotency {
                let key = encode(&StoredKey {
                    run_id: run_id.clone(),
                    at_ms,
                })?;
                let name = idempotency_key(&session, &idempotency);
                patient(&what, || keys.put(name.clone(), key.clone())).await?;
            }
            Ok(())
        })
    }

    fn forget_key(&self, session: &str, idempotency: &str) -> RunFuture<()> {
        let keys = self.keys.clone();
        let key = idempotency_key(session, idempotency);
        let what = format!("forgetting an idempotency key of session {session}");
        Box::pin(async move { patient(&what, || keys.delete(key.clone())).await })
    }

    fn finish(&self, run_id: &str, status: RunStatus, mut payload: Value) -> RunFuture<()> {
        let runs = self.runs.clone();
        let run_id = run_id.to_string();
        Box::pin(async move {
            let Some((mut run, _)) = load_run(&runs, &run_id).await? else {
                return Ok(());
            };
            if !payload.is_object() {
                payload = json!({});
            }
            payload["runId"] = json!(run_id);
            payload["status"] = json!(status.as_str());
            payload["sessionKey"] = json!(run.session);
            run.status = status.as_str().to_string();
            run.payload = Some(payload);
            run.finished_at_ms = Some(now_ms());
            let record = encode(&run)?;
            patient(&format!("finishing run {run_id}"), || {
                runs.put(token(&run_id), record.clone())
            })
            .await?;
            Ok(())
        })
    }

    fn status(&self, run_id: &str) -> RunFuture<Option<(String, RunStatus)>> {
        let runs = self.runs.clone();
        let run_id = run_id.to_string();
        Box::pin(async move {
            Ok(load_run(&runs, &run_id)
                .await?
                .map(|(run, _)| (run.session.clone(), run.status())))
        })
    }

    fn wait(&self, run_id: &str, timeout: Duration) -> RunFuture<Option<Option<RunResult>>> {
        Box::pin(wait(self.runs.clone(), run_id.to_string(), timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_survives_its_wire_name() {
        for status in [
            RunStatus::InFlight,
            RunStatus::Ok,
            RunStatus::Error,
            RunStatus::Aborted,
            RunStatus::Interrupted,
            RunStatus::Dropped,
        ] {
            assert_eq!(status_named(status.as_str()), status);
        }
    }

    #[test]
    fn a_run_finished_longer_ago_than_the_window_is_gone() {
        let run = StoredRun {
            session: "s".into(),
            status: "ok".into(),
            payload: None,
            finished_at_ms: Some(1_000),
        };
        assert!(!run.expired(1_000 + window_ms() - 1));
        assert!(run.expired(1_000 + window_ms()));
        let in_flight = StoredRun {
            finished_at_ms: None,
            ..run
        };
        assert!(!in_flight.expired(u64::MAX));
        assert_eq!(
            in_flight.result("r").payload,
            json!({"runId": "r", "status": "ok", "sessionKey": "s"})
        );
    }
}
