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
//! a [`RunRegistry`]; both stores are asynchronous traits a shared backend implements. At its
//! start the hub takes up what a stopped gateway left in the sessions' inboxes
//! ([`clawcage_agent::inbox`]): finished inputs keep their idempotency keys and statuses, pending
//! ones become runs again under their own ids, and a session's open turn is resumed with a
//! `lifecycle {phase: "resumed"}` event. Cron firings arrive through [`Hub::firing_sink`], each
//! under its key, exactly once. This module holds the session state, its numbering and the
//! shutdown; `inputs` is what goes into a lane, `lane_reports` what a lane says back,
//! `subscribers` where the events go, `reading` the history and session list, `recovery` a
//! start after a stop, `outbox` one connection's frames.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use clawcage_agent::events::{AgentEvent, Epoch, EventLog};
use clawcage_agent::session::{Admission, LaneReply, QueueEvent};
use clawcage_agent::transcript::Position;
use clawcage_agent::{MessageBus, Sessions, SubagentManager, ToolRegistry, TranscriptStore};
use clawcage_core::scheduler::Scheduler;
use clawcage_core::sync::lock;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::protocol::{self, GatewayError};

mod reading;
mod recovery;
pub use clawcage_agent::runs::{IDEMPOTENCY_WINDOW, RunResult, RunStatus};
use clawcage_agent::runs::{Registered, RunRegistry};

mod inputs;
mod lane_reports;
mod outbox;
mod partitions;
mod subscribers;
use lane_reports::{HubObserver, outcome_payload};
pub use outbox::Outbox;
pub use partitions::{Partitions, TakeUp};
pub(crate) use partitions::{SERVED_ELSEWHERE, TAKING_UP};
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
    /// The records every host of a cluster shares (the pairings, the Telegram journal);
    /// `None`: the state directory's files.
    pub shared_records: Option<clawcage_cluster::KvRecords>,
    /// The partitions of the sessions this host serves, when it serves its share of them
    /// rather than all (`None`: every session, under `epoch`).
    pub partitions: Option<Partitions>,
    /// The fences the stores' writes of each session pass, in a cluster (`None`: the process
    /// writes its state directory alone, unfenced).
    pub write_fences: Option<clawcage_cluster::SessionFences>,
}

impl GatewayParts {
    /// The channel pairings: the cluster's shared record, or the state directory's file.
    pub fn pairing(&self) -> crate::channels::pairing::PairingStore {
        match &self.shared_records {
            Some(records) => crate::channels::pairing::PairingStore::in_store(Arc::new(
                records.record(clawcage_cluster::records::PAIRING_RECORD),
            )),
            None => crate::channels::pairing::PairingStore::new(&self.state_dir),
        }
    }

    /// The Telegram journal's store: the cluster's shared record, or the state directory's
    /// `channels/telegram.json`.
    pub fn telegram_journal(&self) -> Arc<dyn clawcage_core::records::RecordStore> {
        match &self.shared_records {
            Some(records) => Arc::new(records.record(clawcage_cluster::records::TELEGRAM_RECORD)),
            None => Arc::new(clawcage_core::records::FileRecord::new(
                self.state_dir.join("channels").join("telegram.json"),
                16 << 20,
                true,
            )),
        }
    }
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
    writer: subscribers::WriterHandle,
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
    /// The partitions taken up and served, when [`GatewayParts::partitions`] is set.
    served_partitions: Mutex<HashSet<u32>>,
    /// When the gateway started.
    pub started: Instant,
    /// Each session's title: set by `sessions.rename`, else its first message's first line.
    titles: Mutex<BTreeMap<String, String>>,
    this: Weak<Hub>,
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
            served_partitions: Mutex::new(HashSet::new()),
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

    /// Whether this host may still write `key`: not in a cluster, or the lease its writes pass
    /// (the gateway's, or the session's partition's) is held and was renewed in time. Once not,
    /// it never is again under the same epoch: a write refused meanwhile stays refused.
    pub(super) fn may_write(&self, key: &str) -> bool {
        self.parts
            .write_fences
            .as_ref()
            .is_none_or(|fences| fences.of(key).is_open())
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
        let writer = subscribers::WriterHandle::start(
            self.parts.events.clone(),
            self.writer_epoch(key),
            key.to_string(),
        );
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

    /// `session`'s events written from now on under this host's epoch for it, numbered on from
    /// the last its log holds (a session this host has just begun to serve).
    async fn renew_writer(&self, session: &SessionHub) -> Result<(), GatewayError> {
        let last = self
            .parts
            .events
            .last_seq(&session.key)
            .await
            .map_err(|error| GatewayError::internal("cannot read the session's events", error))?;
        let writer = subscribers::WriterHandle::start(
            self.parts.events.clone(),
            self.writer_epoch(&session.key),
            session.key.clone(),
        );
        let mut state = session.lock();
        state.writer = writer;
        state.next_seq = last + 1;
        Ok(())
    }

    /// `key`'s session, if it was opened.
    fn session(&self, key: &str) -> Option<Arc<SessionHub>> {
        lock(&self.sessions).get(key).cloned()
    }

    /// Numbers `event` as the session's next and hands it to the session's writer; the caller
    /// holds the session's lock, so events are numbered in the order they happen. Returns the
    /// `seq` it got. A text delta that follows a delta of its run still waiting to be stored is
    /// joined to it and gets its `seq` (see [`subscribers::WriterQueue`]).
    fn publish(&self, state: &mut SessionState, mut event: AgentEvent) -> u64 {
        if let Some(seq) = state.writer.join_delta(&event) {
            return seq;
        }
        let seq = state.next_seq;
        event.seq = seq;
        state.next_seq += 1;
        state.writer.push(Publish::Event(event));
        seq
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
