//! The sessions as the gateway serves them. Each session key has a [`SessionHub`]: the
//! connections subscribed to it and the submissions it has handed to the runtime's lane, each
//! with its run id. A message is submitted to the lane at once, so the lane's queue mode decides
//! what a message to a busy session does (steered into the running turn, queued, interrupting,
//! or refused) and `chat.send` answers with that; the lane's queue changes arrive through its
//! queue listener and become `lifecycle` events (`start` when a run's turn begins, `queue` for
//! the rest). Every observation of a run becomes an [`AgentEvent`], numbered under the session's
//! lock (the next `seq`, so the order of events is the order of what happened) and handed to
//! the session's writer task, which appends it to the [`EventLog`] under this process's
//! [`Epoch`]. Subscribers never get events from the hub: each follows the log
//! ([`EventLog::follow`]) from its `since`, so it sees each stored event exactly once, in order,
//! whichever process stored it. The runs (for `agent.wait` and idempotent sends) are kept behind
//! a [`RunRegistry`]; both stores are asynchronous traits a shared backend implements. At its start the hub takes up what a stopped
//! gateway left in the sessions' inboxes ([`clawcage_agent::inbox`]): finished inputs keep their
//! idempotency keys and statuses, pending ones become runs again under their own ids, and a
//! session's open turn is resumed with a `lifecycle {phase: "resumed"}` event. Cron firings
//! arrive through [`Hub::firing_sink`], each under its key, exactly once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use clawcage_agent::agent_loop::{TurnObserver, Verdict};
use clawcage_agent::events::{AgentEvent, Epoch, EventLog, EventObserver, Stream};
use clawcage_agent::session::{Admission, DropReason, InputMeta, QueueEvent};
use clawcage_agent::transcript::Position;
use clawcage_agent::{
    AgentError, Compaction, LaneInput, MessageBus, ProviderEvents, Sessions, SubagentManager,
    ToolRegistry, TranscriptStore, TurnOutcome,
};
use clawcage_core::scheduler::Scheduler;
use clawcage_core::{InboundMessage, ToolCall};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, Code, GatewayError};

mod reading;
mod recovery;
pub use clawcage_agent::runs::{IDEMPOTENCY_WINDOW, RunResult, RunStatus};
use clawcage_agent::runs::{Registered, RunRegistry};

mod subscribers;
use subscribers::{Publish, Subscriber};

/// Submissions waiting on one session at most (beyond: `RATE_LIMITED`); the lane's own cap
/// (`[queue] cap`) applies first.
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
    pub transcripts: Arc<dyn TranscriptStore>,
    /// Each session's events.
    pub events: Arc<dyn EventLog>,
    /// This process's epoch as the sessions' writer: greater than any earlier gateway's on the
    /// same state (see [`Epoch`]).
    pub epoch: Epoch,
    /// The runs, their results and the idempotency keys of their sends.
    pub runs: Arc<dyn RunRegistry>,
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

/// What [`Hub::send`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A new run was admitted (started, queued, steered or interrupting).
    Started(String),
    /// The session's queue refused the message (the acknowledgement said why).
    Refused,
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

type LaneReply = Result<Option<TurnOutcome>, AgentError>;
type ReplyFuture = Pin<Box<dyn Future<Output = LaneReply> + Send>>;

enum TicketKind {
    Run {
        run_id: String,
        /// `user` or `notification`.
        kind: &'static str,
        text: String,
        sender: Option<String>,
    },
    Reset(Option<oneshot::Sender<LaneReply>>),
}

/// A submission handed to the lane and not yet settled.
struct Ticket {
    kind: TicketKind,
    /// The lane's answer.
    reply: ReplyFuture,
    /// The task waiting for the answer.
    waker: Option<Waker>,
    /// The run it joined (steered into, or collected with), if any.
    joined: Option<String>,
    /// Stop it as soon as its turn starts (an abort or a shutdown while it waited).
    abort_on_start: bool,
    /// Its `queue dropped` event went out.
    dropped_said: bool,
}

impl Ticket {
    fn run_id(&self) -> Option<&str> {
        match &self.kind {
            TicketKind::Run { run_id, .. } => Some(run_id),
            TicketKind::Reset(_) => None,
        }
    }
}

struct CurrentRun {
    run_id: String,
    ticket: u64,
    start_seq: u64,
    /// Where the transcript's committed part ended when the run started: further means the
    /// run is committed.
    committed_at: Position,
    aborting: bool,
}

struct SessionState {
    /// The connections following the session's events.
    subscribers: Vec<Subscriber>,
    /// The `seq` the next event gets.
    next_seq: u64,
    /// The session's writer task: events to append, in order.
    writer: mpsc::UnboundedSender<Publish>,
    /// By lane ticket, in admission order.
    tickets: BTreeMap<u64, Ticket>,
    current: Option<CurrentRun>,
}

impl SessionState {
    /// Runs waiting for their turn (not the current one, not joined to another).
    fn queued(&self) -> usize {
        let current = self.current.as_ref().map(|run| run.ticket);
        self.tickets
            .iter()
            .filter(|(ticket, entry)| {
                Some(**ticket) != current && entry.joined.is_none() && entry.run_id().is_some()
            })
            .count()
    }
}

/// One session as the gateway serves it.
pub struct SessionHub {
    key: String,
    state: Mutex<SessionState>,
    /// Held while a submission is handed to the lane and registered, and while the lane's
    /// report of a taken submission is handled: a run is known before its turn can start.
    /// Taken before `state`, never after.
    admit: Mutex<()>,
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
    runs: Arc<dyn RunRegistry>,
    connections: Mutex<HashMap<u64, Outbox>>,
    next_id: AtomicU64,
    run_prefix: String,
    shutting_down: AtomicBool,
    /// When the gateway started.
    pub started: Instant,
    /// Each session's title: set by `sessions.rename`, else its first message's first line.
    titles: Mutex<BTreeMap<String, String>>,
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
    /// A hub over `parts`. Reports the runs a previous process left in flight and takes up
    /// what it left in the sessions' inboxes.
    pub async fn start(parts: GatewayParts) -> Arc<Hub> {
        let runs = parts.runs.clone();
        let hub = Arc::new_cyclic(|this| Hub {
            parts,
            sessions: Mutex::new(HashMap::new()),
            runs,
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            run_prefix: format!("run-{}", base36(clawcage_agent::transcript::now_ms())),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            titles: Mutex::new(BTreeMap::new()),
            this: this.clone(),
        });
        *lock(&hub.titles) = hub.read_titles();
        hub.recover_interrupted_runs().await;
        let weak = Arc::downgrade(&hub);
        hub.parts.sessions.set_queue_listener(Some(Arc::new(
            move |key: &str, event: &QueueEvent| {
                if let Some(hub) = weak.upgrade() {
                    hub.queue_changed(key, event);
                }
            },
        )));
        hub.take_up_inboxes().await;
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

    /// `key`'s session, opened (its numbering taken up from its log, its writer started) on
    /// first use.
    async fn open_session(&self, key: &str) -> Result<Arc<SessionHub>, GatewayError> {
        if let Some(session) = self.session(key) {
            return Ok(session);
        }
        let last =
            self.parts.events.last_seq(key).await.map_err(|error| {
                GatewayError::internal("cannot read the session's events", error)
            })?;
        let mut sessions = lock(&self.sessions);
        if let Some(session) = sessions.get(key) {
            return Ok(session.clone());
        }
        let (writer, queue) = mpsc::unbounded_channel();
        tokio::spawn(subscribers::write_events(
            self.parts.events.clone(),
            self.parts.epoch,
            key.to_string(),
            queue,
        ));
        let session = Arc::new(SessionHub {
            key: key.to_string(),
            state: Mutex::new(SessionState {
                subscribers: Vec::new(),
                next_seq: last + 1,
                writer,
                tickets: BTreeMap::new(),
                current: None,
            }),
            admit: Mutex::new(()),
        });
        sessions.insert(key.to_string(), session.clone());
        Ok(session)
    }

    /// `key`'s session, if it was opened.
    fn session(&self, key: &str) -> Option<Arc<SessionHub>> {
        lock(&self.sessions).get(key).cloned()
    }

    /// Numbers `event` as the session's next and hands it to the session's writer; the caller
    /// holds the session's lock, so events are numbered in the order they happen. Returns the
    /// event with its `seq`.
    fn publish(&self, state: &mut SessionState, mut event: AgentEvent) -> AgentEvent {
        event.seq = state.next_seq;
        state.next_seq += 1;
        if state.writer.send(Publish::Event(event.clone())).is_err() {
            tracing::error!(session = %event.session_key, "the session's event writer has stopped; the event is lost");
        }
        event
    }

    /// Numbers `event` and hands it to its session's writer (a session not opened yet is
    /// opened first).
    pub async fn publish_event(&self, event: AgentEvent) {
        match self.open_session(&event.session_key).await {
            Ok(session) => {
                let mut state = session.lock();
                self.publish(&mut state, event);
            }
            Err(error) => tracing::error!(?error, "cannot open a session; its event is lost"),
        }
    }

    /// Numbers `event` and hands it to its session's writer, when the session is open (a run's
    /// session always is).
    pub fn publish_to_open(&self, event: AgentEvent) {
        match self.session(&event.session_key) {
            Some(session) => {
                let mut state = session.lock();
                self.publish(&mut state, event);
            }
            None => {
                tracing::warn!(session = %event.session_key, "an event for a session not open here is dropped")
            }
        }
    }

    /// The run `key` is running now, if any.
    pub fn current_run(&self, key: &str) -> Option<String> {
        let session = self.session(key)?;
        let state = session.lock();
        state.current.as_ref().map(|run| run.run_id.clone())
    }

    /// Sends a frame that is not logged to the session's subscribers.
    fn broadcast_unlogged(&self, state: &mut SessionState, frame: Utf8Bytes) {
        state
            .subscribers
            .retain(|subscriber| subscriber.outbox.push(frame.clone()));
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
            if let Some(session) = self.session(key) {
                subscribers::drop_subscriber(&mut session.lock(), id);
            }
        }
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        lock(&self.connections).len()
    }

    // ---- runs -------------------------------------------------------------------------------

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
        // A secret value a person pasted is scrubbed like the model's output: the queue events,
        // the event log, the lane, the transcript and the model all get the scrubbed text.
        let text = self.parts.sessions.agent().redactor().redact(&text);
        self.title_from_first_message(key, &text);
        let run_id = format!("{}-{}", self.run_prefix, self.next_id());
        let registered = self
            .runs
            .register(key, &run_id, idempotency)
            .await
            .map_err(|error| GatewayError::internal("cannot record the run", error))?;
        if let Registered::Duplicate { run_id, status } = registered {
            return Ok(Sent::Duplicate(run_id, status));
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
        let mut state = session.lock();
        let into = state.current.as_ref().map(|run| run.run_id.clone());
        // The acknowledgement goes out before any event of the run can.
        acknowledge(&run_id, &admission, into.as_deref());
        if let Admission::Dropped { reason } = &admission {
            drop(state);
            forget(RunStatus::Dropped, &reason.to_string());
            return Ok(Sent::Refused);
        }
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

    /// Waits in a task of its own for the lane's answer to `ticket`, then settles it (unless the
    /// start of the next job settled it first).
    fn follow(&self, session: &Arc<SessionHub>, ticket: u64) {
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
    fn settle(&self, key: &str, state: &mut SessionState, ticket: u64, reply: LaneReply) {
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
    fn settle_current(&self, key: &str, state: &mut SessionState) {
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
    fn queue_changed(&self, key: &str, event: &QueueEvent) {
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
    fn join(
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
    fn start_run(&self, key: &str, state: &mut SessionState, tickets: &[u64]) -> bool {
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
            start_seq: start.seq,
            committed_at,
            aborting: abort,
        });
        self.join(key, state, rest, Some(&run_id), "collected");
        abort
    }

    /// The lane resumed the open turn answering `tickets`: the first one's run is current
    /// again (the others had joined it), and its clients hear `lifecycle {phase: "resumed"}`
    /// (they drop the partial text they had of it).
    fn resume(&self, key: &str, state: &mut SessionState, tickets: &[u64], attempt: u32) {
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
            start_seq: start.seq,
            committed_at,
            aborting: false,
        });
        for ticket in rest {
            if let Some(entry) = state.tickets.get_mut(ticket) {
                entry.joined = Some(run_id.clone());
            }
        }
    }

    /// The run `run_id`'s status (and its session), if known.
    pub async fn run_status(&self, run_id: &str) -> Option<(String, RunStatus)> {
        match self.runs.status(run_id).await {
            Ok(status) => status,
            Err(error) => {
                tracing::error!(run = run_id, %error, "cannot read a run's status");
                None
            }
        }
    }

    /// Waits for `run_id` to end, at most `timeout`; `None` if it is unknown.
    pub async fn wait_run(&self, run_id: &str, timeout: Duration) -> Option<Option<RunResult>> {
        match self.runs.wait(run_id, timeout).await {
            Ok(waited) => waited,
            Err(error) => {
                tracing::error!(run = run_id, %error, "cannot wait for a run");
                Some(None)
            }
        }
    }

    /// Records `run_id`'s end (in a task of its own: the callers hold the session's lock; the
    /// in-memory registry records it before this returns).
    fn finish_run(&self, run_id: &str, status: RunStatus, payload: Value) {
        let finishing = self.runs.finish(run_id, status, payload);
        let run = run_id.to_string();
        tokio::spawn(async move {
            if let Err(error) = finishing.await {
                tracing::error!(%run, %error, "cannot record a run's end");
            }
        });
    }

    /// Forgets `key`'s idempotency key `idempotency` (its send was refused), in a task of its
    /// own like [`Hub::finish_run`].
    fn forget_key(&self, key: &str, idempotency: &str) {
        let forgetting = self.runs.forget_key(key, idempotency);
        tokio::spawn(async move {
            if let Err(error) = forgetting.await {
                tracing::error!(%error, "cannot forget a refused send's idempotency key");
            }
        });
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

    // ---- reading ----------------------------------------------------------------------------

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
            subscribers::drop_subscriber(&mut state, outbox.id);
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
            subscribers::forward_page(follow.events, outbox.clone(), replayed);
            return Ok(());
        }
        self.add_subscriber(&session, Subscriber::forward(follow.events, outbox.clone()));
        lock(subscriptions).insert(key.to_string());
        Ok(())
    }

    /// Stops sending `key`'s events to `outbox`.
    pub fn unsubscribe(&self, key: &str, outbox: &Outbox) {
        if let Some(session) = self.session(key) {
            subscribers::drop_subscriber(&mut session.lock(), outbox.id);
        }
    }

    /// Runs in flight and queued, across sessions.
    pub fn load(&self) -> (usize, usize) {
        let sessions: Vec<Arc<SessionHub>> = lock(&self.sessions).values().cloned().collect();
        sessions.iter().fold((0, 0), |(running, queued), session| {
            let state = session.lock();
            (
                running + usize::from(state.current.is_some()),
                queued + state.queued(),
            )
        })
    }

    /// Sessions served since the start.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    // ---- shutdown and recovery -------------------------------------------------------------

    /// Stops taking work and stops the lanes where they stand: with the sessions' inboxes, the
    /// running and queued runs stay recorded and the next start takes them up under the same
    /// ids (without an inbox they are aborted, their messages kept, and waited for up to
    /// `grace`); then makes the events durable and tells every connection.
    pub async fn shut_down(&self, grace: Duration) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let sessions: Vec<Arc<SessionHub>> = lock(&self.sessions).values().cloned().collect();
        if self.parts.sessions.inbox().is_some() {
            // Durable: the lanes stop where they stand, their runs stay in the inboxes and the
            // next start resumes them under the same ids (a deploy loses nothing).
            for session in &sessions {
                let mut state = session.lock();
                self.settle_current(&session.key, &mut state);
            }
            self.parts.sessions.halt();
            for session in &sessions {
                let mut state = session.lock();
                state.tickets.clear();
                state.current = None;
            }
        } else {
            for session in &sessions {
                let mut state = session.lock();
                self.settle_current(&session.key, &mut state);
                for entry in state.tickets.values_mut() {
                    entry.abort_on_start = true;
                }
                let running = match state.current.as_mut() {
                    Some(current) => {
                        current.aborting = true;
                        true
                    }
                    None => false,
                };
                drop(state);
                if running {
                    self.parts.sessions.interrupt(&session.key);
                }
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && sessions.iter().any(|session| {
                let state = session.lock();
                state.current.is_some() || !state.tickets.is_empty()
            })
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for session in &sessions {
            subscribers::written(session).await;
        }
        if let Err(error) = self.parts.events.sync().await {
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
}

/// What an admission is on the wire: `{status, position?}`.
pub fn admission_json(admission: &Admission) -> Value {
    match admission {
        Admission::Started => json!({"status": "started"}),
        Admission::Queued { position } => json!({"status": "queued", "position": position}),
        Admission::Steered => json!({"status": "steered"}),
        Admission::Interrupting { position } => {
            json!({"status": "interrupting", "position": position})
        }
        Admission::Dropped { reason } => {
            json!({"status": "dropped", "reason": reason.to_string()})
        }
    }
}

/// The observer of one run: each observation becomes an event of the run, published at once
/// (on the lane's task, in the order the turn makes them).
struct HubObserver {
    hub: Weak<Hub>,
    session: Arc<SessionHub>,
    events: EventObserver,
    received: Mutex<mpsc::UnboundedReceiver<AgentEvent>>,
}

impl HubObserver {
    fn new(hub: Weak<Hub>, session: Arc<SessionHub>, key: &str, run_id: &str) -> Self {
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
