//! [`JetStreamInbox`]: the durable lane inbox on the `CLAW_INBOX` stream, one subject per
//! session (`claw.inbox.<token>`), one message per inbox record (an input, inputs done, a stop
//! asked, the session's queue settings), replayed through the agent's [`SessionInbox`] as the
//! files are. Any host may append to any session: an append expects the last sequence the
//! writer read, and when another host appended meanwhile it reads the session again and tries
//! again, so records keep one total order per session and an idempotency key is checked against
//! everything stored. When dead records outnumber live ones the session is rolled up into one
//! record of its live state (`Nats-Rollup: sub`). What is pending, finished and set is always
//! read from the stream (another host may have appended since); an append decides on what it
//! last read and, refused because the session moved on, reads and decides again.
//!
//! The claim on a session (the one process that takes up what a stopped one left) is a lease
//! (`inbox.<session>` in `claw_leases`), renewed by the store while held and given back when the
//! last input is done. A host that restarts under the same `host_id` takes over the leases of
//! its previous incarnation at once (one live process per host id), instead of waiting for them
//! to lapse; a lease of another live host is respected.
//!
//! Where this differs from the scale-out design (a work-queue `CLAW_IN` stream split into 64
//! partitions by a subject transform, one consumer per owned partition): the agent's seam is a
//! per-session log replayed at start, which this implements as it is; the partitioned work
//! queue is how inputs travel between hosts, and comes with the gateway taking partitions over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use clawcage_agent::LaneInbox;
use clawcage_agent::inbox::{
    Appended, FinishedInput, InputRecord, InputStatus, Line, SessionInbox,
};
use clawcage_agent::session::queue::QueueOverride;
use clawcage_agent::transcript::now_ms;
use clawcage_core::sync::lock;

use crate::keys::token;
use crate::leases::{Holder, Lease, LeaseError, Leases};
use crate::subject_log::{
    AppendError, LogConnection, LogStream, SESSION_HEADER, Worker, append_fenced, cluster_error,
    connect_log, for_each_session, read_subject, setup_limit, take_up,
};
use crate::{ClusterError, ClusterOptions};

/// The stream of inboxes.
pub const INBOX_STREAM: &str = "CLAW_INBOX";

/// Subjects of the stream: this prefix and the session's token.
const SUBJECT_PREFIX: &str = "claw.inbox.";

/// Tries of an append that keeps meeting other hosts' appends.
const APPEND_TRIES: usize = 16;

fn subject_of(session: &str) -> String {
    format!("{SUBJECT_PREFIX}{}", token(session))
}

fn lease_of(session: &str) -> String {
    format!("inbox.{session}")
}

fn unreachable(session: &str, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!(
        "the inbox of session {session}: the NATS servers did not answer: {error}; check that they run and are reachable"
    ))
}

/// How the claim on a session is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claims {
    /// A lease per session (`inbox.<session>`), for hosts that own sessions apart.
    PerSession,
    /// The caller holds a lease that covers every session (the one active gateway of an
    /// active/standby cluster, fenced by that lease): a claim always succeeds.
    CoveredByCaller,
}

/// One session as this store last read it.
#[derive(Clone, Default)]
struct Known {
    inbox: SessionInbox,
    /// The sequence of its last record (0: none).
    last: u64,
}

struct Inner {
    context: jetstream::Context,
    stream: stream::Stream<()>,
    leases: Leases,
    sessions: Mutex<HashMap<String, Known>>,
    claimed: Mutex<HashMap<String, Lease>>,
    claims: Claims,
    timeout: Duration,
    /// This store among the writers (its appends' message ids).
    writer: String,
    /// Closed when the lease this store writes under is lost: nothing more is sent.
    fences: crate::SessionFences,
}

/// Lane inboxes on JetStream. Cheap to clone; the connection, its thread and the renewal of the
/// claims end with the last clone.
#[derive(Clone)]
pub struct JetStreamInbox {
    inner: Arc<Inner>,
    runtime: Arc<Worker>,
}

impl std::fmt::Debug for JetStreamInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamInbox")
            .field("stream", &INBOX_STREAM)
            .finish()
    }
}

impl JetStreamInbox {
    /// Connects to `url` on a runtime of its own as holder `me` (checking the server as
    /// [`Cluster::connect`] does), creates or updates the `CLAW_INBOX` stream and the leases'
    /// buckets, and starts renewing the claims it will hold. Callable from any thread.
    pub fn connect(
        url: &str,
        options: &ClusterOptions,
        me: Holder,
        claims: Claims,
    ) -> Result<Self, ClusterError> {
        let LogConnection {
            worker,
            cluster,
            stream,
        } = connect_log(
            url,
            options,
            "clawcage-inbox",
            LogStream {
                name: INBOX_STREAM,
                prefix: SUBJECT_PREFIX,
                description: "clawcage: each session's lane inbox",
                rollups: true,
            },
        )?;
        let context = cluster.context.clone();
        let leases = worker
            .run(setup_limit(options), async move {
                cluster.leases(me).await.map_err(std::io::Error::other)
            })
            .map_err(|error| cluster_error(error, url, "the leases"))?;
        let inner = Arc::new(Inner {
            context,
            stream,
            leases,
            sessions: Mutex::new(HashMap::new()),
            claimed: Mutex::new(HashMap::new()),
            claims,
            timeout: options.request_timeout,
            writer: crate::subject_log::writer_nonce(),
            fences: options.write_fences.clone(),
        });
        worker.spawn(renew_claims(Arc::downgrade(&inner), options.lease_ttl / 3));
        Ok(Self {
            inner,
            runtime: Arc::new(worker),
        })
    }

    fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(Arc<Inner>) -> futures_util::future::BoxFuture<'static, std::io::Result<T>>,
    ) -> std::io::Result<T> {
        self.runtime
            .run(self.inner.timeout * 6, job(self.inner.clone()))
    }

    /// Takes `sessions` up for this host (`by`: it and its epoch), which has just become their
    /// writer: before it reads one, a [`Line::Taken`] is appended to its inbox, so that an
    /// append of the host it replaced that the server stores only now (held by a stalled
    /// server) is refused rather than land after this host read the session. Up to
    /// sixteen sessions at once.
    pub fn take_up(&self, sessions: &[String], by: &str) -> std::io::Result<()> {
        let marker = serde_json::to_vec(&[Line::Taken { by: by.to_string() }])
            .map_err(std::io::Error::other)?;
        let inner = self.inner.clone();
        for_each_session(
            &self.runtime,
            self.inner.timeout,
            sessions,
            move |session| {
                let (inner, marker) = (inner.clone(), marker.clone());
                async move { inner.take_up(&session, &marker).await }
            },
        )
    }
}

impl Drop for JetStreamInbox {
    /// The last handle gives its claims back, so another process may take the sessions up at
    /// once (a process that dies without this loses its claims when they lapse).
    fn drop(&mut self) {
        if Arc::strong_count(&self.inner) != 1 {
            return;
        }
        let inner = self.inner.clone();
        let released = self.runtime.run(self.inner.timeout, async move {
            let held: Vec<Lease> = lock(&inner.claimed)
                .drain()
                .map(|(_, lease)| lease)
                .collect();
            for lease in held {
                let _ = inner.leases.release(lease).await;
            }
            Ok(())
        });
        if let Err(error) = released {
            tracing::warn!("the inbox's claims were not given back: {error}");
        }
    }
}

/// Renews every claim held, every `every`, while the store lives; a claim lost meanwhile is
/// dropped (another process may take up the session now).
async fn renew_claims(inner: std::sync::Weak<Inner>, every: Duration) {
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(200)));
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let held: Vec<(String, Lease)> = lock(&inner.claimed)
            .iter()
            .map(|(key, lease)| (key.clone(), lease.clone()))
            .collect();
        for (key, mut lease) in held {
            match inner.leases.renew(&mut lease).await {
                Ok(()) => {
                    let mut claimed = lock(&inner.claimed);
                    // Released meanwhile: stays released.
                    if claimed.contains_key(&key) {
                        claimed.insert(key, lease);
                    }
                }
                Err(LeaseError::Lost { .. }) => {
                    tracing::warn!(session = key, "the claim on this session's inbox was lost");
                    lock(&inner.claimed).remove(&key);
                }
                Err(error) => tracing::warn!(session = key, "cannot renew a claim: {error}"),
            }
        }
    }
}

/// What an append decides once it sees the session as stored: `None` appends nothing.
type Decide = Box<dyn Fn(&SessionInbox) -> Option<Line> + Send + Sync>;

impl Inner {
    /// Reads `session` from the stream.
    async fn read(&self, session: &str) -> std::io::Result<Known> {
        let (records, last) =
            read_subject(&self.stream, &subject_of(session), u64::MAX, self.timeout)
                .await
                .map_err(|error| unreachable(session, error))?;
        let mut known = Known {
            inbox: SessionInbox::default(),
            last,
        };
        for (sequence, payload) in records {
            match serde_json::from_slice::<Vec<Line>>(&payload) {
                Ok(lines) => lines.into_iter().for_each(|line| known.inbox.apply(line)),
                Err(error) => tracing::warn!(
                    session,
                    sequence,
                    "skipping an unreadable inbox record: {error}"
                ),
            }
        }
        known.inbox.prune(now_ms());
        lock(&self.sessions).insert(session.to_string(), known.clone());
        Ok(known)
    }

    async fn take_up(&self, session: &str, marker: &[u8]) -> std::io::Result<()> {
        let taken = take_up(
            &self.context,
            &self.stream,
            &self.fences.of(session),
            &subject_of(session),
            session,
            marker,
            &self.writer,
            |error| unreachable(session, error),
        )
        .await;
        // Read again before the next append.
        lock(&self.sessions).remove(session);
        taken.map(drop)
    }

    async fn known(&self, session: &str) -> std::io::Result<Known> {
        let cached = lock(&self.sessions).get(session).cloned();
        match cached {
            Some(known) => Ok(known),
            None => self.read(session).await,
        }
    }

    /// Appends what `decide` makes of the session as stored, reading again and deciding again
    /// when another host appended meanwhile. Returns the session as it is after, and whether
    /// anything was appended.
    async fn append(&self, session: &str, decide: Decide) -> std::io::Result<(Known, bool)> {
        let subject = subject_of(session);
        let mut known = self.known(session).await?;
        for _ in 0..APPEND_TRIES {
            let Some(line) = decide(&known.inbox) else {
                return Ok((known, false));
            };
            let payload =
                serde_json::to_vec(std::slice::from_ref(&line)).map_err(std::io::Error::other)?;
            match append_fenced(
                &self.context,
                &self.fences.of(session),
                &subject,
                session,
                payload,
                known.last,
                &self.writer,
            )
            .await
            {
                Ok(sequence) => {
                    known.inbox.apply(line);
                    known.last = sequence;
                    lock(&self.sessions).insert(session.to_string(), known.clone());
                    return Ok((known, true));
                }
                Err(AppendError::Moved) => known = self.read(session).await?,
                Err(AppendError::Failed(error)) => return Err(unreachable(session, error)),
                Err(AppendError::Fenced(why)) => return Err(std::io::Error::other(why)),
            }
        }
        Err(std::io::Error::other(format!(
            "the inbox of session {session} kept changing under this append; send it again"
        )))
    }

    /// Replaces the session's records with one record of its live state, when dead records
    /// outnumber live ones (the same rule as the files).
    async fn roll_up_if_large(&self, session: &str, known: &Known) -> std::io::Result<()> {
        let mut inbox = known.inbox.clone();
        inbox.prune(now_ms());
        let live = inbox.live_lines();
        let records = inbox.records();
        if records <= live.len() + 64 || records * 2 < live.len() * 3 {
            return Ok(());
        }
        let payload = serde_json::to_vec(&live).map_err(std::io::Error::other)?;
        self.fences
            .of(session)
            .check(|| format!("the roll-up of session {session}'s inbox"))
            .map_err(std::io::Error::other)?;
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, session);
        headers.insert("Nats-Rollup", "sub");
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            known.last.to_string().as_str(),
        );
        let published = self
            .context
            .publish_with_headers(subject_of(session), headers, Bytes::from(payload))
            .await;
        let acknowledged = match published {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acknowledged {
            Ok(_) => {
                // Read back as the next process would.
                self.read(session).await.map(drop)
            }
            // Someone appended meanwhile: the next done tries again.
            Err(error)
                if error.kind() == jetstream::context::PublishErrorKind::WrongLastSequence =>
            {
                Ok(())
            }
            // Rolling up is housekeeping: the records stay as they are, the next done tries
            // again.
            Err(error) => {
                tracing::warn!(session, "cannot roll up this inbox: {error}");
                Ok(())
            }
        }
    }

    async fn claim(&self, session: &str) -> std::io::Result<bool> {
        if self.claims == Claims::CoveredByCaller || lock(&self.claimed).contains_key(session) {
            return Ok(true);
        }
        let name = lease_of(session);
        let taken = match self.leases.acquire(&name).await {
            Ok(Some(lease)) => Some(lease),
            Ok(None) => self
                .leases
                .take_over_from_earlier_self(&name)
                .await
                .map_err(|error| unreachable(session, error))?,
            Err(error) => return Err(unreachable(session, error)),
        };
        match taken {
            Some(lease) => {
                lock(&self.claimed).insert(session.to_string(), lease);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn release(&self, session: &str) {
        let lease = lock(&self.claimed).remove(session);
        if let Some(lease) = lease
            && let Err(error) = self.leases.release(lease).await
        {
            tracing::warn!(session, "cannot give back the claim on this inbox: {error}");
        }
    }

    async fn remove(&self, session: &str) -> std::io::Result<()> {
        self.stream
            .purge()
            .filter(subject_of(session))
            .await
            .map_err(|error| unreachable(session, error))?;
        lock(&self.sessions).remove(session);
        self.release(session).await;
        Ok(())
    }
}

impl LaneInbox for JetStreamInbox {
    fn append(&self, key: &str, record: &InputRecord) -> std::io::Result<Appended> {
        let session = key.to_string();
        let record = record.clone();
        self.call(move |inner| {
            Box::pin(async move {
                let candidate = record.clone();
                let decide: Decide = Box::new(move |inbox: &SessionInbox| {
                    let duplicate = candidate
                        .idempotency
                        .as_deref()
                        .and_then(|key| inbox.find_key(key))
                        .is_some()
                        || inbox.pending().iter().any(|known| known.id == candidate.id);
                    (!duplicate).then(|| Line::In(candidate.clone()))
                });
                let (known, appended) = inner.append(&session, decide).await?;
                if !appended {
                    let earlier = record
                        .idempotency
                        .as_deref()
                        .and_then(|key| known.inbox.find_key(key))
                        .unwrap_or_else(|| record.id.clone());
                    return Ok(Appended::Duplicate(earlier));
                }
                if !inner.claim(&session).await? {
                    tracing::warn!(
                        session,
                        "another clawcage process has inputs in flight in this session"
                    );
                }
                Ok(Appended::New)
            })
        })
    }

    fn done(&self, key: &str, ids: &[String], status: InputStatus) -> std::io::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let session = key.to_string();
        let ids = ids.to_vec();
        self.call(move |inner| {
            Box::pin(async move {
                let decide: Decide = Box::new(move |_inbox: &SessionInbox| {
                    Some(Line::Done {
                        ids: ids.clone(),
                        status,
                        at_ms: now_ms(),
                    })
                });
                let (known, _) = inner.append(&session, decide).await?;
                if known.inbox.pending().is_empty() {
                    inner.release(&session).await;
                }
                inner.roll_up_if_large(&session, &known).await
            })
        })
    }

    fn pending(&self, key: &str) -> std::io::Result<Vec<InputRecord>> {
        let session = key.to_string();
        self.call(move |inner| {
            Box::pin(async move { Ok(inner.read(&session).await?.inbox.pending().to_vec()) })
        })
    }

    fn finished(&self, key: &str) -> std::io::Result<Vec<FinishedInput>> {
        let session = key.to_string();
        self.call(move |inner| {
            Box::pin(async move {
                let mut inbox = inner.read(&session).await?.inbox;
                inbox.prune(now_ms());
                Ok(inbox.finished().to_vec())
            })
        })
    }

    fn sessions(&self) -> std::io::Result<Vec<String>> {
        self.call(|inner| {
            Box::pin(async move {
                let found =
                    crate::subject_log::sessions(&inner.context, INBOX_STREAM, SUBJECT_PREFIX)
                        .await
                        .map_err(|error| unreachable("(all)", error))?;
                let mut keys: Vec<String> = found.into_iter().map(|(key, _)| key).collect();
                keys.sort();
                Ok(keys)
            })
        })
    }

    fn remove(&self, key: &str) -> std::io::Result<()> {
        let session = key.to_string();
        self.call(move |inner| Box::pin(async move { inner.remove(&session).await }))
    }

    fn claim(&self, key: &str) -> std::io::Result<bool> {
        let session = key.to_string();
        self.call(move |inner| Box::pin(async move { inner.claim(&session).await }))
    }

    fn release(&self, key: &str) {
        let session = key.to_string();
        let released = self.call(move |inner| {
            Box::pin(async move {
                inner.release(&session).await;
                Ok(())
            })
        });
        if let Err(error) = released {
            tracing::warn!("cannot give back a claim: {error}");
        }
    }

    fn request_stop(&self, key: &str, id: &str) -> std::io::Result<()> {
        let session = key.to_string();
        let id = id.to_string();
        self.call(move |inner| {
            Box::pin(async move {
                let decide: Decide = Box::new(move |inbox: &SessionInbox| {
                    inbox
                        .pending()
                        .iter()
                        .any(|record| record.id == id)
                        .then(|| Line::Stop { id: id.clone() })
                });
                inner.append(&session, decide).await.map(drop)
            })
        })
    }

    fn set_queue_override(&self, key: &str, value: Option<QueueOverride>) -> std::io::Result<()> {
        let session = key.to_string();
        self.call(move |inner| {
            Box::pin(async move {
                let decide: Decide =
                    Box::new(move |_inbox: &SessionInbox| Some(Line::Queue { value }));
                inner.append(&session, decide).await.map(drop)
            })
        })
    }

    fn queue_override(&self, key: &str) -> std::io::Result<Option<QueueOverride>> {
        let session = key.to_string();
        self.call(move |inner| {
            Box::pin(async move { Ok(inner.read(&session).await?.inbox.queue_override()) })
        })
    }
}
