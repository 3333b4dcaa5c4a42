//! Sessions and their lanes. Every session key owns a lane: a queue drained by one task that
//! holds the session's history. Whatever enters a session — the user's input, a notification
//! from the bus, a cron firing, a reset — is submitted to its lane, so one session runs one job at
//! a time while different sessions run in parallel. What a message that reaches a busy session
//! does is its queue mode ([`queue`]): `steer` it into the running turn at the next safe point,
//! run it as a `followup` turn, `collect` it with the others after a quiet window, or `interrupt`
//! the running turn; a cap with a drop policy bounds the queue, and every submission learns at
//! once what became of it ([`Admission`]). With an [`inbox`](crate::inbox) every submission is
//! recorded there before it is admitted and marked done after the turn answering it is
//! committed. The lane loads its history from the transcript when it starts, journals each step
//! of a turn to it as it happens and commits the turn with its last line (also when the turn
//! failed or was stopped, so nothing is lost), and keeps the history within the configured
//! limit. A turn its process left open is resumed when its session's lane starts: its steps are
//! replayed into the history, a tool call that started and has no result is answered "may have
//! partly run" (never run twice), and the model is asked again only for the step that had not
//! completed; the inputs still pending queue behind it in their order ([`Sessions::recover`]).
//! A compaction, during a turn or asked for with [`Sessions::compact`], is written to the
//! transcript where it happened. With a [`Budget`] each turn gets what the session and the day
//! may still use, a turn on a spent budget is refused, and crossing 80 % is said. It is one file
//! (over 700 lines) because [`Sessions`] is the one front of every lane: submitting, admission
//! under the queue modes, stopping, resetting, compacting and usage all go through its one shared
//! table of lanes; the lane at work is in `lane`, taking up what a stopped process left in
//! `recovery`, the queue modes in `queue`.

mod lane;
pub mod queue;
mod recovery;

use lane::run_lane;
use recovery::ResumePlan;
pub use recovery::{MAY_HAVE_PARTLY_RUN, NOT_STARTED_BEFORE_STOP};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use clawcage_core::sync::lock;
use clawcage_core::{BoxFuture, InboundMessage, Usage};
use tokio::sync::{oneshot, watch};

use crate::agent_loop::{AgentError, AgentLoop, TurnObserver, TurnOutcome};
use crate::budget::Budget;
use crate::bus::Subscription;
use crate::inbox::{Appended, InputRecord, InputStatus, LaneInbox};
use crate::notifications::{NotificationFront, NotificationRoute};
use crate::transcript::{TranscriptStore, now_ms};

pub use queue::{
    Admission, DropPolicy, DropReason, InMemoryLaneQueue, LaneQueue, Origin, QUEUE_USAGE,
    QueueCommand, QueueConfig, QueueMode, QueueOverride, QueueSettings, QueueUsageError,
    parse_queue_command,
};
use queue::{QueueState, QueuedJob, StopCause, read_state, with_state};

tokio::task_local! {
    /// The key of the session whose turn the current task is running.
    static CURRENT_SESSION: String;
}

/// The key of the session whose turn is running in the current task, if any. Tools that act on
/// behalf of a session (`spawn`, the cron scheduler) read it while the lane awaits their call.
pub fn current_session_key() -> Option<String> {
    CURRENT_SESSION.try_with(Clone::clone).ok()
}

/// Run `future` as part of session `key`'s work: [`current_session_key`] answers `key` inside
/// it. Lanes use it for their turns and the sub-agent manager for a child's run.
pub async fn with_session_key<F: std::future::Future>(key: String, future: F) -> F::Output {
    CURRENT_SESSION.scope(key, future).await
}

/// The default number of messages a session keeps.
pub const DEFAULT_HISTORY_LIMIT: usize = 200;

/// What a lane is asked to do.
#[derive(Debug, Clone)]
pub enum LaneInput {
    /// A turn on the user's text; its channel is the one the session key names
    /// (`agent:<agentId>:<channel>:<peer>`), if any.
    User(String),
    /// A turn on the user's text from a channel and thread (a gateway's channels).
    FromChannel {
        /// The text.
        text: String,
        /// Where it came from.
        origin: Origin,
    },
    /// A turn on a notification from the bus (a sub-agent's result, a cron firing). Never
    /// steered into a running turn: it always queues as its own turn.
    Notification(InboundMessage),
    /// Clear the history (recorded in the transcript).
    Reset,
    /// Compact the history now (`/compact`; recorded in the transcript).
    Compact,
}

/// How a lane answered a submission: its turn's outcome (none for a reset or compaction), or
/// how it failed.
pub type LaneReply = Result<Option<TurnOutcome>, AgentError>;

/// Hears how each notification's turn ended (the REPL prints it).
pub type NotificationDone =
    Arc<dyn Fn(&InboundMessage, Result<TurnOutcome, AgentError>) + Send + Sync>;

/// A change of a session's queue, for front ends that show it (the gateway's events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueEvent {
    /// A submission arrived and was admitted as `admission` (or refused).
    Admitted {
        /// Its ticket in the session.
        ticket: u64,
        /// What became of it.
        admission: Admission,
    },
    /// An admitted submission left the queue without running.
    Dropped {
        /// Its ticket.
        ticket: u64,
        /// Why.
        reason: DropReason,
    },
    /// Submissions left the queue into a turn: a new one, or (`steered`) the running one.
    Taken {
        /// Their tickets, oldest first.
        tickets: Vec<u64>,
        /// Whether they joined the running turn.
        steered: bool,
    },
    /// A turn a stopped process left open is running again, answering these recovered
    /// submissions.
    Resumed {
        /// Their tickets, oldest first.
        tickets: Vec<u64>,
        /// This is the turn's `attempt`th resumption (1 the first time).
        attempt: u32,
    },
}

/// Who a submission is, for the inbox: its id (one is made when none is given) and the
/// sender's idempotency key.
#[derive(Debug, Clone, Default)]
pub struct InputMeta {
    /// The id (the gateway's run id).
    pub id: Option<String>,
    /// The sender's idempotency key.
    pub idempotency: Option<String>,
}

/// A submission a stopped process left in the inbox, taken up again.
#[derive(Debug)]
pub struct Recovered {
    /// Its session.
    pub key: String,
    /// The submission as recorded.
    pub record: InputRecord,
    /// Its turn's outcome, as for a new submission.
    pub pending: PendingTurn,
    /// What becomes of it.
    pub fate: RecoveredFate,
}

/// What becomes of a recovered submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveredFate {
    /// The turn answering it was open: it is resumed.
    Resumed,
    /// It had not started: it queues again, in its order.
    Queued,
    /// Its turn was committed just before the stop: its outcome is ready.
    Answered,
}

/// Hears every [`QueueEvent`] with its session key.
pub type QueueListener = Arc<dyn Fn(&str, &QueueEvent) + Send + Sync>;

/// What the lanes keep of a submission while it waits: how to answer it.
struct Waiter {
    observer: Arc<dyn TurnObserver>,
    reply: oneshot::Sender<LaneReply>,
    /// Its id in the inbox.
    id: String,
}

/// What every lane task shares. It does not hold the sender that keeps the lanes open, so
/// dropping [`Sessions`] lets each lane end after the jobs already queued.
struct Shared {
    agent: AgentLoop,
    store: Option<Arc<dyn TranscriptStore>>,
    inbox: Option<Arc<dyn LaneInbox>>,
    /// Sessions whose inbox was looked at by this process.
    recovered: Mutex<HashSet<String>>,
    /// Per session: the open turn its lane resumes first.
    resuming: Mutex<HashMap<String, ResumePlan>>,
    /// Makes ids for submissions that bring none.
    next_input: AtomicU64,
    input_prefix: String,
    history_limit: usize,
    usage: Mutex<HashMap<String, Usage>>,
    queue: Arc<dyn LaneQueue>,
    config: QueueConfig,
    /// Per session, per ticket. Locked before the queue, never the other way round.
    waiters: Mutex<HashMap<String, HashMap<u64, Waiter>>>,
    listener: Mutex<Option<QueueListener>>,
    budget: std::sync::OnceLock<Arc<Budget>>,
    /// Set by [`Sessions::halt`]: the lanes stop where they stand.
    halted: watch::Sender<bool>,
    /// Sessions whose lanes take no next job ([`Sessions::hold`]): their running turn ends,
    /// what waits stays queued.
    held: Mutex<HashSet<String>>,
}

impl Shared {
    fn emit(&self, key: &str, event: QueueEvent) {
        let listener = lock(&self.listener).clone();
        if let Some(listener) = listener {
            listener(key, &event);
        }
    }

    fn observer_of(&self, key: &str, ticket: Option<u64>) -> Arc<dyn TurnObserver> {
        ticket
            .and_then(|ticket| {
                lock(&self.waiters)
                    .get(key)
                    .and_then(|session| session.get(&ticket))
                    .map(|waiter| waiter.observer.clone())
            })
            .unwrap_or_else(|| Arc::new(crate::provider::NoEvents))
    }

    fn answer(&self, key: &str, tickets: &[u64], reply: &LaneReply) {
        let answered: Vec<Waiter> = {
            let mut waiters = lock(&self.waiters);
            let Some(session) = waiters.get_mut(key) else {
                return;
            };
            tickets
                .iter()
                .filter_map(|ticket| session.remove(ticket))
                .collect()
        };
        // Done in the inbox before anyone hears it: whoever hears it may rely on that.
        let ids: Vec<String> = answered.iter().map(|waiter| waiter.id.clone()).collect();
        self.mark_done(key, &ids, status_of(reply));
        for waiter in answered {
            // The submitter may have stopped waiting; the turn is recorded all the same.
            let _ = waiter.reply.send(reply.clone());
        }
    }

    /// The inbox ids of `tickets`.
    fn ids_of(&self, key: &str, tickets: &[u64]) -> Vec<String> {
        let waiters = lock(&self.waiters);
        let Some(session) = waiters.get(key) else {
            return Vec::new();
        };
        tickets
            .iter()
            .filter_map(|ticket| session.get(ticket).map(|waiter| waiter.id.clone()))
            .collect()
    }

    fn mark_done(&self, key: &str, ids: &[String], status: InputStatus) {
        if let Some(inbox) = &self.inbox
            && let Err(error) = inbox.done(key, ids, status)
        {
            // The turn is committed: at the next start the input is found answered.
            tracing::warn!(session = %key, %error, "cannot mark inputs done in the inbox");
        }
    }

    /// The error of a failed write of `key`'s transcript: `message`, said where and what to do.
    fn transcript_error(&self, key: &str, message: String) -> AgentError {
        match &self.store {
            Some(store) => AgentError::Transcript {
                path: store.describe(key),
                message,
                remedy: store.remedy(),
            },
            None => AgentError::Transcript {
                path: "(no transcript)".to_string(),
                message,
                remedy: "",
            },
        }
    }
}

/// How a lane's reply ends its inputs.
fn status_of(reply: &LaneReply) -> InputStatus {
    match reply {
        Ok(_) => InputStatus::Ok,
        Err(AgentError::Dropped(_)) => InputStatus::Dropped,
        Err(AgentError::Interrupted) => InputStatus::Aborted,
        Err(_) => InputStatus::Error,
    }
}

struct Inner {
    shared: Arc<Shared>,
    lanes: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Dropped with the last [`Sessions`] clone: the lanes finish what is queued and end.
    open: watch::Sender<bool>,
}

/// The sessions of one agent. Cloning shares them.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("history_limit", &self.inner.shared.history_limit)
            .field("queue", &self.inner.shared.config)
            .finish_non_exhaustive()
    }
}

/// A submitted job: [`PendingTurn::admission`] says at once what became of it, and
/// [`PendingTurn::wait`] gives its outcome.
#[derive(Debug)]
pub struct PendingTurn {
    receiver: oneshot::Receiver<LaneReply>,
    admission: Admission,
    ticket: u64,
}

impl PendingTurn {
    /// What became of the submission when it arrived.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Its ticket: unique in its session, increasing in arrival order.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// The outcome of the turn that answered it (`None` for a reset): its own turn, the running
    /// turn it was steered into, or the collected turn it joined. A message refused or dropped
    /// by the queue ends with [`AgentError::Dropped`].
    pub async fn wait(self) -> Result<Option<TurnOutcome>, AgentError> {
        self.receiver.await.unwrap_or(Err(AgentError::LaneClosed))
    }
}

impl Sessions {
    /// Sessions run by `agent`, with transcripts in `store` (none: history lives in memory
    /// only), each keeping at most `history_limit` messages, with the default queue settings
    /// (`steer`).
    pub fn new(
        agent: AgentLoop,
        store: Option<Arc<dyn TranscriptStore>>,
        history_limit: usize,
    ) -> Self {
        Self::with_queue(agent, store, history_limit, QueueConfig::default())
    }

    /// [`Sessions::new`] with the queue configuration `queue` (`[queue]`).
    pub fn with_queue(
        agent: AgentLoop,
        store: Option<Arc<dyn TranscriptStore>>,
        history_limit: usize,
        queue: QueueConfig,
    ) -> Self {
        Self::with_queue_backend(
            agent,
            store,
            history_limit,
            queue,
            Arc::new(InMemoryLaneQueue::new()),
        )
    }

    /// [`Sessions::with_queue`] with the queues kept in `backend`.
    pub fn with_queue_backend(
        agent: AgentLoop,
        store: Option<Arc<dyn TranscriptStore>>,
        history_limit: usize,
        queue: QueueConfig,
        backend: Arc<dyn LaneQueue>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    agent,
                    store,
                    inbox: None,
                    recovered: Mutex::new(HashSet::new()),
                    resuming: Mutex::new(HashMap::new()),
                    next_input: AtomicU64::new(1),
                    input_prefix: format!("in-{}-{}", now_ms(), std::process::id()),
                    history_limit: history_limit.max(2),
                    usage: Mutex::new(HashMap::new()),
                    queue: backend,
                    config: queue,
                    waiters: Mutex::new(HashMap::new()),
                    listener: Mutex::new(None),
                    budget: std::sync::OnceLock::new(),
                    halted: watch::Sender::new(false),
                    held: Mutex::new(HashSet::new()),
                }),
                lanes: Mutex::new(HashMap::new()),
                open: watch::Sender::new(true),
            }),
        }
    }

    /// These sessions with every input recorded in `inbox` before it is admitted, and the
    /// work a stopped process left there taken up again (call before the sessions are
    /// shared; later it is ignored).
    pub fn with_inbox(mut self, inbox: Arc<dyn LaneInbox>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner)
            && let Some(shared) = Arc::get_mut(&mut inner.shared)
        {
            shared.inbox = Some(inbox);
        } else {
            tracing::warn!("the sessions are shared already: the inbox is not used");
        }
        self
    }

    /// Stop every lane where it stands, as a process that ends would, without committing the
    /// running turns or answering the waiting inputs: with an inbox, what they did so far is in
    /// the journal, their inputs stay pending, and the next start on this state directory
    /// resumes them. For a service's graceful stop (a deploy, SIGTERM). Waiters hear
    /// [`AgentError::LaneClosed`].
    pub fn halt(&self) {
        self.inner.shared.halted.send_replace(true);
        // Their answers never come in this process.
        lock(&self.inner.shared.waiters).clear();
    }

    /// Session `key`'s lane takes no next job from now on: its running turn goes on to its end,
    /// and what waits stays queued (and recorded in the inbox) for whoever serves the session
    /// next. For a host handing the session's partition over: it lets the running turn end,
    /// then lets the session go ([`Sessions::let_go`]).
    pub fn hold(&self, key: &str) {
        lock(&self.inner.shared.held).insert(key.to_string());
    }

    /// Stop serving session `key` here, as [`Sessions::halt`] stops every session: its lane
    /// stops where it stands (what the running turn did so far is in the journal), its waiters
    /// hear [`AgentError::LaneClosed`], and what this process knew of it (its queue, its
    /// usage, that its inbox was looked at) is forgotten, so that whichever process serves it
    /// next (another host, or this one again) takes it up from the inbox and the journal.
    /// For a host that hands a partition of the sessions over or lost it.
    pub fn let_go(&self, key: &str) {
        let shared = &self.inner.shared;
        lock(&shared.held).remove(key);
        if let Some(lane) = lock(&self.inner.lanes).remove(key) {
            lane.abort();
        }
        // Their answers never come in this process.
        lock(&shared.waiters).remove(key);
        lock(&shared.recovered).remove(key);
        lock(&shared.resuming).remove(key);
        lock(&shared.usage).remove(key);
        with_state(shared.queue.as_ref(), key, |state| {
            *state = QueueState::default();
        });
    }

    /// The inbox, when there is one.
    pub fn inbox(&self) -> Option<&Arc<dyn LaneInbox>> {
        self.inner.shared.inbox.as_ref()
    }

    /// The transcripts, when there are.
    pub fn transcripts(&self) -> Option<&Arc<dyn TranscriptStore>> {
        self.inner.shared.store.as_ref()
    }

    /// The agent.
    pub fn agent(&self) -> &AgentLoop {
        &self.inner.shared.agent
    }

    /// Hold every session's turns to `budget` (set once; a later call is ignored and returns
    /// false).
    pub fn set_budget(&self, budget: Arc<Budget>) -> bool {
        self.inner.shared.budget.set(budget).is_ok()
    }

    /// The budget, when one is set.
    pub fn budget(&self) -> Option<&Arc<Budget>> {
        self.inner.shared.budget.get()
    }

    /// Compact session `key`'s history now, after the turns queued before; returns what to
    /// tell the user (what was summarised, or why nothing was).
    pub async fn compact(
        &self,
        key: &str,
        observer: Arc<dyn TurnObserver>,
    ) -> Result<String, AgentError> {
        let outcome = self
            .submit(key, LaneInput::Compact, observer)
            .wait()
            .await?;
        Ok(outcome.map(|outcome| outcome.text).unwrap_or_default())
    }

    /// Hear every change of every session's queue (replaces an earlier listener). The listener
    /// runs on the submitting or the lane's task: keep it short.
    pub fn set_queue_listener(&self, listener: Option<QueueListener>) {
        *lock(&self.inner.shared.listener) = listener;
    }

    /// Submit `input` to `key`'s lane. What became of it is decided now, before any await
    /// (its ticket fixes its place), and returned with the pending turn: started, queued,
    /// steered into the running turn, interrupting it, or dropped. Must be called inside a
    /// tokio runtime (the lane is a task).
    pub fn submit(
        &self,
        key: &str,
        input: LaneInput,
        observer: Arc<dyn TurnObserver>,
    ) -> PendingTurn {
        self.submit_input(key, input, observer, InputMeta::default())
    }

    /// [`Sessions::submit`] with the submission's id and idempotency key, recorded in the
    /// inbox (when there is one) before it is admitted. A key the inbox knows is not submitted
    /// again: the pending turn is dropped with [`DropReason::NotRecorded`] naming the earlier
    /// input (front ends check keys before, as the gateway does).
    pub fn submit_input(
        &self,
        key: &str,
        input: LaneInput,
        observer: Arc<dyn TurnObserver>,
        meta: InputMeta,
    ) -> PendingTurn {
        // Work a stopped process left for this session goes first; its submitter hears it.
        let recovering = observer.clone();
        self.recover_session(key, &|_, _| recovering.clone());
        let shared = &self.inner.shared;
        let job = match input {
            LaneInput::User(text) => QueuedJob::User {
                text,
                origin: Origin::of_key(key),
            },
            LaneInput::FromChannel { text, origin } => QueuedJob::User { text, origin },
            LaneInput::Notification(message) => QueuedJob::Notification { message },
            LaneInput::Reset => QueuedJob::Reset,
            LaneInput::Compact => QueuedJob::Compact,
        };
        let id = meta.id.unwrap_or_else(|| {
            format!(
                "{}-{}",
                shared.input_prefix,
                shared.next_input.fetch_add(1, Ordering::Relaxed)
            )
        });
        if let Some(inbox) = &shared.inbox {
            // On the disk like the transcript: with every secret value the runtime knows
            // replaced (the model only ever sees it replaced as well).
            let record = InputRecord {
                id: id.clone(),
                at_ms: now_ms(),
                idempotency: meta.idempotency,
                job: redacted_job(&job, shared.agent.redactor()),
                stop_requested: false,
            };
            let refused = match inbox.append(key, &record) {
                Ok(Appended::New) => None,
                Ok(Appended::Duplicate(earlier)) => Some(format!(
                    "the same idempotency key was sent before, as input {earlier}"
                )),
                Err(error) => {
                    tracing::error!(session = %key, %error, "cannot record an input in the inbox");
                    Some(error.to_string())
                }
            };
            if let Some(why) = refused {
                let reason = DropReason::NotRecorded { why };
                let (reply, receiver) = oneshot::channel();
                let _ = reply.send(Err(AgentError::Dropped(reason.clone())));
                return PendingTurn {
                    receiver,
                    admission: Admission::Dropped { reason },
                    ticket: 0,
                };
            }
        }
        self.admit(key, job, observer, id)
    }

    /// Admit `job` (recorded as `id`) to `key`'s queue and start the lane.
    fn admit(
        &self,
        key: &str,
        job: QueuedJob,
        observer: Arc<dyn TurnObserver>,
        id: String,
    ) -> PendingTurn {
        let shared = &self.inner.shared;
        let (reply, receiver) = oneshot::channel();
        let mut dropped = Vec::new();
        let mut refused = None;
        let admitted = {
            let mut waiters = lock(&shared.waiters);
            let admitted = with_state(shared.queue.as_ref(), key, |state| {
                state.admit(job.clone(), &shared.config, now_ms())
            });
            let session = match waiters.get_mut(key) {
                Some(session) => session,
                None => waiters.entry(key.to_string()).or_default(),
            };
            for (ticket, reason) in &admitted.evicted {
                if let Some(waiter) = session.remove(ticket) {
                    dropped.push(waiter.id);
                    let _ = waiter.reply.send(Err(AgentError::Dropped(reason.clone())));
                }
            }
            match &admitted.admission {
                Admission::Dropped { reason } => {
                    refused = Some(id);
                    let _ = reply.send(Err(AgentError::Dropped(reason.clone())));
                }
                _ => {
                    session.insert(
                        admitted.ticket,
                        Waiter {
                            observer,
                            reply,
                            id,
                        },
                    );
                }
            }
            admitted
        };
        shared.mark_done(key, &dropped, InputStatus::Dropped);
        if let Some(refused) = refused {
            shared.mark_done(key, &[refused], InputStatus::Refused);
        }
        self.ensure_lane(key);
        for (ticket, reason) in &admitted.evicted {
            shared.emit(
                key,
                QueueEvent::Dropped {
                    ticket: *ticket,
                    reason: reason.clone(),
                },
            );
        }
        shared.emit(
            key,
            QueueEvent::Admitted {
                ticket: admitted.ticket,
                admission: admitted.admission.clone(),
            },
        );
        PendingTurn {
            receiver,
            admission: admitted.admission,
            ticket: admitted.ticket,
        }
    }

    /// Start `key`'s lane task unless it runs (a lane whose task ended, short of a panic it
    /// cannot, is started again).
    fn ensure_lane(&self, key: &str) {
        let mut lanes = lock(&self.inner.lanes);
        if lanes.get(key).is_some_and(|lane| !lane.is_finished()) {
            return;
        }
        let lane = tokio::spawn(run_lane(
            self.inner.shared.clone(),
            key.to_string(),
            self.inner.open.subscribe(),
        ));
        lanes.insert(key.to_string(), lane);
    }

    /// Run a turn on the user's `text` in session `key` and wait for it.
    pub async fn send_user(
        &self,
        key: &str,
        text: impl Into<String>,
        observer: Arc<dyn TurnObserver>,
    ) -> Result<TurnOutcome, AgentError> {
        self.submit(key, LaneInput::User(text.into()), observer)
            .wait()
            .await?
            .ok_or_else(|| AgentError::History("the lane returned no outcome".to_string()))
    }

    /// Stop the turn running on `key`'s lane now (the REPL's Ctrl-C). The turn ends with
    /// [`AgentError::Interrupted`]; the messages it produced so far stay in the history and reach
    /// the transcript, and a tool call left without a result gets one saying it did not run.
    /// Turns queued behind it still run. Without a running turn this does nothing.
    pub fn interrupt(&self, key: &str) {
        with_state(self.inner.shared.queue.as_ref(), key, |state| {
            state.stop(StopCause::Operator)
        });
    }

    /// Clear session `key`'s history, after the turns queued before.
    pub async fn reset(&self, key: &str) -> Result<(), AgentError> {
        self.submit(key, LaneInput::Reset, Arc::new(crate::provider::NoEvents))
            .wait()
            .await
            .map(|_| ())
    }

    /// The queue settings a user message to session `key` gets (from the channel its key
    /// names): the session's override, else the channel's mode, else `[queue]`.
    pub fn queue_settings(&self, key: &str) -> QueueSettings {
        let shared = &self.inner.shared;
        read_state(shared.queue.as_ref(), key, |state| {
            state.settings_for(&Origin::of_key(key), &shared.config)
        })
    }

    /// Set (`Some`) or remove (`None`) session `key`'s own queue settings, which take precedence
    /// over the channel's and the configuration's. Applies to messages that arrive from now on.
    pub fn set_queue_override(&self, key: &str, value: Option<QueueOverride>) {
        if let Some(inbox) = &self.inner.shared.inbox
            && let Err(error) = inbox.set_queue_override(key, value)
        {
            tracing::warn!(session = %key, %error, "cannot record the session's queue settings; they hold until a restart");
        }
        with_state(self.inner.shared.queue.as_ref(), key, |state| {
            state.set_session_override(value)
        });
    }

    /// Record that a stop was asked for input `id` of `key` (the gateway's run id): a restart
    /// then stops it too instead of running it (or resuming its turn).
    pub fn request_stop(&self, key: &str, id: &str) {
        if let Some(inbox) = &self.inner.shared.inbox
            && let Err(error) = inbox.request_stop(key, id)
        {
            tracing::warn!(session = %key, %error, "cannot record a stop in the inbox");
        }
    }

    /// Carry out a `/queue` command line for session `key`: show the settings, set the
    /// session's own, or reset them. Returns what to tell the user; a wrong command is a usage
    /// error naming the valid values.
    pub fn queue_command(&self, key: &str, line: &str) -> Result<String, QueueUsageError> {
        let command = parse_queue_command(line)?;
        let has_override = read_state(self.inner.shared.queue.as_ref(), key, |state| {
            state.session_override().is_some()
        });
        Ok(match command {
            QueueCommand::Show => format!(
                "queue: {} ({})\n{QUEUE_USAGE}",
                self.queue_settings(key),
                if has_override {
                    "set for this session"
                } else {
                    "from the configuration"
                }
            ),
            QueueCommand::Set(value) => {
                self.set_queue_override(key, Some(value));
                format!("queue for this session: {}", self.queue_settings(key))
            }
            QueueCommand::Reset => {
                self.set_queue_override(key, None);
                format!(
                    "queue for this session: {} (from the configuration)",
                    self.queue_settings(key)
                )
            }
        })
    }

    /// Tokens used by session `key` since its last reset (including earlier runs, from the
    /// transcript).
    pub fn usage(&self, key: &str) -> Usage {
        lock(&self.inner.shared.usage)
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// What session `key` has used, for `/usage`: tokens in (the whole prompt), out, read from
    /// and written to the prompt cache, the cache hit ratio, and each budget with its share.
    pub fn usage_report(&self, key: &str) -> String {
        let usage = self.usage(key);
        let mut lines = vec![format!(
            "tokens since the last reset: {} in, {} out; cache: {} read, {} written ({:.0}% of the input read from the cache)",
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.cache_hit_ratio() * 100.0
        )];
        if let Some(policy) = self.agent().context_policy() {
            lines.push(format!(
                "context window: {} tokens ({}); the history is compacted past {:.0}% ({} tokens)",
                policy.window,
                policy.window_source.describe(),
                policy.compact_threshold * 100.0,
                policy.compact_at()
            ));
        }
        if let Some(budget) = self.budget() {
            let limits = budget.config();
            if let Some(limit) = limits.session_tokens {
                let used = budget.session_used(key);
                lines.push(format!(
                    "session budget: {used} of {limit} tokens ({:.0}%), its sub-agents included",
                    used as f64 * 100.0 / limit as f64
                ));
            }
            if let Some(limit) = limits.daily_tokens {
                let used = budget.used_today();
                lines.push(format!(
                    "today's budget: {used} of {limit} tokens ({:.0}%)",
                    used as f64 * 100.0 / limit as f64
                ));
            }
        }
        lines.join("\n")
    }

    /// A front end that admits each notification to the lane of its `session_key` with
    /// `observer`, and lets `done` hear how its turn ended (the REPL prints it).
    pub fn notification_front(
        &self,
        observer: Arc<dyn TurnObserver>,
        done: NotificationDone,
    ) -> Arc<dyn NotificationFront> {
        Arc::new(TurnsFront {
            sessions: self.clone(),
            observer,
            done,
        })
    }

    /// Deliver every message of `subscription` to the lane of its `session_key` as a
    /// notification ([`Sessions::notification_front`]), until the subscription ends or the
    /// route is dropped.
    pub fn deliver_notifications(
        &self,
        subscription: Subscription,
        observer: Arc<dyn TurnObserver>,
        done: NotificationDone,
    ) -> NotificationRoute {
        NotificationRoute::over(subscription, self.notification_front(observer, done))
    }
}

/// Notifications as turns of [`Sessions`], each outcome told to a callback.
struct TurnsFront {
    sessions: Sessions,
    observer: Arc<dyn TurnObserver>,
    done: NotificationDone,
}

impl NotificationFront for TurnsFront {
    fn admit(&self, message: InboundMessage) -> BoxFuture<'_, ()> {
        let pending = self.sessions.submit(
            &message.session_key,
            LaneInput::Notification(message.clone()),
            self.observer.clone(),
        );
        let done = self.done.clone();
        tokio::spawn(async move {
            let outcome = pending.wait().await.and_then(|outcome| {
                outcome.ok_or_else(|| AgentError::History("no outcome".to_string()))
            });
            done(&message, outcome);
        });
        Box::pin(std::future::ready(()))
    }
}

/// `job` with the values `redactor` knows replaced in its texts.
fn redacted_job(job: &QueuedJob, redactor: &clawcage_core::redact::Redactor) -> QueuedJob {
    if redactor.is_empty() {
        return job.clone();
    }
    match job {
        QueuedJob::User { text, origin } => QueuedJob::User {
            text: redactor.redact(text),
            origin: origin.clone(),
        },
        QueuedJob::Notification { message } => QueuedJob::Notification {
            message: InboundMessage {
                content: redactor.redact(&message.content),
                ..message.clone()
            },
        },
        QueuedJob::Reset | QueuedJob::Compact => job.clone(),
    }
}

/// The text a notification becomes in the history.
pub fn notification_text(message: &InboundMessage) -> String {
    format!(
        "[notification on the `{}` channel from {}]\n{}",
        message.channel, message.sender, message.content
    )
}
