//! What the per-session logs on JetStream (transcripts, inboxes) share: a session's records are
//! the messages of one subject, appended with the sequence the writer last read expected
//! ([`append_fenced`]: the server refuses the append when someone else wrote meanwhile), read
//! back in order with an ordered consumer up to the subject's last sequence ([`read_subject`]);
//! and the [`Worker`], a runtime of the store's own on which its synchronous calls (the agent's
//! store traits are synchronous) run and wait for their answer on a plain channel, so that a
//! call from any thread, inside another runtime or not, never starves the connection that must
//! answer it.

use std::time::Duration;

use async_nats::HeaderMap;

use crate::{Cluster, ClusterError, ClusterOptions, WriteFence};
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;

/// The header naming the session a record belongs to (its subject token may be a hash).
pub(crate) const SESSION_HEADER: &str = "Claw-Session";

/// A runtime of the store's own, shut down without waiting when the store goes (dropping a
/// runtime inside another one would panic).
pub(crate) struct Worker(Option<tokio::runtime::Runtime>);

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Worker {
    /// A runtime of one thread named `name`.
    pub(crate) fn start(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(Self(Some(runtime)))
    }

    /// [`Worker::start`] for the store of `what` at `url`, its failure said as that store's.
    pub(crate) fn start_for(name: &str, url: &str, what: &str) -> Result<Self, ClusterError> {
        Self::start(name).map_err(|error| {
            cluster_error(
                std::io::Error::other(format!("cannot start its runtime: {error}")),
                url,
                what,
            )
        })
    }

    /// Runs `job` on the store's runtime and waits at most `limit` for its answer, from any
    /// thread.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        limit: Duration,
        job: impl std::future::Future<Output = std::io::Result<T>> + Send + 'static,
    ) -> std::io::Result<T> {
        let Some(runtime) = self.0.as_ref() else {
            return Err(std::io::Error::other("the store has shut down"));
        };
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = answer.send(job.await);
        });
        answered.recv_timeout(limit).map_err(|_| {
            std::io::Error::other(format!(
                "the NATS servers did not answer within {} s; check that they run and are reachable",
                limit.as_secs()
            ))
        })?
    }

    /// Spawns `task` on the store's runtime.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        if let Some(runtime) = self.0.as_ref() {
            runtime.spawn(task);
        }
    }
}

/// Why an append failed.
pub(crate) enum AppendError {
    /// Someone else appended to the subject since the writer last read it.
    Moved,
    /// The servers did not take it.
    Failed(String),
    /// Not sent: the writer's lease is lost or stale (its write fence is shut); why.
    Fenced(String),
}

/// How long an append keeps trying while the servers cannot take it (a stream's leader being
/// elected after a server died takes a few seconds).
const APPEND_PATIENCE: Duration = Duration::from_secs(30);

/// Appends `payload` to `subject` for `session`, expecting `last` to be the subject's last
/// sequence; the new record's sequence. `writer` is unique to the store appending (a random
/// nonce): with `last` it makes the message id, so an append tried again after its
/// acknowledgement was lost is recognised by the server as the same message (not stored twice,
/// and not mistaken for another writer's), while another writer's append at the same place is
/// refused by the fence. Errors that pass (no stream leader for a moment, a timeout) are tried
/// again for up to [`APPEND_PATIENCE`], each try only while `fence` is open (a host whose lease
/// lapsed sends nothing more, retries included).
pub(crate) async fn append_fenced(
    context: &jetstream::Context,
    fence: &WriteFence,
    subject: &str,
    session: &str,
    payload: Vec<u8>,
    last: u64,
    writer: &str,
) -> Result<u64, AppendError> {
    let payload = Bytes::from(payload);
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        fence
            .check(|| format!("an append to {subject}"))
            .map_err(AppendError::Fenced)?;
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, session);
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            last.to_string().as_str(),
        );
        headers.insert("Nats-Msg-Id", format!("{writer}:{subject}:{last}").as_str());
        let published = context
            .publish_with_headers(subject.to_string(), headers, payload.clone())
            .await;
        let acknowledged = match published {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        let error = match acknowledged {
            Ok(ack) => return Ok(ack.sequence),
            Err(error)
                if error.kind() == jetstream::context::PublishErrorKind::WrongLastSequence =>
            {
                return Err(AppendError::Moved);
            }
            Err(error) => error,
        };
        let passing = matches!(
            error.kind(),
            jetstream::context::PublishErrorKind::TimedOut
                | jetstream::context::PublishErrorKind::StreamNotFound
                | jetstream::context::PublishErrorKind::BrokenPipe
        ) || is_passing(&error.to_string());
        if !passing || started.elapsed() >= APPEND_PATIENCE {
            return Err(AppendError::Failed(error.to_string()));
        }
        tracing::debug!(session, "an append is tried again: {error}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Runs `setup` (creating or opening a stream or bucket, or one key-value call) until it
/// succeeds, trying again for up to [`APPEND_PATIENCE`] while the error is one that passes (the
/// servers electing a leader for the JetStream API or a stream after one of them died).
pub(crate) async fn patiently<T, F, Fut>(mut setup: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(200);
    loop {
        match setup().await {
            Ok(done) => return Ok(done),
            Err(error)
                if started.elapsed() < APPEND_PATIENCE
                    && [
                        "timed out",
                        "no responders",
                        "temporarily unavailable",
                        "no suitable peers",
                        // A bucket's stream while it has no leader.
                        "no stream found",
                    ]
                    .iter()
                    .any(|passing| error.contains(passing)) =>
            {
                tracing::debug!("a setup is tried again: {error}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(error) => return Err(error),
        }
    }
}

/// A per-session log stream: its name, the prefix of its subjects, what it holds, and whether
/// a session's records may be rolled up into one.
pub(crate) struct LogStream {
    pub(crate) name: &'static str,
    pub(crate) prefix: &'static str,
    pub(crate) description: &'static str,
    pub(crate) rollups: bool,
}

/// Creates or updates `log`'s stream over `prefix*`: kept without age or per-subject limit,
/// refusing new records when full rather than dropping old ones, direct reads allowed; then
/// opens it.
async fn open_log_stream(
    context: &jetstream::Context,
    replicas: usize,
    log: &LogStream,
) -> Result<stream::Stream<()>, String> {
    let config = stream::Config {
        name: log.name.to_string(),
        description: Some(log.description.to_string()),
        subjects: vec![format!("{}*", log.prefix)],
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::New,
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        allow_direct: true,
        allow_rollup: log.rollups,
        ..Default::default()
    };
    patiently(|| async {
        context
            .create_or_update_stream(config.clone())
            .await
            .map_err(|error| error.to_string())?;
        context
            .get_stream_no_info(log.name)
            .await
            .map_err(|error| error.to_string())
    })
    .await
}

/// A synchronous store's connection: its own runtime (a thread named as the store), the
/// cluster reached from it, and the store's log stream.
pub(crate) struct LogConnection {
    pub(crate) worker: Worker,
    pub(crate) cluster: Cluster,
    pub(crate) stream: stream::Stream<()>,
}

/// The [`ClusterError`] a job run on a store's worker failed with (the worker carries it as an
/// I/O error), or one about setting up `what` for anything else.
pub(crate) fn cluster_error(error: std::io::Error, url: &str, what: &str) -> ClusterError {
    match error.into_inner() {
        Some(inner) => match inner.downcast::<ClusterError>() {
            Ok(cluster) => *cluster,
            Err(other) => ClusterError::Setup {
                what: what.to_string(),
                url: url.to_string(),
                reason: other.to_string(),
            },
        },
        None => ClusterError::Setup {
            what: what.to_string(),
            url: url.to_string(),
            reason: "no answer".to_string(),
        },
    }
}

/// Connects to `url` on a new worker named `thread` (checking the server as
/// [`Cluster::connect`] does) and creates or opens `log`'s stream. Callable from any thread,
/// inside a runtime or not.
pub(crate) fn connect_log(
    url: &str,
    options: &ClusterOptions,
    thread: &str,
    log: LogStream,
) -> Result<LogConnection, ClusterError> {
    let what = format!("the stream {}", log.name);
    let worker = Worker::start_for(thread, url, &what)?;
    let (url_owned, options_owned) = (url.to_string(), options.clone());
    let (cluster, stream) = worker
        .run(setup_limit(options), async move {
            let cluster = Cluster::connect(&url_owned, &options_owned)
                .await
                .map_err(std::io::Error::other)?;
            let stream = open_log_stream(&cluster.context, options_owned.replicas, &log)
                .await
                .map_err(std::io::Error::other)?;
            Ok((cluster, stream))
        })
        .map_err(|error| cluster_error(error, url, &what))?;
    Ok(LogConnection {
        worker,
        cluster,
        stream,
    })
}

/// How long a store's setup may take: connecting, and waiting out an election.
pub(crate) fn setup_limit(options: &ClusterOptions) -> Duration {
    options.connect_timeout + options.request_timeout + APPEND_PATIENCE
}

/// Whether a publish error's text is one that passes: nobody answering for a moment, or a
/// stream's new leader not able yet to check an expected sequence (error 10164, "expected last
/// sequence per subject temporarily unavailable", which it words as a wrong last sequence).
pub(crate) fn is_passing(error: &str) -> bool {
    error.contains("no responders") || error.contains("error code 10164")
}

/// A nonce naming one store among the writers of a cluster (its appends' message ids).
pub(crate) fn writer_nonce() -> String {
    let mut bytes = [0u8; 8];
    // Without randomness, time and process make it unique enough among live writers.
    if getrandom::fill(&mut bytes).is_err() {
        bytes =
            (clawcage_agent::transcript::now_ms() ^ u64::from(std::process::id())).to_be_bytes();
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The last sequence of `subject` in `stream` (0: none).
pub(crate) async fn last_sequence(
    stream: &stream::Stream<()>,
    subject: &str,
) -> Result<u64, String> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(message.sequence),
        Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
        Err(error) => Err(error.to_string()),
    }
}

/// How often a take-up reads the subject again because another writer appended meanwhile.
const TAKE_UP_TRIES: usize = 16;

/// How many sessions a store takes up at once.
const TAKE_UP_AT_ONCE: usize = 16;

/// Runs `job` for each of `sessions` on `worker`, [`TAKE_UP_AT_ONCE`] at a time, until all are
/// done or one fails (allowing six request timeouts, and one more per batch).
pub(crate) fn for_each_session<F, Fut>(
    worker: &Worker,
    timeout: Duration,
    sessions: &[String],
    job: F,
) -> std::io::Result<()>
where
    F: Fn(String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    use futures_util::TryStreamExt as _;
    let sessions = sessions.to_vec();
    let batches = u32::try_from(sessions.len() / TAKE_UP_AT_ONCE).unwrap_or(u32::MAX);
    let limit = timeout.saturating_mul(batches.saturating_add(6));
    worker.run(limit, async move {
        futures_util::stream::iter(sessions)
            .map(job)
            .buffer_unordered(TAKE_UP_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await
            .map(drop)
    })
}

/// Takes `session`'s subject up for this writer, which is about to read the session and act on
/// it: appends `marker`, expecting the subject's last sequence as the server has it now (read
/// again when another writer appended meanwhile). A write an earlier writer sent before and the
/// server stores only after (a stalled server) is then refused, its expected sequence no
/// longer holding; one stored before is there when this writer reads. Returns the marker's
/// sequence. A server that does not answer is said by `unreachable`.
#[allow(
    clippy::too_many_arguments,
    reason = "the subject's place and its writer, as append_fenced takes them"
)]
pub(crate) async fn take_up(
    context: &jetstream::Context,
    stream: &stream::Stream<()>,
    fence: &WriteFence,
    subject: &str,
    session: &str,
    marker: &[u8],
    writer: &str,
    unreachable: impl Fn(String) -> std::io::Error,
) -> std::io::Result<u64> {
    for _ in 0..TAKE_UP_TRIES {
        let last = last_sequence(stream, subject).await.map_err(&unreachable)?;
        match append_fenced(
            context,
            fence,
            subject,
            session,
            marker.to_vec(),
            last,
            writer,
        )
        .await
        {
            Ok(sequence) => return Ok(sequence),
            Err(AppendError::Moved) => continue,
            Err(AppendError::Failed(error)) => return Err(unreachable(error)),
            Err(AppendError::Fenced(why)) => return Err(std::io::Error::other(why)),
        }
    }
    Err(std::io::Error::other(format!(
        "{subject} kept changing while this host took it up; take it up again"
    )))
}

/// An ordered consumer of one subject that deletes itself on the server when dropped, rather
/// than lingering for the server's inactivity threshold: a takeover reads every session's
/// inbox and transcript, and left behind, those consumers would pile up by the thousand.
pub(crate) struct Reader {
    messages: Option<consumer::pull::Ordered>,
    name: String,
    stream: stream::Stream<()>,
}

impl Reader {
    /// An ordered consumer of `subject` in `stream` from `deliver_policy`.
    pub(crate) async fn open(
        stream: &stream::Stream<()>,
        subject: &str,
        deliver_policy: consumer::DeliverPolicy,
    ) -> Result<Self, String> {
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.to_string(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|error| error.to_string())?;
        let name = consumer.cached_info().name.clone();
        let messages = consumer
            .messages()
            .await
            .map_err(|error| error.to_string())?;
        Ok(Self {
            messages: Some(messages),
            name,
            stream: stream.clone(),
        })
    }

    /// The next message.
    pub(crate) async fn next(
        &mut self,
    ) -> Option<Result<jetstream::Message, consumer::pull::OrderedError>> {
        match self.messages.as_mut() {
            Some(messages) => messages.next().await,
            None => None,
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // First stop pulling (a live ordered consumer would recreate what is deleted).
        drop(self.messages.take());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (stream, name) = (self.stream.clone(), std::mem::take(&mut self.name));
            runtime.spawn(async move {
                // Best effort: one the client recreated under another name expires by itself.
                let _ = stream.delete_consumer(&name).await;
            });
        }
    }
}

/// The records of `subject`, in order, with their sequences, up to `until` and the last one
/// stored when the read began; and that last sequence.
pub(crate) async fn read_subject(
    stream: &stream::Stream<()>,
    subject: &str,
    until: u64,
    wait: Duration,
) -> Result<(Vec<(u64, Bytes)>, u64), String> {
    let last = last_sequence(stream, subject).await?;
    let mut records = Vec::new();
    if last == 0 || until == 0 {
        return Ok((records, last));
    }
    let mut messages = Reader::open(stream, subject, consumer::DeliverPolicy::All).await?;
    loop {
        let message = match tokio::time::timeout(wait, messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(error))) => return Err(error.to_string()),
            Ok(None) => break,
            Err(_) => return Err("no record came while reading".to_string()),
        };
        let sequence = message
            .info()
            .map(|info| info.stream_sequence)
            .map_err(|error| error.to_string())?;
        if sequence > until {
            break;
        }
        records.push((sequence, message.payload.clone()));
        if sequence >= last {
            break;
        }
    }
    Ok((records, last))
}

/// The sessions with records in `stream` under `prefix`, with when each last wrote (ms since
/// the Unix epoch), from the session header of each subject's last record.
pub(crate) async fn sessions(
    context: &jetstream::Context,
    stream_name: &str,
    prefix: &str,
) -> Result<Vec<(String, u64)>, String> {
    let stream = context
        .get_stream(stream_name)
        .await
        .map_err(|error| error.to_string())?;
    let mut subjects = stream
        .info_with_subjects(format!("{prefix}*"))
        .await
        .map_err(|error| error.to_string())?;
    let mut names = Vec::new();
    while let Some(subject) = subjects.next().await {
        let (subject, _count) = subject.map_err(|error| error.to_string())?;
        names.push(subject);
    }
    let mut found = Vec::with_capacity(names.len());
    for subject in names {
        let message = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                continue;
            }
            Err(error) => return Err(error.to_string()),
        };
        if let Some(key) = message.headers.get(SESSION_HEADER) {
            let at_ms = (message.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            found.push((key.as_str().to_string(), at_ms));
        }
    }
    Ok(found)
}
