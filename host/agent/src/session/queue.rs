//! What happens to a message that reaches a busy session. A session's waiting work is a
//! [`QueueState`]: plain data (entries in admission order, the running job, the overflow notes, the
//! session's `/queue` override) changed only by the methods here, which hold the whole policy —
//! the four [`QueueMode`]s, the cap and its [`DropPolicy`], the collect batches and their quiet
//! window — and are tested without a runtime. Where that state lives is the [`LaneQueue`] trait
//! (three methods: change atomically, read, watch for changes); [`InMemoryLaneQueue`] is the
//! default, and a distributed backend replaces it without touching the lanes, the loop or the
//! front ends. The callbacks of a submission (its reply and observer) never enter the state: the
//! lanes keep them by ticket.
//!
//! Here: the state and its policy (over 700 lines: [`QueueState`]'s methods are the whole
//! policy, kept in one place); `settings` the modes and settings; `command` the `/queue`
//! parser; `tests` the policy's tests.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use clawcage_core::InboundMessage;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

mod command;
mod settings;
#[cfg(test)]
mod tests;

pub use command::{
    QUEUE_USAGE, QueueCommand, QueueUsageError, parse_duration_ms, parse_queue_command,
};
pub use settings::{
    DEFAULT_CAP, DEFAULT_DEBOUNCE_MS, DropPolicy, MAX_CAP, MAX_DEBOUNCE_MS, QueueConfig, QueueMode,
    QueueOverride, QueueSettings, SUMMARY_CHARS,
};

/// Where a user message came from: messages of different channels or threads are never
/// collected into one turn, and `[queue.by_channel]` picks the mode by channel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Origin {
    /// The channel, e.g. `telegram`.
    pub channel: Option<String>,
    /// The thread within the channel.
    pub thread: Option<String>,
}

impl Origin {
    /// The origin a session key names: `agent:<agentId>:<channel>:<peer>` gives the channel;
    /// other keys name none.
    pub fn of_key(key: &str) -> Origin {
        let mut parts = key.split(':');
        let channel = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("agent"), Some(_), Some(channel), Some(_)) if !channel.is_empty() => {
                Some(channel.to_string())
            }
            _ => None,
        };
        Origin {
            channel,
            thread: None,
        }
    }
}

/// A submission that could not be admitted, or an admitted one that left the queue without
/// running. Its sender always hears it (as [`Admission::Dropped`] or from the pending turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DropReason {
    /// `drop = new`: the queue was full, so the new message was refused.
    #[error(
        "not queued: the session already has {cap} messages waiting (queue cap {cap}, drop = new); wait for the agent to finish, or raise the cap (/queue <mode> cap:N)"
    )]
    QueueFull {
        /// The cap.
        cap: usize,
    },
    /// `drop = old`: the queue was full and this was its oldest message.
    #[error(
        "dropped: the queue was full (cap {cap}, drop = old) and this was its oldest message; send it again if it still matters"
    )]
    Evicted {
        /// The cap.
        cap: usize,
    },
    /// `drop = summarize`: evicted as the oldest, with a one-line summary kept for the agent.
    #[error(
        "dropped: the queue was full (cap {cap}, drop = summarize); a one-line summary of it goes to the agent with the next message"
    )]
    Summarized {
        /// The cap.
        cap: usize,
    },
    /// `interrupt`: a newer message from the same channel replaced it before it ran.
    #[error(
        "dropped: a newer message (queue mode interrupt) replaced it before it ran; send it again if it still matters"
    )]
    Superseded,
    /// The queue's backend did not answer.
    #[error("not queued: the session's queue is unavailable; try again")]
    Unavailable,
    /// The session's inbox could not record it, so it was not taken.
    #[error(
        "not queued: the session's inbox cannot record it: {why}. Nothing was taken: send it again once that is fixed"
    )]
    NotRecorded {
        /// What the inbox said.
        why: String,
    },
}

/// What became of a submission, decided when it arrived (before any await).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Admission {
    /// The session was idle: the message starts a turn now.
    Started,
    /// Waiting behind the running turn; `position` 1 runs next.
    Queued {
        /// Place in the queue, from 1.
        position: usize,
    },
    /// Handed to the running turn: it enters at the next safe point (between tool calls,
    /// before the next model call), or starts the next turn if that turn has already answered.
    Steered,
    /// `interrupt`: the running turn is being stopped; this message runs after it, at
    /// `position` in the queue.
    Interrupting {
        /// Place in the queue, from 1.
        position: usize,
    },
    /// Refused; the pending turn ends with the same reason.
    Dropped {
        /// Why.
        reason: DropReason,
    },
}

/// The work of one queue entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum QueuedJob {
    /// A user's message.
    User {
        /// The text.
        text: String,
        /// Where it came from.
        origin: Origin,
    },
    /// A notification (a sub-agent's result, a cron firing): always its own turn.
    Notification {
        /// The message.
        message: InboundMessage,
    },
    /// Clear the history.
    Reset,
    /// Compact the history now (`/compact`).
    Compact,
}

/// One admitted submission, waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    /// Its ticket: unique in the session, increasing in admission order.
    pub ticket: u64,
    /// What to do.
    pub job: QueuedJob,
    /// The mode that applied when it arrived (notifications and resets: `followup`).
    pub mode: QueueMode,
    /// Its quiet window, for `collect`.
    pub debounce_ms: u64,
    /// When it arrived, in milliseconds since the Unix epoch.
    pub arrived_ms: u64,
}

impl Queued {
    fn user_origin(&self) -> Option<&Origin> {
        match &self.job {
            QueuedJob::User { origin, .. } => Some(origin),
            _ => None,
        }
    }

    fn is_steer_user(&self) -> bool {
        self.mode == QueueMode::Steer && self.user_origin().is_some()
    }

    fn text(&self) -> String {
        match &self.job {
            QueuedJob::User { text, .. } => text.clone(),
            QueuedJob::Notification { message } => super::notification_text(message),
            QueuedJob::Reset | QueuedJob::Compact => String::new(),
        }
    }
}

/// Why a running turn is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// The operator (Ctrl-C in `chat`).
    Operator,
    /// A message in `interrupt` mode.
    NewMessage,
}

impl StopCause {
    /// The result given to a tool call the stopped turn left without one.
    pub fn dangling_call_result(self) -> &'static str {
        match self {
            StopCause::Operator => {
                "interrupted by the user before it finished (it may have partly run)"
            }
            StopCause::NewMessage => {
                "interrupted by a new message before it finished (it may have partly run)"
            }
        }
    }
}

/// The job a lane is running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// Admitted as [`Admission::Started`] and not yet picked up by the lane.
    pub start: Option<Queued>,
    /// Set when the job is asked to stop.
    pub stop: Option<StopCause>,
    /// Whether steered messages can still enter it (false for a reset, and once the turn has
    /// answered).
    pub accepts_steer: bool,
}

/// What a lane does next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NextJob {
    /// Nothing waits.
    #[default]
    Idle,
    /// A `collect` batch waits for its quiet window to end (milliseconds since the epoch).
    WaitUntil {
        /// When to look again.
        at_ms: u64,
    },
    /// Run this.
    Run(LaneJob),
}

/// A job taken from the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneJob {
    /// The submissions it answers, oldest first (several for a collected turn).
    pub tickets: Vec<u64>,
    /// What to do.
    pub work: LaneWork,
}

/// What a job does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaneWork {
    /// Clear the history.
    Reset,
    /// Compact the history.
    Compact,
    /// Run a turn on this text.
    Turn {
        /// The user message's text.
        text: String,
    },
}

/// What [`QueueState::admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The submission's ticket.
    pub ticket: u64,
    /// What became of it.
    pub admission: Admission,
    /// Earlier submissions that left the queue because of it, with why.
    pub evicted: Vec<(u64, DropReason)>,
}

impl Default for Admitted {
    fn default() -> Self {
        Self {
            ticket: 0,
            admission: Admission::Dropped {
                reason: DropReason::Unavailable,
            },
            evicted: Vec::new(),
        }
    }
}

/// One session's queue: plain data, changed only through its methods.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    waiting: VecDeque<Queued>,
    running: Option<Running>,
    next_ticket: u64,
    /// One line per message dropped under `summarize`, not yet shown to the agent.
    overflow: Vec<String>,
    session_override: Option<QueueOverride>,
    /// User entries in `waiting`.
    users_waiting: usize,
    /// Entries in `waiting` that are not user messages in `steer` mode.
    others_waiting: usize,
    /// Moves on every change, so watchers wake only when something changed.
    revision: u64,
}

impl QueueState {
    /// Moves on every change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Submissions waiting (not the running one).
    pub fn waiting(&self) -> impl Iterator<Item = &Queued> {
        self.waiting.iter()
    }

    /// Whether a job is running (or admitted to start).
    pub fn is_busy(&self) -> bool {
        self.running.is_some()
    }

    /// The session's override.
    pub fn session_override(&self) -> Option<QueueOverride> {
        self.session_override
    }

    /// Set or remove the session's override.
    pub fn set_session_override(&mut self, value: Option<QueueOverride>) {
        self.session_override = value;
        self.touch();
    }

    /// The settings for a user message from `origin`: the session's override, else the
    /// channel's mode, else the configuration.
    pub fn settings_for(&self, origin: &Origin, config: &QueueConfig) -> QueueSettings {
        let mut settings = config.settings;
        if let Some(mode) = origin
            .channel
            .as_ref()
            .and_then(|channel| config.by_channel.get(channel))
        {
            settings.mode = *mode;
        }
        if let Some(session) = self.session_override {
            settings.mode = session.mode;
            settings.debounce_ms = session.debounce_ms.unwrap_or(settings.debounce_ms);
            settings.cap = session.cap.unwrap_or(settings.cap);
            settings.drop = session.drop.unwrap_or(settings.drop);
        }
        settings
    }

    fn touch(&mut self) {
        self.revision = self.revision.wrapping_add(1);
    }

    fn push(&mut self, entry: Queued) {
        if entry.user_origin().is_some() {
            self.users_waiting += 1;
        }
        if !entry.is_steer_user() {
            self.others_waiting += 1;
        }
        self.waiting.push_back(entry);
    }

    fn remove_at(&mut self, index: usize) -> Option<Queued> {
        let entry = self.waiting.remove(index)?;
        if entry.user_origin().is_some() {
            self.users_waiting -= 1;
        }
        if !entry.is_steer_user() {
            self.others_waiting -= 1;
        }
        Some(entry)
    }

    /// Admit a submission arriving at `now_ms`. Takes its ticket, decides what becomes of it
    /// (and of earlier ones it displaces) and, for `interrupt`, asks the running job to stop.
    pub fn admit(&mut self, job: QueuedJob, config: &QueueConfig, now_ms: u64) -> Admitted {
        self.touch();
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let settings = match &job {
            QueuedJob::User { origin, .. } => Some(self.settings_for(origin, config)),
            _ => None,
        };
        let entry = Queued {
            ticket,
            mode: settings.map_or(QueueMode::Followup, |settings| settings.mode),
            debounce_ms: settings.map_or(0, |settings| settings.debounce_ms),
            arrived_ms: now_ms,
            job,
        };
        let mut evicted = Vec::new();
        if settings.is_some_and(|settings| settings.mode == QueueMode::Interrupt) {
            self.supersede(&entry, &mut evicted);
        }
        if self.running.is_none() && self.waiting.is_empty() {
            let accepts_steer = !matches!(entry.job, QueuedJob::Reset | QueuedJob::Compact);
            self.running = Some(Running {
                start: Some(entry),
                stop: None,
                accepts_steer,
            });
            return Admitted {
                ticket,
                admission: Admission::Started,
                evicted,
            };
        }
        let Some(settings) = settings else {
            self.push(entry);
            return Admitted {
                ticket,
                admission: Admission::Queued {
                    position: self.waiting.len(),
                },
                evicted,
            };
        };
        if self.users_waiting >= settings.cap {
            if settings.drop == DropPolicy::New {
                return Admitted {
                    ticket,
                    admission: Admission::Dropped {
                        reason: DropReason::QueueFull { cap: settings.cap },
                    },
                    evicted,
                };
            }
            while self.users_waiting >= settings.cap {
                let Some(index) = self
                    .waiting
                    .iter()
                    .position(|queued| queued.user_origin().is_some())
                else {
                    break;
                };
                let Some(oldest) = self.remove_at(index) else {
                    break;
                };
                let reason = if settings.drop == DropPolicy::Summarize {
                    self.overflow.push(summary_line(&oldest.text()));
                    DropReason::Summarized { cap: settings.cap }
                } else {
                    DropReason::Evicted { cap: settings.cap }
                };
                evicted.push((oldest.ticket, reason));
            }
        }
        let steered = settings.mode == QueueMode::Steer
            && self.others_waiting == 0
            && self
                .running
                .as_ref()
                .is_some_and(|running| running.accepts_steer && running.stop.is_none());
        let mode = entry.mode;
        self.push(entry);
        let position = self.waiting.len();
        let admission = match mode {
            _ if steered => Admission::Steered,
            QueueMode::Interrupt => Admission::Interrupting { position },
            _ => Admission::Queued { position },
        };
        Admitted {
            ticket,
            admission,
            evicted,
        }
    }

    /// `interrupt`: drop the user messages from `entry`'s origin that have not started, and
    /// ask the running job to stop.
    fn supersede(&mut self, entry: &Queued, evicted: &mut Vec<(u64, DropReason)>) {
        let origin = entry.user_origin();
        let mut index = 0;
        while index < self.waiting.len() {
            if self.waiting[index].user_origin().is_some()
                && self.waiting[index].user_origin() == origin
            {
                if let Some(old) = self.remove_at(index) {
                    evicted.push((old.ticket, DropReason::Superseded));
                }
            } else {
                index += 1;
            }
        }
        if let Some(running) = self.running.as_mut() {
            let superseded_start = running.start.as_ref().is_some_and(|start| {
                start.user_origin().is_some() && start.user_origin() == origin
            });
            if superseded_start {
                if let Some(start) = running.start.take() {
                    evicted.push((start.ticket, DropReason::Superseded));
                }
                // Nothing ran: the lane picks up the queue (this message) instead.
                self.running = None;
            } else {
                running.stop = Some(StopCause::NewMessage);
            }
        }
    }

    /// A turn left open by a stopped process is taken up again: it runs before anything
    /// queued and takes steered messages like any running turn. Returns tickets for its
    /// `inputs` (the submissions it answers).
    pub fn resume(&mut self, inputs: usize) -> Vec<u64> {
        let first = self.next_ticket;
        self.next_ticket += inputs as u64;
        self.running = Some(Running {
            start: None,
            stop: None,
            accepts_steer: true,
        });
        self.touch();
        (first..self.next_ticket).collect()
    }

    /// Ask the running job to stop (the operator's Ctrl-C). False when nothing runs.
    pub fn stop(&mut self, cause: StopCause) -> bool {
        match self.running.as_mut() {
            Some(running) => {
                running.stop = Some(cause);
                self.touch();
                true
            }
            None => false,
        }
    }

    /// Whether the running job was asked to stop, and why.
    pub fn stop_requested(&self) -> Option<StopCause> {
        self.running.as_ref().and_then(|running| running.stop)
    }

    /// The running turn has answered: later steered messages start the next turn instead.
    pub fn turn_answered(&mut self) {
        if let Some(running) = self.running.as_mut()
            && running.accepts_steer
        {
            running.accepts_steer = false;
            self.touch();
        }
    }

    /// At a safe point of the running turn: take the steered messages waiting at the front of
    /// the queue, as the text to append (with the overflow note, if any) and their tickets.
    pub fn take_steered(&mut self) -> Option<(Vec<u64>, String)> {
        let running = self.running.as_ref()?;
        if !running.accepts_steer || running.stop.is_some() {
            return None;
        }
        let mut tickets = Vec::new();
        let mut texts = Vec::new();
        while self.waiting.front().is_some_and(Queued::is_steer_user) {
            let Some(entry) = self.remove_at(0) else {
                break;
            };
            tickets.push(entry.ticket);
            texts.push(entry.text());
        }
        if tickets.is_empty() {
            return None;
        }
        self.touch();
        let text = self.with_overflow_note(texts.join("\n\n"));
        Some((tickets, text))
    }

    /// The running job ended; take the next one (or say how long a `collect` batch still
    /// waits).
    pub fn next_job(&mut self, now_ms: u64) -> NextJob {
        if let Some(start) = self
            .running
            .as_mut()
            .and_then(|running| running.start.take())
        {
            self.touch();
            return NextJob::Run(self.job_of(vec![start], false));
        }
        if self.running.take().is_some() {
            self.touch();
        }
        let Some(head) = self.waiting.front() else {
            return NextJob::Idle;
        };
        let collected = head.mode == QueueMode::Collect && head.user_origin().is_some();
        let batch: Vec<usize> = if collected {
            let origin = head.user_origin().cloned();
            let mut batch = Vec::new();
            for (index, entry) in self.waiting.iter().enumerate() {
                match entry.user_origin() {
                    Some(from) if Some(from) == origin.as_ref() => {
                        if entry.mode != QueueMode::Collect {
                            break;
                        }
                        batch.push(index);
                    }
                    // Another channel's messages keep their place.
                    Some(_) => {}
                    None => break,
                }
            }
            let quiet_at = batch
                .iter()
                .map(|&index| {
                    let entry = &self.waiting[index];
                    entry.arrived_ms.saturating_add(entry.debounce_ms)
                })
                .max()
                .unwrap_or(now_ms);
            if now_ms < quiet_at {
                return NextJob::WaitUntil { at_ms: quiet_at };
            }
            batch
        } else {
            vec![0]
        };
        let mut entries = Vec::with_capacity(batch.len());
        for index in batch.into_iter().rev() {
            if let Some(entry) = self.remove_at(index) {
                entries.push(entry);
            }
        }
        entries.reverse();
        self.touch();
        let accepts_steer = entries
            .first()
            .is_some_and(|entry| !matches!(entry.job, QueuedJob::Reset | QueuedJob::Compact));
        self.running = Some(Running {
            start: None,
            stop: None,
            accepts_steer,
        });
        NextJob::Run(self.job_of(entries, collected))
    }

    /// The job of `entries`; `collected`: a `collect` batch, whose text lists each message.
    fn job_of(&mut self, entries: Vec<Queued>, collected: bool) -> LaneJob {
        let tickets = entries.iter().map(|entry| entry.ticket).collect();
        let work = match entries.first() {
            None => LaneWork::Turn {
                text: String::new(),
            },
            Some(first) => match &first.job {
                QueuedJob::Reset => LaneWork::Reset,
                QueuedJob::Compact => LaneWork::Compact,
                QueuedJob::Notification { .. } => LaneWork::Turn { text: first.text() },
                QueuedJob::User { .. } => {
                    let text = if collected {
                        collect_text(entries.iter().map(Queued::text))
                    } else {
                        first.text()
                    };
                    LaneWork::Turn {
                        text: self.with_overflow_note(text),
                    }
                }
            },
        };
        LaneJob { tickets, work }
    }

    fn with_overflow_note(&mut self, text: String) -> String {
        if self.overflow.is_empty() {
            return text;
        }
        let dropped = std::mem::take(&mut self.overflow);
        let mut note = format!(
            "[Queue overflow] Dropped {} {} while the agent was busy; one line from each:",
            dropped.len(),
            if dropped.len() == 1 {
                "message"
            } else {
                "messages"
            }
        );
        for line in dropped {
            note.push_str("\n- ");
            note.push_str(&line);
        }
        format!("{note}\n\n{text}")
    }
}

/// The text of a `collect` turn: a header, then each message as a `Queued #N` block.
pub fn collect_text(texts: impl IntoIterator<Item = String>) -> String {
    let mut text = String::from("[Queued messages while the agent was busy]");
    for (index, message) in texts.into_iter().enumerate() {
        text.push_str(&format!("\n\n---\nQueued #{}\n{message}", index + 1));
    }
    text
}

/// `text` on one line (whitespace runs become one space), cut to [`SUMMARY_CHARS`]
/// characters with an ellipsis.
pub fn summary_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= SUMMARY_CHARS {
        return flat;
    }
    let mut cut: String = flat.chars().take(SUMMARY_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Where the sessions' queues live. Every change of a session's [`QueueState`] goes through
/// [`LaneQueue::update`], which runs it with no other change of the same session in between;
/// lanes wait for work with [`LaneQueue::watch`]. It is synchronous because a submission takes
/// its ticket before any await, so arrival order is admission order.
pub trait LaneQueue: Send + Sync + fmt::Debug {
    /// Run `change` exactly once on session `key`'s state (created empty if new), atomically;
    /// wake the watchers of `key` when its revision moved.
    fn update(&self, key: &str, change: &mut dyn FnMut(&mut QueueState));
    /// Run `look` exactly once on session `key`'s state without changing it.
    fn read(&self, key: &str, look: &mut dyn FnMut(&QueueState));
    /// A receiver that sees a new value after every change of session `key`'s state.
    fn watch(&self, key: &str) -> watch::Receiver<u64>;
}

/// Change `key`'s state with `change` and return its result (its default if the backend never
/// ran it).
pub fn with_state<R: Default>(
    queue: &dyn LaneQueue,
    key: &str,
    change: impl FnOnce(&mut QueueState) -> R,
) -> R {
    let mut change = Some(change);
    let mut result = None;
    queue.update(key, &mut |state| {
        if let Some(change) = change.take() {
            result = Some(change(state));
        }
    });
    result.unwrap_or_default()
}

/// Look at `key`'s state with `look` and return its result (its default if the backend never
/// ran it).
pub fn read_state<R: Default>(
    queue: &dyn LaneQueue,
    key: &str,
    look: impl FnOnce(&QueueState) -> R,
) -> R {
    let mut look = Some(look);
    let mut result = None;
    queue.read(key, &mut |state| {
        if let Some(look) = look.take() {
            result = Some(look(state));
        }
    });
    result.unwrap_or_default()
}

/// The queues in this process's memory, one mutex over all sessions.
#[derive(Debug, Default)]
pub struct InMemoryLaneQueue {
    slots: Mutex<HashMap<String, Slot>>,
}

#[derive(Debug)]
struct Slot {
    state: QueueState,
    version: watch::Sender<u64>,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: QueueState::default(),
            version: watch::Sender::new(0),
        }
    }
}

impl InMemoryLaneQueue {
    /// Empty queues.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_slot<R>(&self, key: &str, work: impl FnOnce(&mut Slot) -> R) -> R {
        let mut slots = super::lock(&self.slots);
        match slots.get_mut(key) {
            Some(slot) => work(slot),
            None => work(slots.entry(key.to_string()).or_insert_with(Slot::new)),
        }
    }
}

impl LaneQueue for InMemoryLaneQueue {
    fn update(&self, key: &str, change: &mut dyn FnMut(&mut QueueState)) {
        self.with_slot(key, |slot| {
            let before = slot.state.revision;
            change(&mut slot.state);
            if slot.state.revision != before {
                slot.version
                    .send_modify(|version| *version = version.wrapping_add(1));
            }
        });
    }

    fn read(&self, key: &str, look: &mut dyn FnMut(&QueueState)) {
        self.with_slot(key, |slot| look(&slot.state));
    }

    fn watch(&self, key: &str) -> watch::Receiver<u64> {
        self.with_slot(key, |slot| slot.version.subscribe())
    }
}
