//! What a session's lane reports about the runs the hub handed it, made into events and run
//! statuses: a job taken (a run starts, or messages join the running one, steered or collected),
//! a turn resumed after a restart, a message dropped by the queue's policy, and the lane's answer
//! to each submission (the run's end, error or stop). [`HubObserver`] turns what a running turn
//! does into the run's events as it happens.
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use clawcage_agent::agent_loop::{TurnObserver, Verdict};
use clawcage_agent::events::{AgentEvent, EventObserver, Stream};
use clawcage_agent::session::QueueEvent;
use clawcage_agent::{AgentError, Compaction, ProviderEvents, TurnOutcome};
use clawcage_core::ToolCall;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    CurrentRun, Hub, LaneReply, RunStatus, SessionHub, SessionState, Ticket, TicketKind, lock,
};

impl Hub {
    /// Waits in a task of its own for the lane's answer to `ticket`, then settles it (unless the
    /// start of the next job settled it first).
    pub(super) fn follow(&self, session: &Arc<SessionHub>, ticket: u64) {
        let Some(hub) = self.this.upgrade() else {
            return;
        };
        let session = session.clone();
        tokio::spawn(async move {
            std::future::poll_fn(|context: &mut Context<'_>| {
                let mut state = session.lock();
                let Some(entry) = state.tickets.get_mut(&ticket) else {
                    return Poll::Ready(());
                };
                match entry.reply.as_mut().poll(context) {
                    Poll::Ready(reply) => {
                        hub.settle(&session.key, &mut state, ticket, reply);
                        Poll::Ready(())
                    }
                    Poll::Pending => {
                        entry.waker = Some(context.waker().clone());
                        Poll::Pending
                    }
                }
            })
            .await;
        });
    }

    /// The lane's answer to `ticket` arrived: end its run (the current one), or record the
    /// result of a run that joined another or never started.
    pub(super) fn settle(
        &self,
        key: &str,
        state: &mut SessionState,
        ticket: u64,
        reply: LaneReply,
    ) {
        let Some(entry) = state.tickets.remove(&ticket) else {
            return;
        };
        if let Some(waker) = entry.waker {
            waker.wake();
        }
        if self.shutting_down() && matches!(reply, Err(AgentError::LaneClosed)) {
            // Halted for the stop: the run is taken up again at the next start, not ended.
            return;
        }
        let dropped_said = entry.dropped_said;
        let (run_id, joined) = match entry.kind {
            TicketKind::Reset(done) => {
                if let Some(done) = done {
                    let _ = done.send(reply);
                }
                return;
            }
            TicketKind::Run { run_id, .. } => (run_id, entry.joined),
        };
        if let (Err(error), false) = (&reply, self.may_write(key)) {
            // This host's hold on the session ended while the run went on (its lease, or its
            // partition's, was lost or renewed too late): its writes were refused, so the run
            // is left as a crash leaves it, pending in the inbox, for the session's next owner
            // (perhaps this host again, under a new epoch) to resume.
            state.current.take_if(|current| current.ticket == ticket);
            tracing::info!(session = %key, %error, %run_id, "a run this host can no longer write is left to the session's next owner");
            return;
        }
        let current = state.current.take_if(|current| current.ticket == ticket);
        let aborted = current.as_ref().is_some_and(|current| current.aborting);
        let (end, status, mut payload) = match &reply {
            Ok(Some(outcome)) => (
                AgentEvent::run_ended(key, &run_id, outcome),
                RunStatus::Ok,
                outcome_payload(outcome),
            ),
            Ok(None) => (
                AgentEvent::run_failed(
                    key,
                    &run_id,
                    &AgentError::History("the lane returned no outcome".into()),
                    false,
                ),
                RunStatus::Error,
                json!({"error": "the lane returned no outcome"}),
            ),
            Err(error) => {
                let aborted = aborted || matches!(error, AgentError::Interrupted);
                (
                    AgentEvent::run_failed(key, &run_id, error, aborted),
                    if matches!(error, AgentError::Dropped(_)) {
                        RunStatus::Dropped
                    } else if aborted {
                        RunStatus::Aborted
                    } else {
                        RunStatus::Error
                    },
                    json!({"error": error.to_string()}),
                )
            }
        };
        if current.is_some() {
            self.publish(state, end);
        } else if let Some(into) = joined {
            // Its message went into `into`'s turn, whose events carry the answer.
            payload["joinedRun"] = json!(into);
        } else if let (Err(AgentError::Dropped(reason)), false) = (&reply, dropped_said) {
            // Dropped before the hub knew its ticket (while a restart took the inbox up).
            let event = AgentEvent::new(
                key,
                &run_id,
                Stream::Lifecycle,
                json!({"phase": "queue", "status": "dropped", "reason": reason.to_string()}),
            );
            self.publish(state, event);
        }
        self.finish_run(&run_id, status, payload);
    }

    /// Settles the current run if the lane has answered it.
    pub(super) fn settle_current(&self, key: &str, state: &mut SessionState) {
        let Some(ticket) = state.current.as_ref().map(|run| run.ticket) else {
            return;
        };
        let Some(entry) = state.tickets.get_mut(&ticket) else {
            state.current = None;
            return;
        };
        // Polled with the waiting task's waker, which the reply keeps: that task must still
        // hear the answer when it is not there yet.
        let waker = entry.waker.clone().unwrap_or_else(|| Waker::noop().clone());
        let mut context = Context::from_waker(&waker);
        if let Poll::Ready(reply) = entry.reply.as_mut().poll(&mut context) {
            self.settle(key, state, ticket, reply);
        }
    }

    /// The lane's queue of `key` changed.
    pub(super) fn queue_changed(&self, key: &str, event: &QueueEvent) {
        match event {
            // The submitter reports its own admission.
            QueueEvent::Admitted { .. } => {}
            QueueEvent::Dropped { ticket, reason } => {
                let Some(session) = self.session(key) else {
                    return;
                };
                let mut state = session.lock();
                let run_id = state.tickets.get_mut(ticket).and_then(|entry| {
                    entry.dropped_said = true;
                    entry.run_id().map(str::to_string)
                });
                if let Some(run_id) = run_id {
                    self.publish(
                        &mut state,
                        AgentEvent::new(
                            key,
                            &run_id,
                            Stream::Lifecycle,
                            json!({"phase": "queue", "status": "dropped", "reason": reason.to_string()}),
                        ),
                    );
                }
            }
            QueueEvent::Resumed { tickets, attempt } => {
                let Some(session) = self.session(key) else {
                    tracing::warn!(
                        session = key,
                        "a session resumed a turn before it was opened"
                    );
                    return;
                };
                let _admit = lock(&session.admit);
                let mut state = session.lock();
                self.resume(key, &mut state, tickets, *attempt);
            }
            QueueEvent::Taken { tickets, steered } => {
                let Some(session) = self.session(key) else {
                    tracing::warn!(session = key, "a session took a job before it was opened");
                    return;
                };
                let _admit = lock(&session.admit);
                let mut state = session.lock();
                if *steered {
                    let into = state.current.as_ref().map(|run| run.run_id.clone());
                    self.join(key, &mut state, tickets, into.as_deref(), "steered");
                } else {
                    // The lane has answered the job before: its end goes first.
                    self.settle_current(key, &mut state);
                    let interrupt = self.start_run(key, &mut state, tickets);
                    drop(state);
                    if interrupt {
                        self.parts.sessions.interrupt(key);
                    }
                }
            }
        }
    }

    /// Marks `tickets` as joined to `into` and says so.
    pub(super) fn join(
        &self,
        key: &str,
        state: &mut SessionState,
        tickets: &[u64],
        into: Option<&str>,
        how: &str,
    ) {
        for ticket in tickets {
            let Some(entry) = state.tickets.get_mut(ticket) else {
                continue;
            };
            entry.joined = into.map(str::to_string);
            let (Some(run_id), TicketKind::Run { text, .. }) = (entry.run_id(), &entry.kind) else {
                continue;
            };
            let event = AgentEvent::new(
                key,
                run_id,
                Stream::Lifecycle,
                json!({"phase": "queue", "status": "joined", "how": how, "into": into, "message": text}),
            );
            self.publish(state, event);
        }
    }

    /// The lane took `tickets` as one job: the first one's run starts (the others were
    /// collected into it). Returns whether the run must be stopped at once.
    pub(super) fn start_run(&self, key: &str, state: &mut SessionState, tickets: &[u64]) -> bool {
        let Some((&first, rest)) = tickets.split_first() else {
            return false;
        };
        let Some(entry) = state.tickets.get(&first) else {
            return false;
        };
        let TicketKind::Run {
            run_id,
            kind,
            text,
            sender,
        } = &entry.kind
        else {
            return false;
        };
        let (run_id, abort) = (run_id.clone(), entry.abort_on_start || self.shutting_down());
        let mut started = AgentEvent::run_started(key, &run_id, kind, text, sender.as_deref());
        let collected: Vec<String> = rest
            .iter()
            .filter_map(|ticket| state.tickets.get(ticket).and_then(Ticket::run_id))
            .map(str::to_string)
            .collect();
        if !collected.is_empty() {
            started.data["collected"] = json!(collected);
        }
        let committed_at = self
            .parts
            .transcripts
            .committed_position(key)
            .unwrap_or_default();
        let start = self.publish(state, started);
        state.current = Some(CurrentRun {
            run_id: run_id.clone(),
            ticket: first,
            start_seq: start,
            committed_at,
            aborting: abort,
        });
        self.join(key, state, rest, Some(&run_id), "collected");
        abort
    }

    /// The lane resumed the open turn answering `tickets`: the first one's run is current
    /// again (the others had joined it), and its clients hear `lifecycle {phase: "resumed"}`
    /// (they drop the partial text they had of it).
    pub(super) fn resume(
        &self,
        key: &str,
        state: &mut SessionState,
        tickets: &[u64],
        attempt: u32,
    ) {
        let committed_at = self
            .parts
            .transcripts
            .committed_position(key)
            .unwrap_or_default();
        let Some((&first, rest)) = tickets.split_first() else {
            return;
        };
        let Some(run_id) = state
            .tickets
            .get(&first)
            .and_then(Ticket::run_id)
            .map(str::to_string)
        else {
            return;
        };
        let event = AgentEvent::new(
            key,
            &run_id,
            Stream::Lifecycle,
            json!({"phase": "resumed", "attempt": attempt}),
        );
        let start = self.publish(state, event);
        state.current = Some(CurrentRun {
            run_id: run_id.clone(),
            ticket: first,
            start_seq: start,
            committed_at,
            aborting: false,
        });
        for ticket in rest {
            if let Some(entry) = state.tickets.get_mut(ticket) {
                entry.joined = Some(run_id.clone());
            }
        }
    }
}

/// The observer of one run: each observation becomes an event of the run, published at once
/// (on the lane's task, in the order the turn makes them).
pub(super) struct HubObserver {
    hub: Weak<Hub>,
    session: Arc<SessionHub>,
    events: EventObserver,
    received: Mutex<mpsc::UnboundedReceiver<AgentEvent>>,
}

impl HubObserver {
    pub(super) fn new(hub: Weak<Hub>, session: Arc<SessionHub>, key: &str, run_id: &str) -> Self {
        let (events, received) = EventObserver::channel(key, run_id);
        Self {
            hub,
            session,
            events,
            received: Mutex::new(received),
        }
    }

    fn flush(&self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut received = lock(&self.received);
        let mut state = self.session.lock();
        while let Ok(event) = received.try_recv() {
            hub.publish(&mut state, event);
        }
    }
}

impl ProviderEvents for HubObserver {
    fn text_delta(&self, text: &str) {
        self.events.text_delta(text);
        self.flush();
    }

    fn reasoning_delta(&self, text: &str) {
        self.events.reasoning_delta(text);
        self.flush();
    }

    fn retrying(&self, provider: &str, reason: &str, delay: Duration) {
        self.events.retrying(provider, reason, delay);
        self.flush();
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.events.failing_over(from, to, reason);
        self.flush();
    }
}

impl TurnObserver for HubObserver {
    fn tool_started(&self, call: &ToolCall) {
        self.events.tool_started(call);
        self.flush();
    }

    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        self.events.tool_finished(call, verdict, output);
        self.flush();
    }

    fn note(&self, text: &str) {
        self.events.note(text);
        self.flush();
    }

    fn compacted(&self, compaction: &Compaction) {
        self.events.compacted(compaction);
        self.flush();
    }
}

pub(super) fn outcome_payload(outcome: &TurnOutcome) -> Value {
    json!({
        "text": outcome.text,
        "usage": {
            "inputTokens": outcome.usage.input_tokens,
            "outputTokens": outcome.usage.output_tokens,
        },
        "iterations": outcome.iterations,
        "answeredBy": outcome.answered_by,
    })
}
