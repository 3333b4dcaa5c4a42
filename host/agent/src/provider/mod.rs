//! Model providers. A [`Provider`] turns the conversation so far into the model's next message:
//! [`anthropic`] speaks the Anthropic Messages API, [`openai`] OpenAI-compatible chat completions
//! (OpenAI, Ollama, vLLM, llama.cpp, OpenRouter), [`scripted`] plays a recorded script. The wire
//! format is the schema: each provider builds and parses its JSON by hand, next to the request it
//! sends, so what goes over the wire can be read in one place. [`retry`] wraps a provider with
//! backoff and chains providers for fail-over; [`redacting`] scrubs every secret value out of
//! what goes to and comes from the whole chain; [`repair`] fixes tool-call JSON only where the fix
//! is unambiguous; [`sse`] parses server-sent events for streaming. It is one file (over 700 lines)
//! because it holds what every provider shares: the request, response and error types, and the HTTP
//! plumbing each of them calls (sending, reading bounded bodies and event streams, error messages).

pub mod anthropic;
pub mod openai;
pub mod redacting;
pub mod repair;
pub mod retry;
pub mod scripted;
pub mod sse;
pub mod window;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use clawcage_core::ChatMessage;
use clawcage_core::{BoxFuture, ContentBlock, Usage};

use crate::ToolRegistry;

pub use redacting::Redacting;
pub use retry::{FailoverChain, RetryPolicy, Retrying};
pub use scripted::{Script, ScriptedProvider};

/// One request to a model: the system prompt, the history and the tools it may call.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// Instructions that frame the conversation.
    pub system: &'a str,
    /// The conversation so far, oldest first; the last message is the user's (or tool results).
    pub messages: &'a [ChatMessage],
    /// The tools the model may call, rendered in the provider's format.
    pub tools: &'a ToolRegistry,
    /// Whether to stream text as it is generated (reported through [`ProviderEvents`]).
    pub stream: bool,
    /// The most output tokens this request may ask for, when its context window leaves less
    /// than the configured `max_tokens` beside the prompt (`None`: the configured number). The
    /// smaller of the two is sent.
    pub max_tokens: Option<u32>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It ran out of output tokens.
    MaxTokens,
    /// Something else, as the provider named it.
    Other(String),
}

/// The output tokens a request asks for when `[provider] max_tokens` does not say.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// A tool call whose arguments could not be read as JSON: the call is not run, and the model gets
/// `message` back as an error result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedToolCall {
    /// The id of the [`ContentBlock::ToolUse`] (whose `input` is then `{}`).
    pub tool_use_id: String,
    /// What was wrong, written for the model.
    pub message: String,
}

/// The model's next message and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The message's blocks: reasoning, text and tool calls.
    pub content: Vec<ContentBlock>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Tokens counted for this request.
    pub usage: Usage,
    /// `provider/model` that answered (differs from the first choice after a fail-over).
    pub answered_by: String,
    /// Tool calls whose arguments were unreadable.
    pub malformed: Vec<MalformedToolCall>,
    /// Tool-call arguments that were repaired, one line each (shown to the operator).
    pub repairs: Vec<String>,
}

/// What a provider reports while it works. Every method has an empty default.
pub trait ProviderEvents: Send + Sync {
    /// A piece of streamed text.
    fn text_delta(&self, _text: &str) {}
    /// A piece of the model's reasoning. Streamed or not, a provider reports every reasoning
    /// it reads here (a whole reply's at once when it was not streamed): the turn's outcome
    /// carries only the answer, so this is where front ends get to show it.
    fn reasoning_delta(&self, _text: &str) {}
    /// A request failed and will be sent again after `delay`.
    fn retrying(&self, _provider: &str, _reason: &str, _delay: Duration) {}
    /// A provider in the fail-over chain gave up and the next one is tried.
    fn failing_over(&self, _from: &str, _to: &str, _reason: &str) {}
}

/// A [`ProviderEvents`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvents;

impl ProviderEvents for NoEvents {}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The server answered with an error status.
    #[error("{provider} answered HTTP {status}: {message}")]
    Status {
        /// `provider/model`.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The error message from the body (or the start of the body).
        message: String,
        /// How long the server asked us to wait (`retry-after` / `retry-after-ms`).
        retry_after: Option<Duration>,
    },
    /// No answer in time.
    #[error(
        "{provider} did not answer within {seconds}s; check the server, or raise [provider] timeout_secs"
    )]
    Timeout {
        /// `provider/model`.
        provider: String,
        /// The timeout that passed.
        seconds: u64,
    },
    /// The connection failed.
    #[error(
        "cannot reach {provider} at {url}: {message}; check --base-url and that the server runs"
    )]
    Connect {
        /// `provider/model`.
        provider: String,
        /// The URL tried.
        url: String,
        /// What the HTTP client said.
        message: String,
    },
    /// The server answered something that is not the expected wire format.
    #[error("{provider} sent a response clawcage cannot read: {message}")]
    Protocol {
        /// `provider/model`.
        provider: String,
        /// What was wrong.
        message: String,
    },
    /// The provider reported an error inside a stream (e.g. `overloaded_error`).
    #[error("{provider} reported {kind}: {message}")]
    Stream {
        /// `provider/model`.
        provider: String,
        /// The error type the provider named.
        kind: String,
        /// Its message.
        message: String,
    },
    /// The provider cannot be used as configured.
    #[error("{0}")]
    Config(String),
    /// Every provider of a fail-over chain failed; each failure, in order.
    #[error("every provider in the chain failed: {0}")]
    AllFailed(String),
    /// A token budget of the session the call was for is spent; the call was not made.
    #[error("{0}")]
    Budget(String),
    /// The scripted provider has no reply left.
    #[error(
        "the script has no reply left (it had {0}); the scripted provider cannot answer more requests"
    )]
    ScriptExhausted(usize),
}

impl ProviderError {
    /// Whether sending the same request again may succeed. Exhaustive on purpose: a new variant
    /// must decide.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Status { status, .. } => {
                *status == 429 || *status == 408 || *status >= 500
            }
            ProviderError::Timeout { .. } => true,
            ProviderError::Connect { .. } => true,
            ProviderError::Stream { kind, .. } => {
                kind == "overloaded_error" || kind == "api_error" || kind == "rate_limit_error"
            }
            ProviderError::Protocol { .. } => false,
            ProviderError::Config(_) => false,
            ProviderError::AllFailed(_) => false,
            ProviderError::Budget(_) => false,
            ProviderError::ScriptExhausted(_) => false,
        }
    }

    /// Whether the provider refused the request because it does not fit the model's context
    /// window (Anthropic `prompt is too long`, OpenAI `context_length_exceeded`, the wording of
    /// vLLM, llama.cpp and Ollama). A fail-over chain counts when any member said so.
    pub fn is_context_overflow(&self) -> bool {
        match self {
            ProviderError::Status {
                status, message, ..
            } => matches!(status, 400 | 413 | 422) && mentions_context_overflow(message),
            ProviderError::Stream { message, .. } | ProviderError::AllFailed(message) => {
                mentions_context_overflow(message)
            }
            ProviderError::Timeout { .. }
            | ProviderError::Connect { .. }
            | ProviderError::Protocol { .. }
            | ProviderError::Config(_)
            | ProviderError::Budget(_)
            | ProviderError::ScriptExhausted(_) => false,
        }
    }

    /// The context window the server named when it refused a request as too long (llama.cpp's
    /// `n_ctx`), if it did.
    pub fn server_window(&self) -> Option<u64> {
        match self {
            ProviderError::Status { message, .. }
            | ProviderError::Stream { message, .. }
            | ProviderError::AllFailed(message) => window::window_in_overflow_note(message),
            _ => None,
        }
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Whether an error message says the prompt is longer than the model's context window.
fn mentions_context_overflow(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "prompt is too long",
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "exceed context limit",
        "exceeds the available context",
        "too many tokens",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
}

/// A model provider.
pub trait Provider: Send + Sync + fmt::Debug {
    /// `provider/model`, e.g. `anthropic/claude-sonnet-4-5`, for logs and usage lines.
    fn label(&self) -> String;

    /// Ask the model for its next message.
    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;
}

/// An API key. Its `Debug` prints nothing of the key, it is never serialised, and it is only
/// ever put into the request header of the provider it belongs to.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI-compatible chat completions.
    OpenAi,
    /// A recorded script.
    Scripted,
}

impl ProviderKind {
    /// Parse `anthropic`, `openai` or `scripted`.
    pub fn parse(name: &str) -> Result<Self, ProviderError> {
        match name {
            "anthropic" => Ok(ProviderKind::Anthropic),
            "openai" => Ok(ProviderKind::OpenAi),
            "scripted" => Ok(ProviderKind::Scripted),
            other => Err(ProviderError::Config(format!(
                "unknown provider `{other}`; use anthropic, openai or scripted"
            ))),
        }
    }

    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Scripted => "scripted",
        }
    }

    /// The environment variable the key comes from.
    pub fn key_variable(self) -> Option<&'static str> {
        match self {
            ProviderKind::Anthropic => Some(clawcage_core::ANTHROPIC_API_KEY_ENV),
            ProviderKind::OpenAi => Some(clawcage_core::OPENAI_API_KEY_ENV),
            ProviderKind::Scripted => None,
        }
    }
}

/// The HTTP settings shared by the HTTP providers.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Base URL, without the endpoint path (`/v1/messages` or `/chat/completions` is appended).
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// The key, if the server needs one.
    pub api_key: Option<ApiKey>,
    /// Output token cap per request.
    pub max_tokens: u32,
    /// Time for a whole request, and the longest silence between two chunks of a response. A
    /// streamed response, which may legitimately take long, gets four times this in total.
    pub timeout: Duration,
    /// The largest response body read; a larger one is an error.
    pub max_response_bytes: usize,
    /// Mark the stable prefix of each request for the provider's prompt cache (Anthropic
    /// `cache_control` breakpoints; OpenAI-compatible servers cache on their own).
    pub prompt_cache: bool,
}

impl HttpSettings {
    /// The time one request may take: a streamed reply may run four times as long, since it
    /// shows progress while it arrives.
    fn request_timeout(&self, stream: bool) -> Duration {
        if stream {
            self.timeout * 4
        } else {
            self.timeout
        }
    }

    /// Settings with the defaults: [`DEFAULT_MAX_TOKENS`] output tokens, a 300 s timeout,
    /// 16 MiB of response.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            timeout: Duration::from_secs(300),
            max_response_bytes: 16 << 20,
            prompt_cache: false,
        }
    }

    /// The `max_tokens` sent with `request`: the configured cap, or the request's own when it
    /// is smaller (never 0).
    pub fn output_tokens(&self, request: &ChatRequest<'_>) -> u32 {
        request
            .max_tokens
            .map_or(self.max_tokens, |cap| cap.min(self.max_tokens))
            .max(1)
    }

    /// The endpoint URL: the base without trailing slashes, then `path`.
    fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }

    fn client(&self) -> Result<reqwest::Client, ProviderError> {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(self.timeout))
            .read_timeout(self.timeout)
            .user_agent(concat!("clawcage/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| {
                ProviderError::Config(format!("cannot build the HTTP client: {error}"))
            })
    }
}

/// Send `request` and map transport failures to [`ProviderError`]s; error statuses are read and
/// returned as [`ProviderError::Status`] with the server's message and `retry-after`.
async fn send(
    label: &str,
    url: &str,
    settings: &HttpSettings,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::Response, ProviderError> {
    let response = request
        .send()
        .await
        .map_err(|error| transport_error(label, url, settings, &error))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = retry_after(response.headers());
    let body = read_body(label, url, settings, response, 64 << 10)
        .await
        .unwrap_or_default();
    Err(ProviderError::Status {
        provider: label.to_string(),
        status: status.as_u16(),
        message: error_message(&body, status.as_u16(), url),
        retry_after,
    })
}

fn transport_error(
    label: &str,
    url: &str,
    settings: &HttpSettings,
    error: &reqwest::Error,
) -> ProviderError {
    if error.is_timeout() {
        ProviderError::Timeout {
            provider: label.to_string(),
            seconds: settings.timeout.as_secs().max(1),
        }
    } else if error.is_connect() || error.is_request() {
        ProviderError::Connect {
            provider: label.to_string(),
            url: url.to_string(),
            message: error_chain(error),
        }
    } else {
        ProviderError::Protocol {
            provider: label.to_string(),
            message: error_chain(error),
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Read a whole body, refusing more than `cap` bytes.
async fn read_body(
    label: &str,
    url: &str,
    settings: &HttpSettings,
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| transport_error(label, url, settings, &error))?
    {
        if body.len() + chunk.len() > cap {
            return Err(too_large(label, cap));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A streamed response read as server-sent events, chunk by chunk, within the settings' size cap.
struct EventStream<'a> {
    label: &'a str,
    url: &'a str,
    settings: &'a HttpSettings,
    response: reqwest::Response,
    parser: sse::SseParser,
    received: usize,
}

impl<'a> EventStream<'a> {
    fn new(
        label: &'a str,
        url: &'a str,
        settings: &'a HttpSettings,
        response: reqwest::Response,
    ) -> Self {
        Self {
            label,
            url,
            settings,
            response,
            parser: sse::SseParser::new(),
            received: 0,
        }
    }

    /// The events completed by the next chunk (possibly none); `None` at the end of the body.
    async fn next_events(&mut self) -> Result<Option<Vec<sse::SseEvent>>, ProviderError> {
        let Some(chunk) = self
            .response
            .chunk()
            .await
            .map_err(|error| transport_error(self.label, self.url, self.settings, &error))?
        else {
            return Ok(None);
        };
        self.received += chunk.len();
        if self.received > self.settings.max_response_bytes {
            return Err(too_large(self.label, self.settings.max_response_bytes));
        }
        self.parser
            .push(&chunk)
            .map(Some)
            .map_err(|message| ProviderError::Protocol {
                provider: self.label.to_string(),
                message,
            })
    }
}

/// Report the reasoning of a reply that was read whole (not streamed) to `events`, as a
/// stream would have.
fn report_reasoning(response: &ChatResponse, events: &dyn ProviderEvents) {
    for block in &response.content {
        if let ContentBlock::Reasoning { text, .. } = block
            && !text.is_empty()
        {
            events.reasoning_delta(text);
        }
    }
}

/// Whether `response` is a server-sent-events stream (else a whole JSON body).
fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}

/// Read a whole JSON response body within the settings' size cap.
async fn read_json(
    label: &str,
    url: &str,
    settings: &HttpSettings,
    response: reqwest::Response,
) -> Result<serde_json::Value, ProviderError> {
    let bytes = read_body(label, url, settings, response, settings.max_response_bytes).await?;
    parse_json(label, &bytes)
}

fn too_large(label: &str, cap: usize) -> ProviderError {
    ProviderError::Protocol {
        provider: label.to_string(),
        message: format!("the response is larger than {} MiB; refused", cap >> 20),
    }
}

/// Parse a JSON body or say what is wrong with it.
fn parse_json(label: &str, body: &[u8]) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_slice(body).map_err(|error| ProviderError::Protocol {
        provider: label.to_string(),
        message: format!(
            "the body is not valid JSON ({error}); it begins: {}",
            preview(&String::from_utf8_lossy(body), 200)
        ),
    })
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds (the HTTP standard; an HTTP date is
/// ignored).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    text("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map(Duration::from_secs_f64)
}

/// The `error.message` of an error body, else the start of the body.
/// What an error answer of `url` says, for a person: a model API's own error message; or, from a
/// server that is not one (an HTML error page, a plain web server, a wrong base path), a short
/// excerpt of its text with the URL tried and where to fix it.
fn error_message(body: &[u8], status: u16, url: &str) -> String {
    let hint = || {
        format!(
            "{url} may not be a model API: check --base-url (or [provider] base_url): Anthropic's is https://api.anthropic.com, an OpenAI-compatible server's usually ends in /v1"
        )
    };
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        let message = value["error"]["message"]
            .as_str()
            .or_else(|| value["error"].as_str());
        if let Some(message) = message {
            let mut message = preview(message, 500);
            // llama.cpp's `exceed_context_size_error` names the window it has.
            if let Some(window) = value["error"]["n_ctx"].as_u64() {
                message.push_str(&window::overflow_note(
                    value["error"]["n_prompt_tokens"].as_u64(),
                    window,
                ));
            }
            // A model API's path that does not exist: the base URL is wrong.
            return if matches!(status, 404 | 405) {
                format!("{message}; {}", hint())
            } else {
                message
            };
        }
    }
    let text = String::from_utf8_lossy(body);
    let excerpt = page_excerpt(&text);
    if excerpt.is_empty() {
        format!("(empty body); {}", hint())
    } else {
        format!("{excerpt}; {}", hint())
    }
}

/// The first words of a page's text: tags dropped, white space collapsed, at most 160
/// characters.
fn page_excerpt(text: &str) -> String {
    let mut plain = String::with_capacity(text.len().min(4096));
    let mut in_tag = false;
    for character in text.chars().take(64 << 10) {
        match character {
            '<' => {
                in_tag = true;
                plain.push(' ');
            }
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            _ => plain.push(character),
        }
    }
    let words: Vec<&str> = plain.split_whitespace().collect();
    preview(&words.join(" "), 160)
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub fn preview(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// A tool call's arguments as the model sent them (JSON text), parsed with [`repair`].
fn tool_input(
    label: &str,
    id: &str,
    name: &str,
    raw: &str,
    malformed: &mut Vec<MalformedToolCall>,
    repairs: &mut Vec<String>,
) -> serde_json::Value {
    match repair::parse_tool_arguments(raw) {
        Ok(repair::Parsed::Clean(value)) => value,
        // The log lines carry nothing the model wrote (a tool name, a piece of the arguments):
        // the log is not scrubbed, the `repairs` and `malformed` notes are (`redacting`).
        Ok(repair::Parsed::Repaired(value, what)) => {
            tracing::warn!(provider = label, "repaired tool-call arguments: {what}");
            repairs.push(format!("{name}: {what}"));
            value
        }
        Err(problem) => {
            tracing::warn!(
                provider = label,
                "unreadable tool-call arguments; the call is not run and the model is told why"
            );
            malformed.push(MalformedToolCall {
                tool_use_id: id.to_string(),
                message: format!(
                    "the arguments of this `{name}` call are not a JSON object ({problem}); nothing was run. They began: {}. Send the call again with one complete JSON object.",
                    preview(raw, 200)
                ),
            });
            serde_json::json!({})
        }
    }
}

/// Everything needed to build a provider.
#[derive(Debug, Clone)]
pub enum ProviderConfig {
    /// Anthropic Messages API.
    Anthropic(HttpSettings),
    /// OpenAI-compatible chat completions.
    OpenAi(HttpSettings),
    /// A recorded script.
    Scripted(Script),
}

/// Build one provider (without retries). `tools`, the names of the tools the agent offers, is
/// only read by the scripted provider, which leaves out exchanges needing a tool not among them.
pub fn build(config: ProviderConfig, tools: &[&str]) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(match config {
        ProviderConfig::Anthropic(settings) => {
            Arc::new(anthropic::AnthropicProvider::new(settings)?)
        }
        ProviderConfig::OpenAi(settings) => Arc::new(openai::OpenAiProvider::new(settings)?),
        ProviderConfig::Scripted(script) => Arc::new(ScriptedProvider::new(&script, tools)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        let mut dated = reqwest::header::HeaderMap::new();
        dated.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&dated), None);
        dated.insert("retry-after", "-3".parse().unwrap());
        assert_eq!(retry_after(&dated), None);
    }

    #[test]
    fn error_messages_come_from_the_body() {
        let url = "http://127.0.0.1:8080/v1/chat/completions";
        assert_eq!(
            error_message(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                529,
                url
            ),
            "Overloaded"
        );
        let hint = format!("{url} may not be a model API: check --base-url");
        let empty = error_message(b"", 502, url);
        assert!(
            empty.starts_with("(empty body); ") && empty.contains(&hint),
            "{empty}"
        );
        // llama-server's answer to a wrong path is JSON, but the path is what is wrong.
        let not_found = error_message(
            br#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
            404,
            url,
        );
        assert!(not_found.starts_with("File Not Found; ") && not_found.contains(&hint));
        // A plain web server's error page: a short excerpt of its text, no markup.
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>Error response</title></head>\n<body>\n<h1>Error response</h1>\n<p>Error code: 404</p>{}</body></html>",
            "<p>Message: File not found.</p>\n".repeat(35)
        );
        let said = error_message(page.as_bytes(), 404, url);
        assert!(
            said.starts_with(
                "Error response Error response Error code: 404 Message: File not found."
            ),
            "{said}"
        );
        assert!(!said.contains('<') && !said.contains('\n'), "{said}");
        assert!(said.chars().count() < 160 + 300, "{said}");
        assert!(said.contains(&hint), "{said}");
    }

    #[test]
    fn keys_do_not_show_in_debug_output() {
        let key = ApiKey::new("sk-secret-123");
        assert!(!format!("{key:?}").contains("secret"));
        let mut settings = HttpSettings::new("http://x", "m");
        settings.api_key = Some(key);
        assert!(!format!("{settings:?}").contains("secret"));
    }

    #[test]
    fn context_overflow_errors_are_recognised_in_each_wording() {
        let status = |status: u16, message: &str| ProviderError::Status {
            provider: "p".into(),
            status,
            message: message.into(),
            retry_after: None,
        };
        for message in [
            "prompt is too long: 210000 tokens > 200000 maximum",
            "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
            "the request exceeds the available context size, try increasing it",
            "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000",
        ] {
            assert!(status(400, message).is_context_overflow(), "{message}");
        }
        assert!(!status(400, "messages: roles must alternate").is_context_overflow());
        assert!(!status(500, "prompt is too long").is_context_overflow());
        assert!(
            ProviderError::AllFailed("a: HTTP 400: prompt is too long".into())
                .is_context_overflow()
        );
    }

    #[test]
    fn preview_cuts_on_character_boundaries() {
        assert_eq!(preview("héllo", 2), "hé…");
        assert_eq!(preview("hi", 5), "hi");
    }
}
