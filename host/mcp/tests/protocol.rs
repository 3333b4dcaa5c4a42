//! The MCP server driven by raw JSON-RPC, as a hostile or careless client would: over an
//! in-memory pipe with the stdio transport and over a real loopback HTTP listener. Every request
//! gets an answer — deeply nested arguments, invalid JSON, oversized messages — and a call whose
//! tool holds its thread delays neither `tools/list` nor another call. Ordering is checked with
//! events (the slow tool reports that it started and waits to be released), not with timings; the
//! timeouts below only turn a hang into a failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use clawcage_agent::{AuditedRegistry, ToolRegistry};
use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use clawcage_mcp::{MAX_ARGUMENT_DEPTH, MAX_MESSAGE_BYTES, McpServer};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Long enough for a slow machine, short enough that a hang fails the test.
const PATIENCE: Duration = Duration::from_secs(30);

/// A tool that answers at once: `{"text": …}` upper-cased.
#[derive(Debug)]
struct Upper(ToolSpec);

impl Tool for Upper {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            Ok(ToolOutput::text(
                args["text"].as_str().unwrap_or_default().to_uppercase(),
            ))
        })
    }
}

/// A tool whose calls report that they started, then hold their thread (a blocking wait, like a
/// guest that never yields) until the test opens the gate.
#[derive(Debug)]
struct Gate {
    spec: ToolSpec,
    started: mpsc::UnboundedSender<()>,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Tool for Gate {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call<'a>(&'a self, _args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let _ = self.started.send(());
            // Deliberately blocking: the thread is held, not just the task.
            let (open, opened) = &*self.open;
            let (open, waited) = opened
                .wait_timeout_while(open.lock().unwrap(), PATIENCE, |open| !*open)
                .unwrap();
            if waited.timed_out() || !*open {
                return Err(ToolError::Failed("the gate never opened".into()));
            }
            Ok(ToolOutput::text("released"))
        })
    }
}

fn spec(name: &str, schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("The {name} test tool."),
        input_schema: schema,
    }
}

/// The server under test, and the handles on its `gate` tool.
struct Fixture {
    server: McpServer,
    started: mpsc::UnboundedReceiver<()>,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Fixture {
    /// Waits until `count` calls of `gate` are running.
    async fn gate_holds(&mut self, count: usize) {
        for _ in 0..count {
            tokio::time::timeout(PATIENCE, self.started.recv())
                .await
                .expect("the slow call starts")
                .unwrap();
        }
    }

    /// Lets every call of `gate` finish.
    fn open_gate(&self) {
        let (open, opened) = &*self.open;
        *open.lock().unwrap() = true;
        opened.notify_all();
    }
}

fn fixture() -> Fixture {
    let (started_tx, started) = mpsc::unbounded_channel();
    let open = Arc::new((Mutex::new(false), Condvar::new()));
    let mut registry = ToolRegistry::new();
    registry
        .register(Arc::new(Upper(spec(
            "upper",
            json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        ))))
        .unwrap();
    registry
        .register(Arc::new(Gate {
            spec: spec("gate", json!({"type": "object"})),
            started: started_tx,
            open: open.clone(),
        }))
        .unwrap();
    Fixture {
        server: McpServer::new(AuditedRegistry::new(registry, None), "test", "test"),
        started,
        open,
    }
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}
    }})
}

const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

fn call(id: u64, name: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{arguments}}}}}"#
    )
}

fn list(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#)
}

/// `{"a": [[[…]]]}` with `depth` levels of arrays.
fn nested_arguments(depth: usize) -> String {
    format!(r#"{{"a":{}{}}}"#, "[".repeat(depth), "]".repeat(depth))
}

fn assert_deep_refusal(reply: &Value, id: u64) {
    assert_eq!(reply["id"], id, "{reply}");
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
        )),
        "{message}"
    );
}

// ---------------------------------------------------------------------------------------------
// stdio: newline-delimited JSON-RPC over an in-memory pipe

/// A client on the other end of the server's stdio.
struct Stdio {
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<DuplexStream>>>,
    write: tokio::io::WriteHalf<DuplexStream>,
    server: tokio::task::JoinHandle<()>,
}

impl Stdio {
    /// Starts `server` on a pipe and completes the handshake.
    async fn start(server: McpServer) -> Stdio {
        let (client, serving) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(serving);
        let server = tokio::spawn(async move {
            server.serve_io(read, write).await.unwrap();
        });
        let (read, write) = tokio::io::split(client);
        let mut stdio = Stdio {
            lines: BufReader::new(read).lines(),
            write,
            server,
        };
        stdio.send(&initialize(0).to_string()).await;
        let reply = stdio.next().await;
        assert_eq!(reply["result"]["serverInfo"]["name"], "clawcage", "{reply}");
        stdio.send(INITIALIZED).await;
        stdio
    }

    async fn send(&mut self, line: &str) {
        self.write.write_all(line.as_bytes()).await.unwrap();
        self.write.write_all(b"\n").await.unwrap();
        self.write.flush().await.unwrap();
    }

    /// The next message from the server.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("the server answers")
            .unwrap()
            .expect("the server keeps its output open");
        serde_json::from_str(&line).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_a_deeply_nested_call_is_answered_with_an_error_for_its_id() {
    let mut stdio = Stdio::start(fixture().server).await;
    for (id, depth) in [(1, 200), (2, 5_000), (3, 200_000)] {
        stdio
            .send(&call(id, "upper", &nested_arguments(depth)))
            .await;
        assert_deep_refusal(&stdio.next().await, id);
    }
    // Just under serde_json's own limit of 128: refused by the server's bound, not by luck.
    stdio.send(&call(4, "upper", &nested_arguments(120))).await;
    assert_deep_refusal(&stdio.next().await, 4);
    // The deepest arguments accepted reach the tool's schema check.
    stdio
        .send(&call(5, "upper", &nested_arguments(MAX_ARGUMENT_DEPTH - 1)))
        .await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], 5, "{reply}");
    assert_eq!(reply["result"]["isError"], false, "{reply}");
}

/// Two calls hold their threads — as many as the runtime has workers — while `tools/list` and
/// a fast call are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_slow_calls_do_not_delay_other_requests() {
    let mut fixture = fixture();
    let mut stdio = Stdio::start(fixture.server.clone()).await;
    stdio.send(&call(1, "gate", "{}")).await;
    stdio.send(&call(2, "gate", "{}")).await;
    fixture.gate_holds(2).await;
    // The slow calls cannot finish before the gate opens: what comes now answers the others.
    stdio.send(&list(3)).await;
    let listed = stdio.next().await;
    assert_eq!(listed["id"], 3, "{listed}");
    assert_eq!(listed["result"]["tools"].as_array().unwrap().len(), 2);
    stdio.send(&call(4, "upper", r#"{"text":"fast"}"#)).await;
    let fast = stdio.next().await;
    assert_eq!(fast["id"], 4, "{fast}");
    assert_eq!(fast["result"]["content"][0]["text"], "FAST", "{fast}");

    fixture.open_gate();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let slow = stdio.next().await;
        assert_eq!(slow["result"]["content"][0]["text"], "released", "{slow}");
        ids.push(slow["id"].as_u64().unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
}

/// The same on a runtime with a single thread.
#[tokio::test(flavor = "current_thread")]
async fn stdio_a_slow_call_does_not_delay_a_fast_one_on_a_single_thread() {
    let mut fixture = fixture();
    let mut stdio = Stdio::start(fixture.server.clone()).await;
    stdio.send(&call(1, "gate", "{}")).await;
    fixture.gate_holds(1).await;
    stdio.send(&call(2, "upper", r#"{"text":"fast"}"#)).await;
    let fast = stdio.next().await;
    assert_eq!(fast["id"], 2, "{fast}");
    fixture.open_gate();
    assert_eq!(stdio.next().await["id"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_garbage_gets_a_parse_error_and_the_server_keeps_serving() {
    let mut stdio = Stdio::start(fixture().server).await;
    stdio.send("this is not json").await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], Value::Null, "{reply}");
    assert_eq!(reply["error"]["code"], -32700, "{reply}");

    // Broken JSON whose id is still readable is answered for that id.
    stdio
        .send(r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"upper","arguments":{"text": tru}}}"#)
        .await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], 11, "{reply}");
    assert_eq!(reply["error"]["code"], -32700, "{reply}");

    // JSON that is not a JSON-RPC message.
    stdio.send(r#"{"foo":"bar"}"#).await;
    let reply = stdio.next().await;
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    stdio.send("[1, 2, 3]").await;
    let reply = stdio.next().await;
    assert_eq!(reply["error"]["code"], -32600, "{reply}");

    // Blank lines and broken notifications get no answer; the next request does.
    stdio.send("").await;
    stdio.send("   ").await;
    stdio
        .send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"#)
        .await;
    stdio
        .send(&call(12, "upper", r#"{"text":"still here"}"#))
        .await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], 12, "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "STILL HERE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_an_oversized_line_is_refused_for_its_id_without_being_kept() {
    let mut stdio = Stdio::start(fixture().server).await;
    // 100 MB in one line, written while the server reads it.
    let head = r#"{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"upper","arguments":{"text":""#;
    stdio.write.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..100 {
        stdio.write.write_all(&chunk).await.unwrap();
    }
    stdio.send(r#""}}}"#).await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], 21, "{reply}");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&MAX_MESSAGE_BYTES.to_string()),
        "{message}"
    );

    // The line was consumed whole: the next one is read as a message of its own.
    stdio.send(&call(22, "upper", r#"{"text":"after"}"#)).await;
    let reply = stdio.next().await;
    assert_eq!(reply["id"], 22, "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "AFTER");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_the_server_ends_when_the_client_closes_its_input() {
    let mut stdio = Stdio::start(fixture().server).await;
    stdio.write.shutdown().await.unwrap();
    tokio::time::timeout(PATIENCE, &mut stdio.server)
        .await
        .expect("the server stops")
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// streamable HTTP on a loopback listener

/// A running HTTP server and the session a client opened on it.
struct Http {
    address: std::net::SocketAddr,
    session: String,
    shutdown: CancellationToken,
}

impl Drop for Http {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Http {
    async fn start(server: McpServer) -> Http {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move { server.serve_http(listener, stop).await.unwrap() });
        let mut http = Http {
            address,
            session: String::new(),
            shutdown,
        };
        let response = http.post(Full::new(initialize(0).to_string().into())).await;
        assert_eq!(response.status(), 200);
        http.session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let reply = first_message(response).await;
        assert_eq!(reply["result"]["serverInfo"]["name"], "clawcage", "{reply}");
        let accepted = http.post(Full::new(INITIALIZED.into())).await;
        assert_eq!(accepted.status(), 202);
        http
    }

    /// POSTs `body` to the endpoint on a connection of its own.
    async fn post<B>(&self, body: B) -> http::Response<Incoming>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stream = tokio::net::TcpStream::connect(self.address).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = http::Request::post("/mcp")
            .header("host", self.address.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18");
        if !self.session.is_empty() {
            request = request.header("mcp-session-id", &self.session);
        }
        tokio::time::timeout(PATIENCE, sender.send_request(request.body(body).unwrap()))
            .await
            .expect("the server answers")
            .unwrap()
    }

    async fn request(&self, body: String) -> Value {
        first_message(self.post(Full::new(body.into())).await).await
    }
}

/// The first JSON-RPC message of a response, whether sent as JSON or as a server-sent event.
async fn first_message(response: http::Response<Incoming>) -> Value {
    let is_json = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json");
    let mut body = response.into_body();
    let mut text = String::new();
    loop {
        let frame = tokio::time::timeout(PATIENCE, body.frame())
            .await
            .expect("the server answers");
        let Some(frame) = frame else {
            break;
        };
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
        if !is_json
            && let Some(message) = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .find(|message| message.get("id").is_some())
        {
            return message;
        }
    }
    assert!(is_json, "no JSON-RPC message in the event stream: {text}");
    serde_json::from_str(&text).unwrap()
}

/// A request body of `head`, then `count` copies of `chunk`, then `tail`, produced while sent.
struct Streamed {
    parts: std::collections::VecDeque<Bytes>,
}

impl Streamed {
    fn new(head: &str, chunk: Bytes, count: usize, tail: &str) -> Streamed {
        let mut parts = std::collections::VecDeque::new();
        parts.push_back(Bytes::copy_from_slice(head.as_bytes()));
        parts.extend(std::iter::repeat_n(chunk, count));
        parts.push_back(Bytes::copy_from_slice(tail.as_bytes()));
        Streamed { parts }
    }
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.parts.pop_front().map(|part| Ok(Frame::data(part))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_a_deeply_nested_call_is_answered_with_an_error_for_its_id() {
    let http = Http::start(fixture().server).await;
    for (id, depth) in [(1, 120), (2, 5_000), (3, 200_000)] {
        let response = http
            .post(Full::new(
                call(id, "upper", &nested_arguments(depth)).into(),
            ))
            .await;
        assert_eq!(response.status(), 200);
        assert_deep_refusal(&first_message(response).await, id);
    }
    let reply = http
        .request(call(4, "upper", r#"{"text":"shallow"}"#))
        .await;
    assert_eq!(reply["result"]["content"][0]["text"], "SHALLOW", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_slow_calls_do_not_delay_other_requests() {
    let mut fixture = fixture();
    let http = Arc::new(Http::start(fixture.server.clone()).await);
    let slow: Vec<_> = [1, 2]
        .into_iter()
        .map(|id| {
            let http = http.clone();
            tokio::spawn(async move { http.request(call(id, "gate", "{}")).await })
        })
        .collect();
    fixture.gate_holds(2).await;
    let listed = http.request(list(3)).await;
    assert_eq!(
        listed["result"]["tools"].as_array().unwrap().len(),
        2,
        "{listed}"
    );
    let fast = http.request(call(4, "upper", r#"{"text":"fast"}"#)).await;
    assert_eq!(fast["result"]["content"][0]["text"], "FAST", "{fast}");
    assert!(
        slow.iter().all(|call| !call.is_finished()),
        "the slow calls are still held"
    );

    fixture.open_gate();
    for call in slow {
        let reply = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
        assert_eq!(reply["result"]["content"][0]["text"], "released", "{reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_garbage_gets_a_parse_error_and_the_server_keeps_serving() {
    let http = Http::start(fixture().server).await;
    let response = http.post(Full::new(Bytes::from_static(b"not json"))).await;
    assert_eq!(response.status(), 400);
    let reply = first_message(response).await;
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert_eq!(reply["id"], Value::Null, "{reply}");

    let reply = http
        .request(r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"x": tru}}"#.into())
        .await;
    assert_eq!(reply["id"], 5, "{reply}");
    assert_eq!(reply["error"]["code"], -32700, "{reply}");

    let reply = http.request(call(6, "upper", r#"{"text":"ok"}"#)).await;
    assert_eq!(reply["result"]["content"][0]["text"], "OK", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_an_oversized_body_is_refused_for_its_id_without_being_kept() {
    let http = Http::start(fixture().server).await;
    let head = r#"{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"upper","arguments":{"text":""#;
    let body = Streamed::new(head, Bytes::from(vec![b'x'; 1 << 20]), 100, r#""}}}"#);
    let response = http.post(body).await;
    assert_eq!(response.status(), 200);
    let reply = first_message(response).await;
    assert_eq!(reply["id"], 31, "{reply}");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&MAX_MESSAGE_BYTES.to_string()),
        "{reply}"
    );

    let reply = http.request(call(32, "upper", r#"{"text":"after"}"#)).await;
    assert_eq!(reply["result"]["content"][0]["text"], "AFTER", "{reply}");
}
