//! A session's lane at work: the task that drains its queue, the turn it runs with each step
//! journaled to the transcript as it happens (the journal sink), the commit of the turn, a
//! compaction asked for, and the results a stopped turn's dangling tool calls get.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use clawcage_core::{ChatMessage, ContentBlock, Role, Usage};
use tokio::sync::watch;

use super::queue::{LaneJob, LaneWork, NextJob, StopCause, read_state, with_state};
use super::recovery::{ResumePlan, resume_turn};
use super::{CURRENT_SESSION, LaneQueue, LaneReply, QueueEvent, Shared, lock};
use crate::agent_loop::{AgentError, Steering, TurnEnd, TurnObserver, TurnOutcome};
use crate::budget::charged_to;
use crate::compaction::{Journaled, TurnJournal};
use crate::transcript::{Entry, Loaded, TranscriptStore, now_ms, push_message, trim_history};

/// The result a tool call gets when its turn stopped because a step could not be recorded.
const JOURNAL_FAILED_CALL: &str =
    "not run: the turn stopped because its steps could not be recorded";

pub(super) async fn run_lane(shared: Arc<Shared>, key: String, open: watch::Receiver<bool>) {
    let mut halted = shared.halted.subscribe();
    if *halted.borrow_and_update() {
        return;
    }
    tokio::select! {
        () = lane(&shared, &key, open) => {}
        // Halted: the running job is dropped where it stands (its steps are journaled).
        _ = halted.wait_for(|halted| *halted) => {
            tracing::info!(session = %key, "the lane stops; what it was doing resumes at the next start");
        }
    }
}

async fn lane(shared: &Arc<Shared>, key: &str, mut open: watch::Receiver<bool>) {
    let (shared, key) = (shared.clone(), key.to_string());
    let plan = lock(&shared.resuming).remove(&key);
    let mut history = match plan {
        Some(plan) => {
            let ResumePlan {
                loaded,
                tickets,
                stop,
            } = plan;
            let open_turn = loaded.open.clone();
            let mut history = adopt_history(&shared, &key, loaded);
            if let Some(open_turn) = open_turn {
                resume_turn(&shared, &key, &mut history, open_turn, tickets, stop).await;
            }
            history
        }
        None => load_history(&shared, &key).await,
    };
    let mut changes = shared.queue.watch(&key);
    let mut closing = false;
    loop {
        changes.borrow_and_update();
        let next = if lock(&shared.held).contains(&key) {
            // Held for a hand-over: nothing more starts here.
            NextJob::Idle
        } else {
            with_state(shared.queue.as_ref(), &key, |state| {
                state.next_job(now_ms())
            })
        };
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

/// The history and usage of a loaded transcript become the lane's.
fn adopt_history(shared: &Shared, key: &str, loaded: Loaded) -> Vec<ChatMessage> {
    if let Some(budget) = shared.budget.get() {
        budget.seed(key, loaded.usage.total());
    }
    lock(&shared.usage).insert(key.to_string(), loaded.usage);
    loaded.messages
}

async fn load_history(shared: &Shared, key: &str) -> Vec<ChatMessage> {
    let Some(store) = shared.store.clone() else {
        return Vec::new();
    };
    let (load_key, limit) = (key.to_string(), shared.history_limit);
    match tokio::task::spawn_blocking(move || store.load(&load_key, limit)).await {
        Ok(Ok(loaded)) => adopt_history(shared, key, loaded),
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
            commit(shared, key, vec![Entry::Reset { at_ms: now_ms() }])
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
            let inputs = shared.ids_of(key, &tickets);
            let reply = run_one(
                shared,
                key,
                history,
                text,
                inputs,
                observer.as_ref(),
                &steering,
            )
            .await;
            tickets.extend(lock(&steering.taken).drain(..));
            reply
        }
    };
    shared.answer(key, &tickets, &reply);
}

/// The running turn's view of its queue: steered messages, taken at the loop's safe points.
pub(super) struct LaneSteering<'a> {
    pub(super) shared: &'a Shared,
    pub(super) key: &'a str,
    pub(super) taken: Mutex<Vec<u64>>,
}

impl Steering for LaneSteering<'_> {
    fn take(&self) -> Option<String> {
        let (tickets, text) = with_state(self.shared.queue.as_ref(), self.key, |state| {
            state.take_steered()
        })?;
        // The journal says which inputs the message that follows answers.
        let inputs = self.shared.ids_of(self.key, &tickets);
        if let Some(store) = &self.shared.store
            && let Err(error) = store.append_steps(
                self.key,
                &[Entry::Joined {
                    at_ms: now_ms(),
                    inputs,
                }],
            )
        {
            tracing::warn!(session = %self.key, %error, "cannot journal a steered message");
        }
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
    // A compaction is a model call: a spent budget refuses it as it refuses a turn.
    if let Some(budget) = shared.budget.get() {
        budget.check(Some(key)).map_err(AgentError::Budget)?;
    }
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
    commit(
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

/// The lane's turn journal: each step goes to the transcript as it is recorded.
pub(super) struct JournalSink {
    store: Option<Arc<dyn TranscriptStore>>,
    key: String,
    /// Tokens the recorded steps used.
    usage: Usage,
    /// The first step that could not be written.
    failed: Option<String>,
}

impl JournalSink {
    pub(super) fn new(shared: &Shared, key: &str) -> Self {
        Self {
            store: shared.store.clone(),
            key: key.to_string(),
            usage: Usage::default(),
            failed: None,
        }
    }

    pub(super) fn write(&mut self, entries: &[Entry]) {
        if let Some(store) = &self.store
            && let Err(error) = store.append_steps(&self.key, entries)
            && self.failed.is_none()
        {
            tracing::error!(session = %self.key, %error, "cannot journal a step of the turn");
            self.failed = Some(error.to_string());
        }
    }
}

impl TurnJournal for JournalSink {
    fn record(&mut self, item: Journaled) {
        let at_ms = now_ms();
        let entry = match item {
            Journaled::Message(message) => Entry::Message { at_ms, message },
            Journaled::ToolStarted { tool_use_id } => Entry::ToolStarted { at_ms, tool_use_id },
            Journaled::ToolResult(result) => Entry::ToolResult { at_ms, result },
            Journaled::Compacted(compaction) => Entry::compaction(at_ms, &compaction, false),
            Journaled::Used(used) => {
                self.usage.add(used);
                Entry::Used { at_ms, usage: used }
            }
        };
        self.write(&[entry]);
    }

    fn failure(&self) -> Option<String> {
        self.failed.clone()
    }
}

async fn run_one(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    text: String,
    inputs: Vec<String>,
    observer: &dyn TurnObserver,
    steering: &dyn Steering,
) -> LaneReply {
    if let Some(budget) = shared.budget.get() {
        budget.check(Some(key)).map_err(AgentError::Budget)?;
    }
    let input = ChatMessage::user(text);
    push_message(history, input.clone());
    let mut sink = JournalSink::new(shared, key);
    let at_ms = now_ms();
    sink.write(&[
        Entry::Start { at_ms, inputs },
        Entry::Message {
            at_ms,
            message: input,
        },
    ]);
    let result = run_steps(shared, key, history, observer, steering, &mut sink).await;
    finish_turn(
        shared,
        key,
        history,
        observer,
        sink,
        Usage::default(),
        result,
    )
    .await
}

/// Run the model and tools on `history` until the turn ends or is asked to stop; a tool call
/// a stopped turn left without a result gets one saying so.
pub(super) async fn run_steps(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    observer: &dyn TurnObserver,
    steering: &dyn Steering,
    sink: &mut JournalSink,
) -> Result<TurnOutcome, AgentError> {
    let (result, stopped) = {
        let turn = CURRENT_SESSION.scope(
            key.to_string(),
            charged_to(
                key.to_string(),
                shared
                    .agent
                    .run_turn_journaled(history, observer, steering, sink),
            ),
        );
        tokio::select! {
            result = turn => (result, None),
            cause = stop_requested(shared.queue.as_ref(), key) => (Err(AgentError::Interrupted), Some(cause)),
        }
    };
    with_state(shared.queue.as_ref(), key, |state| state.turn_answered());
    if let Some(cause) = stopped {
        let why = cause.dangling_call_result();
        for answer in answer_dangling_calls(history, |_| why.to_string()) {
            sink.record(Journaled::ToolResult(answer));
        }
    } else if let Err(AgentError::Journal(_)) = &result {
        // The calls were not run; the history kept here must stay one a provider accepts.
        for answer in answer_dangling_calls(history, |_| JOURNAL_FAILED_CALL.to_string()) {
            sink.record(Journaled::ToolResult(answer));
        }
    }
    result
}

/// Commit the turn: its `turn` line with what it used (`before`: what its steps used before
/// a resume) and how it ended.
pub(super) async fn finish_turn(
    shared: &Shared,
    key: &str,
    history: &mut Vec<ChatMessage>,
    observer: &dyn TurnObserver,
    sink: JournalSink,
    before: Usage,
    result: Result<TurnOutcome, AgentError>,
) -> LaneReply {
    // What the turn used, also when it failed or was stopped part-way.
    let mut usage = before;
    usage.add(sink.usage);
    let outcome = match &result {
        Ok(outcome) => outcome.answered_by.clone(),
        Err(error) => format!("error: {error}"),
    };
    lock(&shared.usage)
        .entry(key.to_string())
        .or_default()
        .add(sink.usage);
    tell_budget_notices(shared, key, observer);
    trim_history(history, shared.history_limit);
    if let Some(failed) = sink.failed {
        return Err(shared.transcript_error(key, failed));
    }
    commit(
        shared,
        key,
        vec![Entry::Turn {
            at_ms: now_ms(),
            usage,
            outcome,
        }],
    )
    .await?;
    result.map(Some)
}

async fn commit(shared: &Shared, key: &str, entries: Vec<Entry>) -> Result<(), AgentError> {
    let Some(store) = shared.store.clone() else {
        return Ok(());
    };
    let committing = key.to_string();
    let written = tokio::task::spawn_blocking(move || store.commit(&committing, &entries)).await;
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(shared.transcript_error(key, error.to_string())),
        Err(error) => Err(shared.transcript_error(key, error.to_string())),
    }
}

/// Give every tool call of the last assistant message that has no result yet a result saying
/// `why(id)`, so the history stays one a provider accepts; returns the results added.
pub(super) fn answer_dangling_calls(
    history: &mut Vec<ChatMessage>,
    why: impl Fn(&str) -> String,
) -> Vec<ContentBlock> {
    let Some(asked) = history
        .iter()
        .rposition(|message| message.role == Role::Assistant)
    else {
        return Vec::new();
    };
    let answered: HashSet<String> = history[asked + 1..]
        .iter()
        .flat_map(|message| message.content.iter())
        .filter_map(|block| match block {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
            _ => None,
        })
        .collect();
    let results: Vec<ContentBlock> = history[asked]
        .tool_uses()
        .filter(|(id, _, _)| !answered.contains(*id))
        .map(|(id, _, _)| ContentBlock::ToolResult {
            tool_use_id: id.to_string(),
            content: why(id),
            is_error: true,
        })
        .collect();
    for result in &results {
        push_message(
            history,
            ChatMessage {
                role: Role::User,
                cut: None,
                content: vec![result.clone()],
            },
        );
    }
    results
}
