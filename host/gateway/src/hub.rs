//! The sessions as the gateway serves them. Each session key has a [`SessionHub`]: the
//! connections subscribed to it and a queue of runs that one driver task feeds to the runtime's
//! lane one at a time, so the gateway always knows which run is the session's current one (to
//! abort it, to tell a reader of the history where the transcript ends). Every observation of a
//! run becomes an [`AgentEvent`] appended to the session's [`EventLog`] (which gives it its
//! `seq`) and sent, under the session's lock, to every subscriber: a subscriber replaying from
//! the log and then following live sees each event exactly once, in order. The hub also keeps
//! the runs (for `agent.wait` and idempotent sends) and a journal of runs in flight in the state
//! directory, so runs cut off by a killed process are reported at the next start.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use clawcage_agent::events::{AgentEvent, EventLog, EventObserver};
use clawcage_agent::{
    AgentError, LaneInput, MessageBus, Sessions, SubagentManager, ToolRegistry, TranscriptStore,
    TurnOutcome,
};
use clawcage_core::InboundMessage;
use clawcage_core::scheduler::Scheduler;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot, watch};
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, Code, GatewayError};

/// How long an idempotency key is remembered, and a finished run kept for `agent.wait`.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(600);

/// Runs queued on one session at most (beyond: `RATE_LIMITED`).
pub const MAX_QUEUED_RUNS: usize = 32;

/// Events replayed by one `sessions.subscribe` at most; the client asks again for the rest.
pub const REPLAY_PAGE: usize = 1000;

/// What the gateway serves: the runtime's pieces for one agent.
pub struct GatewayParts {
    /// The sessions (one lane each).
    pub sessions: Sessions,
    /// The agent's tools (for `tools.list`).
    pub tools: ToolRegistry,
    /// The inbound bus: sub-agent results and cron firings arrive on its `system` channel.
    pub bus: MessageBus,
    /// The sub-agents, when enabled.
    pub subagents: Option<Arc<SubagentManager>>,
    /// The cron jobs, when this process owns them.
    pub cron: Option<Arc<dyn Scheduler>>,
    /// Why there is no cron, when there is none.
    pub cron_note: String,
    /// The transcripts the lanes write.
    pub transcripts: TranscriptStore,
    /// Each session's events.
    pub events: Arc<dyn EventLog>,
    /// Where the journal of runs in flight is kept (`<state-dir>/gateway/runs`).
    pub runs_dir: PathBuf,
    /// Messages a session keeps (the lanes' history limit).
    pub history_limit: usize,
    /// `provider/model`, or the chain.
    pub label: String,
    /// The workspace, for `status`.
    pub workspace: String,
    /// The state directory, for `status`.
    pub state_dir: PathBuf,
}

/// What a run is, as `agent.wait` and idempotent sends report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Queued or running.
    InFlight,
    /// Answered (or stopped by a guard with an explanation).
    Ok,
    /// Failed.
    Error,
    /// Stopped by `chat.abort` or a shutdown.
    Aborted,
    /// Cut off by a killed gateway (found at the next start).
    Interrupted,
}

impl RunStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::InFlight => "in_flight",
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Aborted => "aborted",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// A run's result: its status and the payload `agent` and `agent.wait` answer with.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The status.
    pub status: RunStatus,
    /// `{runId, status, sessionKey, text?, usage?, error?}`.
    pub payload: Value,
}

struct RunEntry {
    session: String,
    result: watch::Sender<Option<RunResult>>,
    finished: Option<Instant>,
}

#[derive(Default)]
struct Runs {
    entries: HashMap<String, RunEntry>,
    /// `(session, idempotency key)` → run id and when it was first sent.
    idempotency: HashMap<(String, String), (String, Instant)>,
}

impl Runs {
    fn prune(&mut self) {
        let now = Instant::now();
        self.entries.retain(|_, entry| {
            entry
                .finished
                .is_none_or(|at| now.duration_since(at) < IDEMPOTENCY_WINDOW)
        });
        self.idempotency
            .retain(|_, (_, at)| now.duration_since(*at) < IDEMPOTENCY_WINDOW);
    }
}

/// What [`Hub::send`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A new run was queued.
    Started(String),
    /// The idempotency key was seen within the window: that run, and its status.
    Duplicate(String, RunStatus),
}

/// A frame queue to one connection. Pushing never waits: a full queue means the client does not
/// read fast enough, and it is disconnected with a reason rather than slowing anyone else.
#[derive(Clone)]
pub struct Outbox {
    /// The connection's id.
    pub id: u64,
    sender: tokio::sync::mpsc::Sender<Utf8Bytes>,
    kill: CancellationToken,
    reason: Arc<Mutex<Option<(CloseCode, String)>>>,
}

impl Outbox {
    /// An outbox holding at most `capacity` frames, and its receiving end.
    pub fn new(id: u64, capacity: usize) -> (Self, tokio::sync::mpsc::Receiver<Utf8Bytes>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (
            Self {
                id,
                sender,
                kill: CancellationToken::new(),
                reason: Arc::new(Mutex::new(None)),
            },
            receiver,
        )
    }

    /// Queue `frame`; false when the connection is gone or was just cut off for being slow.
    pub fn push(&self, frame: Utf8Bytes) -> bool {
        match self.sender.try_send(frame) {
            Ok(()) => true,
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                self.close(
                    CloseCode::Again,
                    format!(
                        "slow consumer: {} frames were waiting to be sent; read faster or subscribe to fewer sessions",
                        self.sender.max_capacity()
                    ),
                );
                false
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Ask the connection to close with `code` and `reason` (the first reason wins).
    pub fn close(&self, code: CloseCode, reason: String) {
        let mut slot = lock(&self.reason);
        if slot.is_none() {
            *slot = Some((code, reason));
        }
        self.kill.cancel();
    }

    /// Resolves when [`Outbox::close`] was called.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.kill.cancelled()
    }

    /// Why it was closed.
    pub fn close_reason(&self) -> Option<(CloseCode, String)> {
        lock(&self.reason).clone()
    }
}

enum JobKind {
    Turn {
        input: LaneInput,
        /// `user` or `notification`.
        kind: &'static str,
        text: String,
        sender: Option<String>,
    },
    Reset(oneshot::Sender<Result<(), GatewayError>>),
    Delete(oneshot::Sender<Result<(), GatewayError>>),
}

struct Job {
    run_id: String,
    kind: JobKind,
    abort: Arc<Notify>,
}

struct CurrentRun {
    run_id: String,
    start_seq: u64,
    /// The transcript's size when the run started: larger means the run is in it.
    transcript_len: u64,
    abort: Arc<Notify>,
}

#[derive(Default)]
struct SessionState {
    subscribers: Vec<Outbox>,
    queue: VecDeque<Job>,
    current: Option<CurrentRun>,
    driving: bool,
}

/// One session as the gateway serves it.
pub struct SessionHub {
    key: String,
    state: Mutex<SessionState>,
}

impl SessionHub {
    fn lock(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }
}

/// Everything the gateway shares between connections.
pub struct Hub {
    /// The runtime's pieces.
    pub parts: GatewayParts,
    sessions: Mutex<HashMap<String, Arc<SessionHub>>>,
    runs: Mutex<Runs>,
    connections: Mutex<HashMap<u64, Outbox>>,
    next_id: AtomicU64,
    run_prefix: String,
    shutting_down: AtomicBool,
    /// When the gateway started.
    pub started: Instant,
    this: Weak<Hub>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The lowercase hex of `value` in base 36, for short run ids.
fn base36(mut value: u64) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

impl Hub {
    /// A hub over `parts`. Reports the runs a previous process left in flight.
    pub fn new(parts: GatewayParts) -> Arc<Hub> {
        let hub = Arc::new_cyclic(|this| Hub {
            parts,
            sessions: Mutex::new(HashMap::new()),
            runs: Mutex::new(Runs::default()),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            run_prefix: format!("run-{}", base36(clawcage_agent::transcript::now_ms())),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            this: this.clone(),
        });
        hub.recover_interrupted_runs();
        hub
    }

    /// A fresh id for a connection or a run.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    fn session(&self, key: &str) -> Arc<SessionHub> {
        lock(&self.sessions)
            .entry(key.to_string())
            .or_insert_with(|| {
                Arc::new(SessionHub {
                    key: key.to_string(),
                    state: Mutex::new(SessionState::default()),
                })
            })
            .clone()
    }

    /// Appends `event` to its session's log and sends it to the subscribers; the caller holds
    /// the session's lock. Returns the event with its `seq`.
    fn publish(&self, state: &mut SessionState, event: AgentEvent) -> Option<AgentEvent> {
        let stored = match self.parts.events.append(event) {
            Ok(stored) => stored,
            Err(error) => {
                tracing::error!(%error, "cannot append to the event log; the event is lost");
                return None;
            }
        };
        let frames = protocol::agent_frames(&stored);
        state
            .subscribers
            .retain(|out| frames.iter().all(|frame| out.push(frame.clone())));
        Some(stored)
    }

    /// Appends `event` to its session's log and sends it to the subscribers.
    pub fn publish_event(&self, event: AgentEvent) {
        let session = self.session(&event.session_key);
        let mut state = session.lock();
        self.publish(&mut state, event);
    }

    /// The run `key` is running now, if any.
    pub fn current_run(&self, key: &str) -> Option<String> {
        let session = lock(&self.sessions).get(key).cloned()?;
        let state = session.lock();
        state.current.as_ref().map(|run| run.run_id.clone())
    }

    /// Sends a frame that is not logged to the session's subscribers.
    fn broadcast_unlogged(&self, state: &mut SessionState, frame: Utf8Bytes) {
        state.subscribers.retain(|out| out.push(frame.clone()));
    }

    // ---- connections ------------------------------------------------------------------------

    /// Registers a connection (for `status` and the shutdown notice).
    pub fn connect(&self, outbox: Outbox) {
        lock(&self.connections).insert(outbox.id, outbox);
    }

    /// Forgets a connection and its subscriptions.
    pub fn disconnect(&self, id: u64, subscriptions: &HashSet<String>) {
        lock(&self.connections).remove(&id);
        for key in subscriptions {
            if let Some(session) = lock(&self.sessions).get(key).cloned() {
                session.lock().subscribers.retain(|out| out.id != id);
            }
        }
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        lock(&self.connections).len()
    }

    // ---- runs -------------------------------------------------------------------------------

    /// Queues a turn on `key` for `text` from a client, subscribing `subscriber` to the
    /// session first; `before_queue` hears the new run's id before the run can emit anything.
    /// With an idempotency key seen in the last ten minutes, returns that run instead.
    pub fn send(
        &self,
        key: &str,
        text: String,
        idempotency: Option<&str>,
        subscriber: Option<(&Outbox, &mut HashSet<String>)>,
        before_queue: impl FnOnce(&str),
    ) -> Result<Sent, GatewayError> {
        if self.shutting_down() {
            return Err(GatewayError::new(
                Code::Unavailable,
                "the gateway is shutting down; send again once it is back",
            ));
        }
        let run_id = {
            let mut runs = lock(&self.runs);
            if let Some(idempotency) = idempotency
                && let Some((run_id, at)) = runs
                    .idempotency
                    .get(&(key.to_string(), idempotency.to_string()))
                && at.elapsed() < IDEMPOTENCY_WINDOW
            {
                let status = runs.entries.get(run_id).map_or(RunStatus::Ok, |entry| {
                    entry
                        .result
                        .borrow()
                        .as_ref()
                        .map_or(RunStatus::InFlight, |result| result.status)
                });
                return Ok(Sent::Duplicate(run_id.clone(), status));
            }
            runs.prune();
            let run_id = format!("{}-{}", self.run_prefix, self.next_id());
            if let Some(idempotency) = idempotency {
                runs.idempotency.insert(
                    (key.to_string(), idempotency.to_string()),
                    (run_id.clone(), Instant::now()),
                );
            }
            runs.entries.insert(
                run_id.clone(),
                RunEntry {
                    session: key.to_string(),
                    result: watch::channel(None).0,
                    finished: None,
                },
            );
            run_id
        };
        let session = self.session(key);
        let mut state = session.lock();
        if state.queue.len() >= MAX_QUEUED_RUNS {
            drop(state);
            self.finish_run(
                &run_id,
                RunStatus::Error,
                json!({"error": "the session's queue is full"}),
            );
            return Err(GatewayError::new(
                Code::RateLimited,
                format!(
                    "session {key} already has {MAX_QUEUED_RUNS} runs queued; wait for them or abort"
                ),
            ));
        }
        if let Some((outbox, subscriptions)) = subscriber
            && !state.subscribers.iter().any(|out| out.id == outbox.id)
        {
            state.subscribers.push(outbox.clone());
            subscriptions.insert(key.to_string());
        }
        // The acknowledgement goes out before any event of the run can.
        before_queue(&run_id);
        state.queue.push_back(Job {
            run_id: run_id.clone(),
            kind: JobKind::Turn {
                input: LaneInput::User(text.clone()),
                kind: "user",
                text,
                sender: None,
            },
            abort: Arc::new(Notify::new()),
        });
        self.drive(&session, &mut state);
        Ok(Sent::Started(run_id))
    }

    /// The run `run_id`'s status (and its session), if known.
    pub fn run_status(&self, run_id: &str) -> Option<(String, RunStatus)> {
        let runs = lock(&self.runs);
        let entry = runs.entries.get(run_id)?;
        let status = entry
            .result
            .borrow()
            .as_ref()
            .map_or(RunStatus::InFlight, |result| result.status);
        Some((entry.session.clone(), status))
    }

    /// Waits for `run_id` to end, at most `timeout`; `None` if it is unknown.
    pub async fn wait_run(&self, run_id: &str, timeout: Duration) -> Option<Option<RunResult>> {
        let mut receiver = {
            let runs = lock(&self.runs);
            runs.entries.get(run_id)?.result.subscribe()
        };
        let waited = tokio::time::timeout(timeout, receiver.wait_for(Option::is_some)).await;
        Some(match waited {
            Ok(Ok(result)) => result.clone(),
            _ => None,
        })
    }

    fn finish_run(&self, run_id: &str, status: RunStatus, mut payload: Value) {
        let mut runs = lock(&self.runs);
        if let Some(entry) = runs.entries.get_mut(run_id) {
            payload["runId"] = json!(run_id);
            payload["status"] = json!(status.as_str());
            payload["sessionKey"] = json!(entry.session);
            entry.finished = Some(Instant::now());
            entry
                .result
                .send_replace(Some(RunResult { status, payload }));
        }
    }

    /// Stops a run of `key`: `run_id`, or the current one when `None`. A queued run is taken
    /// off the queue. Returns the ids stopped.
    pub fn abort(&self, key: &str, run_id: Option<&str>) -> Vec<String> {
        let session = self.session(key);
        let mut state = session.lock();
        let mut stopped = Vec::new();
        if let Some(current) = &state.current
            && run_id.is_none_or(|id| id == current.run_id)
        {
            current.abort.notify_one();
            stopped.push(current.run_id.clone());
        }
        if let Some(id) = run_id
            && let Some(position) = state.queue.iter().position(|job| job.run_id == id)
            && let Some(job) = state.queue.remove(position)
        {
            self.cancel_queued(key, &mut state, job, "aborted before it started");
            stopped.push(id.to_string());
        }
        stopped
    }

    fn cancel_queued(&self, key: &str, state: &mut SessionState, job: Job, why: &str) {
        match job.kind {
            JobKind::Turn { .. } => {
                self.publish(
                    state,
                    AgentEvent::run_failed(key, &job.run_id, &AgentError::Interrupted, true),
                );
                self.finish_run(&job.run_id, RunStatus::Aborted, json!({"error": why}));
            }
            JobKind::Reset(reply) | JobKind::Delete(reply) => {
                let _ = reply.send(Err(GatewayError::new(Code::Unavailable, why)));
            }
        }
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
        let (reply, answer) = oneshot::channel();
        {
            let session = self.session(key);
            let mut state = session.lock();
            if delete && (state.current.is_some() || !state.queue.is_empty()) {
                return Err(GatewayError::new(
                    Code::Conflict,
                    format!(
                        "session {key} has a run in flight; abort it (chat.abort) or wait, then delete"
                    ),
                ));
            }
            state.queue.push_back(Job {
                run_id: String::new(),
                kind: if delete {
                    JobKind::Delete(reply)
                } else {
                    JobKind::Reset(reply)
                },
                abort: Arc::new(Notify::new()),
            });
            self.drive(&session, &mut state);
        }
        answer.await.unwrap_or_else(|_| {
            Err(GatewayError::new(
                Code::Unavailable,
                "the session stopped before the reset",
            ))
        })
    }

    /// Queues a notification (a sub-agent's result, a cron firing) as a run of its session.
    pub fn notify(&self, message: InboundMessage) {
        if self.shutting_down() {
            tracing::warn!(sender = %message.sender, "a notification arrived during shutdown and is dropped");
            return;
        }
        let run_id = format!("{}-{}", self.run_prefix, self.next_id());
        lock(&self.runs).entries.insert(
            run_id.clone(),
            RunEntry {
                session: message.session_key.clone(),
                result: watch::channel(None).0,
                finished: None,
            },
        );
        let session = self.session(&message.session_key);
        let mut state = session.lock();
        state.queue.push_back(Job {
            run_id,
            kind: JobKind::Turn {
                text: message.content.clone(),
                sender: Some(message.sender.clone()),
                kind: "notification",
                input: LaneInput::Notification(message),
            },
            abort: Arc::new(Notify::new()),
        });
        self.drive(&session, &mut state);
    }

    fn drive(&self, session: &Arc<SessionHub>, state: &mut SessionState) {
        if state.driving {
            return;
        }
        let Some(hub) = self.this.upgrade() else {
            return;
        };
        state.driving = true;
        let session = session.clone();
        tokio::spawn(async move { hub.run_session(session).await });
    }

    async fn run_session(self: Arc<Self>, session: Arc<SessionHub>) {
        loop {
            let job = {
                let mut state = session.lock();
                match state.queue.pop_front() {
                    Some(job) => job,
                    None => {
                        state.driving = false;
                        return;
                    }
                }
            };
            match job.kind {
                JobKind::Turn {
                    input,
                    kind,
                    text,
                    sender,
                } => {
                    self.run_turn(
                        &session,
                        job.run_id,
                        job.abort,
                        input,
                        kind,
                        &text,
                        sender.as_deref(),
                    )
                    .await;
                }
                JobKind::Reset(reply) => {
                    let result = self.clear(&session, false).await;
                    let _ = reply.send(result);
                }
                JobKind::Delete(reply) => {
                    let result = self.clear(&session, true).await;
                    let _ = reply.send(result);
                }
            }
        }
    }

    async fn clear(&self, session: &SessionHub, delete: bool) -> Result<(), GatewayError> {
        let key = &session.key;
        self.parts
            .sessions
            .reset(key)
            .await
            .map_err(|error| GatewayError::internal("cannot reset the session", error))?;
        let mut state = session.lock();
        if !delete {
            self.publish(&mut state, AgentEvent::session_reset(key));
            return Ok(());
        }
        let frame = protocol::event("session.deleted", json!({"sessionKey": key}), None);
        self.broadcast_unlogged(&mut state, frame);
        state.subscribers.clear();
        let transcript = self.parts.transcripts.path(key);
        match std::fs::remove_file(&transcript) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(GatewayError::internal(
                    &format!("cannot delete the transcript {}", transcript.display()),
                    error,
                ));
            }
        }
        self.parts
            .events
            .remove(key)
            .map_err(|error| GatewayError::internal("cannot delete the session's events", error))
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one run's parts, passed once from the driver"
    )]
    async fn run_turn(
        &self,
        session: &SessionHub,
        run_id: String,
        abort: Arc<Notify>,
        input: LaneInput,
        kind: &str,
        text: &str,
        sender: Option<&str>,
    ) {
        let key = session.key.clone();
        {
            let mut state = session.lock();
            let transcript_len = self.parts.transcripts.file_len(&key).unwrap_or(0);
            let start = self.publish(
                &mut state,
                AgentEvent::run_started(&key, &run_id, kind, text, sender),
            );
            state.current = Some(CurrentRun {
                run_id: run_id.clone(),
                start_seq: start.map_or(1, |event| event.seq),
                transcript_len,
                abort: abort.clone(),
            });
        }
        self.journal_start(&key, &run_id);
        let (observer, mut events) = EventObserver::channel(&key, &run_id);
        let pending = self.parts.sessions.submit(&key, input, Arc::new(observer));
        let wait = pending.wait();
        tokio::pin!(wait);
        let mut aborting = false;
        let mut retry = tokio::time::interval(Duration::from_millis(50));
        let result = loop {
            tokio::select! {
                biased;
                Some(event) = events.recv() => {
                    let mut state = session.lock();
                    self.publish(&mut state, event);
                }
                result = &mut wait => break result,
                () = abort.notified(), if !aborting => {
                    aborting = true;
                    self.parts.sessions.interrupt(&key);
                }
                // The lane may not have started the turn when the abort came: ask again until
                // the turn ends.
                _ = retry.tick(), if aborting => self.parts.sessions.interrupt(&key),
            }
        };
        let mut state = session.lock();
        while let Ok(event) = events.try_recv() {
            self.publish(&mut state, event);
        }
        let (end, status, payload) = match &result {
            Ok(Some(outcome)) => (
                AgentEvent::run_ended(&key, &run_id, outcome),
                RunStatus::Ok,
                outcome_payload(outcome),
            ),
            Ok(None) => (
                AgentEvent::run_failed(
                    &key,
                    &run_id,
                    &AgentError::History("the lane returned no outcome".into()),
                    false,
                ),
                RunStatus::Error,
                json!({"error": "the lane returned no outcome"}),
            ),
            Err(error) => {
                let aborted = aborting || matches!(error, AgentError::Interrupted);
                (
                    AgentEvent::run_failed(&key, &run_id, error, aborted),
                    if aborted {
                        RunStatus::Aborted
                    } else {
                        RunStatus::Error
                    },
                    json!({"error": error.to_string()}),
                )
            }
        };
        self.publish(&mut state, end);
        state.current = None;
        drop(state);
        self.finish_run(&run_id, status, payload);
        self.journal_end(&run_id);
    }

    // ---- reading ----------------------------------------------------------------------------

    /// Subscribes `outbox` to `key`: with `since`, first replays the events after it (a `gap`
    /// event first when some are no longer kept), then follows live. The response is queued
    /// before the replay, all under the session's lock, so nothing is lost or repeated.
    pub fn subscribe(
        &self,
        key: &str,
        since: Option<u64>,
        outbox: &Outbox,
        subscriptions: &mut HashSet<String>,
        id: &Value,
    ) -> Result<(), GatewayError> {
        let session = self.session(key);
        let mut state = session.lock();
        state.subscribers.retain(|out| out.id != outbox.id);
        subscriptions.remove(key);
        let log = &self.parts.events;
        let cannot = |error| GatewayError::internal("cannot read the session's events", error);
        let Some(since) = since else {
            let last = log.last_seq(key).map_err(cannot)?;
            outbox.push(protocol::ok(
                id,
                json!({"sessionKey": key, "lastSeq": last, "replayed": 0, "more": false}),
            ));
            state.subscribers.push(outbox.clone());
            subscriptions.insert(key.to_string());
            return Ok(());
        };
        let replay = log.read(key, since, REPLAY_PAGE).map_err(cannot)?;
        if since > replay.last_seq {
            return Err(GatewayError::new(
                Code::InvalidParams,
                format!(
                    "since {since} is after the session's last event {} (its events were deleted or reset): fetch chat.history again and subscribe from its cursor",
                    replay.last_seq
                ),
            ));
        }
        let next = replay.events.last().map_or(
            since.max(replay.first_retained.saturating_sub(1)),
            |event| event.seq,
        );
        let more = next < replay.last_seq;
        outbox.push(protocol::ok(
            id,
            json!({
                "sessionKey": key,
                "since": since,
                "lastSeq": replay.last_seq,
                "firstRetained": replay.first_retained,
                "replayed": replay.events.len(),
                "more": more,
                "nextSince": next,
            }),
        ));
        if since + 1 < replay.first_retained {
            outbox.push(protocol::event(
                "gap",
                json!({
                    "sessionKey": key,
                    "from": since + 1,
                    "to": replay.first_retained - 1,
                    "reason": "these events are older than the retained window",
                }),
                None,
            ));
        }
        for event in &replay.events {
            for frame in protocol::agent_frames(event) {
                if !outbox.push(frame) {
                    return Ok(());
                }
            }
        }
        if !more {
            state.subscribers.push(outbox.clone());
            subscriptions.insert(key.to_string());
        }
        Ok(())
    }

    /// Stops sending `key`'s events to `outbox`.
    pub fn unsubscribe(&self, key: &str, outbox: &Outbox) {
        if let Some(session) = lock(&self.sessions).get(key).cloned() {
            session.lock().subscribers.retain(|out| out.id != outbox.id);
        }
    }

    /// The history of `key` (at most `limit` messages since its last reset), with the cursor to
    /// subscribe from: the transcript is read as it was at one instant, and the cursor is the
    /// last event it already contains. `skipRuns` lists runs whose messages are in it though
    /// their end event is still to come.
    pub async fn history(&self, key: &str, limit: usize) -> Result<Value, GatewayError> {
        let session = self.session(key);
        let (cursor, skip, running, bytes) = {
            let state = session.lock();
            let last = self.parts.events.last_seq(key).map_err(|error| {
                GatewayError::internal("cannot read the session's events", error)
            })?;
            let bytes = self
                .parts
                .transcripts
                .file_len(key)
                .map_err(|error| GatewayError::internal("cannot read the transcript", error))?;
            match &state.current {
                Some(run) if bytes > run.transcript_len => (
                    last,
                    vec![run.run_id.clone()],
                    Some(run.run_id.clone()),
                    bytes,
                ),
                Some(run) => (
                    run.start_seq.saturating_sub(1),
                    Vec::new(),
                    Some(run.run_id.clone()),
                    bytes,
                ),
                None => (last, Vec::new(), None, bytes),
            }
        };
        let store = self.parts.transcripts.clone();
        let events = self.parts.events.clone();
        let owned_key = key.to_string();
        let (loaded, verdicts) = tokio::task::spawn_blocking(move || {
            let loaded = store.load_prefix(&owned_key, limit, bytes);
            (loaded, tool_verdicts(events.as_ref(), &owned_key))
        })
        .await
        .map_err(|error| GatewayError::internal("reading the history failed", error))?;
        let loaded =
            loaded.map_err(|error| GatewayError::internal("cannot read the transcript", error))?;
        let mut messages = serde_json::to_value(&loaded.messages).unwrap_or_else(|_| json!([]));
        annotate_verdicts(&mut messages, &verdicts);
        Ok(json!({
            "sessionKey": key,
            "messages": messages,
            "cursor": cursor,
            "skipRuns": skip,
            "running": running,
        }))
    }

    /// Every session: with a transcript or served since the start, newest first.
    pub fn list_sessions(&self, limit: usize) -> Result<Value, GatewayError> {
        let files = self
            .parts
            .transcripts
            .sessions()
            .map_err(|error| GatewayError::internal("cannot list the transcripts", error))?;
        let mut listed: Vec<(String, u64)> = files
            .into_iter()
            .map(|file| (file.key, file.modified_ms))
            .collect();
        let live: Vec<(String, Arc<SessionHub>)> = lock(&self.sessions)
            .iter()
            .map(|(key, session)| (key.clone(), session.clone()))
            .collect();
        for (key, _) in &live {
            if !listed.iter().any(|(known, _)| known == key) {
                listed.push((key.clone(), clawcage_agent::transcript::now_ms()));
            }
        }
        listed.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let sessions: Vec<Value> = listed
            .into_iter()
            .take(limit)
            .map(|(key, updated)| {
                let (running, queued) = live
                    .iter()
                    .find(|(known, _)| *known == key)
                    .map(|(_, session)| {
                        let state = session.lock();
                        (
                            state.current.as_ref().map(|run| run.run_id.clone()),
                            state.queue.len(),
                        )
                    })
                    .unwrap_or_default();
                json!({
                    "key": key,
                    "updatedAt": updated,
                    "running": running,
                    "queued": queued,
                    "writable": crate::keys::is_gateway_key(&key),
                })
            })
            .collect();
        Ok(json!({"sessions": sessions}))
    }

    /// Runs in flight and queued, across sessions.
    pub fn load(&self) -> (usize, usize) {
        let sessions: Vec<Arc<SessionHub>> = lock(&self.sessions).values().cloned().collect();
        sessions.iter().fold((0, 0), |(running, queued), session| {
            let state = session.lock();
            (
                running + usize::from(state.current.is_some()),
                queued + state.queue.len(),
            )
        })
    }

    /// Sessions served since the start.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    // ---- shutdown and recovery -------------------------------------------------------------

    /// Stops taking work, aborts queued and running runs (their messages are kept, dangling
    /// tool calls answered), waits up to `grace` for them to end, makes the events durable,
    /// and tells every connection.
    pub async fn shut_down(&self, grace: Duration) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let sessions: Vec<Arc<SessionHub>> = lock(&self.sessions).values().cloned().collect();
        for session in &sessions {
            let mut state = session.lock();
            while let Some(job) = state.queue.pop_front() {
                self.cancel_queued(
                    &session.key,
                    &mut state,
                    job,
                    "the gateway is shutting down",
                );
            }
            if let Some(current) = &state.current {
                current.abort.notify_one();
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && sessions.iter().any(|session| session.lock().driving) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Err(error) = self.parts.events.sync() {
            tracing::error!(%error, "cannot sync the event log");
        }
        let connections: Vec<Outbox> = lock(&self.connections).values().cloned().collect();
        let notice = protocol::event(
            "shutdown",
            json!({"reason": "the gateway is shutting down", "restartExpected": false}),
            None,
        );
        for outbox in connections {
            outbox.push(notice.clone());
            outbox.close(
                CloseCode::Restart,
                "the gateway is shutting down".to_string(),
            );
        }
    }

    fn journal_path(&self, run_id: &str) -> PathBuf {
        self.parts.runs_dir.join(format!("{run_id}.json"))
    }

    fn journal_start(&self, key: &str, run_id: &str) {
        let record = json!({
            "runId": run_id,
            "sessionKey": key,
            "pid": std::process::id(),
            "startedMs": clawcage_agent::transcript::now_ms(),
        });
        let written = std::fs::create_dir_all(&self.parts.runs_dir)
            .and_then(|()| std::fs::write(self.journal_path(run_id), record.to_string()));
        if let Err(error) = written {
            tracing::warn!(%error, dir = %self.parts.runs_dir.display(), "cannot record a run in flight");
        }
    }

    fn journal_end(&self, run_id: &str) {
        let _ = std::fs::remove_file(self.journal_path(run_id));
    }

    /// Runs left in the journal were cut off by a killed gateway: report each in its session's
    /// events and to `agent.wait`.
    fn recover_interrupted_runs(&self) {
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
            let session = self.session(key);
            {
                let mut state = session.lock();
                self.publish(&mut state, AgentEvent::run_interrupted(key, run_id, why));
            }
            lock(&self.runs).entries.insert(
                run_id.to_string(),
                RunEntry {
                    session: key.to_string(),
                    result: watch::channel(None).0,
                    finished: None,
                },
            );
            self.finish_run(run_id, RunStatus::Interrupted, json!({"error": why}));
            tracing::warn!(
                run = run_id,
                session = key,
                "reported a run cut off by the last stop"
            );
        }
        if let Err(error) = self.parts.events.sync() {
            tracing::error!(%error, "cannot sync the event log");
        }
    }
}

fn outcome_payload(outcome: &TurnOutcome) -> Value {
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

/// The verdict of every tool call still in the retained events, by tool call id.
fn tool_verdicts(events: &dyn EventLog, key: &str) -> HashMap<String, (String, String)> {
    let mut verdicts = HashMap::new();
    let Ok(replay) = events.read(key, 0, usize::MAX) else {
        return verdicts;
    };
    for event in replay.events {
        if event.stream != clawcage_agent::events::Stream::Tool || event.phase() != Some("end") {
            continue;
        }
        let field = |name: &str| {
            event
                .data
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        verdicts.insert(field("toolCallId"), (field("verdict"), field("label")));
    }
    verdicts
}

/// Adds `verdict` and `label` to each `tool_result` block whose call is in `verdicts`.
fn annotate_verdicts(messages: &mut Value, verdicts: &HashMap<String, (String, String)>) {
    let Some(messages) = messages.as_array_mut() else {
        return;
    };
    for message in messages {
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        for block in blocks {
            if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            let id = block
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some((verdict, label)) = verdicts.get(id) {
                block["verdict"] = json!(verdict);
                block["label"] = json!(label);
            }
        }
    }
}
