//! What clients and the host hand to a session's lane through the hub: a message (`chat.send`,
//! `agent`, a channel's message) as a run with its id and idempotency key, a notification (a
//! sub-agent's result, a cron firing under its key), a stop (`chat.abort`) and a reset or
//! delete. Each is registered before its turn can start, so every event of a run has a run to
//! belong to.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use clawcage_agent::events::{AgentEvent, Stream};
use clawcage_agent::session::{Admission, DropReason, InputMeta};
use clawcage_agent::{AgentError, LaneInput};
use clawcage_core::InboundMessage;
use serde_json::json;
use tokio::sync::oneshot;

use super::{
    Hub, HubObserver, MAX_QUEUED_RUNS, Outbox, Registered, RunStatus, Sent, Ticket, TicketKind,
    admission_json, lock, subscribers,
};
use crate::protocol::{self, Code, GatewayError};

impl Hub {
    /// Whether run `run_id` of `key`, found in flight under the send's idempotency key, was
    /// registered by another process that stopped before its input reached the inbox (a
    /// cluster's registry outlives the host that wrote it): neither this process's own run nor
    /// an input the inbox holds, pending or done.
    fn never_taken(&self, key: &str, run_id: &str, status: RunStatus) -> bool {
        if status != RunStatus::InFlight || run_id.starts_with(&self.run_prefix) {
            return false;
        }
        let Some(inbox) = self.parts.sessions.inbox() else {
            return false;
        };
        let pending = inbox
            .pending(key)
            .map(|pending| pending.iter().any(|record| record.id == run_id));
        let finished = inbox
            .finished(key)
            .map(|finished| finished.iter().any(|input| input.id == run_id));
        // Unknown when the inbox cannot be read: a duplicate, as before.
        matches!((pending, finished), (Ok(false), Ok(false)))
    }

    /// Hands a turn on `text` from a client to `key`'s lane, subscribing `subscriber` to the
    /// session first; `acknowledge` hears the new run's id, what the lane's queue made of it,
    /// and the run it was steered into, before the run can emit anything. With an idempotency
    /// key seen in the last ten minutes, returns that run instead.
    pub async fn send(
        &self,
        key: &str,
        text: String,
        idempotency: Option<&str>,
        subscriber: Option<(&Outbox, &Mutex<HashSet<String>>)>,
        acknowledge: impl FnOnce(&str, &Admission, Option<&str>),
    ) -> Result<Sent, GatewayError> {
        if self.shutting_down() {
            return Err(GatewayError::new(
                Code::Unavailable,
                "the gateway is shutting down; send again once it is back",
            ));
        }
        self.check_served(key)?;
        // A secret value a person pasted is scrubbed like the model's output: the queue events,
        // the event log, the lane, the transcript and the model all get the scrubbed text.
        let text = self.parts.sessions.agent().redactor().redact(&text);
        self.title_from_first_message(key, &text);
        let mut run_id = format!("{}-{}", self.run_prefix, self.next_id());
        let registered = self
            .runs
            .register(key, &run_id, idempotency)
            .await
            .map_err(|error| GatewayError::internal("cannot record the run", error))?;
        if let Registered::Duplicate {
            run_id: earlier,
            status,
        } = registered
        {
            if !self.never_taken(key, &earlier, status) {
                return Ok(Sent::Duplicate(earlier, status));
            }
            // Registered by a process that stopped before its inbox took the input: the send
            // is taken now, under the run id its sender may already wait for.
            tracing::warn!(run = %earlier, session = key, "a run registered but never taken is taken now");
            run_id = earlier;
        }
        let forget = |status: RunStatus, why: &str| {
            if let Some(idempotency) = idempotency {
                self.forget_key(key, idempotency);
            }
            self.finish_run(&run_id, status, json!({"error": why}));
        };
        let session = match self.open_session(key).await {
            Ok(session) => session,
            Err(error) => {
                forget(RunStatus::Error, "the session could not be opened");
                return Err(error);
            }
        };
        let _admit = lock(&session.admit);
        {
            let mut state = session.lock();
            if state.tickets.len() >= MAX_QUEUED_RUNS {
                drop(state);
                forget(RunStatus::Error, "the session's queue is full");
                return Err(GatewayError::new(
                    Code::RateLimited,
                    format!(
                        "session {key} already has {MAX_QUEUED_RUNS} messages waiting; wait for them or abort"
                    ),
                ));
            }
            if let Some((outbox, subscriptions)) = subscriber
                && !state
                    .subscribers
                    .iter()
                    .any(|subscriber| subscriber.outbox.id == outbox.id)
            {
                // From the next event on: every event of the new run.
                let since = state.next_seq - 1;
                let follower = self.follow_live(key, since, outbox.clone());
                state.subscribers.push(follower);
                lock(subscriptions).insert(key.to_string());
            }
        }
        let observer = HubObserver::new(self.this.clone(), session.clone(), key, &run_id);
        let pending = self.parts.sessions.submit_input(
            key,
            LaneInput::User(text.clone()),
            Arc::new(observer),
            InputMeta {
                id: Some(run_id.clone()),
                idempotency: idempotency.map(str::to_string),
            },
        );
        let (ticket, admission) = (pending.ticket(), pending.admission().clone());
        if let Admission::Dropped { reason } = &admission {
            // The key is forgotten before the refusal is said: the same key sent again at once
            // is a new attempt, never a duplicate of the refused one.
            forget(RunStatus::Dropped, &reason.to_string());
            let into = session
                .lock()
                .current
                .as_ref()
                .map(|run| run.run_id.clone());
            acknowledge(&run_id, &admission, into.as_deref());
            return Ok(Sent::Refused);
        }
        let mut state = session.lock();
        let into = state.current.as_ref().map(|run| run.run_id.clone());
        // The acknowledgement goes out before any event of the run can.
        acknowledge(&run_id, &admission, into.as_deref());
        if admission != Admission::Started {
            let mut data = admission_json(&admission);
            data["phase"] = json!("queue");
            data["message"] = json!(text);
            if admission == Admission::Steered
                && let Some(into) = &into
            {
                data["into"] = json!(into);
            }
            self.publish(
                &mut state,
                AgentEvent::new(key, &run_id, Stream::Lifecycle, data),
            );
        }
        state.tickets.insert(
            ticket,
            Ticket {
                kind: TicketKind::Run {
                    run_id: run_id.clone(),
                    kind: "user",
                    text,
                    sender: None,
                },
                reply: Box::pin(pending.wait()),
                waker: None,
                joined: None,
                abort_on_start: false,
                dropped_said: false,
            },
        );
        drop(state);
        self.follow(&session, ticket);
        Ok(Sent::Started(run_id))
    }

    /// Stops a run of `key`: `run_id`, or the current one when `None` (the next one when none
    /// runs yet). A run still waiting is stopped as soon as its turn starts (the lane keeps its
    /// message, marked as stopped). Returns the ids stopped.
    pub fn abort(&self, key: &str, run_id: Option<&str>) -> Vec<String> {
        let Some(session) = self.session(key) else {
            return Vec::new();
        };
        let mut state = session.lock();
        self.settle_current(key, &mut state);
        let mut stopped = Vec::new();
        let mut interrupt = false;
        if let Some(current) = state.current.as_mut()
            && run_id.is_none_or(|id| id == current.run_id)
        {
            current.aborting = true;
            interrupt = true;
            stopped.push(current.run_id.clone());
        } else {
            let current = state.current.as_ref().map(|run| run.ticket);
            let waiting = state.tickets.iter_mut().find(|(ticket, entry)| {
                Some(**ticket) != current
                    && entry.joined.is_none()
                    && entry
                        .run_id()
                        .is_some_and(|id| run_id.is_none_or(|wanted| wanted == id))
            });
            if let Some((_, entry)) = waiting {
                entry.abort_on_start = true;
                stopped.extend(entry.run_id().map(str::to_string));
            }
        }
        drop(state);
        // Recorded, so a restart before the stop takes effect stops them too.
        for run_id in &stopped {
            self.parts.sessions.request_stop(key, run_id);
        }
        if interrupt {
            self.parts.sessions.interrupt(key);
        }
        stopped
    }

    /// Clears `key`'s history after the runs queued before (`delete` also removes its
    /// transcript and events).
    pub async fn reset(&self, key: &str, delete: bool) -> Result<(), GatewayError> {
        if self.shutting_down() {
            return Err(GatewayError::new(
                Code::Unavailable,
                "the gateway is shutting down",
            ));
        }
        self.check_served(key)?;
        let session = self.open_session(key).await?;
        let (done, answer) = oneshot::channel();
        {
            let _admit = lock(&session.admit);
            {
                let mut state = session.lock();
                self.settle_current(key, &mut state);
                if delete && (state.current.is_some() || !state.tickets.is_empty()) {
                    return Err(GatewayError::new(
                        Code::Conflict,
                        format!(
                            "session {key} has a run in flight; abort it (chat.abort) or wait, then delete"
                        ),
                    ));
                }
            }
            let pending = self.parts.sessions.submit(
                key,
                LaneInput::Reset,
                Arc::new(clawcage_agent::provider::NoEvents),
            );
            let ticket = pending.ticket();
            session.lock().tickets.insert(
                ticket,
                Ticket {
                    kind: TicketKind::Reset(Some(done)),
                    reply: Box::pin(pending.wait()),
                    waker: None,
                    joined: None,
                    abort_on_start: false,
                    dropped_said: false,
                },
            );
            self.follow(&session, ticket);
        }
        let cleared = answer.await.unwrap_or(Err(AgentError::LaneClosed));
        cleared.map_err(|error| GatewayError::internal("cannot reset the session", error))?;
        if !delete {
            self.publish(&mut session.lock(), AgentEvent::session_reset(key));
            return Ok(());
        }
        {
            let mut state = session.lock();
            let frame = protocol::event("session.deleted", json!({"sessionKey": key}), None);
            self.broadcast_unlogged(&mut state, frame);
            for subscriber in state.subscribers.drain(..) {
                subscriber.stop();
            }
        }
        // What the session's writer holds is stored before the events are removed.
        subscribers::written(&session).await;
        if let Err(error) = self.parts.transcripts.remove(key) {
            return Err(GatewayError::internal(
                &format!(
                    "cannot delete the transcript {}",
                    self.parts.transcripts.describe(key)
                ),
                error,
            ));
        }
        {
            let mut titles = lock(&self.titles);
            if titles.remove(key).is_some()
                && let Err(error) = self.save_titles(&titles)
            {
                tracing::warn!(?error, "cannot forget a deleted session's title");
            }
        }
        if let Some(inbox) = self.parts.sessions.inbox()
            && let Err(error) = inbox.remove(key)
        {
            return Err(GatewayError::internal(
                "cannot delete the session's inbox",
                error,
            ));
        }
        self.parts
            .events
            .remove(key)
            .await
            .map_err(|error| GatewayError::internal("cannot delete the session's events", error))?;
        session.lock().next_seq = 1;
        Ok(())
    }

    /// Hands a notification (a sub-agent's result, a cron firing) to its session's lane as a
    /// run (it always waits for its own turn).
    pub async fn notify(&self, message: InboundMessage) {
        if let Err(error) = self.notify_keyed(message, None).await {
            tracing::warn!(%error, "a notification was not taken");
        }
    }

    /// [`Hub::notify`] under an idempotency key (a cron firing's `cron:<job>:<due>`): recorded in
    /// the session's inbox when this returns `Ok`; a key taken before is `Ok` without a second
    /// run.
    pub async fn notify_keyed(
        &self,
        message: InboundMessage,
        idempotency: Option<&str>,
    ) -> Result<(), String> {
        if self.shutting_down() {
            return Err(format!(
                "a notification from {} arrived during shutdown",
                message.sender
            ));
        }
        let key = message.session_key.clone();
        self.check_served(&key).map_err(|error| error.message)?;
        let run_id = format!("{}-{}", self.run_prefix, self.next_id());
        let registered = self
            .runs
            .register(&key, &run_id, idempotency)
            .await
            .map_err(|error| format!("cannot record the run: {error}"))?;
        if registered != Registered::New {
            // Delivered before (a firing fired again after a restart).
            return Ok(());
        }
        let session = match self.open_session(&key).await {
            Ok(session) => session,
            Err(error) => {
                if let Some(idempotency) = idempotency {
                    self.forget_key(&key, idempotency);
                }
                self.finish_run(&run_id, RunStatus::Error, json!({"error": error.message}));
                return Err(error.message);
            }
        };
        let _admit = lock(&session.admit);
        let observer = HubObserver::new(self.this.clone(), session.clone(), &key, &run_id);
        let (text, sender) = (message.content.clone(), message.sender.clone());
        let pending = self.parts.sessions.submit_input(
            &key,
            LaneInput::Notification(message),
            Arc::new(observer),
            InputMeta {
                id: Some(run_id.clone()),
                idempotency: idempotency.map(str::to_string),
            },
        );
        let ticket = pending.ticket();
        if let Admission::Dropped { reason } = pending.admission() {
            self.finish_run(
                &run_id,
                RunStatus::Dropped,
                json!({"error": reason.to_string()}),
            );
            if let DropReason::NotRecorded { why } = reason {
                if let Some(idempotency) = idempotency {
                    self.forget_key(&key, idempotency);
                }
                return Err(why.clone());
            }
            return Ok(());
        }
        session.lock().tickets.insert(
            ticket,
            Ticket {
                kind: TicketKind::Run {
                    run_id,
                    kind: "notification",
                    text,
                    sender: Some(sender),
                },
                reply: Box::pin(pending.wait()),
                waker: None,
                joined: None,
                abort_on_start: false,
                dropped_said: false,
            },
        );
        self.follow(&session, ticket);
        Ok(())
    }
}

/// The bus's notifications become runs of their sessions ([`Hub::notify`]), admitted in arrival
/// order.
impl clawcage_agent::NotificationFront for Hub {
    fn admit(&self, message: InboundMessage) -> clawcage_core::BoxFuture<'_, ()> {
        Box::pin(self.notify(message))
    }
}
