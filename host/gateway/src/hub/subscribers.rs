//! Where a session's events go after the hub numbers them: the session's writer task appends
//! them to the [`EventLog`], one after another under this process's epoch, and each subscribed
//! connection has a forwarder that follows the log and pushes the stored events to its outbox.
//! The hub never sends an event to a client itself, so what a client sees is exactly what the
//! log stored, in the log's order, whoever stored it. `sessions.subscribe` and
//! `sessions.unsubscribe` are here.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clawcage_agent::events::{AgentEvent, Epoch, EventLog, EventLogError, Stream};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
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

/// What the hub has handed a session's writer task and the task has not taken yet. A streamed
/// text delta (`assistant` or `reasoning` `{delta}`) handed while the previous delta of the same
/// run still waits here is joined to it rather than numbered as an event of its own: a delta is
/// never held back, but while the log is busy storing an event (a round trip to a shared
/// store), the deltas that arrive meanwhile are stored as one. A client sees fewer, longer
/// deltas of the same text; the protocol promises no particular split.
pub(super) struct WriterQueue {
    items: Mutex<VecDeque<Publish>>,
    ready: Notify,
    /// The session is gone: the task stores what is left and ends.
    closed: AtomicBool,
}

/// The hub's end of a [`WriterQueue`]; dropping it (with the session) lets the writer finish.
pub(super) struct WriterHandle(Arc<WriterQueue>);

impl Drop for WriterHandle {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.ready.notify_one();
    }
}

impl WriterHandle {
    /// A queue and the task that stores what it is handed in `log`, under `epoch`.
    pub(super) fn start(log: Arc<dyn EventLog>, epoch: Epoch, key: String) -> Self {
        let queue = Arc::new(WriterQueue {
            items: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(write_events(log, epoch, key, queue.clone()));
        Self(queue)
    }

    /// Joins `event`'s delta to the delta of the same run and stream waiting last in the queue,
    /// if there is one, and returns that event's `seq`; `None` when `event` must be numbered.
    pub(super) fn join_delta(&self, event: &AgentEvent) -> Option<u64> {
        let delta = text_delta(event)?;
        let mut items = lock(&self.0.items);
        let Some(Publish::Event(waiting)) = items.back_mut() else {
            return None;
        };
        if waiting.run_id != event.run_id || waiting.stream != event.stream {
            return None;
        }
        text_delta(waiting)?;
        let Some(Value::String(text)) = waiting.data.get_mut("delta") else {
            return None;
        };
        text.push_str(delta);
        Some(waiting.seq)
    }

    /// Hands `item` to the writer task.
    pub(super) fn push(&self, item: Publish) {
        lock(&self.0.items).push_back(item);
        self.0.ready.notify_one();
    }
}

/// The text of a streamed delta event (`assistant` or `reasoning` with `{delta}` alone).
fn text_delta(event: &AgentEvent) -> Option<&str> {
    if !matches!(event.stream, Stream::Assistant | Stream::Reasoning) {
        return None;
    }
    let data = event.data.as_object()?;
    if data.len() != 1 {
        return None;
    }
    data.get("delta")?.as_str()
}

/// Appends `key`'s events to `log` in the order they were handed over. A refused append is
/// logged: an event the log fences off was written by a process that no longer owns the session.
async fn write_events(log: Arc<dyn EventLog>, epoch: Epoch, key: String, queue: Arc<WriterQueue>) {
    loop {
        let next = lock(&queue.items).pop_front();
        let Some(item) = next else {
            if queue.closed.load(Ordering::Acquire) {
                return;
            }
            // A push after the look above left a permit: this returns at once.
            queue.ready.notified().await;
            continue;
        };
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
    session.lock().writer.push(Publish::Written(done));
    let _ = stored.await;
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
        // The last event numbered, when this host numbers them (another host serving the
        // session numbers its events: its log says how far).
        let numbered = {
            let mut state = session.lock();
            drop_subscriber(&mut state, outbox.id);
            self.check_served(key).is_ok().then_some(state.next_seq - 1)
        };
        lock(subscriptions).remove(key);
        let Some(since) = since else {
            // The last event the log has stored, not the last numbered: a number not stored yet
            // is given again after a crash (to another event), and a client resuming from it
            // would miss that event. The events numbered meanwhile come on the subscription.
            let stored = self.parts.events.last_seq(key).await.map_err(|error| {
                GatewayError::internal("cannot read the session's events", error)
            })?;
            outbox.push(protocol::ok(
                id,
                json!({"sessionKey": key, "lastSeq": stored, "replayed": 0, "more": false}),
            ));
            self.add_subscriber(&session, self.follow_live(key, stored, outbox.clone()));
            lock(subscriptions).insert(key.to_string());
            return Ok(());
        };
        let numbered = match numbered {
            Some(numbered) => numbered,
            None => self.parts.events.last_seq(key).await.map_err(|error| {
                GatewayError::internal("cannot read the session's events", error)
            })?,
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
        // Stored, not numbered (as above): the events numbered after come live.
        let last = follow.last_seq;
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

    /// Follows `key` for `outbox` from after event `since`, without an answer of its own (a
    /// client whose send another host took follows the session here). Events older than the
    /// retained window are not replayed.
    pub async fn follow_from(
        &self,
        key: &str,
        since: u64,
        outbox: &Outbox,
        subscriptions: &Mutex<HashSet<String>>,
    ) -> Result<(), GatewayError> {
        let session = self.open_session(key).await?;
        let follow = self
            .parts
            .events
            .follow(key, since)
            .await
            .map_err(|error| GatewayError::internal("cannot read the session's events", error))?;
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

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "tests fail by panicking"
    )]

    use super::*;
    use clawcage_agent::events::{EventFuture, Follow, Replay};
    use tokio::sync::Semaphore;

    /// A log that stores an append only when the test lets it (one permit per append), so
    /// the writer can be held busy while more is handed to it.
    #[derive(Debug)]
    struct HeldLog {
        gate: Semaphore,
        stored: Mutex<Vec<AgentEvent>>,
    }

    impl EventLog for HeldLog {
        fn append(&self, event: AgentEvent, _epoch: Epoch) -> EventFuture<'_, AgentEvent> {
            Box::pin(async move {
                self.gate.acquire().await.unwrap().forget();
                lock(&self.stored).push(event.clone());
                Ok(event)
            })
        }
        fn read<'a>(&'a self, _: &'a str, _: u64, _: usize) -> EventFuture<'a, Replay> {
            Box::pin(async { Err(std::io::Error::other("not read here").into()) })
        }
        fn last_seq<'a>(&'a self, _: &'a str) -> EventFuture<'a, u64> {
            Box::pin(async { Ok(0) })
        }
        fn follow<'a>(&'a self, _: &'a str, _: u64) -> EventFuture<'a, Follow> {
            Box::pin(async { Err(std::io::Error::other("not followed here").into()) })
        }
        fn remove<'a>(&'a self, _: &'a str) -> EventFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn sync(&self) -> EventFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Numbers and hands `event` over as the hub does.
    fn publish(writer: &WriterHandle, next_seq: &mut u64, mut event: AgentEvent) -> u64 {
        if let Some(seq) = writer.join_delta(&event) {
            return seq;
        }
        event.seq = *next_seq;
        *next_seq += 1;
        writer.push(Publish::Event(event));
        *next_seq - 1
    }

    fn delta(run: &str, stream: Stream, text: &str) -> AgentEvent {
        AgentEvent::new("s", run, stream, json!({"delta": text}))
    }

    #[tokio::test]
    async fn deltas_waiting_together_are_stored_as_one_and_nothing_else_is_joined() {
        let log = Arc::new(HeldLog {
            gate: Semaphore::new(0),
            stored: Mutex::new(Vec::new()),
        });
        let writer = WriterHandle::start(log.clone(), 1, "s".to_string());
        let mut next = 1;
        // The first delta is taken by the writer and held in its append.
        assert_eq!(
            publish(&writer, &mut next, delta("r1", Stream::Assistant, "He")),
            1
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // These wait meanwhile: consecutive deltas of one run and stream join.
        assert_eq!(
            publish(&writer, &mut next, delta("r1", Stream::Assistant, "ll")),
            2
        );
        assert_eq!(
            publish(&writer, &mut next, delta("r1", Stream::Assistant, "o")),
            2
        );
        // Another stream, another run, or an event that is not a bare delta is never joined,
        // and nothing is joined across them.
        assert_eq!(
            publish(&writer, &mut next, delta("r1", Stream::Reasoning, "hm")),
            3
        );
        assert_eq!(
            publish(&writer, &mut next, delta("r2", Stream::Reasoning, "x")),
            4
        );
        let message = AgentEvent::new(
            "s",
            "r2",
            Stream::Assistant,
            json!({"delta": "sent", "kind": "message"}),
        );
        assert_eq!(publish(&writer, &mut next, message), 5);
        assert_eq!(
            publish(&writer, &mut next, delta("r2", Stream::Assistant, "a")),
            6
        );
        assert_eq!(
            publish(&writer, &mut next, delta("r2", Stream::Assistant, "b")),
            6
        );
        log.gate.add_permits(100);
        let (done, stored) = oneshot::channel();
        writer.push(Publish::Written(done));
        stored.await.unwrap();
        let stored: Vec<(u64, String, String)> = lock(&log.stored)
            .iter()
            .map(|event| {
                (
                    event.seq,
                    event.run_id.clone(),
                    event.data["delta"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let expected: Vec<(u64, String, String)> = [
            (1, "r1", "He"),
            (2, "r1", "llo"),
            (3, "r1", "hm"),
            (4, "r2", "x"),
            (5, "r2", "sent"),
            (6, "r2", "ab"),
        ]
        .into_iter()
        .map(|(seq, run, text)| (seq, run.to_string(), text.to_string()))
        .collect();
        assert_eq!(
            stored, expected,
            "seq contiguous, the text whole and in order"
        );
        // Once stored, a delta is no longer joined: the next one is an event of its own.
        assert_eq!(
            publish(&writer, &mut next, delta("r2", Stream::Assistant, "c")),
            7
        );
    }
}
