//! How the hub takes up what a stopped gateway left: the sessions' inboxes at its start
//! (finished inputs keep their keys and statuses; pending ones become runs again under their
//! ids, an open turn resumed), the run journal of an older gateway, and cron firings delivered
//! exactly once through [`Hub::firing_sink`].

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use clawcage_agent::agent_loop::{AgentError, TurnObserver};
use clawcage_agent::cron::FiringSink;
use clawcage_agent::events::{AgentEvent, Stream};
use clawcage_agent::inbox::{FinishedInput, InputRecord, InputStatus};
use clawcage_agent::session::queue::QueuedJob;
use clawcage_agent::session::{Recovered, RecoveredFate};
use clawcage_core::InboundMessage;
use serde_json::{Value, json};

use super::{
    Hub, HubObserver, LaneReply, Registered, RunStatus, Ticket, TicketKind, lock, outcome_payload,
};

impl Hub {
    /// Takes up what a stopped gateway left in the sessions' inboxes: finished inputs keep
    /// their idempotency keys and statuses (for duplicates and `agent.wait`); pending ones
    /// become runs again under their own ids, the open turn of a session resumed. A host that
    /// serves its share of the partitions takes each up when it gains it, not here.
    pub(super) async fn take_up_inboxes(&self) {
        if self.parts.partitions.is_some() {
            return;
        }
        let Some(inbox) = self.parts.sessions.inbox().cloned() else {
            return;
        };
        match inbox.sessions() {
            Ok(keys) => self.take_up_sessions(keys).await,
            Err(error) => {
                tracing::error!(%error, "cannot list the sessions' inboxes: no run is resumed");
            }
        }
    }

    /// [`Hub::take_up_inboxes`] for the sessions `keys`.
    pub(super) async fn take_up_sessions(&self, keys: Vec<String>) {
        let Some(inbox) = self.parts.sessions.inbox().cloned() else {
            return;
        };
        let (mut resumed, mut queued) = (0usize, 0usize);
        for key in keys {
            let finished = inbox.finished(&key).unwrap_or_default();
            for input in &finished {
                self.remember_finished(&key, input).await;
            }
            let lately = lately_finished(&finished);
            if !lately.is_empty() {
                // The last holder may have stopped between marking them done and saying their
                // end: said now, where the log lacks it.
                let hub = self.this.clone();
                let session_key = key.clone();
                tokio::spawn(async move {
                    if let Some(hub) = hub.upgrade() {
                        hub.say_unsaid_ends(&session_key, lately).await;
                    }
                });
            }
            let session = match self.open_session(&key).await {
                Ok(session) => session,
                Err(error) => {
                    tracing::error!(session = %key, ?error, "cannot open a session: its runs are not resumed");
                    continue;
                }
            };
            let _admit = lock(&session.admit);
            let observe = |key: &str, record: &InputRecord| -> Arc<dyn TurnObserver> {
                Arc::new(HubObserver::new(
                    self.this.clone(),
                    session.clone(),
                    key,
                    &record.id,
                ))
            };
            let recovered = self.parts.sessions.recover_session(&key, &observe);
            let mut state = session.lock();
            for item in recovered {
                let Recovered {
                    record,
                    pending,
                    fate,
                    ..
                } = item;
                match fate {
                    RecoveredFate::Resumed => resumed += 1,
                    RecoveredFate::Queued => queued += 1,
                    RecoveredFate::Answered => {}
                }
                let run_id = record.id.clone();
                let stop_requested = record.stop_requested;
                // Known to the registry before anything of it is said (the in-memory registry at
                // once; another one in the task's order).
                let registering = self
                    .runs
                    .register(&key, &run_id, record.idempotency.as_deref());
                let (runs, registered_key, registered_run) =
                    (self.runs.clone(), key.clone(), run_id.clone());
                tokio::spawn(async move {
                    match registering.await {
                        Ok(Registered::New) => {}
                        // Registered by the host that took it first (a cluster's registry):
                        // the same run.
                        Ok(Registered::Duplicate {
                            run_id: earlier, ..
                        }) if earlier == registered_run => {}
                        Ok(Registered::Duplicate {
                            run_id: earlier, ..
                        }) => {
                            // Two pending inputs under one key cannot come from the inbox; keep
                            // both.
                            tracing::warn!(run = %registered_run, %earlier, "two pending runs share an idempotency key");
                            let _ = runs.register(&registered_key, &registered_run, None).await;
                        }
                        Err(error) => {
                            tracing::error!(run = %registered_run, %error, "cannot record a resumed run");
                        }
                    }
                });
                let (kind, text, sender) = match &record.job {
                    QueuedJob::User { text, .. } => ("user", text.clone(), None),
                    QueuedJob::Notification { message } => (
                        "notification",
                        message.content.clone(),
                        Some(message.sender.clone()),
                    ),
                    QueuedJob::Reset | QueuedJob::Compact => {
                        // A reset or compaction nobody waits for any more: it just runs.
                        continue;
                    }
                };
                if fate == RecoveredFate::Answered {
                    // Committed just before the stop: its end is said now, unless it was then.
                    let hub = self.this.clone();
                    let session_key = key.clone();
                    tokio::spawn(async move {
                        let Some(strong) = hub.upgrade() else {
                            return;
                        };
                        let said = strong.run_has_ended(&session_key, &run_id).await;
                        drop(strong);
                        let reply = pending.wait().await;
                        if let Some(hub) = hub.upgrade() {
                            hub.settle_answered(&session_key, &run_id, reply, said);
                        }
                    });
                    continue;
                }
                let ticket = pending.ticket();
                state.tickets.insert(
                    ticket,
                    Ticket {
                        kind: TicketKind::Run {
                            run_id,
                            kind,
                            text,
                            sender,
                        },
                        reply: Box::pin(pending.wait()),
                        waker: None,
                        joined: None,
                        abort_on_start: stop_requested,
                        dropped_said: false,
                    },
                );
                drop(state);
                self.follow(&session, ticket);
                state = session.lock();
            }
        }
        if resumed + queued > 0 {
            tracing::info!(
                resumed,
                queued,
                "took up the runs the last gateway left in flight"
            );
        }
    }

    /// Whether `key`'s events hold the end of `run_id`.
    async fn run_has_ended(&self, key: &str, run_id: &str) -> bool {
        self.lifecycle_marks(key, &[run_id.to_string()])
            .await
            .is_ok_and(|marks| marks.ended.contains(run_id))
    }

    /// A run whose turn was committed just before the last stop: its status, and its end event
    /// unless `said` already.
    fn settle_answered(&self, key: &str, run_id: &str, reply: LaneReply, said: bool) {
        let Some((end, status, payload)) = ending_of(key, run_id, &reply) else {
            return;
        };
        if !said {
            self.publish_to_open(end);
        }
        self.finish_run(run_id, status, payload);
    }

    /// Says the end of each run of `lately` (inputs of `key` done before the last stop) whose
    /// start or resumption its log holds and whose end it lacks: the last holder stopped, or
    /// its fence shut, after marking the input done and before storing the end. The end is
    /// said from the committed turn in the transcript (the registry kept its status already).
    async fn say_unsaid_ends(&self, key: &str, lately: Vec<FinishedInput>) {
        let ids: Vec<String> = lately.iter().map(|input| input.id.clone()).collect();
        let unsaid = match self.runs_without_end(key, &ids).await {
            Ok(unsaid) if unsaid.is_empty() => return,
            Ok(unsaid) => unsaid,
            Err(error) => {
                tracing::error!(session = %key, %error, "cannot read the session's events: the end of a run finished before the last stop may be missing from them");
                return;
            }
        };
        let mut replies = match self.parts.sessions.committed_replies(key, &unsaid) {
            Ok(replies) => replies,
            Err(error) => {
                tracing::error!(session = %key, %error, "cannot read the transcript: the end of a run finished before the last stop is not said");
                return;
            }
        };
        for input in lately.iter().filter(|input| unsaid.contains(&input.id)) {
            let reply = match (replies.remove(&input.id), input.status) {
                (Some(reply), _) => reply,
                // Stopped before its turn began: it ended as it was marked.
                (None, InputStatus::Aborted) => Err(AgentError::Interrupted),
                (None, _) => {
                    tracing::warn!(run = %input.id, session = %key, "a run finished before the last stop has no end in the log and no turn in the transcript: its end is not said");
                    continue;
                }
            };
            if let Some((end, _, _)) = ending_of(key, &input.id, &reply) {
                tracing::warn!(run = %input.id, session = %key, "said the end of a run finished just before the last stop, which its log lacked");
                self.publish_event(end).await;
            }
        }
    }

    /// Which runs of `ids` `key`'s log shows started (or resumed) and not ended.
    async fn runs_without_end(
        &self,
        key: &str,
        ids: &[String],
    ) -> Result<Vec<String>, clawcage_agent::events::EventLogError> {
        let marks = self.lifecycle_marks(key, ids).await?;
        Ok(ids
            .iter()
            .filter(|id| marks.started.contains(*id) && !marks.ended.contains(*id))
            .cloned()
            .collect())
    }

    /// Which runs of `ids` `key`'s log shows started (or resumed), and which ended. Reads the
    /// log's tail, further back only while some run is in neither set.
    async fn lifecycle_marks(
        &self,
        key: &str,
        ids: &[String],
    ) -> Result<LifecycleMarks, clawcage_agent::events::EventLogError> {
        let last = self.parts.events.last_seq(key).await?;
        let mut back = UNSAID_END_FIRST_LOOK;
        loop {
            let since = last.saturating_sub(back);
            let replay = self.parts.events.read(key, since, usize::MAX).await?;
            let mut marks = LifecycleMarks::default();
            for event in &replay.events {
                if event.stream != Stream::Lifecycle || !ids.contains(&event.run_id) {
                    continue;
                }
                if event.ends_run() {
                    marks.ended.insert(event.run_id.clone());
                } else if matches!(event.phase(), Some("start" | "resumed")) {
                    marks.started.insert(event.run_id.clone());
                }
            }
            let known = |id: &String| marks.started.contains(id) || marks.ended.contains(id);
            if since == 0 || ids.iter().all(known) {
                return Ok(marks);
            }
            back = back.saturating_mul(16);
        }
    }

    /// An input finished before the last stop: its idempotency key and status stay known for
    /// the window.
    async fn remember_finished(&self, key: &str, finished: &FinishedInput) {
        let age = Duration::from_millis(
            clawcage_agent::transcript::now_ms().saturating_sub(finished.at_ms),
        );
        let status = match finished.status {
            InputStatus::Ok => RunStatus::Ok,
            InputStatus::Error => RunStatus::Error,
            InputStatus::Aborted => RunStatus::Aborted,
            InputStatus::Dropped | InputStatus::Refused => RunStatus::Dropped,
        };
        // A refused input was never taken: its key may be sent again (as the inbox allows).
        let idempotency = finished
            .idempotency
            .as_deref()
            .filter(|_| finished.status != InputStatus::Refused);
        if let Err(error) = self
            .runs
            .remember(key, &finished.id, idempotency, status, age)
            .await
        {
            tracing::error!(run = %finished.id, %error, "cannot record a finished run");
        }
    }

    /// Runs left in the run journal of an older gateway (before the inbox) were cut off by a
    /// killed gateway: report each in its session's events and to `agent.wait`.
    pub(super) async fn recover_interrupted_runs(&self) {
        let Ok(entries) = std::fs::read_dir(&self.parts.runs_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let record = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            let _ = std::fs::remove_file(&path);
            let Some(record) = record else { continue };
            let (Some(run_id), Some(key)) = (
                record.get("runId").and_then(Value::as_str),
                record.get("sessionKey").and_then(Value::as_str),
            ) else {
                continue;
            };
            let why = "the gateway stopped while this run was in progress; what the transcript holds from before it is intact, the run's own messages were not saved";
            self.publish_event(AgentEvent::run_interrupted(key, run_id, why))
                .await;
            if let Err(error) = self.runs.register(key, run_id, None).await {
                tracing::error!(run = run_id, %error, "cannot record an interrupted run");
            }
            self.finish_run(run_id, RunStatus::Interrupted, json!({"error": why}));
            tracing::warn!(
                run = run_id,
                session = key,
                "reported a run cut off by the last stop"
            );
        }
        let sessions: Vec<Arc<super::SessionHub>> =
            lock(&self.sessions).values().cloned().collect();
        for session in &sessions {
            super::subscribers::written(session).await;
        }
        if let Err(error) = self.parts.events.sync().await {
            tracing::error!(%error, "cannot sync the event log");
        }
    }
    /// Where the cron service delivers its firings: this hub, exactly once.
    pub fn firing_sink(&self) -> Arc<dyn FiringSink> {
        Arc::new(HubFirings(self.this.clone()))
    }
}

/// The runs a session's log shows started (or resumed), and those it shows ended.
#[derive(Default)]
struct LifecycleMarks {
    started: HashSet<String>,
    ended: HashSet<String>,
}

/// Inputs done at most this long before the newest one done of a session are looked at for a
/// missing end when the session is taken up: the last holder stopped right after them.
const UNSAID_END_WINDOW_MS: u64 = 60_000;

/// At most this many of them (the newest).
const UNSAID_END_CANDIDATES: usize = 16;

/// Events read back from a log's tail first when looking for a run's start or end (then 16 times more,
/// until the whole kept window).
const UNSAID_END_FIRST_LOOK: u64 = 256;

/// The inputs of `finished` that ran (or were stopped) and were done just before the newest
/// of them: those whose end the last holder may not have said.
fn lately_finished(finished: &[FinishedInput]) -> Vec<FinishedInput> {
    let ran = |input: &&FinishedInput| {
        matches!(
            input.status,
            InputStatus::Ok | InputStatus::Error | InputStatus::Aborted
        )
    };
    let Some(newest) = finished.iter().filter(ran).map(|input| input.at_ms).max() else {
        return Vec::new();
    };
    let mut lately: Vec<FinishedInput> = finished
        .iter()
        .filter(ran)
        .filter(|input| input.at_ms + UNSAID_END_WINDOW_MS >= newest)
        .cloned()
        .collect();
    lately.sort_by_key(|input| input.at_ms);
    let cut = lately.len().saturating_sub(UNSAID_END_CANDIDATES);
    lately.split_off(cut)
}

/// A run's end event, status and `agent.wait` payload from its lane's `reply` (none when it
/// had nothing to answer).
fn ending_of(key: &str, run_id: &str, reply: &LaneReply) -> Option<(AgentEvent, RunStatus, Value)> {
    Some(match reply {
        Ok(Some(outcome)) => (
            AgentEvent::run_ended(key, run_id, outcome),
            RunStatus::Ok,
            outcome_payload(outcome),
        ),
        Ok(None) => return None,
        // Interrupted (by a newer message or the operator): aborted.
        Err(error) => {
            let aborted = matches!(error, AgentError::Interrupted);
            (
                AgentEvent::run_failed(key, run_id, error, aborted),
                if aborted {
                    RunStatus::Aborted
                } else {
                    RunStatus::Error
                },
                json!({"error": error.to_string()}),
            )
        }
    })
}

/// Cron firings into the hub: each a notification run recorded under its key.
struct HubFirings(Weak<Hub>);

impl FiringSink for HubFirings {
    fn deliver<'a>(
        &'a self,
        message: InboundMessage,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let hub = self
                .0
                .upgrade()
                .ok_or_else(|| "the gateway has stopped".to_string())?;
            hub.notify_keyed(message, Some(key)).await
        })
    }

    fn delivers_to(&self, session: &str) -> bool {
        self.0
            .upgrade()
            .is_some_and(|hub| hub.check_served(session).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: &str, status: InputStatus, at_ms: u64) -> FinishedInput {
        FinishedInput {
            id: id.into(),
            idempotency: None,
            status,
            at_ms,
        }
    }

    fn ids(inputs: &[FinishedInput]) -> Vec<&str> {
        inputs.iter().map(|input| input.id.as_str()).collect()
    }

    #[test]
    fn the_runs_looked_at_for_a_missing_end_are_the_latest_that_ran() {
        let finished = [
            input("old", InputStatus::Ok, 1_000),
            input("refused", InputStatus::Refused, 500_000),
            input("dropped", InputStatus::Dropped, 400_000),
            input("stopped", InputStatus::Aborted, 299_000),
            input("failed", InputStatus::Error, 250_000),
            input("last", InputStatus::Ok, 300_000),
        ];
        assert_eq!(
            ids(&lately_finished(&finished)),
            ["failed", "stopped", "last"]
        );
        assert!(lately_finished(&finished[1..3]).is_empty());
        let many: Vec<FinishedInput> = (0..40)
            .map(|n| input(&format!("run-{n}"), InputStatus::Ok, 10_000 + n))
            .collect();
        let latest = lately_finished(&many);
        assert_eq!(latest.len(), UNSAID_END_CANDIDATES);
        assert_eq!(latest[UNSAID_END_CANDIDATES - 1].id, "run-39");
    }
}
