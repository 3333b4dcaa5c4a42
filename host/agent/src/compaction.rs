//! Compaction: the older part of a history replaced by one summary the model writes, so a long
//! session keeps going inside the model's context window. [`find_cut`] chooses where the recent
//! part begins (never between a tool call and its result), [`summary_request`] renders the older
//! messages as the text the model summarises (cut to fit the window itself), and
//! [`apply_compaction`] puts the summary in front of the recent part as the first user message.
//! The same function rebuilds the history when a transcript is loaded, so a session resumed
//! after a restart sees exactly what it saw before; the transcript file keeps every message.

use clawcage_core::{ChatMessage, ContentBlock, Role, Usage};
use serde::{Deserialize, Serialize};

use crate::context::{ContextPolicy, TokenEstimator, raw_message_tokens};
use crate::provider::preview;

/// The instructions of a summary request.
pub const SUMMARY_SYSTEM_PROMPT: &str = "You condense conversations between a user and an assistant that works on a workspace through tools. \
Write a summary the assistant can continue from without the original messages: the user's goals and requests, decisions taken, facts learned (file names, paths, values, commands and their results), what was done and what is still open. \
Keep names and numbers exact. Write plain text, at most a few paragraphs or a short list; do not address the user.";

/// The line that opens the text summarised.
const SUMMARY_REQUEST_INTRO: &str = "Summarise this conversation so far (oldest first):";

/// How the summary starts in the history.
pub const SUMMARY_HEADER: &str = "[Summary of the earlier conversation, written when it was compacted to fit the model's context window]";

/// Why a history was compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionReason {
    /// The history passed the threshold share of the window.
    Threshold,
    /// The provider refused the request as too long for its window.
    Overflow,
    /// The user asked (`/compact`).
    Requested,
}

impl CompactionReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionReason::Threshold => "threshold",
            CompactionReason::Overflow => "overflow",
            CompactionReason::Requested => "requested",
        }
    }
}

/// One compaction, as the transcript records it and front ends show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// Why.
    pub reason: CompactionReason,
    /// The summary the model wrote (cut to the policy's bound).
    pub summary: String,
    /// Messages replaced by the summary.
    pub summarised: usize,
    /// Messages of the history kept after it, as they were.
    pub kept: usize,
    /// The estimated prompt before, in tokens.
    pub tokens_before: u64,
    /// The estimated prompt after, in tokens.
    pub tokens_after: u64,
    /// What the summary request cost.
    pub usage: Usage,
}

impl Compaction {
    /// One line for the operator: what was summarised and what it saved.
    pub fn describe(&self) -> String {
        let why = match self.reason {
            CompactionReason::Threshold => "it passed the compaction threshold",
            CompactionReason::Overflow => "the provider found it too long",
            CompactionReason::Requested => "as asked",
        };
        format!(
            "history compacted ({why}): {} older messages summarised, {} kept; about {} -> {} tokens",
            self.summarised, self.kept, self.tokens_before, self.tokens_after
        )
    }
}

/// What a turn did to its history, in order: what the lane writes to the transcript as it
/// happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Journaled {
    /// A message was appended.
    Message(ChatMessage),
    /// A tool call is about to run (written before it starts, so a crash during the call
    /// is known to have possibly run it).
    ToolStarted {
        /// The `tool_use` id.
        tool_use_id: String,
    },
    /// A tool call has its result (a `tool_result` block): it joins the user message that
    /// answers the model's calls.
    ToolResult(ContentBlock),
    /// The history was compacted.
    Compacted(Compaction),
    /// A model call (or a summary request) used these tokens; a turn that fails still counts
    /// what it used.
    Used(Usage),
}

/// Where a turn records what it does, step by step: a `Vec` in memory, or a sink that
/// persists each step as it is recorded (the lanes' transcript journal), so a crash loses at
/// most the step that was being taken.
pub trait TurnJournal: Send {
    /// Record `item`, the next step of the turn.
    fn record(&mut self, item: Journaled);

    /// Why a step could not be recorded, once one could not. The turn then does nothing more
    /// (no tool call a restart would not know was started, no model call whose answer would
    /// not be kept) and ends with [`crate::AgentError::Journal`].
    fn failure(&self) -> Option<String> {
        None
    }
}

impl TurnJournal for Vec<Journaled> {
    fn record(&mut self, item: Journaled) {
        self.push(item);
    }
}

/// Whether the history may begin at `messages[index]`: an assistant message, or a user message
/// without tool results (a result must follow its call).
fn can_start_at(messages: &[ChatMessage], index: usize) -> bool {
    let message = &messages[index];
    message.role == Role::Assistant || !message.has_tool_results()
}

/// Where the recent part begins: the earliest point after the first message from which the rest
/// takes at most `keep_tokens` — the start of a user's message when one is in reach, so whole
/// exchanges are kept — else the latest possible point (the most is summarised). `None` when
/// there is no point to cut at (a single message, or one call with its results).
pub fn find_cut(
    messages: &[ChatMessage],
    estimator: &TokenEstimator,
    keep_tokens: u64,
) -> Option<usize> {
    let mut tail = 0u64;
    let mut best_user = None;
    let mut best = None;
    let mut latest = None;
    for index in (1..messages.len()).rev() {
        tail += estimator.message(&messages[index]);
        if !can_start_at(messages, index) {
            continue;
        }
        latest.get_or_insert(index);
        if tail > keep_tokens {
            break;
        }
        best = Some(index);
        if messages[index].role == Role::User {
            best_user = Some(index);
        }
    }
    best_user.or(best).or(latest)
}

/// The one user message a summary request sends: the older messages as text, each block cut
/// so the whole fits `room_tokens`; when even that is too much, the oldest are left out (said
/// so). Tool calls show their name and arguments, tool results their text.
pub fn summary_request(
    older: &[ChatMessage],
    estimator: &TokenEstimator,
    room_tokens: u64,
) -> ChatMessage {
    let blocks: usize = older.iter().map(|message| message.content.len()).sum();
    // Bytes the room holds, by the same measure the estimate uses.
    let room_bytes = (room_tokens as f64 * 4.0 / estimator.factor().max(0.1)) as usize;
    let mut cap = usize::MAX;
    let mut lines = render(older, cap);
    let size = |lines: &[String]| lines.iter().map(|line| line.len() + 1).sum::<usize>();
    if size(&lines) > room_bytes {
        cap = (room_bytes / blocks.max(1)).max(200);
        lines = render(older, cap);
    }
    let mut left_out = 0;
    while size(&lines) > room_bytes && lines.len() > 1 {
        lines.remove(0);
        left_out += 1;
    }
    let mut text = String::from(SUMMARY_REQUEST_INTRO);
    text.push('\n');
    if left_out > 0 {
        text.push_str(&format!(
            "[{left_out} older parts left out: they do not fit the model's context window]\n"
        ));
    }
    for line in lines {
        text.push_str(&line);
        text.push('\n');
    }
    ChatMessage::user(text)
}

/// Each block of `messages` as one line, at most `cap` characters of its text.
fn render(messages: &[ChatMessage], cap: usize) -> Vec<String> {
    let cut = |text: &str| {
        if cap == usize::MAX {
            text.to_string()
        } else {
            preview(text, cap)
        }
    };
    let mut lines = Vec::new();
    for message in messages {
        let who = match message.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        for block in &message.content {
            lines.push(match block {
                ContentBlock::Text { text } if text.is_empty() => continue,
                ContentBlock::Text { text } => format!("[{who}] {}", cut(text)),
                // The model's reasoning is not what was said: the summary leaves it out.
                ContentBlock::Reasoning { .. } => continue,
                ContentBlock::ToolUse { name, input, .. } => {
                    format!("[assistant called {name}] {}", cut(&input.to_string()))
                }
                ContentBlock::ToolResult {
                    content, is_error, ..
                } => format!(
                    "[tool {}] {}",
                    if *is_error { "error" } else { "result" },
                    cut(content)
                ),
            });
        }
    }
    lines
}

/// `summary` cut to the policy's bound, with a note when it was cut (a model that ignores the
/// request for brevity must not fill the window it was asked to free).
pub fn bounded_summary(summary: &str, policy: &ContextPolicy) -> String {
    let max_chars = (policy.max_summary() * crate::context::BYTES_PER_TOKEN) as usize;
    let summary = summary.trim();
    match summary.char_indices().nth(max_chars) {
        Some((cut, _)) => format!(
            "{}\n[the summary was cut at {max_chars} characters]",
            &summary[..cut]
        ),
        None => summary.to_string(),
    }
}

/// Replace `history[..cut]` with `summary`: the summary becomes a text block at the start of
/// the first kept message when that is the user's own, else a user message of its own in
/// front, so the history still starts with a plain user message and roles alternate.
pub fn apply_compaction(history: &mut Vec<ChatMessage>, cut: usize, summary: &str) {
    let cut = cut.min(history.len());
    history.drain(..cut);
    let block = ContentBlock::text(format!("{SUMMARY_HEADER}\n{summary}\n\n"));
    match history.first_mut() {
        Some(first) if first.role == Role::User && !first.has_tool_results() => {
            first.content.insert(0, block);
        }
        _ => history.insert(
            0,
            ChatMessage {
                role: Role::User,
                cut: None,
                content: vec![block],
            },
        ),
    }
}

/// The estimated tokens of `messages` alone (no prompt, no tools).
pub fn messages_tokens(messages: &[ChatMessage], estimator: &TokenEstimator) -> u64 {
    estimator.correct(messages.iter().map(raw_message_tokens).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> ChatMessage {
        ChatMessage {
            role: Role::Assistant,
            cut: None,
            content: vec![ContentBlock::ToolUse {
                id: id.into(),
                name: "read_file".into(),
                input: json!({"path": "a"}),
            }],
        }
    }

    fn result(id: &str, text: &str) -> ChatMessage {
        ChatMessage {
            role: Role::User,
            cut: None,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: id.into(),
                content: text.into(),
                is_error: false,
            }],
        }
    }

    #[test]
    fn the_cut_never_separates_a_result_from_its_call() {
        let estimator = TokenEstimator::new();
        let history = vec![
            ChatMessage::user("first"),
            call("t1"),
            result("t1", &"x".repeat(4000)),
            ChatMessage::assistant("done"),
            ChatMessage::user("second"),
            call("t2"),
            result("t2", "short"),
        ];
        // The earliest user message in reach, not the assistant's answer before it.
        let cut = find_cut(&history, &estimator, 100).unwrap();
        assert_eq!(cut, 4);
        assert!(can_start_at(&history, cut));
        // Nothing fits: the latest point is used.
        assert_eq!(find_cut(&history, &estimator, 1), Some(5));
        assert_eq!(find_cut(&history[..1], &estimator, 1), None);
        assert_eq!(
            find_cut(
                &[ChatMessage::user("a"), call("t"), result("t", "r")],
                &estimator,
                0
            ),
            Some(1)
        );
    }

    #[test]
    fn the_summary_leads_the_kept_messages() {
        let mut history = vec![
            ChatMessage::user("one"),
            ChatMessage::assistant("ok"),
            ChatMessage::user("two"),
            ChatMessage::assistant("ok"),
        ];
        apply_compaction(&mut history, 2, "the user said one");
        assert_eq!(history.len(), 2);
        assert_eq!(history[0].content.len(), 2);
        assert!(history[0].text().starts_with(SUMMARY_HEADER));
        assert!(history[0].text().ends_with("the user said one\n\ntwo"));
        let mut mid_turn = vec![
            ChatMessage::user("go"),
            call("t1"),
            result("t1", "r"),
            call("t2"),
        ];
        apply_compaction(&mut mid_turn, 3, "s");
        assert_eq!(mid_turn.len(), 2);
        assert_eq!(mid_turn[0].role, Role::User);
        assert_eq!(mid_turn[1], call("t2"));
    }

    #[test]
    fn a_summary_request_fits_its_room_and_a_long_summary_is_cut() {
        let estimator = TokenEstimator::new();
        let older: Vec<ChatMessage> = (0..50)
            .flat_map(|n| {
                [
                    call(&format!("t{n}")),
                    result(&format!("t{n}"), &"y".repeat(10_000)),
                ]
            })
            .collect();
        let request = summary_request(&older, &estimator, 5_000);
        assert!(
            estimator.message(&request) <= 5_100,
            "{}",
            estimator.message(&request)
        );
        assert!(request.text().contains("[assistant called read_file]"));
        let policy = ContextPolicy::new(20_000, 1000);
        let summary = bounded_summary(&"z".repeat(100_000), &policy);
        assert!(summary.len() < 10_000);
        assert!(summary.ends_with("characters]"));
    }
}
