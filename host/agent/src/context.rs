//! How much of a model's context window a request takes, and keeping it inside: each model's
//! window ([`context_window`]: `[models."NAME"] context_window`, else what the model's server
//! reports ([`crate::provider::window`], asked on the first model call), else a built-in table,
//! else 32k; [`WindowSource`] says which), the token estimate of a request ([`TokenEstimator`]:
//! bytes corrected by the provider's own counts), the room a request may take
//! ([`ContextPolicy::prompt_room`]: the window minus the reply's reserve and a margin), the
//! output budget of a request ([`ContextPolicy::reply_budget`]: the configured `max_tokens`,
//! but no more than the window leaves beside the prompt), and the cut of a single tool result
//! too large for the history ([`trim_oversized_results`]), which leaves a note saying how to
//! read the rest.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use clawcage_core::{ChatMessage, ContentBlock, Role};

use crate::provider::window::ServerWindow;

/// Bytes per token of the uncorrected estimate (English prose and code average 3.5 to 4.5).
pub const BYTES_PER_TOKEN: u64 = 4;

/// Tokens every message costs beyond its text (role and framing).
const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// Tokens every tool call or result block costs beyond its text (ids and framing).
const BLOCK_OVERHEAD_TOKENS: u64 = 8;

/// The window assumed for a model neither the table nor the configuration knows.
pub const UNKNOWN_MODEL_WINDOW: u64 = 32_768;

/// The share of the window at which the history is compacted, unless configured.
pub const DEFAULT_COMPACT_THRESHOLD: f64 = 0.7;

/// Requests estimated below this many tokens do not correct the estimate: their fixed costs
/// (framing the provider adds) weigh more than their text.
const CALIBRATION_MIN_TOKENS: u64 = 1024;

/// A correction outside this range is not believed (a server that reports something else than
/// the prompt, e.g. a test double or a proxy that caches whole answers).
const CALIBRATION_RANGE: (f64, f64) = (0.4, 2.5);

/// The context window of `model` from the built-in table (`None`: not in the table). Names are
/// matched by prefix, after any `vendor/` part (OpenRouter's `anthropic/claude-...`).
pub fn builtin_context_window(model: &str) -> Option<u64> {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    const TABLE: &[(&str, u64)] = &[
        ("claude-", 200_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("gpt-5", 400_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("llama3.1", 131_072),
        ("llama3.2", 131_072),
        ("llama3.3", 131_072),
        ("llama3", 8_192),
        ("qwen3", 40_960),
        ("qwen2.5", 32_768),
        ("mistral", 32_768),
        ("gemma3", 131_072),
        ("gemma2", 8_192),
        ("deepseek", 65_536),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, window)| *window)
}

/// The context window of `model`: the configured one, else the table's, else
/// [`UNKNOWN_MODEL_WINDOW`].
pub fn context_window(model: &str, configured: Option<u64>) -> u64 {
    window_of(model, configured).0
}

/// The context window of `model` without asking its server, and where it came from.
pub fn window_of(model: &str, configured: Option<u64>) -> (u64, WindowSource) {
    match (configured, builtin_context_window(model)) {
        (Some(window), _) => (window, WindowSource::Configured),
        (None, Some(window)) => (window, WindowSource::Table),
        (None, None) => (UNKNOWN_MODEL_WINDOW, WindowSource::Default),
    }
}

/// Where a model's context window came from, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSource {
    /// `[models."NAME"] context_window` (or the caller that built the policy).
    Configured,
    /// The model's server reported it.
    Server,
    /// clawcage's table of known models.
    Table,
    /// Nobody knew: [`UNKNOWN_MODEL_WINDOW`].
    Default,
}

impl WindowSource {
    /// How `/usage` names it: "from the server".
    pub fn describe(self) -> &'static str {
        match self {
            WindowSource::Configured => "from the configuration",
            WindowSource::Server => "from the server",
            WindowSource::Table => "from clawcage's table of known models",
            WindowSource::Default => "assumed: neither the configuration nor the server said",
        }
    }
}

/// One model a request may go to (a fail-over chain has several) and what is known of its
/// window.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWindow {
    /// The model's name.
    pub model: String,
    /// Its window so far, in tokens.
    pub window: u64,
    /// Where that came from.
    pub source: WindowSource,
    /// Its server, to ask when the configuration does not give the window.
    pub server: Option<ServerWindow>,
}

impl ModelWindow {
    /// `model` with the configured window if any, else the table's; `server` is asked on the
    /// first model call unless the window is configured.
    pub fn new(model: &str, configured: Option<u64>, server: Option<ServerWindow>) -> Self {
        let (window, source) = window_of(model, configured);
        Self {
            model: model.to_string(),
            window,
            source,
            server: server.filter(|_| source != WindowSource::Configured),
        }
    }
}

/// The smallest window of `models` (any member of a chain may answer) with its source.
fn smallest(models: &[ModelWindow]) -> Option<(u64, WindowSource)> {
    models
        .iter()
        .min_by_key(|model| model.window)
        .map(|model| (model.window.max(MIN_POLICY_WINDOW), model.source))
}

/// The smallest window a policy works with.
const MIN_POLICY_WINDOW: u64 = 1024;

/// How an agent keeps its requests inside the model's window.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextPolicy {
    /// The model's context window, in tokens.
    pub window: u64,
    /// Where [`ContextPolicy::window`] came from.
    pub window_source: WindowSource,
    /// The reply's configured `max_tokens`.
    pub reply_tokens: u64,
    /// The share of the window at which the history is compacted (0 to 1).
    pub compact_threshold: f64,
    /// The models requests go to, when the policy was built from them
    /// ([`ContextPolicy::for_models`]); their servers are asked for windows not configured.
    pub models: Vec<ModelWindow>,
}

impl ContextPolicy {
    /// A policy for a `window` and a reply of `reply_tokens`, compacting at 70 %.
    pub fn new(window: u64, reply_tokens: u64) -> Self {
        Self {
            window: window.max(MIN_POLICY_WINDOW),
            window_source: WindowSource::Configured,
            reply_tokens,
            compact_threshold: DEFAULT_COMPACT_THRESHOLD,
            models: Vec::new(),
        }
    }

    /// A policy for requests that may go to any of `models` (the smallest window counts) with
    /// replies of `reply_tokens`; `None` without models.
    pub fn for_models(models: Vec<ModelWindow>, reply_tokens: u64) -> Option<Self> {
        let (window, source) = smallest(&models)?;
        let mut policy = Self::new(window, reply_tokens);
        policy.window_source = source;
        policy.models = models;
        Some(policy)
    }

    /// Whether a model's server is still to be asked for its window.
    pub fn asks_servers(&self) -> bool {
        self.models.iter().any(|model| model.server.is_some())
    }

    /// The policy with the windows the models' servers report (each server asked once per
    /// process, at most [`crate::provider::window::PROBE_TIMEOUT`]; one that says nothing
    /// keeps the table's window).
    pub async fn with_server_windows(&self) -> Self {
        let mut models = self.models.clone();
        for model in &mut models {
            if let Some(server) = &model.server
                && let Some(window) = server.window().await
            {
                model.window = window;
                model.source = WindowSource::Server;
            }
        }
        self.with_models(models)
    }

    /// The policy after the server refused a request as too long and named its `window`: a
    /// window not configured becomes at most that (and the servers remember it).
    pub fn with_refusal_window(&self, window: u64) -> Self {
        if self.window_source == WindowSource::Configured || window >= self.window {
            return self.clone();
        }
        let mut models = self.models.clone();
        if models.is_empty() {
            let mut policy = self.clone();
            policy.window = window.max(MIN_POLICY_WINDOW);
            policy.window_source = WindowSource::Server;
            return policy;
        }
        for model in &mut models {
            if model.source != WindowSource::Configured && model.window > window {
                if let Some(server) = &model.server {
                    server.learn(window);
                }
                model.window = window;
                model.source = WindowSource::Server;
            }
        }
        self.with_models(models)
    }

    fn with_models(&self, models: Vec<ModelWindow>) -> Self {
        let mut policy = self.clone();
        if let Some((window, source)) = smallest(&models) {
            policy.window = window;
            policy.window_source = source;
        }
        policy.models = models;
        policy
    }

    /// The `max_tokens` of a request whose prompt is estimated at `prompt_tokens`: the
    /// configured number, but no more than the window leaves beside the prompt and the
    /// margin, and never less than [`ContextPolicy::reply_reserve`] — the fit check compacts
    /// (or refuses) a prompt that would leave less, so the two agree.
    pub fn reply_budget(&self, prompt_tokens: u64) -> u64 {
        let left = self
            .window
            .saturating_sub(prompt_tokens)
            .saturating_sub(self.margin());
        self.reply_tokens.min(left.max(self.reply_reserve())).max(1)
    }

    /// The tokens kept free for the reply: its `max_tokens`, but at most a quarter of the
    /// window (a local model's small window with the default 8192 would leave no room at all;
    /// such a reply is cut by the server, not refused).
    pub fn reply_reserve(&self) -> u64 {
        self.reply_tokens.min(self.window / 4)
    }

    /// The margin kept for the estimate's error: 5 % of the window.
    pub fn margin(&self) -> u64 {
        self.window / 20
    }

    /// The most tokens a request's prompt may take: the window minus the reply and the margin.
    pub fn prompt_room(&self) -> u64 {
        self.window - self.reply_reserve() - self.margin()
    }

    /// The prompt size at which the history is compacted.
    pub fn compact_at(&self) -> u64 {
        ((self.window as f64 * self.compact_threshold) as u64).min(self.prompt_room())
    }

    /// The most tokens the recent messages kept by a compaction may take: half of
    /// [`ContextPolicy::compact_at`], so a compacted history has room to grow again.
    pub fn keep_recent(&self) -> u64 {
        self.compact_at() / 2
    }

    /// The most tokens one tool result may take in the history: a quarter of the prompt room.
    pub fn max_tool_result(&self) -> u64 {
        (self.prompt_room() / 4).max(256)
    }

    /// The most tokens a summary may take: a tenth of the prompt room, at most 4096.
    pub fn max_summary(&self) -> u64 {
        (self.prompt_room() / 10).clamp(256, 4096)
    }
}

/// Token estimates, corrected by what the provider reported. Shared by every session of an
/// agent (they ask the same model), safe to use from many tasks.
///
/// A byte heuristic (4 bytes a token) corrected by the reported usage, rather than a tokenizer:
/// Anthropic publishes no tokenizer, the OpenAI-compatible servers clawcage talks to run models
/// with tokenizers of their own (Llama, Qwen, Mistral), and a BPE crate with its vocabularies
/// adds megabytes and build time to guess one of them. What the fit check needs is an estimate
/// that errs on the safe side of the window, and the provider's own count of each request it
/// answers makes the heuristic that: the ratio of reported to estimated tokens of the large
/// requests corrects the next estimate.
#[derive(Debug)]
pub struct TokenEstimator {
    /// The correction factor times 1000.
    factor_milli: AtomicU64,
}

impl Default for TokenEstimator {
    fn default() -> Self {
        Self {
            factor_milli: AtomicU64::new(1000),
        }
    }
}

impl Clone for TokenEstimator {
    fn clone(&self) -> Self {
        Self {
            factor_milli: AtomicU64::new(self.factor_milli.load(Ordering::Relaxed)),
        }
    }
}

/// Uncorrected tokens of `bytes` bytes.
fn tokens_of_bytes(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_TOKEN)
}

/// Uncorrected tokens of one message.
pub fn raw_message_tokens(message: &ChatMessage) -> u64 {
    let mut tokens = MESSAGE_OVERHEAD_TOKENS;
    for block in &message.content {
        tokens += match block {
            ContentBlock::Text { text } => tokens_of_bytes(text.len()),
            // Reasoning is left out of requests (but for a signed block in its tool-use turn).
            ContentBlock::Reasoning { .. } => 0,
            ContentBlock::ToolUse { name, input, .. } => {
                BLOCK_OVERHEAD_TOKENS + tokens_of_bytes(name.len() + json_len(input))
            }
            ContentBlock::ToolResult { content, .. } => {
                BLOCK_OVERHEAD_TOKENS + tokens_of_bytes(content.len())
            }
        };
    }
    tokens
}

/// The length of `value` as compact JSON text, without building the text (escapes inside
/// strings are not counted: an estimate).
fn json_len(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(number) => number.to_string().len(),
        Value::String(text) => text.len() + 2,
        Value::Array(items) => {
            2 + items.len().saturating_sub(1) + items.iter().map(json_len).sum::<usize>()
        }
        Value::Object(map) => {
            2 + map.len().saturating_sub(1)
                + map
                    .iter()
                    .map(|(key, value)| key.len() + 3 + json_len(value))
                    .sum::<usize>()
        }
    }
}

/// Uncorrected tokens of a request: its system prompt, tool definitions (`tools_bytes` of JSON)
/// and messages.
pub fn raw_request_tokens(system: &str, tools_bytes: usize, messages: &[ChatMessage]) -> u64 {
    tokens_of_bytes(system.len())
        + tokens_of_bytes(tools_bytes)
        + messages.iter().map(raw_message_tokens).sum::<u64>()
}

impl TokenEstimator {
    /// An estimator with no correction yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The correction factor (reported tokens per estimated token; 1 until calibrated).
    pub fn factor(&self) -> f64 {
        self.factor_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// `raw` uncorrected tokens, corrected.
    pub fn correct(&self, raw: u64) -> u64 {
        (raw.saturating_mul(self.factor_milli.load(Ordering::Relaxed))).div_ceil(1000)
    }

    /// The estimated tokens of a message.
    pub fn message(&self, message: &ChatMessage) -> u64 {
        self.correct(raw_message_tokens(message))
    }

    /// The estimated tokens of a request.
    pub fn request(&self, system: &str, tools_bytes: usize, messages: &[ChatMessage]) -> u64 {
        self.correct(raw_request_tokens(system, tools_bytes, messages))
    }

    /// Learn from a request estimated at `raw` uncorrected tokens that the provider counted as
    /// `reported` prompt tokens. Small requests and implausible ratios are ignored; the factor
    /// moves halfway to the new ratio, so one odd request does not swing it.
    pub fn calibrate(&self, raw: u64, reported: u64) {
        if raw < CALIBRATION_MIN_TOKENS || reported == 0 {
            return;
        }
        let ratio = reported as f64 / raw as f64;
        if !(CALIBRATION_RANGE.0..=CALIBRATION_RANGE.1).contains(&ratio) {
            tracing::debug!(
                raw,
                reported,
                "the provider's token count is far from the estimate; not used to correct it"
            );
            return;
        }
        let old = self.factor();
        let new = (old + ratio) / 2.0;
        self.factor_milli
            .store((new * 1000.0).round() as u64, Ordering::Relaxed);
    }
}

/// The first line of the note that replaces the end of a trimmed tool result.
pub const TRIMMED_NOTE_START: &str = "[clawcage trimmed this tool result";

/// `messages` with every tool result larger than `max_chars` characters cut to its first
/// `max_chars` characters and a note saying how much was left out and how to read it (for
/// `read_file`, the offset to continue from). Borrowed when nothing is too large, so the common
/// case costs one pass over the lengths. The stored history keeps every result whole: the cut
/// is made for each request, the same way each time, so the cached prefix stays the same.
pub fn trim_oversized_results(
    messages: &[ChatMessage],
    max_chars: usize,
) -> Cow<'_, [ChatMessage]> {
    let oversized = |block: &ContentBlock| matches!(block, ContentBlock::ToolResult { content, .. } if content.len() > max_chars);
    if !messages
        .iter()
        .any(|message| message.role == Role::User && message.content.iter().any(oversized))
    {
        return Cow::Borrowed(messages);
    }
    let mut trimmed = messages.to_vec();
    for index in 0..trimmed.len() {
        if trimmed[index].role != Role::User {
            continue;
        }
        for block_index in 0..trimmed[index].content.len() {
            let ContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } = &trimmed[index].content[block_index]
            else {
                continue;
            };
            let Some(cut) = content.char_indices().nth(max_chars).map(|(at, _)| at) else {
                continue;
            };
            let call = index.checked_sub(1).and_then(|before| {
                trimmed[before]
                    .tool_uses()
                    .find(|(id, _, _)| id == tool_use_id)
                    .map(|(_, name, input)| (name.to_string(), input.clone()))
            });
            let note = trimmed_note(content, cut, call.as_ref());
            let kept = format!("{}\n{note}", &content[..cut]);
            if let ContentBlock::ToolResult { content, .. } =
                &mut trimmed[index].content[block_index]
            {
                *content = kept;
            }
        }
    }
    Cow::Owned(trimmed)
}

/// The note after a result cut at byte `cut`: its size, what is shown, how to read the rest.
fn trimmed_note(content: &str, cut: usize, call: Option<&(String, serde_json::Value)>) -> String {
    let total = content.chars().count();
    let shown = content[..cut].chars().count();
    let how = match call {
        Some((name, input)) if name == "read_file" => {
            let first = input["offset"].as_u64().unwrap_or(1);
            let lines_shown = content[..cut].matches('\n').count() as u64;
            let path = input["path"].as_str().unwrap_or("the file");
            format!(
                "call read_file with path {path:?} and offset={} (and a smaller limit) to read on from there",
                first + lines_shown
            )
        }
        Some((name, _)) if name == "exec" => "run the command again asking for less: pipe it through head, tail, grep or sed -n 'FIRST,LASTp', or write the output to a file and read it with read_file with offset and limit".to_string(),
        _ => "ask for it in smaller parts (for a file, read_file with offset and limit; for a command, exec with head, tail, grep or sed -n)".to_string(),
    };
    format!(
        "{TRIMMED_NOTE_START} to keep the conversation within the model's context window: it had {total} characters, the first {shown} are shown above. To see the rest, {how}.]"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn windows_come_from_the_configuration_then_the_table() {
        assert_eq!(context_window("claude-sonnet-4-5", None), 200_000);
        assert_eq!(context_window("anthropic/claude-3-5-haiku", None), 200_000);
        assert_eq!(context_window("llama3.1:8b", None), 131_072);
        assert_eq!(context_window("llama3.1:8b", Some(8192)), 8192);
        assert_eq!(context_window("my-own-model", None), UNKNOWN_MODEL_WINDOW);
        assert_eq!(context_window("gpt-4o-mini", None), 128_000);
    }

    #[test]
    fn the_room_leaves_the_reply_and_a_margin() {
        let policy = ContextPolicy::new(200_000, 8192);
        assert_eq!(policy.prompt_room(), 200_000 - 8192 - 10_000);
        assert_eq!(policy.compact_at(), 140_000);
        // A small window with the default max_tokens still leaves room for a prompt.
        let small = ContextPolicy::new(8192, 8192);
        assert_eq!(small.reply_reserve(), 2048);
        assert_eq!(small.prompt_room(), 8192 - 2048 - 409);
        assert!(small.compact_at() <= small.prompt_room());
    }

    #[test]
    fn the_reply_gets_what_the_window_leaves_but_never_less_than_its_reserve() {
        // `[models."smollm2"] context_window = 4096` with the default max_tokens of 8192.
        let policy = ContextPolicy::new(4096, 8192);
        assert_eq!(policy.reply_budget(100), 4096 - 100 - 204);
        // The fit check lets a prompt take up to prompt_room: the reply then gets its reserve,
        // the two agree.
        assert_eq!(
            policy.reply_budget(policy.prompt_room()),
            policy.reply_reserve()
        );
        // Beyond it (an estimate off, a prompt that could not be compacted): still the reserve,
        // never a sliver or 0.
        assert_eq!(policy.reply_budget(4000), 1024);
        assert_eq!(policy.reply_budget(u64::MAX), 1024);
        // A big window: the configured max_tokens.
        assert_eq!(
            ContextPolicy::new(200_000, 8192).reply_budget(150_000),
            8192
        );
        // A configured max_tokens below the reserve is kept.
        assert_eq!(ContextPolicy::new(4096, 100).reply_budget(4000), 100);
    }

    #[test]
    fn windows_follow_the_precedence_and_a_refusal_lowers_the_unconfigured_ones() {
        assert_eq!(
            window_of("smollm2", Some(4096)),
            (4096, WindowSource::Configured)
        );
        assert_eq!(window_of("qwen2.5:7b", None), (32_768, WindowSource::Table));
        assert_eq!(
            window_of("smollm2", None),
            (UNKNOWN_MODEL_WINDOW, WindowSource::Default)
        );
        let chain = ContextPolicy::for_models(
            vec![
                ModelWindow::new("claude-sonnet-4-5", None, None),
                ModelWindow::new("llama3.1:8b", Some(8192), None),
            ],
            8192,
        )
        .unwrap();
        assert_eq!(
            (chain.window, chain.window_source),
            (8192, WindowSource::Configured)
        );
        // Configured: a refusal naming a smaller window does not override it.
        assert_eq!(chain.with_refusal_window(2048).window, 8192);
        let alone =
            ContextPolicy::for_models(vec![ModelWindow::new("tiny", None, None)], 8192).unwrap();
        let refused = alone.with_refusal_window(2048);
        assert_eq!(
            (refused.window, refused.window_source),
            (2048, WindowSource::Server)
        );
        assert_eq!(refused.reply_reserve(), 512);
        // A larger window named later does not raise it.
        assert_eq!(refused.with_refusal_window(4096).window, 2048);
        assert_eq!(ContextPolicy::for_models(Vec::new(), 8192), None);
    }

    #[test]
    fn estimates_are_corrected_by_reported_usage_within_reason() {
        let estimator = TokenEstimator::new();
        let message = ChatMessage::user("x".repeat(4000));
        assert_eq!(estimator.message(&message), 1004);
        estimator.calibrate(10_000, 15_000);
        assert!((estimator.factor() - 1.25).abs() < 1e-9);
        assert_eq!(estimator.message(&message), 1255);
        // Implausible or small requests leave the factor alone.
        estimator.calibrate(10_000, 100);
        estimator.calibrate(100, 1000);
        assert!((estimator.factor() - 1.25).abs() < 1e-9);
    }

    #[test]
    fn json_lengths_match_the_text() {
        let value = json!({"path": "a/b.txt", "n": [1, 22, true, null], "o": {"k": "v\u{e9}"}});
        assert_eq!(json_len(&value), value.to_string().len());
    }

    #[test]
    fn an_oversized_result_is_cut_with_a_note_naming_the_offset_to_read_on() {
        let content: String = (1..=1000).map(|n| format!("line {n}\n")).collect();
        let history = vec![
            ChatMessage::user("read it"),
            ChatMessage {
                role: Role::Assistant,
                cut: None,
                content: vec![ContentBlock::ToolUse {
                    id: "t1".into(),
                    name: "read_file".into(),
                    input: json!({"path": "big.txt", "offset": 11}),
                }],
            },
            ChatMessage {
                role: Role::User,
                cut: None,
                content: vec![ContentBlock::ToolResult {
                    tool_use_id: "t1".into(),
                    content: content.clone(),
                    is_error: false,
                }],
            },
        ];
        assert!(matches!(
            trim_oversized_results(&history, content.len()),
            Cow::Borrowed(_)
        ));
        let trimmed = trim_oversized_results(&history, 71);
        let ContentBlock::ToolResult { content: cut, .. } = &trimmed[2].content[0] else {
            panic!("a tool result");
        };
        assert!(cut.starts_with("line 1\nline 2\n"), "{cut}");
        assert!(
            cut.contains(&format!("it had {} characters", content.len())),
            "{cut}"
        );
        // Ten whole lines shown from offset 11: read on at 21.
        assert!(cut.contains("path \"big.txt\" and offset=21"), "{cut}");
        assert_eq!(
            history[2].content[0],
            ContentBlock::ToolResult {
                tool_use_id: "t1".into(),
                content,
                is_error: false,
            }
        );
    }
}
