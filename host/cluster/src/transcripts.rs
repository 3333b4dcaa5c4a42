//! [`JetStreamTranscripts`]: the sessions' transcripts and turn journals on the `CLAW_TX`
//! stream, one subject per session (`claw.tx.<token>`), one record per write of entries (split
//! before each turn's start; read whole or not at all, scrubbed by the redactor before it
//! leaves the process), the session key in a header. A record is one message, or, when it is
//! larger than the server takes (`max_payload`), several parts appended one after the other
//! (framed by [`PART_MAGIC`]) that a reader joins again; a record whose last part never came (its
//! writer died in between) is passed over as if never written. Every append
//! expects the last sequence the writer knows of the session's subject
//! (`Nats-Expected-Last-Subject-Sequence`), so after another host wrote to the session this
//! one's append is refused by the server — it no longer owns the session — instead of
//! interleaving. A position is a stream sequence: the committed part of a session ends at the
//! sequence of its last committed entry (before an open turn's start), and a load reads the
//! subject with an ordered consumer through [`TranscriptReplay`], the same replay the files use.
//!
//! [`TranscriptStore`] is a synchronous trait (the lanes call it where a file store writes and
//! fsyncs): the store runs its own connection on a [`Worker`] of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use clawcage_agent::transcript::{Entry, Loaded, Position, SessionFile};
use clawcage_agent::{TranscriptReplay, TranscriptStore};
use clawcage_core::redact::Redactor;
use clawcage_core::sync::lock;

use crate::keys::token;
use crate::subject_log::{
    AppendError, LogConnection, LogStream, Worker, append_fenced, connect_log, for_each_session,
    last_sequence, read_subject, take_up,
};
use crate::{ClusterError, ClusterOptions};

/// The stream of transcripts.
pub const TRANSCRIPT_STREAM: &str = "CLAW_TX";

/// Subjects of the stream: this prefix and the session's token.
const SUBJECT_PREFIX: &str = "claw.tx.";

/// The subject of `session`'s transcript.
fn subject_of(session: &str) -> String {
    format!("{SUBJECT_PREFIX}{}", token(session))
}

/// What a part of a record split across messages begins with: a record alone is a JSON array,
/// which never begins with a zero byte. Then `<index> <count>\n` and the part's bytes.
pub(crate) const PART_MAGIC: &[u8] = b"\0clawcage-part ";

/// Room left in each message for its headers (the session key among them) beside a part.
const HEADER_ROOM: usize = 4096;

/// The messages `payload` is stored as, each at most `limit` bytes (headers aside): itself
/// when it fits, else parts framed by [`PART_MAGIC`].
fn split_record(payload: Vec<u8>, limit: usize) -> Vec<Vec<u8>> {
    if payload.len() <= limit {
        return vec![payload];
    }
    // The frame takes at most 40 bytes; a part carries the rest.
    let room = limit.saturating_sub(PART_MAGIC.len() + 40).max(1);
    let count = payload.len().div_ceil(room);
    payload
        .chunks(room)
        .enumerate()
        .map(|(index, bytes)| {
            let mut part = PART_MAGIC.to_vec();
            part.extend_from_slice(format!("{index} {count}\n").as_bytes());
            part.extend_from_slice(bytes);
            part
        })
        .collect()
}

/// Where part `payload` stands among its record's parts, and its bytes; `None` for a whole
/// record.
fn part_of(payload: &[u8]) -> Option<(usize, usize, &[u8])> {
    let rest = payload.strip_prefix(PART_MAGIC)?;
    let newline = rest.iter().position(|byte| *byte == b'\n')?;
    let frame = std::str::from_utf8(&rest[..newline]).ok()?;
    let (index, count) = frame.split_once(' ')?;
    Some((
        index.parse().ok()?,
        count.parse().ok()?,
        &rest[newline + 1..],
    ))
}

/// One record of a session as read back: the sequence before its first message, the sequence
/// of its last one, and its bytes (the parts joined).
#[derive(Debug, PartialEq)]
struct Record {
    previous: u64,
    sequence: u64,
    payload: Bytes,
}

/// The records the messages `stored` (sequence and payload, in order) hold, parts joined. Parts
/// that do not make a whole record (their writer died before the last, or they come out of
/// order) are passed over, with a warning for `session`.
fn records_read(session: &str, stored: Vec<(u64, Bytes)>) -> Vec<Record> {
    let mut records = Vec::new();
    let (mut previous, mut last_seen) = (0, 0);
    // The parts of the record being joined: where it began and its bytes so far.
    let mut joining: Option<(u64, usize, usize, Vec<u8>)> = None;
    let torn = |first: u64| {
        tracing::warn!(
            session,
            first,
            "passing over a transcript record whose writer stopped before its last part"
        );
    };
    for (sequence, payload) in stored {
        match part_of(&payload) {
            None => {
                if let Some((first, ..)) = joining.take() {
                    torn(first);
                    previous = last_seen;
                }
                records.push(Record {
                    previous,
                    sequence,
                    payload,
                });
            }
            Some((index, count, bytes)) => {
                let joined = match joining.take() {
                    Some((first, expected, of, mut so_far)) if index == expected && count == of => {
                        so_far.extend_from_slice(bytes);
                        Some((first, so_far))
                    }
                    other => {
                        if let Some((first, ..)) = other {
                            torn(first);
                            previous = last_seen;
                        }
                        (index == 0).then(|| (previous, bytes.to_vec()))
                    }
                };
                match joined {
                    Some((first, so_far)) if index + 1 == count => records.push(Record {
                        previous: first,
                        sequence,
                        payload: Bytes::from(so_far),
                    }),
                    Some((first, so_far)) => joining = Some((first, index + 1, count, so_far)),
                    None => torn(sequence),
                }
            }
        }
        // Until a record is whole, the place before it is the place before its first part.
        last_seen = sequence;
        if joining.is_none() {
            previous = sequence;
        }
    }
    if let Some((first, ..)) = joining {
        torn(first);
    }
    records
}

/// Where a session's transcript stands, as this store last saw it.
#[derive(Debug, Clone, Copy, Default)]
struct Tail {
    /// The sequence of its last entry (0: none).
    last: u64,
    /// Where its committed part ends.
    committed_end: u64,
    /// Whether a turn is open after it.
    open: bool,
}

impl Tail {
    /// The tail after `entry`, stored at `sequence` right after the tail's last entry: the rule
    /// [`TranscriptReplay`] follows.
    fn after(self, entry: &Entry, sequence: u64) -> Tail {
        let (committed_end, open) = match entry {
            Entry::Start { .. } => (self.last, true),
            Entry::Turn { .. } => (sequence, false),
            _ if !self.open => (sequence, false),
            _ => (self.committed_end, true),
        };
        Tail {
            last: sequence,
            committed_end,
            open,
        }
    }
}

struct Inner {
    context: jetstream::Context,
    stream: stream::Stream<()>,
    redactor: Redactor,
    tails: Mutex<HashMap<String, Tail>>,
    timeout: Duration,
    /// This store among the writers (its appends' message ids).
    writer: String,
    /// Closed when the lease this store writes under is lost: nothing more is sent.
    fences: crate::SessionFences,
    /// The largest message the server takes, headers aside: a larger record goes in parts.
    part_limit: usize,
}

/// Transcripts on JetStream. Cheap to clone; the connection and its thread end with the last
/// clone.
#[derive(Clone)]
pub struct JetStreamTranscripts {
    inner: Arc<Inner>,
    runtime: Arc<Worker>,
}

impl std::fmt::Debug for JetStreamTranscripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamTranscripts")
            .field("stream", &TRANSCRIPT_STREAM)
            .finish()
    }
}

fn unreachable(session: &str, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!(
        "the transcript of session {session}: the NATS servers did not answer: {error}; check that they run and are reachable"
    ))
}

impl JetStreamTranscripts {
    /// Connects to `url` on a runtime of its own (checking the server as [`Cluster::connect`]
    /// does), and creates or updates the `CLAW_TX` stream. Entries are scrubbed by `redactor`
    /// before they are sent. Callable from any thread, inside a runtime or not.
    pub fn connect(
        url: &str,
        options: &ClusterOptions,
        redactor: Redactor,
    ) -> Result<Self, ClusterError> {
        let LogConnection {
            worker,
            cluster,
            stream,
        } = connect_log(
            url,
            options,
            "clawcage-transcripts",
            LogStream {
                name: TRANSCRIPT_STREAM,
                prefix: SUBJECT_PREFIX,
                description: "clawcage: each session's transcript and turn journal",
                rollups: false,
            },
        )?;
        let context = cluster.context.clone();
        Ok(Self {
            inner: Arc::new(Inner {
                context,
                stream,
                redactor,
                tails: Mutex::new(HashMap::new()),
                timeout: options.request_timeout,
                writer: crate::subject_log::writer_nonce(),
                fences: options.write_fences.clone(),
                part_limit: cluster.max_payload().saturating_sub(HEADER_ROOM).max(1024),
            }),
            runtime: Arc::new(worker),
        })
    }

    fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(Arc<Inner>) -> futures_util::future::BoxFuture<'static, std::io::Result<T>>,
    ) -> std::io::Result<T> {
        // A load reads the whole subject: allow it several request timeouts.
        let limit = self.inner.timeout * 6;
        self.runtime.run(limit, job(self.inner.clone()))
    }

    /// Takes `sessions` up for this host, which has just become their writer: before it reads
    /// one, a marker is appended to its transcript, so that a write of the host it replaced
    /// that the server stores only now (held by a stalled server) is refused rather than land
    /// after this host read the session. Sixteen sessions at once.
    pub fn take_up(&self, sessions: &[String]) -> std::io::Result<()> {
        let inner = self.inner.clone();
        for_each_session(
            &self.runtime,
            self.inner.timeout,
            sessions,
            move |session| {
                let inner = inner.clone();
                async move { inner.take_up(&session).await }
            },
        )
    }

    fn write(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        let key = key.to_string();
        let entries = entries.to_vec();
        self.call(move |inner| Box::pin(async move { inner.append(&key, entries).await }))
    }
}

/// The records one write of `entries` is stored as: each a message of its own, stored whole or
/// not at all, so a host killed during the write leaves no half of a step (a turn's start
/// without the message it answers). A record ends before each turn's start, so that a start
/// is always the first entry of its record and "just before the start" is a position.
fn records_of(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut records: Vec<Vec<Entry>> = Vec::new();
    for entry in entries {
        let starts = matches!(entry, Entry::Start { .. });
        match records.last_mut() {
            Some(record) if !starts => record.push(entry),
            _ => records.push(vec![entry]),
        }
    }
    records
}

impl Inner {
    /// The session's tail: as last seen, else read from the stream (its whole subject, for the
    /// committed end).
    async fn tail(&self, session: &str) -> std::io::Result<Tail> {
        if let Some(tail) = lock(&self.tails).get(session).copied() {
            return Ok(tail);
        }
        self.read(session, 1, u64::MAX).await?;
        Ok(lock(&self.tails).get(session).copied().unwrap_or_default())
    }

    async fn append(&self, session: &str, entries: Vec<Entry>) -> std::io::Result<()> {
        let subject = subject_of(session);
        let mut tail = self.tail(session).await?;
        for record in records_of(entries) {
            let scrubbed: Vec<Entry> = if self.redactor.is_empty() {
                record.clone()
            } else {
                record
                    .iter()
                    .map(|entry| entry.redacted(&self.redactor))
                    .collect()
            };
            let payload = serde_json::to_vec(&scrubbed).map_err(std::io::Error::other)?;
            // Each part expects the one before: nobody can write between them.
            let mut sequence = tail.last;
            for part in split_record(payload, self.part_limit) {
                sequence = match append_fenced(
                    &self.context,
                    &self.fences.of(session),
                    &subject,
                    session,
                    part,
                    sequence,
                    &self.writer,
                )
                .await
                {
                    Ok(sequence) => sequence,
                    Err(AppendError::Moved) => {
                        // Whatever is stored now is someone else's: read it again next time.
                        lock(&self.tails).remove(session);
                        return Err(std::io::Error::other(format!(
                            "the transcript of session {session} was written by another host meanwhile: this one no longer owns the session and stops writing to it"
                        )));
                    }
                    // Parts may be stored already: the next write reads where the subject ends.
                    Err(AppendError::Failed(error)) => {
                        lock(&self.tails).remove(session);
                        return Err(unreachable(session, error));
                    }
                    Err(AppendError::Fenced(why)) => {
                        lock(&self.tails).remove(session);
                        return Err(std::io::Error::other(why));
                    }
                };
            }
            for entry in &record {
                tail = tail.after(entry, sequence);
            }
            lock(&self.tails).insert(session.to_string(), tail);
        }
        Ok(())
    }

    /// Replays `session`'s entries up to sequence `until` into a [`Loaded`]; a whole read
    /// records the session's tail.
    async fn read(&self, session: &str, limit: usize, until: u64) -> std::io::Result<Loaded> {
        let (records, last) = read_subject(&self.stream, &subject_of(session), until, self.timeout)
            .await
            .map_err(|error| unreachable(session, error))?;
        let mut replay = TranscriptReplay::new(limit);
        let mut tail = Tail::default();
        for Record {
            previous,
            sequence,
            payload,
        } in records_read(session, records)
        {
            match serde_json::from_slice::<Vec<Entry>>(&payload) {
                Ok(entries) => {
                    for entry in entries {
                        tail = tail.after(&entry, sequence);
                        replay.apply(entry, previous, sequence);
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        session,
                        sequence,
                        "skipping an unreadable transcript entry: {error}"
                    );
                    replay.skip();
                    tail.last = sequence;
                }
            }
        }
        if until == u64::MAX {
            tail.last = tail.last.max(last);
            lock(&self.tails).insert(session.to_string(), tail);
        }
        Ok(replay.finish())
    }

    /// Takes `session` up for this host before it reads it ([`take_up`]): the marker is an
    /// empty record, which a replay passes over.
    async fn take_up(&self, session: &str) -> std::io::Result<()> {
        let taken = take_up(
            &self.context,
            &self.stream,
            &self.fences.of(session),
            &subject_of(session),
            session,
            b"[]",
            &self.writer,
            |error| unreachable(session, error),
        )
        .await;
        // Read whole again before the next write.
        lock(&self.tails).remove(session);
        taken.map(drop)
    }

    async fn remove(&self, session: &str) -> std::io::Result<()> {
        self.stream
            .purge()
            .filter(subject_of(session))
            .await
            .map_err(|error| unreachable(session, error))?;
        lock(&self.tails).insert(session.to_string(), Tail::default());
        Ok(())
    }

    async fn sessions(&self) -> std::io::Result<Vec<SessionFile>> {
        let found = crate::subject_log::sessions(&self.context, TRANSCRIPT_STREAM, SUBJECT_PREFIX)
            .await
            .map_err(|error| unreachable("(all)", error))?;
        let mut sessions: Vec<SessionFile> = found
            .into_iter()
            .map(|(key, modified_ms)| SessionFile {
                key,
                modified_ms,
                bytes: 0,
            })
            .collect();
        sessions.sort_by(|a, b| b.modified_ms.cmp(&a.modified_ms).then(a.key.cmp(&b.key)));
        Ok(sessions)
    }
}

impl TranscriptStore for JetStreamTranscripts {
    fn append_steps(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.write(key, entries)
    }

    /// Durable once the stream acknowledged it (stored by its replicas).
    fn commit(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.write(key, entries)
    }

    fn load(&self, key: &str, limit: usize) -> std::io::Result<Loaded> {
        let key = key.to_string();
        self.call(move |inner| Box::pin(async move { inner.read(&key, limit, u64::MAX).await }))
    }

    fn load_until(&self, key: &str, limit: usize, until: Position) -> std::io::Result<Loaded> {
        let key = key.to_string();
        self.call(move |inner| Box::pin(async move { inner.read(&key, limit, until.0).await }))
    }

    fn committed_position(&self, key: &str) -> std::io::Result<Position> {
        let key = key.to_string();
        self.call(move |inner| {
            Box::pin(async move { Ok(Position(inner.tail(&key).await?.committed_end)) })
        })
    }

    fn exists(&self, key: &str) -> std::io::Result<bool> {
        let key = key.to_string();
        self.call(move |inner| {
            Box::pin(async move {
                let last = last_sequence(&inner.stream, &subject_of(&key))
                    .await
                    .map_err(|error| unreachable(&key, error))?;
                Ok(last > 0)
            })
        })
    }

    fn remove(&self, key: &str) -> std::io::Result<()> {
        let key = key.to_string();
        self.call(move |inner| Box::pin(async move { inner.remove(&key).await }))
    }

    /// Every session with a transcript, newest first (`bytes` is not known here: 0).
    fn sessions(&self) -> std::io::Result<Vec<SessionFile>> {
        self.call(|inner| Box::pin(async move { inner.sessions().await }))
    }

    fn describe(&self, key: &str) -> String {
        format!("{} on the NATS stream {TRANSCRIPT_STREAM}", subject_of(key))
    }

    fn remedy(&self) -> &'static str {
        "check that the cluster's NATS servers answer (`clawcage cluster status`)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_core::ChatMessage;

    fn start(input: &str) -> Entry {
        Entry::Start {
            at_ms: 1,
            inputs: vec![input.to_string()],
        }
    }

    fn message(text: &str) -> Entry {
        Entry::Message {
            at_ms: 1,
            message: ChatMessage::user(text),
        }
    }

    fn stored(messages: Vec<Vec<u8>>, first: u64) -> Vec<(u64, Bytes)> {
        (first..)
            .zip(messages)
            .map(|(sequence, payload)| (sequence, Bytes::from(payload)))
            .collect()
    }

    #[test]
    fn a_record_larger_than_a_message_is_split_and_joined_again() {
        let record = b"[\"0123456789abcdefghijklmnopqrstuvwxyz\"]".repeat(40);
        assert_eq!(
            split_record(record.clone(), 10_000),
            std::slice::from_ref(&record)
        );
        let parts = split_record(record.clone(), 100);
        assert!(parts.len() > 10);
        assert!(parts.iter().all(|part| part.len() <= 100));
        let mut messages = vec![b"[]".to_vec()];
        messages.extend(parts.clone());
        messages.push(b"[1]".to_vec());
        let read = records_read("s", stored(messages, 5));
        let last_part = 5 + parts.len() as u64;
        assert_eq!(
            read,
            [
                Record {
                    previous: 0,
                    sequence: 5,
                    payload: Bytes::from_static(b"[]")
                },
                Record {
                    previous: 5,
                    sequence: last_part,
                    payload: Bytes::from(record)
                },
                Record {
                    previous: last_part,
                    sequence: last_part + 1,
                    payload: Bytes::from_static(b"[1]")
                },
            ]
        );
    }

    #[test]
    fn parts_that_never_make_a_whole_record_are_passed_over() {
        let parts = split_record(b"[\"abcdefghijklmnopqrstuvwxyz\"]".repeat(10), 80);
        assert!(parts.len() >= 3);
        // The writer died after two parts; the next owner's marker and a record follow.
        let mut messages = parts[..2].to_vec();
        messages.push(b"[]".to_vec());
        messages.push(b"[2]".to_vec());
        let read = records_read("s", stored(messages, 1));
        let payloads: Vec<&[u8]> = read.iter().map(|record| &record.payload[..]).collect();
        assert_eq!(payloads, [&b"[]"[..], &b"[2]"[..]]);
        assert_eq!((read[0].previous, read[0].sequence), (2, 3));
        // Parts out of order, or a part without its first, make no record either.
        let mut shuffled = vec![parts[1].clone(), parts[0].clone()];
        shuffled.extend(parts[2..].to_vec());
        assert!(records_read("s", stored(shuffled, 1)).is_empty());
        // Torn at the very end: nothing, and the whole record before it stays.
        let mut tail = vec![b"[3]".to_vec()];
        tail.extend(parts[..parts.len() - 1].to_vec());
        let read = records_read("s", stored(tail, 1));
        assert_eq!(read.len(), 1);
        assert_eq!(&read[0].payload[..], b"[3]");
    }

    #[test]
    fn a_write_is_stored_whole_and_a_turns_start_begins_a_record() {
        let kinds =
            |records: Vec<Vec<Entry>>| -> Vec<usize> { records.iter().map(Vec::len).collect() };
        // A turn's start and the message it answers: one record, never apart.
        assert_eq!(kinds(records_of(vec![start("r1"), message("hi")])), [2]);
        // Steps of a running turn: one record.
        assert_eq!(kinds(records_of(vec![message("a"), message("b")])), [2]);
        // A start in the middle begins a record of its own, with what follows it.
        assert_eq!(
            kinds(records_of(vec![message("a"), start("r2"), message("b")])),
            [1, 2]
        );
        assert!(records_of(Vec::new()).is_empty());
    }
}
