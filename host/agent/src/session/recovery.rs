//! Taking up what a stopped process left: the inputs still pending in a session's inbox are
//! answered from the transcript (their turn was committed), resumed (their turn was open: its
//! steps replayed, a started call answered "may have partly run", the model asked again only
//! for what had not completed) or queued again in their order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use clawcage_core::{ChatMessage, Role};
use tokio::sync::oneshot;

use super::lane::{JournalSink, LaneSteering, answer_dangling_calls, finish_turn, run_steps};
use super::queue::{StopCause, with_state};
use super::{
    Admission, LaneReply, PendingTurn, QueueEvent, Recovered, RecoveredFate, Sessions, Shared,
    Waiter, lock,
};
use crate::agent_loop::{AgentError, TurnEnd, TurnObserver, TurnOutcome};
use crate::compaction::{Journaled, TurnJournal};
use crate::inbox::InputRecord;
use crate::transcript::{Entry, Loaded, OpenTurn, now_ms};

/// A turn to resume when its session's lane starts: what recovery loaded, and the tickets of
/// the submissions it answers.
pub(super) struct ResumePlan {
    pub(super) loaded: Loaded,
    pub(super) tickets: Vec<u64>,
    /// A stop was asked for the turn before its process stopped: it ends stopped, without a
    /// model call.
    pub(super) stop: bool,
}

impl Sessions {
    /// Take up the work stopped processes left in every session's inbox: for each input still
    /// pending, its turn is resumed (it was open), it queues again in its order, or (its turn
    /// was committed just before the stop) it is answered at once. `observe` gives each
    /// recovered input its observer. Sessions already looked at by this process are skipped.
    pub fn recover(
        &self,
        observe: &dyn Fn(&str, &InputRecord) -> Arc<dyn TurnObserver>,
    ) -> Vec<Recovered> {
        let Some(inbox) = self.inner.shared.inbox.clone() else {
            return Vec::new();
        };
        let keys = match inbox.sessions() {
            Ok(keys) => keys,
            Err(error) => {
                tracing::error!(%error, "cannot list the sessions' inboxes: nothing is resumed");
                return Vec::new();
            }
        };
        keys.iter()
            .flat_map(|key| self.recover_session(key, observe))
            .collect()
    }

    /// [`Sessions::recover`] for one session (once per process; a submission to a session
    /// does it first).
    pub fn recover_session(
        &self,
        key: &str,
        observe: &dyn Fn(&str, &InputRecord) -> Arc<dyn TurnObserver>,
    ) -> Vec<Recovered> {
        let shared = &self.inner.shared;
        let (Some(inbox), Some(store)) = (shared.inbox.clone(), shared.store.clone()) else {
            return Vec::new();
        };
        if !lock(&shared.recovered).insert(key.to_string()) {
            return Vec::new();
        }
        match inbox.claim(key) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(session = %key, "another clawcage process runs this session: what a stopped process left in it is left to that one");
                return Vec::new();
            }
            Err(error) => {
                tracing::error!(session = %key, %error, "cannot claim the session: its pending inputs are not resumed");
                return Vec::new();
            }
        }
        let pending = match inbox.pending(key) {
            Ok(pending) => pending,
            Err(error) => {
                tracing::error!(session = %key, %error, "cannot read the session's inbox: its pending inputs are not resumed");
                Vec::new()
            }
        };
        let loaded = match store.load(key, shared.history_limit) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(session = %key, %error, "cannot read the transcript: the session's pending inputs are not resumed");
                return Vec::new();
            }
        };
        match inbox.queue_override(key) {
            Ok(Some(value)) => with_state(shared.queue.as_ref(), key, |state| {
                state.set_session_override(Some(value))
            }),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(session = %key, %error, "cannot read the session's queue settings")
            }
        }
        if pending.is_empty() && loaded.open.is_none() {
            inbox.release(key);
            return Vec::new();
        }
        let mut recovered = Vec::new();
        // Answered by a committed turn just before the stop: say so now.
        let mut answered = Vec::new();
        let mut waiting = Vec::new();
        let mut resumed = Vec::new();
        for record in pending {
            if let Some(turn) = loaded.answered.get(&record.id) {
                answered.push((record, turn.clone()));
            } else if loaded
                .open
                .as_ref()
                .is_some_and(|open| open.inputs.contains(&record.id))
            {
                resumed.push(record);
            } else {
                waiting.push(record);
            }
        }
        for (record, turn) in answered {
            let reply = committed_reply(&turn);
            shared.mark_done(
                key,
                std::slice::from_ref(&record.id),
                super::status_of(&reply),
            );
            let (sender, receiver) = oneshot::channel();
            let _ = sender.send(reply);
            recovered.push(Recovered {
                key: key.to_string(),
                record,
                pending: PendingTurn {
                    receiver,
                    admission: Admission::Started,
                    ticket: 0,
                },
                fate: RecoveredFate::Answered,
            });
        }
        if loaded.open.is_some() {
            let stop = resumed.iter().any(|record| record.stop_requested);
            let mut waiters = lock(&shared.waiters);
            let tickets = with_state(shared.queue.as_ref(), key, |state| {
                state.resume(resumed.len())
            });
            let session = waiters.entry(key.to_string()).or_default();
            for (record, &ticket) in resumed.into_iter().zip(&tickets) {
                let (reply, receiver) = oneshot::channel();
                let observer = observe(key, &record);
                session.insert(
                    ticket,
                    Waiter {
                        observer,
                        reply,
                        id: record.id.clone(),
                    },
                );
                recovered.push(Recovered {
                    key: key.to_string(),
                    record,
                    pending: PendingTurn {
                        receiver,
                        admission: Admission::Started,
                        ticket,
                    },
                    fate: RecoveredFate::Resumed,
                });
            }
            drop(waiters);
            lock(&shared.resuming).insert(
                key.to_string(),
                ResumePlan {
                    loaded,
                    tickets,
                    stop,
                },
            );
        }
        for record in waiting {
            let observer = observe(key, &record);
            let pending = self.admit(key, record.job.clone(), observer, record.id.clone());
            recovered.push(Recovered {
                key: key.to_string(),
                record,
                pending,
                fate: RecoveredFate::Queued,
            });
        }
        self.ensure_lane(key);
        recovered
    }

    /// What the committed turns of `key` answered inputs `ids` with, by id, read from its
    /// transcript: for saying again the end of a run finished before the stop. Inputs no
    /// committed turn answered are left out.
    pub fn committed_replies(
        &self,
        key: &str,
        ids: &[String],
    ) -> std::io::Result<HashMap<String, LaneReply>> {
        let shared = &self.inner.shared;
        let Some(store) = shared.store.clone() else {
            return Ok(HashMap::new());
        };
        let loaded = store.load(key, shared.history_limit)?;
        Ok(ids
            .iter()
            .filter_map(|id| {
                let turn = loaded.answered.get(id)?;
                Some((id.clone(), committed_reply(turn)))
            })
            .collect())
    }
}

/// The reply a turn committed just before the stop gave: its answer, or how it failed; a turn
/// a newer message or the operator interrupted ends interrupted again (its run `aborted`), not
/// as a failure.
fn committed_reply(turn: &crate::transcript::Answered) -> LaneReply {
    match turn.outcome.strip_prefix("error: ") {
        Some(error) if error == AgentError::Interrupted.to_string() => Err(AgentError::Interrupted),
        Some(_) => Err(AgentError::History(turn.outcome.clone())),
        None => Ok(Some(TurnOutcome {
            text: turn.text.clone(),
            end: TurnEnd::Answered,
            usage: turn.usage,
            iterations: 0,
            answered_by: turn.outcome.clone(),
        })),
    }
}

/// What a tool call that started and has no result is told when its turn is resumed.
pub const MAY_HAVE_PARTLY_RUN: &str = "the process running this call stopped before it finished: it may have partly run. Check its effects before repeating it.";

/// What a tool call that never started is told when its turn is resumed.
pub const NOT_STARTED_BEFORE_STOP: &str =
    "not run: the process stopped before this call started; call it again if it is still needed.";

/// Take up a turn a stopped process left open: its steps are in `history` already; calls left
/// without a result are answered (never run again), then the model is asked for what had not
/// completed, unless the turn had answered already.
pub(super) async fn resume_turn(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    open: OpenTurn,
    tickets: Vec<u64>,
    stop: bool,
) {
    let attempt = open.resumed + 1;
    shared.emit(
        key,
        QueueEvent::Resumed {
            tickets: tickets.clone(),
            attempt,
        },
    );
    tracing::info!(session = %key, attempt, "resuming the turn the last process left open");
    let observer = shared.observer_of(key, tickets.first().copied());
    observer.note("resuming the turn a stopped process left open (a tool call it had started is not run again)");
    let mut sink = JournalSink::new(shared, key);
    sink.write(&[Entry::Resumed { at_ms: now_ms() }]);
    let started: HashSet<&str> = open.started_calls.iter().map(String::as_str).collect();
    if stop {
        // Asked to stop before the process went away: it ends stopped, as it would have.
        with_state(shared.queue.as_ref(), key, |state| state.turn_answered());
        let why = StopCause::Operator.dangling_call_result();
        for answer in answer_dangling_calls(history, |_| why.to_string()) {
            sink.record(Journaled::ToolResult(answer));
        }
        let reply = finish_turn(
            shared,
            key,
            history,
            observer.as_ref(),
            sink,
            open.usage,
            Err(AgentError::Interrupted),
        )
        .await;
        shared.answer(key, &tickets, &reply);
        return;
    }
    for answer in answer_dangling_calls(history, |id| {
        if started.contains(id) {
            MAY_HAVE_PARTLY_RUN.to_string()
        } else {
            NOT_STARTED_BEFORE_STOP.to_string()
        }
    }) {
        sink.record(Journaled::ToolResult(answer));
    }
    let answered = history
        .last()
        .filter(|message| message.role == Role::Assistant && message.tool_uses().next().is_none())
        .map(ChatMessage::text);
    let mut tickets = tickets;
    let result = match answered {
        // The model had answered; only the commit was missing.
        Some(text) => {
            with_state(shared.queue.as_ref(), key, |state| state.turn_answered());
            Ok(TurnOutcome {
                end: if text.trim().is_empty() {
                    TurnEnd::NoAnswer
                } else {
                    TurnEnd::Answered
                },
                text,
                usage: open.usage,
                iterations: 0,
                answered_by: shared.agent.provider().label(),
            })
        }
        None => {
            let steering = LaneSteering {
                shared,
                key,
                taken: Mutex::new(Vec::new()),
            };
            let result = run_steps(
                shared,
                key,
                history,
                observer.as_ref(),
                &steering,
                &mut sink,
            )
            .await;
            tickets.extend(lock(&steering.taken).drain(..));
            result
        }
    };
    let reply = finish_turn(
        shared,
        key,
        history,
        observer.as_ref(),
        sink,
        open.usage,
        result,
    )
    .await;
    shared.answer(key, &tickets, &reply);
}
