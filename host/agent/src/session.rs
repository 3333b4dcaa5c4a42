//! Sessions and their lanes. Every session key owns a lane: a queue drained by one task that
//! holds the session's history. Whatever enters a session — the user's input, a notification
//! from the bus, later a cron firing — is a job on its lane, so one session's turns run one after
//! another in the order they were submitted, while different sessions run in parallel. The lane
//! loads its history from the transcript when it starts, appends each turn's messages to it when
//! the turn ends (also when the turn failed, so nothing is lost), and keeps the history within
//! the configured limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use clawcage_core::{ChatMessage, InboundMessage, Usage};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::agent_loop::{AgentError, AgentLoop, TurnObserver, TurnOutcome};
use crate::bus::Subscription;
use crate::transcript::{Entry, TranscriptStore, now_ms, push_message, trim_history};

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
    /// A turn on the user's text.
    User(String),
    /// A turn on a notification from the bus (a sub-agent's result, a cron firing).
    Notification(InboundMessage),
    /// Clear the history (recorded in the transcript).
    Reset,
}

type LaneReply = Result<Option<TurnOutcome>, AgentError>;

/// Hears how each notification's turn ended (the REPL prints it).
pub type NotificationDone =
    Arc<dyn Fn(&InboundMessage, Result<TurnOutcome, AgentError>) + Send + Sync>;

struct Job {
    input: LaneInput,
    observer: Arc<dyn TurnObserver>,
    reply: oneshot::Sender<LaneReply>,
}

/// What every lane task shares. It does not hold the lanes' senders, so dropping [`Sessions`]
/// closes the queues and each lane ends after its queued jobs.
struct Shared {
    agent: AgentLoop,
    store: Option<TranscriptStore>,
    history_limit: usize,
    usage: Mutex<HashMap<String, Usage>>,
    /// Per session: wakes the turn running on its lane to stop it.
    interrupts: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Shared {
    fn interrupt_signal(&self, key: &str) -> Arc<Notify> {
        lock(&self.interrupts)
            .entry(key.to_string())
            .or_default()
            .clone()
    }
}

struct Inner {
    shared: Arc<Shared>,
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
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
            .finish_non_exhaustive()
    }
}

/// A submitted job; await [`PendingTurn::wait`] for its outcome.
#[derive(Debug)]
pub struct PendingTurn {
    receiver: oneshot::Receiver<LaneReply>,
}

impl PendingTurn {
    /// The outcome of the turn (`None` for a reset).
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
    /// only), each keeping at most `history_limit` messages.
    pub fn new(agent: AgentLoop, store: Option<TranscriptStore>, history_limit: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    agent,
                    store,
                    history_limit: history_limit.max(2),
                    usage: Mutex::new(HashMap::new()),
                    interrupts: Mutex::new(HashMap::new()),
                }),
                lanes: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &AgentLoop {
        &self.inner.shared.agent
    }

    /// Queue `input` on `key`'s lane. Jobs submitted to one key run in submission order.
    /// Must be called inside a tokio runtime (the lane is a task).
    pub fn submit(
        &self,
        key: &str,
        input: LaneInput,
        observer: Arc<dyn TurnObserver>,
    ) -> PendingTurn {
        let (reply, receiver) = oneshot::channel();
        let mut job = Job {
            input,
            observer,
            reply,
        };
        let mut lanes = lock(&self.inner.lanes);
        // A lane whose task ended (it cannot, short of a panic) is replaced.
        if let Some(sender) = lanes.get(key) {
            match sender.send(job) {
                Ok(()) => return PendingTurn { receiver },
                Err(mpsc::error::SendError(returned)) => job = returned,
            }
        }
        let (sender, jobs) = mpsc::unbounded_channel();
        // A fresh channel's receiver is alive, so this send succeeds.
        let _ = sender.send(job);
        lanes.insert(key.to_string(), sender);
        tokio::spawn(run_lane(self.inner.shared.clone(), key.to_string(), jobs));
        PendingTurn { receiver }
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
        self.inner.shared.interrupt_signal(key).notify_waiters();
    }

    /// Clear session `key`'s history, after the turns queued before.
    pub async fn reset(&self, key: &str) -> Result<(), AgentError> {
        self.submit(key, LaneInput::Reset, Arc::new(crate::provider::NoEvents))
            .wait()
            .await
            .map(|_| ())
    }

    /// Tokens used by session `key` since its last reset (including earlier runs, from the
    /// transcript).
    pub fn usage(&self, key: &str) -> Usage {
        lock(&self.inner.shared.usage)
            .get(key)
            .copied()
            .unwrap_or_default()
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

async fn run_lane(inner: Arc<Shared>, key: String, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut history = match &inner.store {
        Some(store) => {
            let store = store.clone();
            let (load_key, limit) = (key.clone(), inner.history_limit);
            match tokio::task::spawn_blocking(move || store.load(&load_key, limit)).await {
                Ok(Ok(loaded)) => {
                    lock(&inner.usage).insert(key.clone(), loaded.usage);
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
        None => Vec::new(),
    };

    while let Some(job) = jobs.recv().await {
        let reply = match job.input {
            LaneInput::Reset => {
                history.clear();
                lock(&inner.usage).insert(key.clone(), Usage::default());
                persist(&inner, &key, vec![Entry::Reset { at_ms: now_ms() }])
                    .await
                    .map(|()| None)
            }
            LaneInput::User(text) => {
                run_one(&inner, &key, &mut history, text, job.observer.as_ref()).await
            }
            LaneInput::Notification(message) => {
                run_one(
                    &inner,
                    &key,
                    &mut history,
                    notification_text(&message),
                    job.observer.as_ref(),
                )
                .await
            }
        };
        // The submitter may have stopped waiting; the turn is recorded all the same.
        let _ = job.reply.send(reply);
    }
}

async fn run_one(
    inner: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    text: String,
    observer: &dyn TurnObserver,
) -> LaneReply {
    let input = ChatMessage::user(text);
    push_message(history, input.clone());
    let start = history.len();
    let interrupt = inner.interrupt_signal(key);
    let result = {
        let turn = CURRENT_SESSION.scope(key.to_string(), inner.agent.run_turn(history, observer));
        tokio::select! {
            result = turn => result,
            () = interrupt.notified() => Err(AgentError::Interrupted),
        }
    };
    if matches!(result, Err(AgentError::Interrupted)) {
        answer_dangling_calls(
            history,
            "interrupted by the user before it finished (it may have partly run)",
        );
    }

    let mut entries = vec![Entry::Message {
        at_ms: now_ms(),
        message: input,
    }];
    let at_ms = now_ms();
    entries.extend(history[start..].iter().map(|message| Entry::Message {
        at_ms,
        message: message.clone(),
    }));
    let (usage, outcome) = match &result {
        Ok(outcome) => (outcome.usage, outcome.answered_by.clone()),
        Err(error) => (Usage::default(), format!("error: {error}")),
    };
    entries.push(Entry::Turn {
        at_ms,
        usage,
        outcome,
    });
    lock(&inner.usage)
        .entry(key.to_string())
        .or_default()
        .add(usage);
    trim_history(history, inner.history_limit);

    persist(inner, key, entries).await?;
    result.map(Some)
}

async fn persist(inner: &Shared, key: &str, entries: Vec<Entry>) -> Result<(), AgentError> {
    let Some(store) = inner.store.clone() else {
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
/// `why`, so the history stays one a provider accepts.
fn answer_dangling_calls(history: &mut Vec<ChatMessage>, why: &str) {
    let Some(last) = history.last() else {
        return;
    };
    if last.role != clawcage_core::Role::Assistant {
        return;
    }
    let results: Vec<clawcage_core::ContentBlock> = last
        .tool_uses()
        .map(|(id, _, _)| clawcage_core::ContentBlock::ToolResult {
            tool_use_id: id.to_string(),
            content: why.to_string(),
            is_error: true,
        })
        .collect();
    if !results.is_empty() {
        history.push(ChatMessage {
            role: clawcage_core::Role::User,
            content: results,
        });
    }
}
