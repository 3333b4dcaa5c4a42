//! A scripted LLM server on 127.0.0.1 for the tests: a real HTTP/1.1 server (hyper) that answers
//! each request with the next [`Reply`] of its script and records every request (path, headers,
//! body, arrival time), so a test can assert exactly what the agent sent. Replies speak the real
//! wire formats ([`anthropic`] and [`openai`] build them): JSON bodies, error statuses with
//! `retry-after`, server-sent-event streams cut into small chunks, hostile answers (a body
//! without end, a request never answered) and replies held at a [`ReplyGate`] until the test
//! opens it. When the script runs out the server answers 500, so
//! an extra request fails the test visibly. [`text_of`] and [`message_texts`] read the text the
//! agent sent back out of a recorded body.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::mpsc;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A JSON body with a status and extra headers.
    Json {
        /// HTTP status.
        status: u16,
        /// Extra headers, e.g. `retry-after`.
        headers: Vec<(String, String)>,
        /// The body text (need not be valid JSON).
        body: String,
    },
    /// A `text/event-stream` body sent in chunks of `chunk` bytes.
    Sse {
        /// The whole stream text.
        text: String,
        /// Bytes per chunk.
        chunk: usize,
    },
    /// A 200 body of `total` bytes of `fill`, sent in 64 KiB chunks (stops early if the client
    /// goes away).
    Endless {
        /// The content type announced.
        content_type: String,
        /// The byte repeated.
        fill: u8,
        /// The total size.
        total: usize,
    },
    /// Never answer.
    Hang,
    /// Wait at a [`ReplyGate`] until the test opens it, then answer with the inner reply. The
    /// request is recorded before it waits.
    Held(ReplyGate, Box<Reply>),
    /// Wait this long, then answer with the inner reply (a slow model).
    Delayed(Duration, Box<Reply>),
    /// A `text/event-stream` body sent in chunks of `chunk` bytes with `pause` between them
    /// (a slowly streaming model).
    SlowSse {
        /// The whole stream text.
        text: String,
        /// Bytes per chunk.
        chunk: usize,
        /// The pause before each chunk after the first.
        pause: Duration,
    },
}

/// A gate that holds replies until the test opens it, and tells the test when a request has
/// reached it, so a test can order what it does by events rather than by sleeping.
#[derive(Debug, Clone, Default)]
pub struct ReplyGate {
    inner: Arc<GateState>,
}

#[derive(Debug)]
struct GateState {
    reached: tokio::sync::watch::Sender<usize>,
    open: tokio::sync::watch::Sender<bool>,
}

impl Default for GateState {
    fn default() -> Self {
        Self {
            reached: tokio::sync::watch::Sender::new(0),
            open: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl ReplyGate {
    /// A closed gate.
    pub fn new() -> ReplyGate {
        ReplyGate::default()
    }

    /// `reply`, held at this gate.
    pub fn hold(&self, reply: Reply) -> Reply {
        Reply::Held(self.clone(), Box::new(reply))
    }

    /// Wait until `count` requests have reached the gate (held or let through).
    pub async fn reached(&self, count: usize) {
        let mut reached = self.inner.reached.subscribe();
        let _ = reached.wait_for(|reached| *reached >= count).await;
    }

    /// Let every held reply, and every later one, through.
    pub fn open(&self) {
        self.inner.open.send_replace(true);
    }

    async fn pass(&self) {
        self.inner.reached.send_modify(|reached| *reached += 1);
        let mut open = self.inner.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Reply {
    /// A 200 JSON reply.
    pub fn json(body: Value) -> Reply {
        Reply::Json {
            status: 200,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    /// An error status with a JSON error body and optional headers.
    pub fn status(status: u16, message: &str, headers: &[(&str, &str)]) -> Reply {
        Reply::Json {
            status,
            headers: headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            body: serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}})
                .to_string(),
        }
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The path, e.g. `/v1/messages`.
    pub path: String,
    /// Headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
    /// When it arrived.
    pub at: Instant,
}

impl Recorded {
    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Chooses the reply from the request body (for concurrent callers, e.g. sub-agents).
pub type Router = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Default)]
struct State {
    replies: VecDeque<Reply>,
    requests: Vec<Recorded>,
    router: Option<Router>,
    /// Whether the questions a provider asks about the model's context window (`GET …/models`,
    /// `/props`, Ollama's `POST /api/show`) take scripted replies; when not, they are answered
    /// 404 at once, neither recorded nor taking a reply, so a script lists model calls only.
    scripts_window_questions: bool,
    /// How many window questions were answered 404 that way.
    refused_window_questions: usize,
}

/// A running server; it stops when dropped.
pub struct LlmServer {
    url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmServer {
    /// Start a server that plays `replies` in order.
    pub async fn start(replies: Vec<Reply>) -> LlmServer {
        Self::start_with(replies, None, false).await
    }

    /// Like [`LlmServer::start`], but the window questions (`GET …/models`, `/props`,
    /// `/api/show`) are requests like any other: recorded, and answered from the script.
    pub async fn start_answering_window_questions(replies: Vec<Reply>) -> LlmServer {
        Self::start_with(replies, None, true).await
    }

    /// Start a server that answers each request with `route(body)`, whatever the order in
    /// which concurrent callers ask.
    pub async fn start_routed(
        route: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> LlmServer {
        Self::start_with(Vec::new(), Some(Arc::new(route)), false).await
    }

    async fn start_with(
        replies: Vec<Reply>,
        router: Option<Router>,
        scripts_window_questions: bool,
    ) -> LlmServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let state = Arc::new(Mutex::new(State {
            replies: replies.into(),
            requests: Vec::new(),
            router,
            scripts_window_questions,
            refused_window_questions: 0,
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                // Headers and body go out in separate writes; without this, Nagle's algorithm
                // and delayed ACKs add 40 ms to every response.
                let _ = stream.set_nodelay(true);
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(state, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        LlmServer { url, state, task }
    }

    /// The base URL, e.g. `http://127.0.0.1:4711`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many window questions were answered 404 without the script (see
    /// [`LlmServer::start_answering_window_questions`]).
    pub fn refused_window_questions(&self) -> usize {
        self.state
            .lock()
            .expect("server state")
            .refused_window_questions
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("server state").requests.clone()
    }

    /// Waits until at least `count` requests were received, at most 60 seconds (then panics,
    /// saying how many came): a test waiting on the model never hangs.
    pub async fn wait_for_requests(&self, count: usize) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let requests = self.requests();
            if requests.len() >= count {
                return requests;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the model server received {} of {count} requests within 60 s",
                requests.len()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The JSON bodies received so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// Replies not yet played.
    pub fn remaining(&self) -> usize {
        self.state.lock().expect("server state").replies.len()
    }
}

/// The text of the last user message of a request body in either wire format, and whether that
/// message carries tool results (empty and false when there is none).
pub fn last_user(body: &Value) -> (String, bool) {
    let Some(message) = body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
    else {
        return (String::new(), false);
    };
    let results = message["content"]
        .as_array()
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
    (text_of(message), results)
}

/// The text of a request message in either wire format: its content when that is a string, else
/// its text blocks joined (tool calls and results left out).
pub fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

/// The text of the tool result `message` carries, if any: its content when that is a string,
/// else its text parts joined.
pub fn tool_result_of(message: &Value) -> Option<String> {
    let blocks = message["content"].as_array()?;
    let block = blocks.iter().find(|block| block["type"] == "tool_result")?;
    Some(text_of(block))
}

/// The text of each message of a request body, in order.
pub fn message_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .expect("a request body with messages")
        .iter()
        .map(text_of)
        .collect()
}

async fn answer(state: Arc<Mutex<State>>, request: Request<Incoming>) -> Response<ChannelBody> {
    let at = Instant::now();
    let path = request.uri().path().to_string();
    let window_question = request.method() == hyper::Method::GET || path.ends_with("/api/show");
    if window_question {
        let mut state = state.lock().expect("server state");
        if !state.scripts_window_questions {
            state.refused_window_questions += 1;
            drop(state);
            let (sender, body) = ChannelBody::new();
            tokio::spawn(async move {
                let _ = sender.send(Bytes::from_static(b"not found")).await;
            });
            return Response::builder()
                .status(404)
                .body(body)
                .expect("a valid response");
        }
    }
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                value.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let reply = {
        let mut state = state.lock().expect("server state");
        let routed = state.router.as_ref().map(|route| route(&body));
        state.requests.push(Recorded {
            path,
            headers,
            body,
            at,
        });
        routed.or_else(|| state.replies.pop_front())
    };
    let mut reply =
        reply.unwrap_or_else(|| Reply::status(500, "the test script has no reply left", &[]));
    loop {
        match reply {
            Reply::Held(gate, inner) => {
                gate.pass().await;
                reply = *inner;
            }
            Reply::Delayed(wait, inner) => {
                tokio::time::sleep(wait).await;
                reply = *inner;
            }
            _ => break,
        }
    }
    let (sender, body) = ChannelBody::new();
    let mut builder = Response::builder();
    match reply {
        Reply::Json {
            status,
            headers,
            body: text,
        } => {
            builder = builder
                .status(status)
                .header("content-type", "application/json");
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            tokio::spawn(async move {
                let _ = sender.send(Bytes::from(text)).await;
            });
        }
        Reply::Sse { text, chunk } => {
            builder = builder
                .status(200)
                .header("content-type", "text/event-stream");
            tokio::spawn(async move {
                for piece in text.into_bytes().chunks(chunk.max(1)) {
                    if sender.send(Bytes::copy_from_slice(piece)).await.is_err() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            });
        }
        Reply::Endless {
            content_type,
            fill,
            total,
        } => {
            builder = builder.status(200).header("content-type", content_type);
            tokio::spawn(async move {
                let block = Bytes::from(vec![fill; 64 << 10]);
                let mut sent = 0;
                while sent < total {
                    if sender.send(block.clone()).await.is_err() {
                        return;
                    }
                    sent += block.len();
                }
            });
        }
        Reply::SlowSse { text, chunk, pause } => {
            builder = builder
                .status(200)
                .header("content-type", "text/event-stream");
            tokio::spawn(async move {
                for (index, piece) in text.into_bytes().chunks(chunk.max(1)).enumerate() {
                    if index > 0 {
                        tokio::time::sleep(pause).await;
                    }
                    if sender.send(Bytes::copy_from_slice(piece)).await.is_err() {
                        return;
                    }
                }
            });
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Reply::Held(..) | Reply::Delayed(..) => {}
    }
    builder.body(body).expect("a valid response")
}

/// A response body fed through a channel, so chunks go out as they are produced.
pub struct ChannelBody {
    receiver: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender whose chunks it yields; it ends when the sender is dropped.
    pub fn new() -> (mpsc::Sender<Bytes>, ChannelBody) {
        let (sender, receiver) = mpsc::channel(4);
        (sender, ChannelBody { receiver })
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// `reply` (a JSON reply) with its body's `usage` replaced by `usage`.
fn with_usage(reply: Reply, usage: Value) -> Reply {
    match reply {
        Reply::Json {
            status,
            headers,
            body,
        } => {
            let mut value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            value["usage"] = usage;
            Reply::Json {
                status,
                headers,
                body: value.to_string(),
            }
        }
        other => other,
    }
}

/// Replies in the Anthropic Messages API format.
pub mod anthropic {
    use serde_json::{Value, json};

    use super::Reply;

    /// A block of a scripted message.
    #[derive(Debug, Clone)]
    pub enum Block {
        /// Text.
        Text(String),
        /// A tool call: id, name, the argument JSON *text* (so tests can send malformed JSON).
        Tool(String, String, String),
        /// Extended thinking: its text and signature.
        Thinking(String, String),
        /// Redacted thinking: its encrypted data.
        RedactedThinking(String),
    }

    /// A thinking block with `signature`.
    pub fn thinking(text: &str, signature: &str) -> Block {
        Block::Thinking(text.to_string(), signature.to_string())
    }

    /// A redacted thinking block.
    pub fn redacted_thinking(data: &str) -> Block {
        Block::RedactedThinking(data.to_string())
    }

    /// A text block.
    pub fn text(text: &str) -> Block {
        Block::Text(text.to_string())
    }

    /// A tool-use block with arguments `input`.
    pub fn tool(id: &str, name: &str, input: Value) -> Block {
        Block::Tool(id.to_string(), name.to_string(), input.to_string())
    }

    /// A tool-use block whose arguments are the raw text `json` (streaming only).
    pub fn raw_tool(id: &str, name: &str, json: &str) -> Block {
        Block::Tool(id.to_string(), name.to_string(), json.to_string())
    }

    /// A complete (non-streaming) message.
    pub fn message(blocks: &[Block]) -> Reply {
        let mut tool = false;
        let content: Vec<Value> = blocks
            .iter()
            .map(|block| match block {
                Block::Text(text) => json!({"type": "text", "text": text}),
                Block::Tool(id, name, input) => {
                    tool = true;
                    let input: Value =
                        serde_json::from_str(input).unwrap_or(Value::String(input.clone()));
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
                Block::Thinking(text, signature) => {
                    json!({"type": "thinking", "thinking": text, "signature": signature})
                }
                Block::RedactedThinking(data) => json!({"type": "redacted_thinking", "data": data}),
            })
            .collect();
        Reply::json(json!({
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": if tool { "tool_use" } else { "end_turn" },
            "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 20},
        }))
    }

    /// [`message`] reporting `usage` (e.g. with `cache_read_input_tokens`) instead of the
    /// default 100 in / 20 out.
    pub fn message_with_usage(blocks: &[Block], usage: Value) -> Reply {
        super::with_usage(message(blocks), usage)
    }

    /// The same message as a server-sent-event stream, in chunks of `chunk` bytes, with the
    /// tool arguments split across several `input_json_delta`s.
    pub fn stream(blocks: &[Block], chunk: usize) -> Reply {
        let mut events = Vec::new();
        let mut push = |name: &str, data: Value| {
            events.push(format!("event: {name}\ndata: {data}\n\n"));
        };
        push(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        );
        push("ping", json!({"type": "ping"}));
        let mut tool = false;
        for (index, block) in blocks.iter().enumerate() {
            match block {
                Block::Text(text) => {
                    push(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
                    );
                    let pieces: Vec<String> =
                        text.split_inclusive(' ').map(str::to_string).collect();
                    for piece in pieces {
                        push(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}),
                        );
                    }
                }
                Block::Thinking(text, signature) => {
                    push(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}),
                    );
                    for piece in text.split_inclusive(' ') {
                        push(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": piece}}),
                        );
                    }
                    push(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}}),
                    );
                }
                Block::RedactedThinking(data) => push(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": {"type": "redacted_thinking", "data": data}}),
                ),
                Block::Tool(id, name, input) => {
                    tool = true;
                    push(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    );
                    let characters: Vec<char> = input.chars().collect();
                    for piece in characters.chunks(5) {
                        let piece: String = piece.iter().collect();
                        push(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
                        );
                    }
                }
            }
            push(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            );
        }
        push(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": if tool { "tool_use" } else { "end_turn" }, "stop_sequence": null}, "usage": {"output_tokens": 20}}),
        );
        push("message_stop", json!({"type": "message_stop"}));
        Reply::Sse {
            text: events.concat(),
            chunk,
        }
    }
}

/// Replies in the OpenAI chat-completions format.
pub mod openai {
    use serde_json::{Value, json};

    use super::Reply;

    /// A complete message: text and tool calls `(id, name, arguments text)`.
    pub fn message(text: Option<&str>, calls: &[(&str, &str, &str)]) -> Reply {
        let tool_calls: Vec<Value> = calls
            .iter()
            .map(|(id, name, arguments)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(tool_calls);
        }
        Reply::json(json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{"index": 0, "message": message, "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }))
    }

    /// [`message`] reporting `usage` (e.g. with `prompt_tokens_details.cached_tokens`) instead
    /// of the default 50 in / 10 out.
    pub fn message_with_usage(
        text: Option<&str>,
        calls: &[(&str, &str, &str)],
        usage: Value,
    ) -> Reply {
        super::with_usage(message(text, calls), usage)
    }

    /// The same as a stream of `data:` chunks ending in `[DONE]`.
    pub fn stream(text: Option<&str>, calls: &[(&str, &str, &str)], chunk: usize) -> Reply {
        let mut events = Vec::new();
        let mut push = |data: Value| events.push(format!("data: {data}\n\n"));
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
        );
        if let Some(text) = text {
            for piece in text.split_inclusive(' ') {
                push(
                    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}),
                );
            }
        }
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            push(
                json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}, "finish_reason": null}]}),
            );
            let characters: Vec<char> = arguments.chars().collect();
            for piece in characters.chunks(4) {
                let piece: String = piece.iter().collect();
                push(
                    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, "finish_reason": null}]}),
                );
            }
        }
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}]}),
        );
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}),
        );
        events.push("data: [DONE]\n\n".to_string());
        Reply::Sse {
            text: events.concat(),
            chunk,
        }
    }

    /// A complete message of `reasoning` (in `field`: `reasoning_content` or `reasoning`) and
    /// `text` (`""` as llama-server sends when the model only reasoned), ending with
    /// `finish_reason` (`stop`, `length`).
    pub fn reasoning(field: &str, reasoning: &str, text: &str, finish_reason: &str) -> Reply {
        Reply::json(json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, field: reasoning}, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }))
    }

    /// The same streamed: the reasoning in `delta.<field>` pieces, then the text in
    /// `delta.content` pieces (an empty `content` beside each reasoning piece, as llama-server
    /// sends), in chunks of `chunk` bytes.
    pub fn reasoning_stream(
        field: &str,
        reasoning: &str,
        text: &str,
        finish_reason: &str,
        chunk: usize,
    ) -> Reply {
        let mut events = Vec::new();
        let mut push = |data: Value| events.push(format!("data: {data}\n\n"));
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": null}, "finish_reason": null}]}),
        );
        for piece in reasoning.split_inclusive(' ') {
            push(
                json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": null, field: piece}, "finish_reason": null}]}),
            );
        }
        for piece in text.split_inclusive(' ') {
            push(
                json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}),
            );
        }
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}),
        );
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}),
        );
        events.push("data: [DONE]\n\n".to_string());
        Reply::Sse {
            text: events.concat(),
            chunk,
        }
    }
}
