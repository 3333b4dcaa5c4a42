//! The one event vocabulary every front end renders: an [`AgentEvent`] `{runId, seq, stream, ts,
//! data, sessionKey}` on one of six [`Stream`]s (`lifecycle`, `assistant`, `reasoning`, `tool`,
//! `compaction`, `error`). [`EventObserver`] is a [`TurnObserver`] that turns what a turn does
//! into such events on a channel, and the `AgentEvent::run_*` constructors give the lifecycle
//! events a front end emits around a turn, so a terminal, the gateway's WebSocket and ACP all see
//! the same shapes. [`EventLog`] keeps each session's events in order with a strictly increasing
//! `seq` and feeds its followers (the scale-out seam, asynchronous, with appends fenced by the
//! writer's [`Epoch`]: [`DiskEventLog`], bounded files in the state directory with an in-memory
//! fan-out, is the in-process implementation; a distributed one replaces it behind the trait).

mod disk;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agent_loop::{AgentError, TurnEnd, TurnObserver, TurnOutcome, Verdict};
use crate::compaction::Compaction;
use crate::provider::ProviderEvents;
use crate::transcript::now_ms;
use clawcage_core::{ToolCall, Usage};

pub use disk::{DEFAULT_SEGMENT_BYTES, DEFAULT_SEGMENT_EVENTS, DiskEventLog};

/// The most characters of a tool's output an event carries (the model gets all of it).
pub const TOOL_OUTPUT_EXCERPT_CHARS: usize = 2_000;

/// Tool arguments larger than this (as JSON text) are sent as a cut preview.
pub const TOOL_ARGS_MAX_CHARS: usize = 8_000;

/// Which part of a run an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// The run started, ended or failed; notes from the loop; session resets.
    Lifecycle,
    /// The model's text as it streams.
    Assistant,
    /// The model's reasoning, apart from its answer (`{delta}` like `assistant`).
    Reasoning,
    /// A tool call started or ended (with its verdict).
    Tool,
    /// The history was compacted: older messages replaced by a summary.
    Compaction,
    /// A provider request failed and is retried, or the chain fails over.
    Error,
}

impl Stream {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Lifecycle => "lifecycle",
            Stream::Assistant => "assistant",
            Stream::Reasoning => "reasoning",
            Stream::Tool => "tool",
            Stream::Compaction => "compaction",
            Stream::Error => "error",
        }
    }
}

/// One event of one run of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentEvent {
    /// The run (one turn) it belongs to; empty for session-level events such as a reset.
    pub run_id: String,
    /// Its position in the session's event log, from 1, strictly increasing. 0 until the
    /// session's owner numbers it (see [`EventLog`]).
    pub seq: u64,
    /// Which part of the run.
    pub stream: Stream,
    /// Milliseconds since the Unix epoch.
    pub ts: u64,
    /// The stream's payload (see `docs/gateway-protocol.md`).
    pub data: Value,
    /// The session.
    pub session_key: String,
}

impl AgentEvent {
    /// An event not yet given its `seq`.
    pub fn new(session_key: &str, run_id: &str, stream: Stream, data: Value) -> Self {
        Self {
            run_id: run_id.to_string(),
            seq: 0,
            stream,
            ts: now_ms(),
            data,
            session_key: session_key.to_string(),
        }
    }

    /// `lifecycle {phase: "start"}`: the run begins on `input` (`kind` is `user` or
    /// `notification`; `sender` names a notification's origin).
    pub fn run_started(
        session_key: &str,
        run_id: &str,
        kind: &str,
        input: &str,
        sender: Option<&str>,
    ) -> Self {
        let mut data = json!({"phase": "start", "kind": kind, "message": input});
        if let Some(sender) = sender {
            data["sender"] = Value::String(sender.to_string());
        }
        Self::new(session_key, run_id, Stream::Lifecycle, data)
    }

    /// `lifecycle {phase: "end"}`: the run ended with `outcome`.
    pub fn run_ended(session_key: &str, run_id: &str, outcome: &TurnOutcome) -> Self {
        let end = match &outcome.end {
            TurnEnd::Answered => "answered",
            TurnEnd::IterationLimit => "iteration_limit",
            TurnEnd::LoopDetected { .. } => "loop_detected",
            TurnEnd::NoAnswer => "no_answer",
        };
        Self::new(
            session_key,
            run_id,
            Stream::Lifecycle,
            json!({
                "phase": "end",
                "end": end,
                "text": outcome.text,
                "usage": usage_json(outcome.usage),
                "iterations": outcome.iterations,
                "answeredBy": outcome.answered_by,
            }),
        )
    }

    /// `lifecycle {phase: "error"}`: the run failed. `aborted` is set when it was stopped on
    /// purpose (an abort, a shutdown); `interrupted` when the process stopped under it.
    pub fn run_failed(session_key: &str, run_id: &str, error: &AgentError, aborted: bool) -> Self {
        Self::new(
            session_key,
            run_id,
            Stream::Lifecycle,
            json!({
                "phase": "error",
                "message": error.to_string(),
                "aborted": aborted || matches!(error, AgentError::Interrupted),
            }),
        )
    }

    /// `lifecycle {phase: "error", interrupted: true}`: the process running the run stopped
    /// before it ended (found at the next start).
    pub fn run_interrupted(session_key: &str, run_id: &str, why: &str) -> Self {
        Self::new(
            session_key,
            run_id,
            Stream::Lifecycle,
            json!({"phase": "error", "message": why, "aborted": false, "interrupted": true}),
        )
    }

    /// `lifecycle {phase: "reset"}`: the session's history was cleared.
    pub fn session_reset(session_key: &str) -> Self {
        Self::new(
            session_key,
            "",
            Stream::Lifecycle,
            json!({"phase": "reset"}),
        )
    }

    /// The `phase` of a lifecycle or tool event.
    pub fn phase(&self) -> Option<&str> {
        self.data.get("phase").and_then(Value::as_str)
    }

    /// Whether this event ends its run (`lifecycle` `end` or `error`).
    pub fn ends_run(&self) -> bool {
        self.stream == Stream::Lifecycle && matches!(self.phase(), Some("end" | "error"))
    }
}

fn usage_json(usage: Usage) -> Value {
    let mut value = json!({"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens});
    // Only where a cache was used, so the shape of a plain run's usage is unchanged.
    if usage.cache_read_tokens > 0 || usage.cache_write_tokens > 0 {
        value["cacheReadTokens"] = json!(usage.cache_read_tokens);
        value["cacheWriteTokens"] = json!(usage.cache_write_tokens);
    }
    value
}

/// The `compaction` event's data: why, how much was summarised and kept, the estimated
/// tokens before and after, the summary (cut to [`TOOL_OUTPUT_EXCERPT_CHARS`]) and what the
/// summary cost.
pub fn compaction_json(compaction: &Compaction) -> Value {
    let (summary, truncated) = excerpt(&compaction.summary, TOOL_OUTPUT_EXCERPT_CHARS);
    json!({
        "phase": "end",
        "reason": compaction.reason.as_str(),
        "summarisedMessages": compaction.summarised,
        "keptMessages": compaction.kept,
        "tokensBefore": compaction.tokens_before,
        "tokensAfter": compaction.tokens_after,
        "summary": summary,
        "summaryTruncated": truncated,
        "usage": usage_json(compaction.usage),
    })
}

/// `text` cut to at most `max` characters, and whether it was cut.
pub fn excerpt(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((end, _)) => (&text[..end], true),
        None => (text, false),
    }
}

/// The wire form of a verdict: `ok`, `denied` (refused by the sandbox or a policy) or `error`,
/// with the detailed label (`failed`, `invalid`, `not_run`).
pub fn verdict_json(verdict: &Verdict) -> (&'static str, &'static str) {
    match verdict {
        Verdict::Ok => ("ok", "ok"),
        Verdict::Denied(_) => ("denied", "denied"),
        Verdict::Failed(_) => ("error", "failed"),
        Verdict::Invalid(_) => ("error", "invalid"),
        Verdict::NotRun(_) => ("error", "not_run"),
    }
}

/// A [`TurnObserver`] that sends every observation of one run as an [`AgentEvent`] on a channel
/// (unbounded: the observer is called synchronously inside the turn and must never block; the
/// receiver drains it as fast as it writes the log).
#[derive(Debug, Clone)]
pub struct EventObserver {
    session_key: String,
    run_id: String,
    sender: mpsc::UnboundedSender<AgentEvent>,
}

impl EventObserver {
    /// An observer of run `run_id` of session `session_key`, sending to `sender`.
    pub fn new(
        session_key: impl Into<String>,
        run_id: impl Into<String>,
        sender: mpsc::UnboundedSender<AgentEvent>,
    ) -> Self {
        Self {
            session_key: session_key.into(),
            run_id: run_id.into(),
            sender,
        }
    }

    /// A channel and an observer sending to it.
    pub fn channel(session_key: &str, run_id: &str) -> (Self, mpsc::UnboundedReceiver<AgentEvent>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self::new(session_key, run_id, sender), receiver)
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Send an event of this run on `stream` with `data` (dropped when nobody listens).
    pub fn emit(&self, stream: Stream, data: Value) {
        let _ = self.sender.send(AgentEvent::new(
            &self.session_key,
            &self.run_id,
            stream,
            data,
        ));
    }
}

impl ProviderEvents for EventObserver {
    fn text_delta(&self, text: &str) {
        if !text.is_empty() {
            self.emit(Stream::Assistant, json!({"delta": text}));
        }
    }

    fn reasoning_delta(&self, text: &str) {
        if !text.is_empty() {
            self.emit(Stream::Reasoning, json!({"delta": text}));
        }
    }

    fn retrying(&self, provider: &str, reason: &str, delay: std::time::Duration) {
        self.emit(
            Stream::Error,
            json!({
                "kind": "retrying",
                "provider": provider,
                "message": excerpt(reason, 500).0,
                "delayMs": delay.as_millis() as u64,
            }),
        );
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.emit(
            Stream::Error,
            json!({"kind": "failover", "from": from, "to": to, "message": excerpt(reason, 500).0}),
        );
    }
}

/// A call's arguments as events carry them: whole, or over [`TOOL_ARGS_MAX_CHARS`] a preview.
fn args_json(call: &ToolCall) -> Value {
    let text = call.arguments.to_string();
    if text.chars().count() > TOOL_ARGS_MAX_CHARS {
        json!({"truncated": true, "preview": excerpt(&text, TOOL_ARGS_MAX_CHARS).0})
    } else {
        call.arguments.clone()
    }
}

impl TurnObserver for EventObserver {
    fn tool_started(&self, call: &ToolCall) {
        self.emit(
            Stream::Tool,
            json!({"phase": "start", "toolCallId": call.id, "name": call.name, "args": args_json(call)}),
        );
    }

    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        let (verdict_name, label) = verdict_json(verdict);
        let (cut, truncated) = excerpt(output, TOOL_OUTPUT_EXCERPT_CHARS);
        let mut data = json!({
            "phase": "end",
            "toolCallId": call.id,
            "name": call.name,
            "verdict": verdict_name,
            "label": label,
            "output": cut,
            "outputChars": output.chars().count(),
            "truncated": truncated,
        });
        if let Some(reason) = verdict.reason() {
            data["reason"] = Value::String(excerpt(reason, 500).0.to_string());
        }
        // A call that never started (not run, invalid) had no start event to carry them.
        if matches!(verdict, Verdict::NotRun(_) | Verdict::Invalid(_)) {
            data["args"] = args_json(call);
        }
        self.emit(Stream::Tool, data);
    }

    fn note(&self, text: &str) {
        self.emit(Stream::Lifecycle, json!({"phase": "note", "text": text}));
    }

    fn compacted(&self, compaction: &Compaction) {
        self.emit(Stream::Compaction, compaction_json(compaction));
    }
}

/// What [`EventLog::read`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    /// The events after `since`, oldest first, at most the limit asked for.
    pub events: Vec<AgentEvent>,
    /// The oldest `seq` still kept (`last_seq + 1` when the log is empty): events before it were
    /// dropped from the window and can only be reported as a gap.
    pub first_retained: u64,
    /// The newest `seq` (0 for a log without events).
    pub last_seq: u64,
}

/// The fencing token of a session's writer. Whoever owns a session (one gateway process; in a
/// cluster, the holder of the session's partition lease, whose lease revision is its epoch)
/// writes its events under its epoch, and a log refuses a write under an epoch older than one it
/// has stored for that session: a writer that lost its session cannot add to it afterwards.
pub type Epoch = u64;

/// Why an [`EventLog`] refused an append or could not serve a call.
#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    /// The store failed (a file, a connection).
    #[error("the event log failed: {0}")]
    Io(#[from] std::io::Error),
    /// A writer with a newer epoch has written this session: this writer no longer owns it.
    #[error(
        "session {session}: refused an event written under epoch {epoch}, older than epoch {current} that wrote since; this process no longer owns the session"
    )]
    Fenced {
        /// The session.
        session: String,
        /// The refused writer's epoch.
        epoch: Epoch,
        /// The newest epoch the log has stored for the session.
        current: Epoch,
    },
    /// The event's `seq` is not after the last one stored: another writer numbered the same
    /// place.
    #[error(
        "session {session}: event {seq} is not after the last stored event {last}; another writer has numbered it"
    )]
    OutOfOrder {
        /// The session.
        session: String,
        /// The refused event's `seq`.
        seq: u64,
        /// The last `seq` stored.
        last: u64,
    },
}

/// What the calls of an [`EventLog`] return.
pub type EventFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, EventLogError>> + Send + 'a>>;

/// What [`EventLog::follow`] returns: where the session's log stood when following began, and
/// the events themselves.
#[derive(Debug)]
pub struct Follow {
    /// The oldest `seq` still kept when following began (`last_seq + 1` for a log without
    /// events): a follower from before it missed `since + 1 .. first_retained` (a gap).
    pub first_retained: u64,
    /// The newest `seq` stored when following began.
    pub last_seq: u64,
    /// Every event after `since` that is kept, stored ones first and then each new one as it is
    /// stored, in `seq` order, each once. Ends when the session is removed or the log stops
    /// (the follower then subscribes again with the last `seq` it had).
    pub events: mpsc::Receiver<AgentEvent>,
}

/// Each session's events in order, with a strictly increasing `seq` per session, kept within a
/// bounded window, and followed live. Only the session's owner appends (and numbers its
/// events: one more than the last stored, which it learns from [`EventLog::last_seq`] when it
/// takes the session up); anyone may read and follow. Implementations must be safe to call
/// from many tasks; appends for one session are made one after another by their owner.
pub trait EventLog: Send + Sync + std::fmt::Debug {
    /// Store `event` under the `seq` it carries, written by the owner holding `epoch`: refused
    /// with [`EventLogError::Fenced`] when a newer epoch has written the session, and with
    /// [`EventLogError::OutOfOrder`] when `seq` is not after the last stored. Returns the event
    /// as stored (with its time).
    fn append(&self, event: AgentEvent, epoch: Epoch) -> EventFuture<'_, AgentEvent>;
    /// The events of `session_key` with `seq > since`, at most `limit` of them.
    fn read<'a>(
        &'a self,
        session_key: &'a str,
        since: u64,
        limit: usize,
    ) -> EventFuture<'a, Replay>;
    /// The newest `seq` of `session_key` (0 when it has none).
    fn last_seq<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, u64>;
    /// Follows `session_key` from `since`: the kept events after it, then each new one as it is
    /// stored, with nothing missed or repeated in between. `since` may be ahead of the last
    /// stored event (an owner's numbering runs ahead of its stores): the follower then starts
    /// with the first event after it.
    fn follow<'a>(&'a self, session_key: &'a str, since: u64) -> EventFuture<'a, Follow>;
    /// Forget `session_key`'s events (its followers end); its next event is `seq` 1 again.
    fn remove<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, ()>;
    /// Make every appended event durable (on disk: synced).
    fn sync(&self) -> EventFuture<'_, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialise_in_camel_case_with_lowercase_streams() {
        let mut event = AgentEvent::new("agent:main:cli:main", "r1", Stream::Tool, json!({}));
        event.seq = 7;
        event.ts = 5;
        let json = serde_json::to_value(&event).unwrap_or_default();
        assert_eq!(
            json,
            json!({"runId": "r1", "seq": 7, "stream": "tool", "ts": 5, "data": {}, "sessionKey": "agent:main:cli:main"})
        );
        let back: AgentEvent = serde_json::from_value(json).unwrap_or_else(|_| event.clone());
        assert_eq!(back, event);
    }

    #[test]
    fn a_call_that_never_started_carries_its_arguments_on_its_end() {
        let (observer, mut events) = EventObserver::channel("s", "r");
        let call = ToolCall {
            id: "t9".into(),
            name: "exec".into(),
            arguments: json!({"command": "ls"}),
        };
        observer.tool_finished(
            &call,
            &Verdict::NotRun("not run: skipped".into()),
            "not run",
        );
        let end = events.try_recv().ok().map(|e| e.data).unwrap_or_default();
        assert_eq!(end["args"], json!({"command": "ls"}), "{end}");
        observer.tool_started(&call);
        let _ = events.try_recv();
        observer.tool_finished(&call, &Verdict::Ok, "a\nb");
        let end = events.try_recv().ok().map(|e| e.data).unwrap_or_default();
        assert!(end.get("args").is_none(), "its start carried them: {end}");
    }

    #[test]
    fn the_observer_reports_tools_with_verdicts_and_cut_output() {
        let (observer, mut events) = EventObserver::channel("s", "r");
        let call = ToolCall {
            id: "t1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "/etc/passwd"}),
        };
        observer.reasoning_delta("think");
        observer.text_delta("Hel");
        observer.tool_started(&call);
        observer.tool_finished(
            &call,
            &Verdict::Denied("outside the workspace".into()),
            &"x".repeat(TOOL_OUTPUT_EXCERPT_CHARS + 10),
        );
        let reasoning = events.try_recv().ok();
        assert_eq!(
            reasoning.map(|e| (e.stream.as_str(), e.data)),
            Some(("reasoning", json!({"delta": "think"})))
        );
        let delta = events.try_recv().ok();
        assert_eq!(delta.map(|e| e.data), Some(json!({"delta": "Hel"})));
        let start = events.try_recv().ok().map(|e| e.data);
        assert_eq!(
            start,
            Some(
                json!({"phase": "start", "toolCallId": "t1", "name": "read_file", "args": {"path": "/etc/passwd"}})
            )
        );
        let end = events.try_recv().ok().map(|e| e.data).unwrap_or_default();
        assert_eq!(end["verdict"], "denied");
        assert_eq!(end["reason"], "outside the workspace");
        assert_eq!(end["truncated"], true);
        assert_eq!(
            end["output"].as_str().map(|s| s.len()),
            Some(TOOL_OUTPUT_EXCERPT_CHARS)
        );
    }

    #[test]
    fn a_compaction_is_an_event_on_its_own_stream() {
        let (observer, mut events) = EventObserver::channel("s", "r");
        observer.compacted(&Compaction {
            reason: crate::compaction::CompactionReason::Threshold,
            summary: "the user wants a report".into(),
            summarised: 12,
            kept: 4,
            tokens_before: 150_000,
            tokens_after: 30_000,
            usage: Usage {
                input_tokens: 100,
                output_tokens: 20,
                ..Usage::default()
            },
        });
        let event = events.try_recv().ok();
        assert_eq!(event.as_ref().map(|e| e.stream), Some(Stream::Compaction));
        assert_eq!(
            event.map(|e| e.data),
            Some(json!({
                "phase": "end", "reason": "threshold", "summarisedMessages": 12, "keptMessages": 4,
                "tokensBefore": 150_000, "tokensAfter": 30_000,
                "summary": "the user wants a report", "summaryTruncated": false,
                "usage": {"inputTokens": 100, "outputTokens": 20},
            }))
        );
    }

    #[test]
    fn excerpts_cut_on_character_boundaries() {
        assert_eq!(excerpt("héllo", 2), ("hé", true));
        assert_eq!(excerpt("hé", 2), ("hé", false));
    }
}
