//! Where a session's events go after the hub numbers them: the session's writer task appends
//! them to the [`EventLog`], one after another under this process's epoch, and each subscribed
//! connection has a forwarder that follows the log and pushes the stored events to its outbox.
//! The hub never sends an event to a client itself, so what a client sees is exactly what the
//! log stored, in the log's order, whoever stored it. `sessions.subscribe` and
//! `sessions.unsubscribe` are here.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use clawcage_agent::events::{AgentEvent, Epoch, EventLog, EventLogError};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Hub, Outbox, REPLAY_PAGE, SessionHub, SessionState, lock};
use crate::protocol::{self, Code, GatewayError};

/// What a session's writer task is handed.
pub(super) enum Publish {
    /// Append this event (already numbered).
    Event(AgentEvent),
    /// Say when everything handed before is stored.
    Written(oneshot::Sender<()>),
}

/// Appends `key`'s events to `log` in the order they were handed over. A refused append is
/// logged: an event the log fences off was written by a process that no longer owns the session.
pub(super) async fn write_events(
    log: Arc<dyn EventLog>,
    epoch: Epoch,
    key: String,
    mut queue: mpsc::UnboundedReceiver<Publish>,
) {
    while let Some(item) = queue.recv().await {
        match item {
            Publish::Event(event) => match log.append(event, epoch).await {
                Ok(_) => {}
                Err(error @ EventLogError::Fenced { .. }) => {
                    tracing::error!(session = %key, %error, "another gateway owns this session now; its events from here are not stored");
                }
                Err(error) => {
                    tracing::error!(session = %key, %error, "cannot store an event; it is lost");
                }
            },
            Publish::Written(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Waits until every event handed to `session`'s writer so far is stored.
pub(super) async fn written(session: &SessionHub) {
    let (done, stored) = oneshot::channel();
    if session.lock().writer.send(Publish::Written(done)).is_ok() {
        let _ = stored.await;
    }
}

/// A connection following a session's events.
pub(super) struct Subscriber {
    /// Where the events go.
    pub(super) outbox: Outbox,
    stop: CancellationToken,
}

impl Subscriber {
    /// Forwards `events` to `outbox` until stopped, the outbox closes, or the log ends them.
    pub(super) fn forward(events: mpsc::Receiver<AgentEvent>, outbox: Outbox) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(forward(events, outbox.clone(), stop.clone(), None));
        Self { outbox, stop }
    }

    /// Stops its forwarder.
    pub(super) fn stop(self) {
        self.stop.cancel();
    }
}

/// Forwards the first `count` of `events` to `outbox`, then stops (a replay page).
pub(super) fn forward_page(events: mpsc::Receiver<AgentEvent>, outbox: Outbox, count: u64) {
    tokio::spawn(forward(
        events,
        outbox,
        CancellationToken::new(),
        Some(count),
    ));
}

/// Stops and forgets connection `id`'s subscription.
pub(super) fn drop_subscriber(state: &mut SessionState, id: u64) {
    let (gone, kept) = std::mem::take(&mut state.subscribers)
        .into_iter()
        .partition(|subscriber| subscriber.outbox.id == id);
    state.subscribers = kept;
    for subscriber in gone {
        subscriber.stop();
    }
}

async fn forward(
    mut events: mpsc::Receiver<AgentEvent>,
    outbox: Outbox,
    stop: CancellationToken,
    count: Option<u64>,
) {
    let mut sent = 0u64;
    while count.is_none_or(|count| sent < count) {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            () = outbox.closed() => return,
            event = events.recv() => event,
        };
        let Some(event) = event else {
            // The log stopped following (the session was removed).
            return;
        };
        for frame in protocol::agent_frames(&event) {
            if !outbox.push(frame) {
                return;
            }
        }
        sent += 1;
    }
}

impl Hub {
    /// A subscriber for `outbox` following `key` from after `since`: it starts following at
    /// once, in a task of its own, so it may be made under the session's lock.
    pub(super) fn follow_live(&self, key: &str, since: u64, outbox: Outbox) -> Subscriber {
        let stop = CancellationToken::new();
        let (log, key, forwarded) = (self.parts.events.clone(), key.to_string(), outbox.clone());
        let stopped = stop.clone();
        tokio::spawn(async move {
            match log.follow(&key, since).await {
                Ok(follow) => forward(follow.events, forwarded, stopped, None).await,
                Err(error) => {
                    tracing::error!(session = %key, %error, "cannot follow the session's events");
                }
            }
        });
        Subscriber { outbox, stop }
    }

    /// Adds `subscriber` to `session` in place of the connection's earlier subscription.
    pub(super) fn add_subscriber(&self, session: &SessionHub, subscriber: Subscriber) {
        let mut state = session.lock();
        drop_subscriber(&mut state, subscriber.outbox.id);
        state.subscribers.push(subscriber);
    }
}

impl Hub {
    /// Subscribes `outbox` to `key`: with `since`, first replays the events after it (a `gap`
    /// event first when some are no longer kept), then follows live; the response goes out
    /// before any event. A replay longer than a page ends the subscription after the page
    /// (`more`): the client subscribes again from `nextSince`.
    pub async fn subscribe(
        &self,
        key: &str,
        since: Option<u64>,
        outbox: &Outbox,
        subscriptions: &Mutex<HashSet<String>>,
        id: &Value,
    ) -> Result<(), GatewayError> {
        let session = self.open_session(key).await?;
        let numbered = {
            let mut state = session.lock();
            drop_subscriber(&mut state, outbox.id);
            state.next_seq - 1
        };
        lock(subscriptions).remove(key);
        let Some(since) = since else {
            outbox.push(protocol::ok(
                id,
                json!({"sessionKey": key, "lastSeq": numbered, "replayed": 0, "more": false}),
            ));
            self.add_subscriber(&session, self.follow_live(key, numbered, outbox.clone()));
            lock(subscriptions).insert(key.to_string());
            return Ok(());
        };
        if since > numbered {
            return Err(GatewayError::new(
                Code::InvalidParams,
                format!(
                    "since {since} is after the session's last event {numbered} (its events were deleted or reset): fetch chat.history again and subscribe from its cursor"
                ),
            ));
        }
        let follow = self
            .parts
            .events
            .follow(key, since)
            .await
            .map_err(|error| GatewayError::internal("cannot read the session's events", error))?;
        let last = follow.last_seq.max(numbered);
        let start = since.max(follow.first_retained.saturating_sub(1));
        let waiting = last.saturating_sub(start);
        let replayed = waiting.min(REPLAY_PAGE as u64);
        let more = waiting > replayed;
        outbox.push(protocol::ok(
            id,
            json!({
                "sessionKey": key,
                "since": since,
                "lastSeq": last,
                "firstRetained": follow.first_retained,
                "replayed": replayed,
                "more": more,
                "nextSince": start + replayed,
            }),
        ));
        if since + 1 < follow.first_retained {
            outbox.push(protocol::event(
                "gap",
                json!({
                    "sessionKey": key,
                    "from": since + 1,
                    "to": follow.first_retained - 1,
                    "reason": "these events are older than the retained window",
                }),
                None,
            ));
        }
        if more {
            // One page, then the client asks again.
            forward_page(follow.events, outbox.clone(), replayed);
            return Ok(());
        }
        self.add_subscriber(&session, Subscriber::forward(follow.events, outbox.clone()));
        lock(subscriptions).insert(key.to_string());
        Ok(())
    }

    /// Stops sending `key`'s events to `outbox`.
    pub fn unsubscribe(&self, key: &str, outbox: &Outbox) {
        if let Some(session) = self.session(key) {
            drop_subscriber(&mut session.lock(), outbox.id);
        }
    }
}
