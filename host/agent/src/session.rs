//! Sessions and their lanes. Every session key owns a lane: a queue drained by one task that
//! holds the session's history. Whatever enters a session — the user's input, a notification
//! from the bus, a cron firing, a reset — is submitted to its lane, so one session runs one job at
//! a time while different sessions run in parallel. What a message that reaches a busy session
//! does is its queue mode ([`queue`]): `steer` it into the running turn at the next safe point,
//! run it as a `followup` turn, `collect` it with the others after a quiet window, or `interrupt`
//! the running turn; a cap with a drop policy bounds the queue, and every submission learns at
//! once what became of it ([`Admission`]). The lane loads its history from the transcript when it
//! starts, appends each turn's messages to it when the turn ends (also when the turn failed or was
//! stopped, so nothing is lost), and keeps the history within the configured limit. A
//! compaction, during a turn or asked for with [`Sessions::compact`], is written to the
//! transcript where it happened. With a [`Budget`] each turn gets what the session and the day
//! may still use, a turn on a spent budget is refused, and crossing 80 % is said.

pub mod queue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use clawcage_core::{ChatMessage, InboundMessage, Usage};
use tokio::sync::{oneshot, watch};

use crate::agent_loop::{AgentError, AgentLoop, Steering, TurnEnd, TurnObserver, TurnOutcome};
use crate::budget::{Budget, charged_to};
use crate::bus::Subscription;
use crate::compaction::Journaled;
use crate::transcript::{Entry, TranscriptStore, now_ms, push_message, trim_history};

pub use queue::{
    Admission, DropPolicy, DropReason, InMemoryLaneQueue, LaneQueue, Origin, QUEUE_USAGE,
    QueueCommand, QueueConfig, QueueMode, QueueOverride, QueueSettings, QueueUsageError,
    parse_queue_command,
};
use queue::{LaneJob, LaneWork, NextJob, QueuedJob, StopCause, read_state, with_state};

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

type LaneReply = Result<Option<TurnOutcome>, AgentError>;

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
}

/// Hears every [`QueueEvent`] with its session key.
pub type QueueListener = Arc<dyn Fn(&str, &QueueEvent) + Send + Sync>;

/// What the lanes keep of a submission while it waits: how to answer it.
struct Waiter {
    observer: Arc<dyn TurnObserver>,
    reply: oneshot::Sender<LaneReply>,
}

/// What every lane task shares. It does not hold the sender that keeps the lanes open, so
/// dropping [`Sessions`] lets each lane end after the jobs already queued.
struct Shared {
    agent: AgentLoop,
    store: Option<TranscriptStore>,
    history_limit: usize,
    usage: Mutex<HashMap<String, Usage>>,
    queue: Arc<dyn LaneQueue>,
    config: QueueConfig,
    /// Per session, per ticket. Locked before the queue, never the other way round.
    waiters: Mutex<HashMap<String, HashMap<u64, Waiter>>>,
    listener: Mutex<Option<QueueListener>>,
    budget: std::sync::OnceLock<Arc<Budget>>,
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
        let mut waiters = lock(&self.waiters);
        let Some(session) = waiters.get_mut(key) else {
            return;
        };
        for ticket in tickets {
            if let Some(waiter) = session.remove(ticket) {
                // The submitter may have stopped waiting; the turn is recorded all the same.
                let _ = waiter.reply.send(reply.clone());
            }
        }
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Sessions {
    /// Sessions run by `agent`, with transcripts in `store` (none: history lives in memory
    /// only), each keeping at most `history_limit` messages, with the default queue settings
    /// (`steer`).
    pub fn new(agent: AgentLoop, store: Option<TranscriptStore>, history_limit: usize) -> Self {
        Self::with_queue(agent, store, history_limit, QueueConfig::default())
    }

    /// [`Sessions::new`] with the queue configuration `queue` (`[queue]`).
    pub fn with_queue(
        agent: AgentLoop,
        store: Option<TranscriptStore>,
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
        store: Option<TranscriptStore>,
        history_limit: usize,
        queue: QueueConfig,
        backend: Arc<dyn LaneQueue>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    agent,
                    store,
                    history_limit: history_limit.max(2),
                    usage: Mutex::new(HashMap::new()),
                    queue: backend,
                    config: queue,
                    waiters: Mutex::new(HashMap::new()),
                    listener: Mutex::new(None),
                    budget: std::sync::OnceLock::new(),
                }),
                lanes: Mutex::new(HashMap::new()),
                open: watch::Sender::new(true),
            }),
        }
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
        let (reply, receiver) = oneshot::channel();
        let admitted = {
            let mut waiters = lock(&shared.waiters);
            let admitted = with_state(shared.queue.as_ref(), key, |state| {
                state.admit(job, &shared.config, now_ms())
            });
            let session = match waiters.get_mut(key) {
                Some(session) => session,
                None => waiters.entry(key.to_string()).or_default(),
            };
            for (ticket, reason) in &admitted.evicted {
                if let Some(waiter) = session.remove(ticket) {
                    let _ = waiter.reply.send(Err(AgentError::Dropped(reason.clone())));
                }
            }
            match &admitted.admission {
                Admission::Dropped { reason } => {
                    let _ = reply.send(Err(AgentError::Dropped(reason.clone())));
                }
                _ => {
                    session.insert(admitted.ticket, Waiter { observer, reply });
                }
            }
            admitted
        };
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
        with_state(self.inner.shared.queue.as_ref(), key, |state| {
            state.set_session_override(value)
        });
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

    /// Deliver every message of `subscription` to the lane of its `session_key` as a
    /// notification, in a task that runs until the subscription ends; `done` hears each
    /// outcome (the REPL prints it).
    pub fn deliver_notifications(
        &self,
        mut subscription: Subscription,
        observer: Arc<dyn TurnObserver>,
        done: NotificationDone,
    ) -> tokio::task::JoinHandle<()> {
        let sessions = self.clone();
        tokio::spawn(async move {
            while let Some(message) = subscription.recv().await {
                let pending = sessions.submit(
                    &message.session_key,
                    LaneInput::Notification(message.clone()),
                    observer.clone(),
                );
                let done = done.clone();
                tokio::spawn(async move {
                    let outcome = pending.wait().await.and_then(|outcome| {
                        outcome.ok_or_else(|| AgentError::History("no outcome".to_string()))
                    });
                    done(&message, outcome);
                });
            }
        })
    }
}

/// The text a notification becomes in the history.
pub fn notification_text(message: &InboundMessage) -> String {
    format!(
        "[notification on the `{}` channel from {}]\n{}",
        message.channel, message.sender, message.content
    )
}

async fn run_lane(shared: Arc<Shared>, key: String, mut open: watch::Receiver<bool>) {
    let mut history = load_history(&shared, &key).await;
    let mut changes = shared.queue.watch(&key);
    let mut closing = false;
    loop {
        changes.borrow_and_update();
        let next = with_state(shared.queue.as_ref(), &key, |state| {
            state.next_job(now_ms())
        });
        match next {
            NextJob::Idle if closing => break,
            NextJob::Idle => {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { break },
                    // Only ever an error: the last `Sessions` is gone.
                    _ = open.changed() => closing = true,
                }
            }
            NextJob::WaitUntil { at_ms } => {
                let wait = std::time::Duration::from_millis(at_ms.saturating_sub(now_ms()));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = changes.changed() => if changed.is_err() { break },
                }
            }
            NextJob::Run(job) => run_job(&shared, &key, &mut history, job).await,
        }
    }
}

async fn load_history(shared: &Shared, key: &str) -> Vec<ChatMessage> {
    let Some(store) = shared.store.clone() else {
        return Vec::new();
    };
    let (load_key, limit) = (key.to_string(), shared.history_limit);
    match tokio::task::spawn_blocking(move || store.load(&load_key, limit)).await {
        Ok(Ok(loaded)) => {
            if let Some(budget) = shared.budget.get() {
                budget.seed(key, loaded.usage.total());
            }
            lock(&shared.usage).insert(key.to_string(), loaded.usage);
            loaded.messages
        }
        Ok(Err(error)) => {
            tracing::warn!(session = %key, "cannot read the transcript, starting empty: {error}");
            Vec::new()
        }
        Err(error) => {
            tracing::warn!(session = %key, "loading the transcript failed: {error}");
            Vec::new()
        }
    }
}

async fn run_job(shared: &Shared, key: &str, history: &mut Vec<ChatMessage>, job: LaneJob) {
    let LaneJob { mut tickets, work } = job;
    shared.emit(
        key,
        QueueEvent::Taken {
            tickets: tickets.clone(),
            steered: false,
        },
    );
    let reply = match work {
        LaneWork::Reset => {
            history.clear();
            lock(&shared.usage).insert(key.to_string(), Usage::default());
            if let Some(budget) = shared.budget.get() {
                budget.reset(key);
            }
            persist(shared, key, vec![Entry::Reset { at_ms: now_ms() }])
                .await
                .map(|()| None)
        }
        LaneWork::Compact => {
            let observer = shared.observer_of(key, tickets.first().copied());
            compact_now(shared, key, history, observer.as_ref()).await
        }
        LaneWork::Turn { text } => {
            let observer = shared.observer_of(key, tickets.first().copied());
            let steering = LaneSteering {
                shared,
                key,
                taken: Mutex::new(Vec::new()),
            };
            let reply = run_one(shared, key, history, text, observer.as_ref(), &steering).await;
            tickets.extend(lock(&steering.taken).drain(..));
            reply
        }
    };
    shared.answer(key, &tickets, &reply);
}

/// The running turn's view of its queue: steered messages, taken at the loop's safe points.
struct LaneSteering<'a> {
    shared: &'a Shared,
    key: &'a str,
    taken: Mutex<Vec<u64>>,
}

impl Steering for LaneSteering<'_> {
    fn take(&self) -> Option<String> {
        let (tickets, text) = with_state(self.shared.queue.as_ref(), self.key, |state| {
            state.take_steered()
        })?;
        lock(&self.taken).extend(&tickets);
        self.shared.emit(
            self.key,
            QueueEvent::Taken {
                tickets,
                steered: true,
            },
        );
        Some(text)
    }
}

/// Resolves when the running job is asked to stop, with why.
async fn stop_requested(queue: &dyn LaneQueue, key: &str) -> StopCause {
    let mut changes = queue.watch(key);
    loop {
        changes.borrow_and_update();
        if let Some(cause) = read_state(queue, key, |state| state.stop_requested()) {
            return cause;
        }
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn compact_now(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    observer: &dyn TurnObserver,
) -> LaneReply {
    let mut journal = Vec::new();
    let compacted = CURRENT_SESSION
        .scope(
            key.to_string(),
            charged_to(
                key.to_string(),
                shared.agent.compact(history, observer, &mut journal),
            ),
        )
        .await;
    tell_budget_notices(shared, key, observer);
    let compacted = compacted?;
    let Some(compaction) = compacted else {
        return Ok(Some(TurnOutcome {
            text: "nothing to compact: the history is too short".to_string(),
            end: TurnEnd::Answered,
            usage: Usage::default(),
            iterations: 0,
            answered_by: String::new(),
        }));
    };
    lock(&shared.usage)
        .entry(key.to_string())
        .or_default()
        .add(compaction.usage);
    persist(
        shared,
        key,
        vec![Entry::compaction(now_ms(), &compaction, true)],
    )
    .await?;
    Ok(Some(TurnOutcome {
        text: compaction.describe(),
        end: TurnEnd::Answered,
        usage: compaction.usage,
        iterations: 1,
        answered_by: shared.agent.provider().label(),
    }))
}

/// Says the budget notices session `key`'s work (its children's included) left since the last
/// time.
fn tell_budget_notices(shared: &Shared, key: &str, observer: &dyn TurnObserver) {
    if let Some(budget) = shared.budget.get() {
        for notice in budget.take_notices(key) {
            observer.note(&notice);
        }
    }
}

async fn run_one(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    text: String,
    observer: &dyn TurnObserver,
    steering: &dyn Steering,
) -> LaneReply {
    if let Some(budget) = shared.budget.get() {
        budget.check(Some(key)).map_err(AgentError::Budget)?;
    }
    let input = ChatMessage::user(text);
    push_message(history, input.clone());
    let mut journal = Vec::new();
    let (result, stopped) = {
        let turn = CURRENT_SESSION.scope(
            key.to_string(),
            charged_to(
                key.to_string(),
                shared
                    .agent
                    .run_turn_journaled(history, observer, steering, &mut journal),
            ),
        );
        tokio::select! {
            result = turn => (result, None),
            cause = stop_requested(shared.queue.as_ref(), key) => (Err(AgentError::Interrupted), Some(cause)),
        }
    };
    with_state(shared.queue.as_ref(), key, |state| state.turn_answered());
    if let Some(cause) = stopped
        && let Some(answers) = answer_dangling_calls(history, cause.dangling_call_result())
    {
        journal.push(Journaled::Message(answers));
    }

    let mut entries = vec![Entry::Message {
        at_ms: now_ms(),
        message: input,
    }];
    let at_ms = now_ms();
    // What the turn used, also when it failed or was stopped part-way.
    let mut usage = Usage::default();
    for item in journal {
        match item {
            Journaled::Message(message) => entries.push(Entry::Message { at_ms, message }),
            Journaled::Compacted(compaction) => {
                entries.push(Entry::compaction(at_ms, &compaction, false));
            }
            Journaled::Used(used) => usage.add(used),
        }
    }
    let outcome = match &result {
        Ok(outcome) => outcome.answered_by.clone(),
        Err(error) => format!("error: {error}"),
    };
    entries.push(Entry::Turn {
        at_ms,
        usage,
        outcome,
    });
    lock(&shared.usage)
        .entry(key.to_string())
        .or_default()
        .add(usage);
    tell_budget_notices(shared, key, observer);
    trim_history(history, shared.history_limit);

    persist(shared, key, entries).await?;
    result.map(Some)
}

async fn persist(shared: &Shared, key: &str, entries: Vec<Entry>) -> Result<(), AgentError> {
    let Some(store) = shared.store.clone() else {
        return Ok(());
    };
    let path = store.path(key).display().to_string();
    let key = key.to_string();
    let written = tokio::task::spawn_blocking(move || store.append(&key, &entries)).await;
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(AgentError::Transcript {
            path,
            message: error.to_string(),
        }),
        Err(error) => Err(AgentError::Transcript {
            path,
            message: error.to_string(),
        }),
    }
}

/// Give every tool call of the last assistant message that has no result a result saying
/// `why`, so the history stays one a provider accepts; returns the message of results added.
fn answer_dangling_calls(history: &mut Vec<ChatMessage>, why: &str) -> Option<ChatMessage> {
    let last = history.last()?;
    if last.role != clawcage_core::Role::Assistant {
        return None;
    }
    let results: Vec<clawcage_core::ContentBlock> = last
        .tool_uses()
        .map(|(id, _, _)| clawcage_core::ContentBlock::ToolResult {
            tool_use_id: id.to_string(),
            content: why.to_string(),
            is_error: true,
        })
        .collect();
    if results.is_empty() {
        return None;
    }
    let answers = ChatMessage {
        role: clawcage_core::Role::User,
        cut: None,
        content: results,
    };
    history.push(answers.clone());
    Some(answers)
}
