//! [`JetStreamEventLog`]: each session's events on one subject, `claw.ev.<session token>`, of
//! the limits stream `CLAW_EV` (at most [`EVENTS_PER_SESSION`] kept per subject, the oldest
//! dropped first). An event is a message whose payload is the event's JSON and whose headers
//! carry its `Claw-Seq`, the writer's `Claw-Epoch` and its `Claw-Run`. An append is published
//! with `Nats-Expected-Last-Subject-Sequence` set to the stream sequence of the session's last
//! stored message, which the log remembers per session after its first append or lookup; the
//! server refuses it when another writer stored something since (error 10071), and the log then
//! reads the last message again and decides: a newer epoch there fences this writer, a `seq` at
//! or past this one is out of order, anything else is retried once. Removing a session publishes
//! a tombstone (`Claw-Removed`, with the last writer's epoch, so the fence outlives the removal)
//! that rolls the subject up (`Nats-Rollup: sub`): the server drops every earlier message of the
//! subject, and followers, who receive the tombstone, end. `read` and `follow` find the first
//! event after `since` by a binary search over the stream with direct gets of the subject's next
//! message, then read with an ordered consumer filtered on the subject from that stream sequence;
//! a follower's task skips anything at or before the last `seq` it delivered, so a consumer the
//! client recreates after a reconnection never repeats an event. A read's or an ended follower's
//! consumer is deleted on the server at once. It is one file (over 700 lines) because appending,
//! fencing, removing, reading and following all work on the same subjects and the per-session tails
//! the log remembers, and must agree on the same headers.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, context::PublishErrorKind, stream};
use bytes::Bytes;
use clawcage_agent::events::{
    AgentEvent, Epoch, EventFuture, EventLog, EventLogError, Follow, Replay,
};
use clawcage_core::sync::lock;
use tokio::sync::{mpsc, watch};

use crate::ClusterOptions;
use crate::keys::token;
use crate::subject_log::Reader;

/// The stream of every session's events.
pub const EVENT_STREAM: &str = "CLAW_EV";

/// Events kept per session by default (the file log keeps 5,000 to 10,000).
pub const EVENTS_PER_SESSION: i64 = 10_000;

/// How long an append waits for a stream's new leader after a server died.
const ELECTION_PATIENCE: Duration = Duration::from_secs(30);
const SUBJECT_PREFIX: &str = "claw.ev.";
const SEQ_HEADER: &str = "Claw-Seq";
const EPOCH_HEADER: &str = "Claw-Epoch";
const RUN_HEADER: &str = "Claw-Run";
const REMOVED_HEADER: &str = "Claw-Removed";
const ROLLUP_HEADER: &str = "Nats-Rollup";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// How long one try of an append waits for the server's acknowledgement before it is sent
/// again under the same expectation (safe: a copy that was stored makes the next try fail with
/// "wrong last sequence", and the log then finds its own event at the end). Short, so an append
/// caught by a reconnection or a leader election is sent again as soon as the servers answer.
const ACK_WAIT: Duration = Duration::from_secs(2);

/// Tries of an append whose acknowledgement does not come (about ten seconds in all).
const LOST_ACK_TRIES: usize = 5;

/// Events a follower's receiver holds before the feeding task waits for it.
const FOLLOWER_BUFFER: usize = 256;

/// The first pause before a follower whose consumer failed follows again, doubled up to
/// [`MAX_RETRY_PAUSE`] while the servers stay unreachable.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// The subject of `session_key`'s events.
pub fn subject_of(session_key: &str) -> String {
    format!("{SUBJECT_PREFIX}{}", token(session_key))
}

/// The event log on JetStream. Cheap to clone: clones share the connection and what is known of
/// each session's last stored message.
#[derive(Clone)]
pub struct JetStreamEventLog {
    inner: Arc<Inner>,
}

struct Inner {
    context: jetstream::Context,
    stream: stream::Stream<()>,
    /// The last stored message of each session this handle appended to or looked up.
    tails: Mutex<HashMap<String, Tail>>,
    /// Moves with every reconnection to the servers.
    reconnected: watch::Receiver<u64>,
    /// Closed when the lease this log is written under is lost: nothing more is sent.
    fences: crate::SessionFences,
}

impl std::fmt::Debug for JetStreamEventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamEventLog")
            .field("stream", &EVENT_STREAM)
            .finish_non_exhaustive()
    }
}

/// Where a session's log ends: its last message's stream sequence, `seq` and writer's epoch (all
/// 0 for a subject without messages; `seq` 0 after a removal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tail {
    stream_sequence: u64,
    seq: u64,
    epoch: Epoch,
}

/// What a stored message says of itself.
#[derive(Debug, Clone, Copy)]
struct Place {
    seq: u64,
    epoch: Epoch,
    removed: bool,
}

fn place_of(headers: Option<&HeaderMap>) -> Place {
    let number = |name: &str| {
        headers
            .and_then(|headers| headers.get(name))
            .and_then(|value| value.as_str().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Place {
        seq: number(SEQ_HEADER),
        epoch: number(EPOCH_HEADER),
        removed: headers.is_some_and(|headers| headers.get(REMOVED_HEADER).is_some()),
    }
}

/// An I/O error saying what failed and what to do.
fn failed(what: impl std::fmt::Display) -> EventLogError {
    EventLogError::Io(std::io::Error::other(what.to_string()))
}

fn unreachable_store(session: &str, error: impl std::fmt::Display) -> EventLogError {
    failed(format!(
        "session {session}: the NATS event stream {EVENT_STREAM} did not answer: {error}; check that the NATS servers run and are reachable"
    ))
}

/// Where a read or follow starts, and the window it sees.
#[derive(Debug, Clone, Copy)]
struct Located {
    first_retained: u64,
    last_seq: u64,
    /// The stream sequence of the subject's last message (0 without one).
    last_stream_sequence: u64,
    /// The stream sequence to start from; `None` for a subject without messages (every message
    /// it ever gets comes after).
    start: Option<u64>,
}

impl JetStreamEventLog {
    /// Creates or updates the `CLAW_EV` stream and opens the log on it. An error names the
    /// stream and says why.
    pub(crate) async fn open(
        context: jetstream::Context,
        options: &ClusterOptions,
        reconnected: watch::Receiver<u64>,
    ) -> Result<Self, (String, String)> {
        let config = stream::Config {
            name: EVENT_STREAM.to_string(),
            description: Some("clawcage: each session's events, one subject per session".into()),
            subjects: vec![format!("{SUBJECT_PREFIX}*")],
            retention: stream::RetentionPolicy::Limits,
            max_messages_per_subject: options.events_per_session.max(1),
            max_age: options.events_max_age.unwrap_or_default(),
            discard: stream::DiscardPolicy::Old,
            storage: stream::StorageType::File,
            num_replicas: options.replicas.max(1),
            allow_direct: true,
            allow_rollup: true,
            ..Default::default()
        };
        let what = || format!("the stream {EVENT_STREAM}");
        let stream = crate::subject_log::patiently(|| async {
            context
                .create_or_update_stream(config.clone())
                .await
                .map_err(|error| error.to_string())?;
            context
                .get_stream_no_info(EVENT_STREAM)
                .await
                .map_err(|error| error.to_string())
        })
        .await
        .map_err(|error| (what(), error))?;
        Ok(Self {
            inner: Arc::new(Inner {
                context,
                stream,
                tails: Mutex::new(HashMap::new()),
                reconnected,
                fences: options.write_fences.clone(),
            }),
        })
    }
}

impl JetStreamEventLog {
    /// How many consumers the event stream has: every live follower and read has one.
    pub async fn open_consumers(&self) -> std::io::Result<usize> {
        let mut stream = self
            .inner
            .context
            .get_stream(EVENT_STREAM)
            .await
            .map_err(std::io::Error::other)?;
        let info = stream.info().await.map_err(std::io::Error::other)?;
        Ok(info.state.consumer_count)
    }

    /// Each message stored for `session_key`, in the stream's order, as its `seq` and its
    /// writer's epoch: what a check of the cluster's fencing reads (along a session's subject
    /// the epoch never goes back, and the seqs run 1, 2, … without a hole or a repeat).
    pub async fn writers_of(&self, session_key: &str) -> std::io::Result<Vec<(u64, Epoch)>> {
        let subject = subject_of(session_key);
        let stream = &self.inner.stream;
        let last = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => message.sequence,
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Vec::new());
            }
            Err(error) => return Err(std::io::Error::other(error)),
        };
        let mut messages = Reader::open(stream, &subject, consumer::DeliverPolicy::All)
            .await
            .map_err(std::io::Error::other)?;
        let mut writers = Vec::new();
        loop {
            let message = match tokio::time::timeout(Duration::from_secs(30), messages.next()).await
            {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(error))) => return Err(std::io::Error::other(error)),
                Ok(None) => break,
                Err(_) => {
                    return Err(std::io::Error::other(format!(
                        "no message of {subject} came for 30 s while reading"
                    )));
                }
            };
            let place = place_of(message.headers.as_ref());
            writers.push((place.seq, place.epoch));
            let sequence = message
                .info()
                .map(|info| info.stream_sequence)
                .map_err(std::io::Error::other)?;
            if sequence >= last {
                break;
            }
        }
        Ok(writers)
    }
}

impl Inner {
    /// The session's last stored message, read from the stream leader.
    async fn lookup_tail(&self, session: &str, subject: &str) -> Result<Tail, EventLogError> {
        let tail = match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => {
                let place = place_of(Some(&message.headers));
                Tail {
                    stream_sequence: message.sequence,
                    seq: if place.removed { 0 } else { place.seq },
                    epoch: place.epoch,
                }
            }
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                Tail::default()
            }
            Err(error) => return Err(unreachable_store(session, error)),
        };
        lock(&self.tails).insert(session.to_string(), tail);
        Ok(tail)
    }

    async fn tail(&self, session: &str, subject: &str) -> Result<Tail, EventLogError> {
        let known = lock(&self.tails).get(session).copied();
        match known {
            Some(tail) => Ok(tail),
            None => self.lookup_tail(session, subject).await,
        }
    }

    async fn append(&self, event: AgentEvent, epoch: Epoch) -> Result<AgentEvent, EventLogError> {
        let session = event.session_key.clone();
        let subject = subject_of(&session);
        let payload = Bytes::from(serde_json::to_vec(&event).map_err(std::io::Error::other)?);
        let mut tail = self.tail(&session, &subject).await?;
        if epoch < tail.epoch || event.seq <= tail.seq {
            // What this handle knew may be stale (another handle removed the session): ask.
            tail = self.lookup_tail(&session, &subject).await?;
            refuse_behind(&session, &event, epoch, tail)?;
        }
        // Conflicts with another writer (each read again and judged), and tries whose
        // acknowledgement was lost (each sent again under the same expectation).
        let (mut conflicts, mut lost) = (0, 0);
        let electing = std::time::Instant::now();
        let mut reconnected = self.reconnected.clone();
        reconnected.mark_unchanged();
        loop {
            self.fences
                .of(&session)
                .check(|| format!("event {} of session {session}", event.seq))
                .map_err(failed)?;
            let mut headers = HeaderMap::new();
            headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
            headers.insert(EPOCH_HEADER, epoch.to_string().as_str());
            if !event.run_id.is_empty() {
                headers.insert(RUN_HEADER, event.run_id.as_str());
            }
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE,
                tail.stream_sequence.to_string().as_str(),
            );
            let published = self
                .context
                .publish_with_headers(subject.clone(), headers, payload.clone())
                .await;
            let acked = match published {
                Ok(ack) => tokio::select! {
                    acked = tokio::time::timeout(ACK_WAIT, ack.into_future()) => {
                        acked.unwrap_or_else(|_| Err(PublishErrorKind::TimedOut.into()))
                    }
                    // An acknowledgement due on the connection that was lost never comes.
                    Ok(()) = reconnected.changed() => Err(PublishErrorKind::TimedOut.into()),
                },
                Err(error) => Err(error),
            };
            let error = match acked {
                Ok(ack) => {
                    lock(&self.tails).insert(
                        session.clone(),
                        Tail {
                            stream_sequence: ack.sequence,
                            seq: event.seq,
                            epoch,
                        },
                    );
                    return Ok(event);
                }
                Err(error) => error,
            };
            match error.kind() {
                PublishErrorKind::WrongLastSequence => {
                    tail = self.lookup_tail(&session, &subject).await?;
                    if lost > 0
                        && self
                            .already_stored(&subject, tail, &event, epoch, &payload)
                            .await
                    {
                        return Ok(event);
                    }
                    refuse_behind(&session, &event, epoch, tail)?;
                    conflicts += 1;
                    if conflicts > 1 {
                        return Err(failed(format!(
                            "session {session}: event {} could not be appended: another writer kept appending to the session; it is owned elsewhere",
                            event.seq
                        )));
                    }
                }
                PublishErrorKind::MaxPayloadExceeded => {
                    return Err(EventLogError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "session {session}: event {} is {} bytes, more than the NATS server takes ({error}); raise max_payload in the server's configuration or keep events smaller",
                            event.seq,
                            payload.len()
                        ),
                    )));
                }
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe
                    if lost < LOST_ACK_TRIES =>
                {
                    lost += 1;
                }
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                    // Unknown whether it was stored: the next append asks the server.
                    lock(&self.tails).remove(&session);
                    return Err(failed(format!(
                        "session {session}: event {} was not acknowledged after {} tries ({error}); it may or may not be stored: check the NATS servers, and read the session's last seq before numbering on",
                        event.seq,
                        LOST_ACK_TRIES + 1
                    )));
                }
                // No stream leader for a moment (a server died and a new leader is being
                // elected): nothing was stored; tried again, for a while.
                PublishErrorKind::StreamNotFound if electing.elapsed() < ELECTION_PATIENCE => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ if electing.elapsed() < ELECTION_PATIENCE
                    && crate::subject_log::is_passing(&error.to_string()) =>
                {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ => return Err(unreachable_store(&session, error)),
            }
        }
    }

    /// Whether the log's end `tail` is this very event, stored by an earlier try whose
    /// acknowledgement was lost (a timeout, a reconnection): the same place, epoch and bytes.
    async fn already_stored(
        &self,
        subject: &str,
        tail: Tail,
        event: &AgentEvent,
        epoch: Epoch,
        payload: &Bytes,
    ) -> bool {
        tail.epoch == epoch
            && tail.seq == event.seq
            && self
                .stream
                .get_last_raw_message_by_subject(subject)
                .await
                .is_ok_and(|message| message.payload == *payload)
    }

    /// Finds where a reader from `since` starts: the first message of the subject whose `seq` is
    /// after `since`, by a binary search over stream sequences with direct gets of the
    /// subject's next message (⌈log2 n⌉ + 1 gets for a stream of n messages).
    async fn locate(
        &self,
        session: &str,
        subject: &str,
        since: u64,
    ) -> Result<Located, EventLogError> {
        let last = match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Located {
                    first_retained: 1,
                    last_seq: 0,
                    last_stream_sequence: 0,
                    start: None,
                });
            }
            Err(error) => return Err(unreachable_store(session, error)),
        };
        let last_place = place_of(Some(&last.headers));
        if last_place.removed {
            return Ok(Located {
                first_retained: 1,
                last_seq: 0,
                last_stream_sequence: last.sequence,
                start: Some(last.sequence + 1),
            });
        }
        let next = |from: u64| async move {
            match self
                .stream
                .direct_get_next_for_subject(subject, Some(from))
                .await
            {
                Ok(message) => Ok(Some((message.sequence, place_of(Some(&message.headers))))),
                Err(error) if error.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
                Err(error) => Err(unreachable_store(session, error)),
            }
        };
        let Some((mut first_sequence, mut first)) = next(1).await? else {
            return Ok(Located {
                first_retained: 1,
                last_seq: 0,
                last_stream_sequence: 0,
                start: None,
            });
        };
        if first.removed {
            // The tombstone a removal left, before the session's new events.
            match next(first_sequence + 1).await? {
                Some((sequence, place)) => (first_sequence, first) = (sequence, place),
                None => (first_sequence, first) = (last.sequence, last_place),
            }
        }
        let located = |start| Located {
            first_retained: first.seq.min(last_place.seq),
            last_seq: last_place.seq,
            last_stream_sequence: last.sequence,
            start: Some(start),
        };
        if last_place.seq <= since {
            return Ok(located(last.sequence + 1));
        }
        if first.seq > since {
            return Ok(located(first_sequence));
        }
        // next(low) has seq <= since, next(high) has seq > since: find the smallest stream
        // sequence whose next message of the subject is after `since`.
        let (mut low, mut high) = (first_sequence, last.sequence);
        while low < high {
            let middle = low + (high - low) / 2;
            match next(middle).await? {
                Some((_, place)) if place.seq > since || place.removed => high = middle,
                Some((sequence, _)) => low = sequence + 1,
                // Removed meanwhile: start after what was last seen.
                None => return Ok(located(last.sequence + 1)),
            }
        }
        Ok(located(low))
    }

    /// An ordered consumer of `subject` from `located`.
    async fn reader(
        &self,
        session: &str,
        subject: &str,
        located: Located,
    ) -> Result<Reader, EventLogError> {
        let deliver_policy = match located.start {
            Some(start_sequence) => consumer::DeliverPolicy::ByStartSequence { start_sequence },
            None => consumer::DeliverPolicy::All,
        };
        Reader::open(&self.stream, subject, deliver_policy)
            .await
            .map_err(|error| unreachable_store(session, error))
    }

    async fn read(&self, session: &str, since: u64, limit: usize) -> Result<Replay, EventLogError> {
        let subject = subject_of(session);
        let located = self.locate(session, &subject, since).await?;
        let mut replay = Replay {
            events: Vec::new(),
            first_retained: located.first_retained,
            last_seq: located.last_seq,
        };
        let Some(start) = located.start else {
            return Ok(replay);
        };
        if limit == 0 || located.last_seq <= since || start > located.last_stream_sequence {
            return Ok(replay);
        }
        let mut messages = self.reader(session, &subject, located).await?;
        while replay.events.len() < limit {
            let message = match tokio::time::timeout(Duration::from_secs(30), messages.next()).await
            {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(error))) => return Err(unreachable_store(session, error)),
                Ok(None) => break,
                Err(_) => {
                    return Err(unreachable_store(
                        session,
                        "no message for 30 s while reading",
                    ));
                }
            };
            let stream_sequence = message
                .info()
                .map(|info| info.stream_sequence)
                .unwrap_or(u64::MAX);
            let place = place_of(message.headers.as_ref());
            if place.removed {
                break;
            }
            if place.seq > since {
                match serde_json::from_slice::<AgentEvent>(&message.payload) {
                    Ok(event) => replay.events.push(event),
                    Err(error) => tracing::warn!(
                        session,
                        seq = place.seq,
                        "skipping an unreadable event: {error}"
                    ),
                }
            }
            if stream_sequence >= located.last_stream_sequence {
                break;
            }
        }
        Ok(replay)
    }

    async fn remove(&self, session: &str) -> Result<(), EventLogError> {
        let subject = subject_of(session);
        let tail = self.lookup_tail(session, &subject).await?;
        self.fences
            .of(session)
            .check(|| format!("the removal of session {session}'s events"))
            .map_err(failed)?;
        let mut headers = HeaderMap::new();
        headers.insert(ROLLUP_HEADER, "sub");
        headers.insert(REMOVED_HEADER, "1");
        headers.insert(SEQ_HEADER, "0");
        headers.insert(EPOCH_HEADER, tail.epoch.to_string().as_str());
        let published = self
            .context
            .publish_with_headers(subject, headers, Bytes::new())
            .await;
        let ack = match published {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        }
        .map_err(|error| unreachable_store(session, error))?;
        lock(&self.tails).insert(
            session.to_string(),
            Tail {
                stream_sequence: ack.sequence,
                seq: 0,
                epoch: tail.epoch,
            },
        );
        Ok(())
    }
}

/// Refuses `event` under `epoch` when the log's end `tail` is newer.
fn refuse_behind(
    session: &str,
    event: &AgentEvent,
    epoch: Epoch,
    tail: Tail,
) -> Result<(), EventLogError> {
    if tail.epoch > epoch {
        return Err(EventLogError::Fenced {
            session: session.to_string(),
            epoch,
            current: tail.epoch,
        });
    }
    if tail.seq >= event.seq {
        return Err(EventLogError::OutOfOrder {
            session: session.to_string(),
            seq: event.seq,
            last: tail.seq,
        });
    }
    Ok(())
}

/// Feeds one follower from its ordered consumer: each event after `since` once, in order. When
/// the client reconnects, or the consumer fails (the server went away and the client could not
/// recreate it), the follower follows again from the last event it delivered, waiting longer
/// between tries while the servers are unreachable. Ends when the follower goes away or the session is removed (its
/// tombstone arrives, or the log turns out to have been removed meanwhile).
async fn feed_follower(
    inner: Arc<Inner>,
    session: String,
    since: u64,
    messages: Reader,
    follower: mpsc::Sender<AgentEvent>,
) {
    let mut delivered = since;
    let mut messages = Some(messages);
    let mut pause = RETRY_PAUSE;
    let mut reconnected = inner.reconnected.clone();
    reconnected.mark_unchanged();
    loop {
        let Some(stream) = messages.as_mut() else {
            tokio::select! {
                () = follower.closed() => return,
                () = tokio::time::sleep(pause) => {}
            }
            let subject = subject_of(&session);
            let again = async {
                let located = inner.locate(&session, &subject, delivered).await?;
                Ok::<_, EventLogError>((located, inner.reader(&session, &subject, located).await?))
            };
            match again.await {
                Ok((located, _)) if located.last_seq < delivered => {
                    // Removed (and perhaps numbered anew) while the follower was away.
                    return;
                }
                Ok((_, again)) => {
                    messages = Some(again);
                    pause = RETRY_PAUSE;
                }
                Err(error) => {
                    tracing::debug!(session, "following again failed: {error}");
                    pause = (pause * 2).clamp(RETRY_PAUSE, MAX_RETRY_PAUSE);
                }
            }
            continue;
        };
        let next = tokio::select! {
            () = follower.closed() => return,
            next = stream.next() => next,
            Ok(()) = reconnected.changed() => {
                // The servers may have lost the consumer with the connection: follow again now.
                messages = None;
                pause = Duration::ZERO;
                continue;
            }
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                tracing::warn!(
                    session,
                    "a followed session's event stream failed, following again: {error}"
                );
                messages = None;
                continue;
            }
            None => {
                messages = None;
                continue;
            }
        };
        let place = place_of(message.headers.as_ref());
        if place.removed {
            return;
        }
        if place.seq <= delivered {
            continue;
        }
        let event = match serde_json::from_slice::<AgentEvent>(&message.payload) {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(
                    session,
                    seq = place.seq,
                    "skipping an unreadable event: {error}"
                );
                continue;
            }
        };
        delivered = place.seq;
        if follower.send(event).await.is_err() {
            return;
        }
    }
}

impl EventLog for JetStreamEventLog {
    fn append(&self, event: AgentEvent, epoch: Epoch) -> EventFuture<'_, AgentEvent> {
        Box::pin(self.inner.append(event, epoch))
    }

    fn read<'a>(
        &'a self,
        session_key: &'a str,
        since: u64,
        limit: usize,
    ) -> EventFuture<'a, Replay> {
        Box::pin(self.inner.read(session_key, since, limit))
    }

    fn last_seq<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, u64> {
        Box::pin(async move {
            let tail = self
                .inner
                .lookup_tail(session_key, &subject_of(session_key))
                .await?;
            Ok(tail.seq)
        })
    }

    fn follow<'a>(&'a self, session_key: &'a str, since: u64) -> EventFuture<'a, Follow> {
        Box::pin(async move {
            let subject = subject_of(session_key);
            let located = self.inner.locate(session_key, &subject, since).await?;
            let messages = self.inner.reader(session_key, &subject, located).await?;
            let (sender, events) = mpsc::channel(FOLLOWER_BUFFER);
            tokio::spawn(feed_follower(
                self.inner.clone(),
                session_key.to_string(),
                since,
                messages,
                sender,
            ));
            Ok(Follow {
                first_retained: located.first_retained,
                last_seq: located.last_seq,
                events,
            })
        })
    }

    fn remove<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, ()> {
        Box::pin(self.inner.remove(session_key))
    }

    fn sync(&self) -> EventFuture<'_, ()> {
        // Every append waited for the server's acknowledgement: it is stored as the stream's
        // configuration says (replicated on R3; on disk within the server's sync_interval).
        Box::pin(std::future::ready(Ok(())))
    }
}
