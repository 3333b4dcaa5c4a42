//! `clawcage gateway` as a process on 127.0.0.1 beside the scripted LLM server, driven by a
//! WebSocket client: the handshake and its refusals, sessions in parallel and in order, an
//! idempotent re-send, an abort mid-turn, a reconnect that replays exactly the missed events, a
//! kill -9 mid-turn and a restart, a SIGTERM, and `gateway status`. It is one file (over 700 lines)
//! because every test drives the same gateway process through the same `Setup`, `Gateway` and
//! client helpers, one test per behaviour; parts would each need that setup again.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clawcage_tests::gateway_client::{GatewayClient, WAIT, connect_params};
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{
    LlmServer, Reply, ReplyGate, anthropic, last_user, text_of, tool_result_of,
};
use serde_json::{Value, json};

const TOKEN: &str = "gateway-test-token-0123456789";

/// The shared compiled-component cache of the CLI tests, filled before a gateway starts so that
/// no deadline below counts compiling components.
fn cache_dir() -> PathBuf {
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    clawcage_tests::cli_state::shared_state_dir().join("cache")
}

/// A state directory, workspace and configuration of a test's own.
struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(llm: &str) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(cache_dir()).unwrap();
        std::os::unix::fs::symlink(cache_dir(), state.join("cache")).unwrap();
        std::fs::write(workspace.join("hello.txt"), "hello from the workspace\n").unwrap();
        let config = root.path().join("clawcage.toml");
        std::fs::write(
            &config,
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n[subagents]\nenabled = false\n"
            ),
        )
        .unwrap();
        Setup {
            _root: root,
            state,
            workspace,
            config,
        }
    }
}

/// A running `clawcage gateway`; killed when dropped.
struct Gateway {
    process: GatewayProcess,
    addr: SocketAddr,
}

impl Gateway {
    fn start(setup: &Setup, extra: &[&str]) -> Gateway {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--config")
            .arg(&setup.config)
            .arg("--state-dir")
            .arg(&setup.state)
            .arg("--workspace")
            .arg(&setup.workspace)
            .args(["gateway", "--bind", "127.0.0.1:0"])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-gateway-test");
        let process = GatewayProcess::start(command);
        let addr = process.addr;
        Gateway { process, addr }
    }

    fn with_token(setup: &Setup) -> Gateway {
        Self::start(setup, &["--token", TOKEN, "--sends-per-minute", "1000"])
    }

    async fn client(&self) -> GatewayClient {
        GatewayClient::connect(self.addr, TOKEN).await.0
    }

    /// Sends SIGTERM and waits for the exit status.
    fn terminate(self) -> std::process::ExitStatus {
        self.process.terminate().0
    }

    /// kill -9.
    fn kill(self) {
        self.process.kill();
    }
}

/// A streamed answer of `text`.
fn answer(text: &str) -> Reply {
    anthropic::stream(&[anthropic::text(text)], 48)
}

/// The text of the last user message of a request body.
fn last_user_text(body: &Value) -> String {
    last_user(body).0
}

fn send_params(session: &str, message: &str, idempotency: &str) -> Value {
    json!({"sessionKey": session, "message": message, "idempotencyKey": idempotency})
}

fn is_end(event: &Value) -> bool {
    event["stream"] == "lifecycle"
        && matches!(event["data"]["phase"].as_str(), Some("end" | "error"))
}

fn error_code(response: &Value) -> &str {
    response["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_refusals_are_answered_while_another_client_is_served() {
    let server = LlmServer::start(vec![]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::start(&setup, &["--token", TOKEN, "--sends-per-minute", "2"]);
    let (mut good, hello) = GatewayClient::connect(gateway.addr, TOKEN).await;
    let payload = &hello["payload"];
    assert_eq!(payload["protocol"], 1);
    assert!(payload["server"]["version"].is_string());
    let methods = payload["features"]["methods"].as_array().unwrap();
    for method in [
        "chat.send",
        "chat.history",
        "sessions.subscribe",
        "agent.wait",
        "cron.add",
    ] {
        assert!(
            methods.iter().any(|m| m == method),
            "{method} in {methods:?}"
        );
    }
    assert_eq!(payload["policy"]["maxPayload"], 256 * 1024);
    assert!(payload["policy"]["tickIntervalMs"].as_u64().unwrap() > 0);
    let still_served = |response: Value| assert_eq!(response["payload"]["ok"], true, "{response}");

    // No token, a wrong token, a first frame that is not connect, garbage, an oversized frame.
    let refusals: Vec<(Value, &str, &str)> = vec![
        (
            json!({"type": "req", "id": "1", "method": "connect", "params": {"minProtocol": 1, "maxProtocol": 1, "client": {"id": "x"}}}),
            "UNAUTHORIZED",
            "unauthorized",
        ),
        (
            json!({"type": "req", "id": "1", "method": "connect", "params": connect_params("wrong-token-0123456789")}),
            "UNAUTHORIZED",
            "wrong token",
        ),
        (
            json!({"type": "req", "id": "1", "method": "health", "params": {}}),
            "INVALID_REQUEST",
            "first request must be `connect`",
        ),
        (
            json!({"type": "req", "id": "1", "method": "connect", "params": {"minProtocol": 2, "maxProtocol": 3, "auth": {"token": TOKEN}}}),
            "INVALID_REQUEST",
            "protocol mismatch",
        ),
    ];
    for (frame, code, reason) in refusals {
        let (mut client, _) = GatewayClient::open(gateway.addr, None).await.unwrap();
        client.send_text(frame.to_string()).await;
        let (frames, closed) = client.until_closed().await;
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(error_code(&frames[0]), code, "{frames:?}");
        assert_eq!(closed.code, 1008, "{closed:?}");
        assert!(
            closed.reason.contains(reason),
            "{closed:?} should say {reason}"
        );
        still_served(good.request("health", json!({})).await);
    }
    let (mut garbage, _) = GatewayClient::open(gateway.addr, None).await.unwrap();
    garbage.send_text("{not json").await;
    let (frames, closed) = garbage.until_closed().await;
    assert_eq!(error_code(&frames[0]), "INVALID_REQUEST");
    assert!(closed.reason.contains("not valid JSON"), "{closed:?}");
    let (mut huge, _) = GatewayClient::open(gateway.addr, None).await.unwrap();
    let _ = huge.try_send_text("x".repeat(300 * 1024)).await;
    let (_, closed) = huge.until_closed().await;
    assert_eq!(closed.code, 1009, "{closed:?}");
    assert!(closed.reason.contains("too large"), "{closed:?}");
    // A page from another origin cannot even open the socket.
    let refused = GatewayClient::open(gateway.addr, Some("http://evil.example"))
        .await
        .err()
        .unwrap();
    assert_eq!(refused, "HTTP 403");
    still_served(good.request("health", json!({})).await);

    // After the handshake: errors are answered and the connection stays.
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    client.send_text("][").await;
    let response = client.next_response().await;
    assert_eq!(response["id"], Value::Null);
    assert_eq!(error_code(&response), "INVALID_REQUEST");
    let unknown = client.request("sessions.teleport", json!({})).await;
    assert_eq!(error_code(&unknown), "UNKNOWN_METHOD", "{unknown}");
    for params in [
        json!({"sessionKey": "agent:main:test:a", "message": 5}),
        json!({"message": "hi"}),
        json!({"sessionKey": "../../etc/passwd", "message": "hi"}),
    ] {
        let wrong = client.request("chat.send", params).await;
        assert_eq!(error_code(&wrong), "INVALID_PARAMS", "{wrong}");
        assert_eq!(wrong["error"]["retryable"], false);
    }
    let wrong = client.request("agent.wait", json!({"runId": 7})).await;
    assert_eq!(error_code(&wrong), "INVALID_PARAMS", "{wrong}");
    let missing = client
        .request("agent.wait", json!({"runId": "run-none"}))
        .await;
    assert_eq!(error_code(&missing), "NOT_FOUND", "{missing}");
    client.send_binary(vec![1, 2, 3]).await;
    assert_eq!(error_code(&client.next_response().await), "INVALID_REQUEST");
    still_served(client.request("health", json!({})).await);

    // chat.send is rate-limited per connection (here 2 per minute). The two accepted sends fail
    // at the provider (the script is empty), which this test does not wait for.
    let session = "agent:main:test:rate";
    for n in 0..2 {
        let sent = client
            .request(
                "chat.send",
                send_params(session, &format!("m{n}"), &format!("i{n}")),
            )
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
    }
    let limited = client
        .request("chat.send", send_params(session, "m3", "i3"))
        .await;
    assert_eq!(error_code(&limited), "RATE_LIMITED", "{limited}");
    assert_eq!(limited["error"]["retryable"], true);
    // The limit is per connection: another one still sends.
    let elsewhere = good
        .request("chat.send", send_params("agent:main:test:other", "m", "g1"))
        .await;
    assert_eq!(elsewhere["ok"], true, "{elsewhere}");

    // An oversized frame after the handshake closes that socket, with a reason.
    let _ = client
        .try_send_text(format!("{{\"x\":\"{}\"}}", "y".repeat(300 * 1024)))
        .await;
    let (_, closed) = client.until_closed().await;
    assert_eq!(closed.code, 1009, "{closed:?}");
    still_served(good.request("health", json!({})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_in_parallel_and_one_sessions_turns_in_order() {
    let server = LlmServer::start_routed(|body| {
        let text = last_user_text(body);
        if text.contains("slow") {
            Reply::Hang
        } else {
            answer(&format!("answer to {text}"))
        }
    })
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let (slow, fast) = ("agent:main:test:slow", "agent:main:test:fast");

    let sent = client
        .request("chat.send", send_params(slow, "slow one", "s1"))
        .await;
    assert_eq!(sent["payload"]["status"], "started", "{sent}");
    let slow_run = sent["payload"]["runId"].as_str().unwrap().to_string();
    // Each message its own turn (the default, steer, would let q2 and q3 join q1's turn).
    let mode = client
        .request("chat.send", send_params(fast, "/queue followup", "mode"))
        .await;
    assert_eq!(mode["payload"]["status"], "command", "{mode}");
    // The other session answers while the first one's model never does.
    let mut runs = Vec::new();
    for n in 1..=3 {
        let sent = client
            .request(
                "chat.send",
                send_params(fast, &format!("q{n}"), &format!("f{n}")),
            )
            .await;
        runs.push(sent["payload"]["runId"].as_str().unwrap().to_string());
    }
    let events = client
        .agent_events_until(WAIT, |e| is_end(e) && e["runId"] == runs[2].as_str())
        .await;
    let fast_events: Vec<&Value> = events.iter().filter(|e| e["sessionKey"] == fast).collect();
    // One session's runs strictly one after another, in the order they were sent.
    let lifecycle: Vec<(String, String)> = fast_events
        .iter()
        .filter(|e| e["stream"] == "lifecycle" && e["data"]["phase"] != "queue")
        .map(|e| {
            (
                e["runId"].as_str().unwrap().to_string(),
                e["data"]["phase"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = runs
        .iter()
        .flat_map(|run| {
            [
                (run.clone(), "start".to_string()),
                (run.clone(), "end".to_string()),
            ]
        })
        .collect();
    assert_eq!(lifecycle, expected);
    let seqs: Vec<u64> = fast_events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let finals: Vec<&Value> = fast_events
        .iter()
        .filter(|e| e["data"]["phase"] == "end")
        .copied()
        .collect();
    assert_eq!(finals[2]["data"]["text"], "answer to q3");
    // The third request carried the first two exchanges.
    let third = server
        .bodies()
        .into_iter()
        .find(|body| last_user_text(body) == "q3")
        .unwrap();
    let history: Vec<String> = third["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}:{}", m["role"].as_str().unwrap(), text_of(m)))
        .collect();
    assert_eq!(
        history,
        [
            "user:q1",
            "assistant:answer to q1",
            "user:q2",
            "assistant:answer to q2",
            "user:q3"
        ]
    );
    let status = client
        .request("agent.wait", json!({"runId": slow_run, "timeoutMs": 10}))
        .await;
    assert_eq!(status["payload"]["status"], "timeout", "{status}");
    let aborted = client
        .request("chat.abort", json!({"sessionKey": slow}))
        .await;
    assert_eq!(aborted["payload"]["runIds"], json!([slow_run]));
    let waited = client
        .request("agent.wait", json!({"runId": slow_run, "timeoutMs": 20000}))
        .await;
    assert_eq!(waited["payload"]["status"], "aborted", "{waited}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_session_steers_queues_or_refuses_and_says_so_in_events() {
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |body| {
        let text = last_user_text(body);
        if text == "first" {
            // A tool call: the turn reaches a safe point after it, where steered messages enter.
            held.hold(anthropic::stream(
                &[
                    anthropic::text("Looking."),
                    anthropic::tool("t1", "read_file", json!({"path": "hello.txt"})),
                ],
                40,
            ))
        } else {
            answer(&format!("answer to {text}"))
        }
    })
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let session = "agent:main:test:busy";
    let send = |message: &str| send_params(session, message, &format!("k-{message}"));

    let first = client.request("chat.send", send("first")).await;
    assert_eq!(first["payload"]["status"], "started", "{first}");
    let run = first["payload"]["runId"].as_str().unwrap().to_string();
    gate.reached(1).await;
    // The default mode, steer: the message joins the running turn.
    let steered = client.request("chat.send", send("correction")).await;
    assert_eq!(steered["payload"]["status"], "steered", "{steered}");
    assert_eq!(steered["payload"]["into"], run.as_str());
    let steered_run = steered["payload"]["runId"].as_str().unwrap().to_string();
    // /queue is a command: it answers with the setting and runs nothing.
    let set = client.request("chat.send", send("/queue followup")).await;
    assert_eq!(set["payload"]["status"], "command", "{set}");
    assert!(
        set["payload"]["text"]
            .as_str()
            .unwrap()
            .contains("followup"),
        "{set}"
    );
    let wrong = client.request("chat.send", send("/queue sideways")).await;
    assert_eq!(error_code(&wrong), "INVALID_PARAMS", "{wrong}");
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("steer, followup, collect or interrupt"),
        "{wrong}"
    );
    // followup: each waits for a turn of its own, at a position (the steered message waits in
    // front until the running turn takes it).
    let later1 = client.request("chat.send", send("later 1")).await;
    assert_eq!(later1["payload"]["status"], "queued", "{later1}");
    assert_eq!(later1["payload"]["position"], 2, "{later1}");
    let later2 = client.request("chat.send", send("later 2")).await;
    assert_eq!(later2["payload"]["position"], 3, "{later2}");
    // A full queue with drop = new refuses the message, saying what to do.
    let cap = client
        .request("chat.send", send("/queue followup cap:2 drop:new"))
        .await;
    assert_eq!(cap["payload"]["status"], "command", "{cap}");
    let refused = client.request("chat.send", send("later 3")).await;
    assert_eq!(error_code(&refused), "QUEUE_FULL", "{refused}");
    assert_eq!(refused["error"]["retryable"], true);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cap"),
        "{refused}"
    );
    // The same key again is a new attempt, not a duplicate of the refused one.
    let again = client.request("chat.send", send("later 3")).await;
    assert_eq!(error_code(&again), "QUEUE_FULL", "{again}");

    gate.open();
    let last_run = later2["payload"]["runId"].as_str().unwrap().to_string();
    let events = client
        .agent_events_until(WAIT, |e| is_end(e) && e["runId"] == last_run.as_str())
        .await;
    let lifecycle: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["stream"] == "lifecycle" && e["data"]["phase"] != "note")
        .map(|e| {
            let phase = e["data"]["phase"].as_str().unwrap();
            let what = if phase == "queue" {
                format!("queue {}", e["data"]["status"].as_str().unwrap())
            } else {
                phase.to_string()
            };
            (e["runId"].as_str().unwrap().to_string(), what)
        })
        .collect();
    let later1_run = later1["payload"]["runId"].as_str().unwrap().to_string();
    let expected: Vec<(String, String)> = [
        (&run, "start"),
        (&steered_run, "queue steered"),
        (&later1_run, "queue queued"),
        (&last_run, "queue queued"),
        (&steered_run, "queue joined"),
        (&run, "end"),
        (&later1_run, "start"),
        (&later1_run, "end"),
        (&last_run, "start"),
        (&last_run, "end"),
    ]
    .into_iter()
    .map(|(run, what)| (run.clone(), what.to_string()))
    .collect();
    assert_eq!(lifecycle, expected);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The steered message entered the running turn, after the tool's result and before the
    // next model call.
    let bodies = server.bodies();
    let second = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(text_of(&second[0]), "first");
    assert_eq!(text_of(&second[1]), "Looking.");
    let last = second.last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(text_of(last), "correction");
    assert!(
        second[2]["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|block| block["type"] == "tool_result"),
        "{second:?}"
    );
    let joined = client
        .request(
            "agent.wait",
            json!({"runId": steered_run, "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(joined["payload"]["status"], "ok", "{joined}");
    assert_eq!(joined["payload"]["joinedRun"], run.as_str());
    assert_eq!(joined["payload"]["text"], "answer to correction");
    assert_eq!(
        server.requests().len(),
        4,
        "first, correction, later 1, later 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_with_the_same_idempotency_key_returns_the_first_run() {
    let server = LlmServer::start(vec![answer("only once")]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let session = "agent:main:test:idem";
    let first = client
        .request("chat.send", send_params(session, "hello", "k-1"))
        .await;
    let again = client
        .request("chat.send", send_params(session, "hello", "k-1"))
        .await;
    let run = first["payload"]["runId"].clone();
    assert_eq!(again["payload"]["runId"], run, "{again}");
    assert_eq!(again["payload"]["duplicate"], true);
    assert!(
        matches!(
            again["payload"]["status"].as_str(),
            Some("in_flight" | "ok")
        ),
        "{again}"
    );
    let done = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await;
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    assert_eq!(done["payload"]["text"], "only once");
    // Later, from another connection, with the agent method: still the first run, finished.
    let mut other = gateway.client().await;
    let id = other
        .send_request("agent", send_params(session, "hello", "k-1"))
        .await;
    let ack = other.response(&id).await;
    assert_eq!(ack["payload"]["runId"], run);
    assert_eq!(ack["payload"]["status"], "ok");
    let last = other.response(&id).await;
    assert_eq!(last["payload"]["text"], "only once", "{last}");
    assert_eq!(server.requests().len(), 1, "one run, one model request");
    let history = other
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    assert_eq!(history["payload"]["messages"].as_array().unwrap().len(), 2);

    // The agent method: an acknowledgement, then the final result under the same id.
    let id = other
        .send_request("agent", send_params(session, "again", "k-2"))
        .await;
    let ack = other.response(&id).await;
    assert_eq!(ack["payload"]["status"], "accepted", "{ack}");
    let last = other.response(&id).await;
    assert_eq!(last["payload"]["status"], "error", "{last}");
    assert!(
        last["payload"]["error"].as_str().unwrap().contains("500"),
        "the script had one reply: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_mid_turn_keeps_the_messages_and_answers_the_tool_call() {
    let server = LlmServer::start(vec![
        anthropic::stream(
            &[
                anthropic::text("Reading it."),
                anthropic::tool("t1", "read_file", json!({"path": "/etc/passwd"})),
            ],
            40,
        ),
        Reply::Hang,
        answer("after the abort"),
    ])
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let session = "agent:main:test:abort";
    let sent = client
        .request("chat.send", send_params(session, "read /etc/passwd", "a1"))
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    let events = client
        .agent_events_until(Duration::from_secs(120), |e| {
            e["stream"] == "tool" && e["data"]["phase"] == "end"
        })
        .await;
    let tool_end = events.last().unwrap();
    assert_eq!(tool_end["data"]["verdict"], "denied", "{tool_end}");
    assert_eq!(tool_end["data"]["name"], "read_file");
    let start = events
        .iter()
        .find(|e| e["data"]["phase"] == "start" && e["stream"] == "tool")
        .unwrap();
    assert_eq!(start["data"]["args"], json!({"path": "/etc/passwd"}));
    let text: String = events
        .iter()
        .filter(|e| e["stream"] == "assistant")
        .map(|e| e["data"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Reading it.");
    // The model's second request never answers: stop the turn there.
    server.wait_for_requests(2).await;
    let aborted = client
        .request("chat.abort", json!({"sessionKey": session, "runId": run}))
        .await;
    assert_eq!(aborted["payload"]["aborted"], true, "{aborted}");
    let end = client.agent_events_until(WAIT, is_end).await;
    let end = end.last().unwrap();
    assert_eq!(end["data"]["phase"], "error");
    assert_eq!(end["data"]["aborted"], true, "{end}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    let messages = history["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"][0]["text"], "read /etc/passwd");
    assert_eq!(messages[1]["content"][1]["type"], "tool_use");
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["verdict"], "denied", "{result}");
    // The session goes on after the abort.
    let next = client
        .request("chat.send", send_params(session, "go on", "a2"))
        .await;
    let run = next["payload"]["runId"].clone();
    let done = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await;
    assert_eq!(done["payload"]["text"], "after the abort", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_with_since_gets_exactly_the_missed_events_then_live_ones() {
    let long = "one two three four five six seven eight nine ten eleven twelve";
    let server = LlmServer::start(vec![answer(long), answer("second answer")]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let session = "agent:main:test:resume";
    let mut watcher = gateway.client().await;
    let subscribed = watcher
        .request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": 0}),
        )
        .await;
    assert_eq!(subscribed["payload"]["lastSeq"], 0, "{subscribed}");
    let mut sender = gateway.client().await;
    let sent = sender
        .request("chat.send", send_params(session, "count", "r1"))
        .await;
    let run = sent["payload"]["runId"].clone();
    // The watcher sees the start and at least three words, then drops (deltas that wait
    // together to be stored arrive joined, so "three " may end a longer one).
    let mut streamed = String::new();
    let seen = watcher
        .agent_events_until(WAIT, |e| {
            if e["stream"] == "assistant" {
                streamed.push_str(e["data"]["delta"].as_str().unwrap_or_default());
            }
            streamed.contains("three ")
        })
        .await;
    let last_seen = seen.last().unwrap()["seq"].as_u64().unwrap();
    watcher.close().await;
    let done = sender
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await;
    assert_eq!(done["payload"]["status"], "ok");

    let mut back = gateway.client().await;
    let id = back
        .send_request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": last_seen}),
        )
        .await;
    let answer = back.response(&id).await;
    assert_eq!(answer["payload"]["more"], false, "{answer}");
    let last = answer["payload"]["lastSeq"].as_u64().unwrap();
    let replayed = back.agent_events_until(WAIT, |e| e["seq"] == last).await;
    let seqs: Vec<u64> = replayed
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, ((last_seen + 1)..=last).collect::<Vec<_>>());
    let text: String = seen
        .iter()
        .chain(&replayed)
        .filter(|e| e["stream"] == "assistant")
        .map(|e| e["data"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, long, "nothing lost, nothing repeated");
    // Then the live events of the next run, and nothing twice.
    let sent = sender
        .request("chat.send", send_params(session, "more", "r2"))
        .await;
    let live = back.agent_events_until(WAIT, is_end).await;
    assert_eq!(live[0]["seq"].as_u64().unwrap(), last + 1);
    assert!(live.iter().all(|e| e["runId"] == sent["payload"]["runId"]));
    assert_eq!(live.last().unwrap()["data"]["text"], "second answer");
    // A since after the last event is refused with what to do.
    let future = back
        .request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": 10_000}),
        )
        .await;
    assert!(
        future["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chat.history"),
        "{future}"
    );
    // The history and its cursor: everything up to the cursor is in the messages.
    let history = back
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    let cursor = history["payload"]["cursor"].as_u64().unwrap();
    assert_eq!(cursor, live.last().unwrap()["seq"].as_u64().unwrap());
    assert_eq!(history["payload"]["messages"].as_array().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_turn_then_a_restart_resumes_the_run_under_its_id() {
    let server = LlmServer::start(vec![
        answer("first answer"),
        Reply::Hang,
        answer("second answer"),
    ])
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let session = "agent:main:test:crash";
    let mut client = gateway.client().await;
    let first = client
        .request("chat.send", send_params(session, "first", "c1"))
        .await;
    let done = client
        .request(
            "agent.wait",
            json!({"runId": first["payload"]["runId"], "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(done["payload"]["status"], "ok");
    let second = client
        .request("chat.send", send_params(session, "second", "c2"))
        .await;
    let second_run = second["payload"]["runId"].as_str().unwrap().to_string();
    server.wait_for_requests(2).await;
    let before = client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": 0}),
        )
        .await;
    assert_eq!(before["ok"], true, "{before}");
    // The last event stored before the kill: the second run's start, as the log replays it
    // (the hub numbers events before its writer stores them, so `lastSeq` may run ahead).
    let stored = client
        .agent_events_until(WAIT, |e| {
            e["runId"] == second_run.as_str() && e["data"]["phase"] == "start"
        })
        .await;
    let seq_before = stored.last().unwrap()["seq"].as_u64().unwrap();
    gateway.kill();

    // The restarted gateway takes the run up again under its id: the model is asked again
    // for the step that had not completed, and the run ends once.
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let waited = client
        .request(
            "agent.wait",
            json!({"runId": second_run, "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    assert_eq!(waited["payload"]["text"], "second answer", "{waited}");
    assert_eq!(server.requests().len(), 3, "one more model call, not more");
    let again = client
        .request("chat.send", send_params(session, "second", "c2"))
        .await;
    assert_eq!(again["payload"]["runId"], second_run.as_str(), "{again}");
    assert_eq!(again["payload"]["duplicate"], true, "{again}");

    let id = client
        .send_request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": seq_before}),
        )
        .await;
    let answer = client.response(&id).await;
    let last = answer["payload"]["lastSeq"].as_u64().unwrap();
    let events = client.agent_events_until(WAIT, |e| e["seq"] == last).await;
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (seq_before + 1..=last).collect::<Vec<_>>(),
        "the event log goes on without a hole"
    );
    assert!(events.iter().all(|e| e["runId"] == second_run.as_str()));
    let phases: Vec<&str> = events
        .iter()
        .filter(|e| e["stream"] == "lifecycle")
        .map(|e| e["data"]["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["resumed", "note", "end"], "{events:?}");
    assert_eq!(events[0]["data"]["attempt"], 1);
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    let messages = history["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(messages[2]["content"][0]["text"], "second");
    assert_eq!(messages[3]["content"][0]["text"], "second answer");
    let transcript = std::fs::read_to_string(
        setup
            .state
            .join("sessions")
            .join("agent%3Amain%3Atest%3Acrash.jsonl"),
    )
    .unwrap();
    for line in transcript.lines() {
        serde_json::from_str::<Value>(line).expect("every transcript line is whole");
    }
    assert_eq!(transcript.matches("\"kind\":\"turn\"").count(), 2);
}

/// The events of `session` its log holds now and, when `until` is given, until one satisfies
/// it (live).
async fn logged_events(
    gateway: &Gateway,
    session: &str,
    until: Option<&dyn Fn(&Value) -> bool>,
) -> Vec<Value> {
    let mut client = gateway.client().await;
    let subscribed = client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": session, "since": 0}),
        )
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let last = subscribed["payload"]["lastSeq"].as_u64().unwrap();
    let mut events = client
        .agent_events_until(WAIT, |e| e["seq"].as_u64() == Some(last))
        .await;
    if let Some(until) = until
        && !events.iter().any(until)
    {
        events.extend(client.agent_events_until(WAIT, until).await);
    }
    // Whatever else comes at once (an end said twice would).
    while let Some(event) = client.next_event(Duration::from_millis(500)).await {
        if event["event"] == "agent" {
            events.push(event["payload"].clone());
        }
    }
    events
}

/// A run finished just before its gateway stopped whose end never reached the log (the gateway
/// stopped, or lost the session's partition, after marking its input done and before storing
/// its end): the next start says the end once, with the answer the transcript holds, without
/// asking the model; a start with nothing missing says nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_the_log_lacks_is_ended_at_the_next_start() {
    let server = LlmServer::start(vec![answer("first answer"), answer("second answer")]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let session = "agent:main:test:unsaid";
    let mut client = gateway.client().await;
    let mut runs = Vec::new();
    for (message, idempotency) in [("first", "u1"), ("second", "u2")] {
        let sent = client
            .request("chat.send", send_params(session, message, idempotency))
            .await;
        let run = sent["payload"]["runId"].as_str().unwrap().to_string();
        let done = client
            .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
            .await;
        assert_eq!(done["payload"]["status"], "ok", "{done}");
        runs.push(run);
    }
    let second = runs[1].clone();
    let ends_second = |e: &Value| is_end(e) && e["runId"] == second.as_str();
    logged_events(&gateway, session, Some(&ends_second)).await;
    assert!(gateway.terminate().success());

    // The log loses the second run's end and what came after it.
    let log = setup
        .state
        .join("gateway/events/agent%3Amain%3Atest%3Aunsaid.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines
        .iter()
        .position(|line| ends_second(&serde_json::from_str::<Value>(line).unwrap()))
        .expect("the second run's end is in the log");
    std::fs::write(&log, format!("{}\n", lines[..cut].join("\n"))).unwrap();

    let gateway = Gateway::with_token(&setup);
    let events = logged_events(&gateway, session, Some(&ends_second)).await;
    let ends: Vec<&Value> = events.iter().filter(|e| is_end(e)).collect();
    assert_eq!(ends.len(), 2, "one end for each run: {events:#?}");
    assert_eq!(ends[0]["runId"], runs[0].as_str());
    assert_eq!(ends[1]["runId"], second.as_str());
    assert_eq!(ends[1]["data"]["phase"], "end", "{:?}", ends[1]);
    assert_eq!(ends[1]["data"]["text"], "second answer", "{:?}", ends[1]);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "the log goes on without a hole"
    );
    assert_eq!(server.requests().len(), 2, "the model is not asked again");
    let waited = client_wait(&gateway, &second).await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    assert!(gateway.terminate().success());

    // Nothing is missing now: the next start says nothing more.
    let gateway = Gateway::with_token(&setup);
    let again = logged_events(&gateway, session, None).await;
    assert_eq!(again, events, "nothing said twice");
}

/// `agent.wait` on `run` from a new client of `gateway`.
async fn client_wait(gateway: &Gateway, run: &str) -> Value {
    let mut client = gateway.client().await;
    client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_leaves_the_running_turn_to_the_next_start_and_exits_0() {
    let server = LlmServer::start(vec![Reply::Hang, answer("answered after the restart")]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let session = "agent:main:test:term";
    let mut client = gateway.client().await;
    let sent = client
        .request("chat.send", send_params(session, "wait forever", "t1"))
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    server.wait_for_requests(1).await;
    let status = tokio::task::spawn_blocking(move || gateway.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let (frames, closed) = client.until_closed().await;
    let events: Vec<&str> = frames.iter().filter_map(|f| f["event"].as_str()).collect();
    assert!(events.contains(&"shutdown"), "{frames:?}");
    assert!(
        !frames
            .iter()
            .any(|f| f["event"] == "agent" && f["payload"]["data"]["phase"] == "error"),
        "the run is not ended by the stop: {frames:?}"
    );
    assert_eq!(closed.code, 1012, "{closed:?}");
    let transcript = std::fs::read_to_string(
        setup
            .state
            .join("sessions")
            .join("agent%3Amain%3Atest%3Aterm.jsonl"),
    )
    .unwrap();
    assert!(transcript.contains("wait forever"), "{transcript}");
    assert!(!setup.state.join("gateway/gateway.json").exists());

    // The next start takes the run up under its id and answers it.
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let waited = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    assert_eq!(waited["payload"]["text"], "answered after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_a_second_gateway_and_the_generated_token() {
    let server = LlmServer::start(vec![]).await;
    let setup = Setup::new(server.url());
    let status = |setup: &Setup| {
        Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .arg("--state-dir")
            .arg(&setup.state)
            .args(["gateway", "status"])
            .output()
            .unwrap()
    };
    let before = status(&setup);
    assert_eq!(before.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&before.stderr).contains("no gateway runs"));

    let gateway = Gateway::start(&setup, &[]);
    let token = std::fs::read_to_string(setup.state.join("gateway/token")).unwrap();
    let token = token.trim();
    assert_eq!(token.len(), 64);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(setup.state.join("gateway/token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (mut client, _) = GatewayClient::connect(gateway.addr, token).await;
    assert_eq!(
        client.request("health", json!({})).await["payload"]["ok"],
        true
    );

    let during = status(&setup);
    let text = String::from_utf8_lossy(&during.stdout);
    assert!(during.status.success(), "{during:?}");
    assert!(
        text.contains(&format!("http://{}/", gateway.addr)),
        "{text}"
    );
    let second = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .arg("--config")
        .arg(&setup.config)
        .arg("--state-dir")
        .arg(&setup.state)
        .args(["gateway", "--bind", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&second.stderr).contains("already runs"));
    let exposed = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .arg("--config")
        .arg(&setup.config)
        .arg("--state-dir")
        .arg(setup.state.join("other"))
        .args(["gateway", "--bind", "0.0.0.0:0"])
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .output()
        .unwrap();
    assert_eq!(exposed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&exposed.stderr).contains("--token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_prints_the_url_with_the_token() {
    let server = LlmServer::start(vec![]).await;
    let setup = Setup::new(server.url());
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .arg("--config")
        .arg(&setup.config)
        .arg("--state-dir")
        .arg(&setup.state)
        .arg("--workspace")
        .arg(&setup.workspace)
        .args(["gateway", "--bind", "127.0.0.1:0"])
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .env("ANTHROPIC_API_KEY", "sk-gateway-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let open = loop {
        let line = lines
            .next()
            .expect("the gateway prints the URL before it serves")
            .unwrap();
        if line.starts_with("open ") {
            break line;
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let token = std::fs::read_to_string(setup.state.join("gateway/token")).unwrap();
    assert!(
        open.contains(&format!("/#token={}", token.trim())),
        "{open}"
    );
}

/// A `clawcage chat --gateway` process: piped stdin, its stdout read line by line.
struct RemoteChat {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl RemoteChat {
    fn command(state: &Path, addr: SocketAddr, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--state-dir")
            .arg(state)
            .args(["chat", "--gateway", &format!("ws://{addr}")])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN");
        command
    }

    fn start(state: &Path, addr: SocketAddr, extra: &[&str]) -> RemoteChat {
        let mut child = Self::command(state, addr, extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("clawcage chat starts");
        let (sender, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        RemoteChat {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn say(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for a line containing `needle` (lines already seen count); returns it.
    fn wait_for(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|line| line.contains(needle)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line.clone());
                    if found {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?}; the chat printed {:#?}", self.seen),
            }
        }
    }

    /// Closes stdin (Ctrl-D) and waits for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("clawcage chat did not exit within 15 s of the end of its input");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_terminals_attached_to_one_session_see_each_others_turns() {
    let server =
        LlmServer::start_routed(|body| answer(&format!("answer to {}", last_user_text(body))))
            .await;
    let setup = Setup::new(server.url());
    // No --token: the gateway saves its token in the state directory, where chat finds it.
    let gateway = Gateway::start(&setup, &["--sends-per-minute", "1000"]);
    let session = "agent:main:cli:pair";
    let mut left = RemoteChat::start(&setup.state, gateway.addr, &["--session", session]);
    let mut right = RemoteChat::start(&setup.state, gateway.addr, &["--session", session]);
    let header = left.wait_for("clawcage chat:");
    assert!(header.contains("via the gateway"), "{header}");
    assert!(header.contains(session), "{header}");
    right.wait_for("clawcage chat:");

    left.say("hello from the left");
    left.wait_for("answer to hello from the left");
    left.wait_for("tokens this turn");
    right.wait_for("other> hello from the left");
    right.wait_for("answer to hello from the left");

    right.say("hello from the right");
    right.wait_for("answer to hello from the right");
    left.wait_for("other> hello from the right");
    left.wait_for("answer to hello from the right");
    // Its own message is not echoed back as another client's.
    assert!(
        !left
            .seen
            .iter()
            .any(|line| line.contains("other> hello from the left")),
        "{:#?}",
        left.seen
    );

    // A third terminal attached later is told what the session holds.
    let mut late = RemoteChat::start(&setup.state, gateway.addr, &["--session", session]);
    late.wait_for("resuming session agent:main:cli:pair: 4 earlier messages");
    // /queue is answered by the gateway, and runs no turn.
    late.say("/queue followup");
    late.wait_for("queue for this session: followup");
    assert!(late.finish().success());
    assert!(left.finish().success());
    assert!(right.finish().success());
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_gateway_says_what_is_wrong_with_a_wrong_token_or_no_gateway() {
    let server = LlmServer::start(vec![]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let run = |command: &mut Command| {
        let output = command.stdin(Stdio::null()).output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    // A wrong token: a configuration error (exit 2) that says what to pass.
    let (code, stderr) = run(&mut RemoteChat::command(
        &setup.state,
        gateway.addr,
        &["--token", "wrong-token-0123456789"],
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("refused the token"), "{stderr}");
    assert!(stderr.contains("--token"), "{stderr}");
    // No token given and none saved (this gateway was started with --token).
    let (code, stderr) = run(&mut RemoteChat::command(&setup.state, gateway.addr, &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no gateway token"), "{stderr}");
    // A session key the gateway would refuse is refused before connecting.
    let (code, stderr) = run(&mut RemoteChat::command(
        &setup.state,
        gateway.addr,
        &["--token", TOKEN, "--session", "../../etc/passwd"],
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("agent:<agentId>:<channel>:<peer>"),
        "{stderr}"
    );
    // Nothing listens: the task cannot be done (exit 1), and the message says how to start one.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = free.local_addr().unwrap();
    drop(free);
    let (code, stderr) = run(&mut RemoteChat::command(
        &setup.state,
        nobody,
        &["--token", TOKEN],
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no gateway answers"), "{stderr}");
    assert!(stderr.contains("clawcage gateway"), "{stderr}");
    // Not a WebSocket URL.
    let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .arg("--state-dir")
        .arg(&setup.state)
        .args(["chat", "--gateway", "wss://example.org", "--token", TOKEN])
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("ssh -L"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_is_cut_off_with_a_reason_and_the_others_are_served() {
    // 50,000 streamed words: about 100,000 frames (18 MB), more than the kernel's socket
    // buffers and the connection's queue of 4,096 frames hold.
    let flood = "ab ".repeat(50_000);
    let flood_reply = anthropic::stream(&[anthropic::text(&flood)], 64);
    let server = LlmServer::start_routed(move |body| {
        if last_user_text(body) == "flood" {
            flood_reply.clone()
        } else {
            answer("meanwhile")
        }
    })
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let session = "agent:main:test:flood";
    let mut slow = gateway.client().await;
    let subscribed = slow
        .request("sessions.subscribe", json!({"sessionKey": session}))
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    // The sender leaves the run's events to the slow client, which never reads.
    let mut sender = gateway.client().await;
    let sent = sender
        .request("chat.send", send_params(session, "flood", "f1"))
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    sender
        .request("sessions.unsubscribe", json!({"sessionKey": session}))
        .await;
    // Another client is served while the flood streams: a whole turn of its own.
    let mut other = gateway.client().await;
    let id = other
        .send_request(
            "agent",
            send_params("agent:main:test:elsewhere", "hello", "m1"),
        )
        .await;
    let ack = other.response(&id).await;
    assert_eq!(ack["ok"], true, "{ack}");
    let done = other.response(&id).await;
    assert_eq!(done["payload"]["text"], "meanwhile", "{done}");
    let flooded = other
        .request("agent.wait", json!({"runId": run, "timeoutMs": 120_000}))
        .await;
    assert_eq!(flooded["payload"]["status"], "ok", "{flooded}");
    assert_eq!(
        flooded["payload"]["text"].as_str().unwrap().len(),
        flood.len(),
        "the run streamed to its end"
    );
    assert_eq!(
        other.request("health", json!({})).await["payload"]["ok"],
        true
    );
    // The slow client's socket holds what the kernel buffered, then a close with the reason.
    let (frames, closed) = slow.until_closed().await;
    assert_eq!(closed.code, 1013, "{closed:?}");
    assert!(
        closed.reason.contains("slow consumer") || closed.reason.contains("did not read"),
        "{closed:?}"
    );
    assert!(frames.len() < 100_000, "it was cut off before the end");
    let status = other.request("status", json!({})).await;
    assert_eq!(status["payload"]["connections"], 2, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keys_that_could_name_a_path_are_refused_or_escaped() {
    let server = LlmServer::start(vec![]).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let long_peer = format!("agent:main:test:{}", "p".repeat(200));
    let long_key = "k".repeat(300);
    // Keys that start turns or change a session must have the gateway's form.
    for key in [
        "agent:main:test:..",
        "agent:main:test:../../../../tmp/escape",
        "agent:main:test:a/b",
        "agent:main:../x:peer",
        "agent:main:test:a\u{0}b",
        long_peer.as_str(),
        "/etc/passwd",
    ] {
        for (method, params) in [
            ("chat.send", send_params(key, "hi", "k")),
            ("sessions.reset", json!({"sessionKey": key})),
            ("sessions.delete", json!({"sessionKey": key})),
        ] {
            let refused = client.request(method, params).await;
            assert_eq!(
                error_code(&refused),
                "INVALID_PARAMS",
                "{method} {key:?}: {refused}"
            );
        }
    }
    // Keys only read may be any printable text, but no control character and not too long.
    for key in ["a\u{0}b", "line\nbreak", long_key.as_str(), ""] {
        for method in ["chat.history", "sessions.subscribe"] {
            let refused = client.request(method, json!({"sessionKey": key})).await;
            assert_eq!(
                error_code(&refused),
                "INVALID_PARAMS",
                "{method} {key:?}: {refused}"
            );
        }
    }
    // Readable keys with `..` and `/` are data: nothing is read or created outside the state
    // directory's own files, whose names are escaped.
    let outside = setup.state.parent().unwrap().to_path_buf();
    for key in [
        "../../../../tmp/escape",
        "../escape",
        "a/../../escape",
        "..",
    ] {
        let history = client
            .request("chat.history", json!({"sessionKey": key}))
            .await;
        assert_eq!(history["payload"]["messages"], json!([]), "{history}");
        let subscribed = client
            .request("sessions.subscribe", json!({"sessionKey": key, "since": 0}))
            .await;
        assert_eq!(subscribed["payload"]["lastSeq"], 0, "{subscribed}");
        let aborted = client
            .request("chat.abort", json!({"sessionKey": key}))
            .await;
        assert_eq!(aborted["payload"]["aborted"], false, "{aborted}");
    }
    assert!(!outside.join("escape").exists());
    assert!(!Path::new("/tmp/escape").exists());
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|entry| entry.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    for dir in [
        setup.state.join("sessions"),
        setup.state.join("gateway").join("events"),
    ] {
        for name in names(&dir) {
            assert!(!name.contains(".."), "{name} in {}", dir.display());
        }
    }
    // A real session is unaffected and the gateway still serves.
    assert_eq!(
        client.request("health", json!({})).await["payload"]["ok"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_stops_the_running_turn_and_collect_drains_the_waiting_messages_as_one() {
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |body| {
        let text = last_user_text(body);
        match text.as_str() {
            "never answered" => Reply::Hang,
            "slow start" => held.hold(answer("started slowly")),
            other => answer(&format!("answer to {}", other.lines().count())),
        }
    })
    .await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let lifecycle = |events: &[Value]| -> Vec<(String, String)> {
        events
            .iter()
            .filter(|e| e["stream"] == "lifecycle" && e["data"]["phase"] != "note")
            .map(|e| {
                let data = &e["data"];
                let what = match data["phase"].as_str().unwrap() {
                    "queue" => format!("queue {}", data["status"].as_str().unwrap()),
                    "error" if data["aborted"] == true => "aborted".to_string(),
                    phase => phase.to_string(),
                };
                (e["runId"].as_str().unwrap().to_string(), what)
            })
            .collect()
    };
    let run_of = |response: &Value| response["payload"]["runId"].as_str().unwrap().to_string();

    // interrupt: the running turn stops (its message kept), the new one runs.
    let session = "agent:main:test:interrupt";
    let mode = client
        .request("chat.send", send_params(session, "/queue interrupt", "i0"))
        .await;
    assert_eq!(mode["payload"]["status"], "command", "{mode}");
    let first = client
        .request("chat.send", send_params(session, "never answered", "i1"))
        .await;
    server.wait_for_requests(1).await;
    let urgent = client
        .request("chat.send", send_params(session, "urgent", "i2"))
        .await;
    assert_eq!(urgent["payload"]["status"], "interrupting", "{urgent}");
    assert_eq!(urgent["payload"]["position"], 1, "{urgent}");
    let events = client
        .agent_events_until(WAIT, |e| {
            is_end(e) && e["runId"] == run_of(&urgent).as_str()
        })
        .await;
    assert_eq!(
        lifecycle(&events),
        [
            (run_of(&first), "start".to_string()),
            (run_of(&urgent), "queue interrupting".to_string()),
            (run_of(&first), "aborted".to_string()),
            (run_of(&urgent), "start".to_string()),
            (run_of(&urgent), "end".to_string()),
        ]
    );
    let stopped = client
        .request(
            "agent.wait",
            json!({"runId": run_of(&first), "timeoutMs": 1000}),
        )
        .await;
    assert_eq!(stopped["payload"]["status"], "aborted", "{stopped}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    let texts: Vec<String> = history["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text_of)
        .collect();
    // The stopped turn's message is kept (the lane joins it with the next user message, as
    // the stopped turn left no answer between them).
    assert!(texts[0].starts_with("never answered"), "{texts:?}");
    assert_eq!(texts.last().unwrap(), "answer to 1");

    // collect: the messages that waited drain as one turn after the quiet window.
    let session = "agent:main:test:collect";
    client
        .request(
            "chat.send",
            send_params(session, "/queue collect debounce:200ms", "c0"),
        )
        .await;
    let first = client
        .request("chat.send", send_params(session, "slow start", "c1"))
        .await;
    gate.reached(1).await;
    let a = client
        .request("chat.send", send_params(session, "one", "c2"))
        .await;
    let b = client
        .request("chat.send", send_params(session, "two", "c3"))
        .await;
    assert_eq!(a["payload"]["status"], "queued", "{a}");
    assert_eq!(b["payload"]["position"], 2, "{b}");
    gate.open();
    let events = client
        .agent_events_until(WAIT, |e| is_end(e) && e["runId"] == run_of(&a).as_str())
        .await;
    assert_eq!(
        lifecycle(&events),
        [
            (run_of(&first), "start".to_string()),
            (run_of(&a), "queue queued".to_string()),
            (run_of(&b), "queue queued".to_string()),
            (run_of(&first), "end".to_string()),
            (run_of(&a), "start".to_string()),
            (run_of(&b), "queue joined".to_string()),
            (run_of(&a), "end".to_string()),
        ]
    );
    let start = events
        .iter()
        .find(|e| e["runId"] == run_of(&a).as_str() && e["data"]["phase"] == "start")
        .unwrap();
    assert_eq!(start["data"]["collected"], json!([run_of(&b)]));
    let collected = server.bodies().pop().unwrap();
    let text = last_user_text(&collected);
    assert!(text.contains("one") && text.contains("two"), "{text}");
    let joined = client
        .request(
            "agent.wait",
            json!({"runId": run_of(&b), "timeoutMs": 1000}),
        )
        .await;
    assert_eq!(
        joined["payload"]["joinedRun"],
        run_of(&a).as_str(),
        "{joined}"
    );
}

/// A model that runs `rm -r DIR` for "remove DIR" and then repeats the tool's result.
fn remove_on_request(body: &Value) -> Reply {
    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
    if let Some(result) = tool_result_of(&last) {
        return answer(&format!("RESULT: {result}"));
    }
    match text_of(&last).strip_prefix("remove ") {
        Some(dir) => anthropic::stream(
            &[anthropic::tool(
                "t1",
                "exec",
                json!({"command": format!("rm -r {dir}")}),
            )],
            48,
        ),
        None => answer("ok"),
    }
}

impl Setup {
    /// [`Setup::new`] with exec under an allowlist that asks on a miss.
    fn with_approvals(llm: &str) -> Setup {
        let setup = Setup::new(llm);
        let mut config = std::fs::read_to_string(&setup.config).unwrap();
        config.push_str("\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n");
        std::fs::write(&setup.config, config).unwrap();
        setup
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_reach_approver_connections_and_only_they_may_answer() {
    let server = LlmServer::start_routed(remove_on_request).await;
    let setup = Setup::with_approvals(server.url());
    for dir in ["build", "dist"] {
        std::fs::create_dir(setup.workspace.join(dir)).unwrap();
    }
    let gateway = Gateway::with_token(&setup);

    // With no approver connected, the fallback (deny) decides at once.
    let mut plain = gateway.client().await;
    let sent = plain
        .request(
            "agent",
            send_params("agent:main:web:a", "remove dist", "a0"),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let first = sent["payload"]["runId"].as_str().unwrap().to_string();
    let waited = plain
        .request("agent.wait", json!({"runId": first, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["ok"], true, "{waited}");
    let text = waited["payload"]["text"].as_str().unwrap_or_default();
    assert!(text.contains("no operator is connected"), "{waited}");
    assert!(setup.workspace.join("dist").exists());

    // An approver: connect with the approvals scope.
    let (mut approver, challenge) = GatewayClient::open(gateway.addr, None).await.unwrap();
    assert_eq!(challenge["event"], "connect.challenge");
    let mut params = clawcage_tests::gateway_client::connect_params(TOKEN);
    params["scopes"] = json!(["operator.approvals"]);
    let hello = approver.request("connect", params).await;
    assert_eq!(hello["ok"], true, "{hello}");
    let features = hello["payload"]["features"].to_string();
    assert!(features.contains("exec.approval.resolve"), "{features}");

    let run = plain
        .send_request(
            "agent",
            send_params("agent:main:web:a", "remove build", "a1"),
        )
        .await;
    let request = approver.event_named("exec.approval.requested").await;
    assert_eq!(request["sessionKey"], "agent:main:web:a", "{request}");
    assert_eq!(request["tool"], "exec");
    assert_eq!(request["summary"], "rm -r build", "{request}");
    // The tool call it gates, so a page shows the question on that call's card.
    assert_eq!(request["toolCallId"], "t1", "{request}");
    assert!(request["expiresAtMs"].as_u64().unwrap() > 0);
    let id = request["id"].as_str().unwrap().to_string();
    // Nothing ran yet; a connection without the scope may not answer.
    assert!(setup.workspace.join("build").exists());
    let refused = plain
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "allow-once"}),
        )
        .await;
    assert_eq!(error_code(&refused), "UNAUTHORIZED", "{refused}");
    let bad = approver
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "maybe"}),
        )
        .await;
    assert_eq!(error_code(&bad), "INVALID_PARAMS", "{bad}");
    let listed = approver.request("exec.approval.list", json!({})).await;
    assert_eq!(listed["payload"]["pending"][0]["id"], id, "{listed}");
    // An approver of one session neither hears, lists nor answers another session's request.
    let (mut narrow, _) = GatewayClient::open(gateway.addr, None).await.unwrap();
    let mut params = clawcage_tests::gateway_client::connect_params(TOKEN);
    params["scopes"] = json!(["operator.approvals"]);
    params["approvalSession"] = json!("agent:main:cli:elsewhere");
    let hello = narrow.request("connect", params).await;
    assert_eq!(hello["ok"], true, "{hello}");
    let listed = narrow.request("exec.approval.list", json!({})).await;
    assert_eq!(listed["payload"]["pending"], json!([]), "{listed}");
    let refused = narrow
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "allow-once"}),
        )
        .await;
    assert_eq!(error_code(&refused), "UNAUTHORIZED", "{refused}");
    assert!(setup.workspace.join("build").exists());
    let mut heard = Vec::new();
    while let Some(event) = narrow.next_event(Duration::from_millis(300)).await {
        heard.push(event["event"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        !heard.iter().any(|name| name.starts_with("exec.approval")),
        "{heard:?}"
    );
    // A malformed approvalSession is refused at connect.
    let (mut malformed, _) = GatewayClient::open(gateway.addr, None).await.unwrap();
    let mut params = clawcage_tests::gateway_client::connect_params(TOKEN);
    params["scopes"] = json!(["operator.approvals"]);
    params["approvalSession"] = json!("not a key");
    let hello = malformed.request("connect", params).await;
    assert_eq!(error_code(&hello), "INVALID_PARAMS", "{hello}");
    let resolved = approver
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "allow-once"}),
        )
        .await;
    assert_eq!(resolved["ok"], true, "{resolved}");
    let done = approver.event_named("exec.approval.resolved").await;
    assert_eq!(done["decision"], "allow-once");
    let accepted = plain.response(&run).await;
    let second = accepted["payload"]["runId"].as_str().unwrap().to_string();
    let waited = plain
        .request("agent.wait", json!({"runId": second, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["ok"], true, "{waited}");
    assert!(!setup.workspace.join("build").exists());
    // The connection without the scope heard nothing of it and may not list what waits.
    let mut heard = Vec::new();
    while let Some(event) = plain.next_event(Duration::from_millis(300)).await {
        heard.push(event["event"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        !heard.iter().any(|name| name.starts_with("exec.approval")),
        "{heard:?}"
    );
    let listed = plain.request("exec.approval.list", json!({})).await;
    assert_eq!(error_code(&listed), "UNAUTHORIZED", "{listed}");
    // The same id cannot be answered twice.
    let again = approver
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "allow-once"}),
        )
        .await;
    assert_eq!(error_code(&again), "NOT_FOUND", "{again}");
    // A session's own modes: only an approver may set them; `exec full` runs without asking.
    let refused = plain
        .request(
            "exec.approval.policy",
            json!({"sessionKey": "agent:main:web:a", "exec": "full"}),
        )
        .await;
    assert_eq!(error_code(&refused), "UNAUTHORIZED", "{refused}");
    let bad = approver
        .request(
            "exec.approval.policy",
            json!({"sessionKey": "agent:main:web:a", "exec": "sometimes"}),
        )
        .await;
    assert_eq!(error_code(&bad), "INVALID_PARAMS", "{bad}");
    let set = approver
        .request(
            "exec.approval.policy",
            json!({"sessionKey": "agent:main:web:a", "exec": "full", "ask": "off"}),
        )
        .await;
    assert_eq!(set["payload"]["exec"], "full", "{set}");
    assert_eq!(set["payload"]["own"], true, "{set}");
    let sent = plain
        .request(
            "agent",
            send_params("agent:main:web:a", "remove dist", "a2"),
        )
        .await;
    let third = sent["payload"]["runId"].as_str().unwrap().to_string();
    let waited = plain
        .request("agent.wait", json!({"runId": third, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["ok"], true, "{waited}");
    assert!(!setup.workspace.join("dist").exists(), "{waited}");
    let reset = approver
        .request(
            "exec.approval.policy",
            json!({"sessionKey": "agent:main:web:a", "reset": true}),
        )
        .await;
    assert_eq!(reset["payload"]["own"], false, "{reset}");
    assert_eq!(reset["payload"]["exec"], "allowlist", "{reset}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_via_the_gateway_answers_its_sessions_approvals_inline() {
    let server = LlmServer::start_routed(remove_on_request).await;
    let setup = Setup::with_approvals(server.url());
    std::fs::create_dir(setup.workspace.join("build")).unwrap();
    let gateway = Gateway::start(&setup, &["--sends-per-minute", "1000"]);
    let session = "agent:main:cli:approver";
    let mut chat = RemoteChat::start(&setup.state, gateway.addr, &["--session", session]);
    // A terminal on another session hears nothing of this one's approvals.
    let mut other = RemoteChat::start(
        &setup.state,
        gateway.addr,
        &["--session", "agent:main:cli:bystander"],
    );
    chat.wait_for("clawcage chat:");
    other.wait_for("clawcage chat:");
    // A request of a session no terminal is attached to is not held for the terminals: with no
    // other approver connected, its fallback (deny) decides at once, long before the
    // request's time limit.
    let token = std::fs::read_to_string(setup.state.join("gateway").join("token")).unwrap();
    let (mut web, _) = GatewayClient::connect(gateway.addr, token.trim()).await;
    let sent = web
        .request(
            "agent",
            send_params("agent:main:web:a", "remove build", "w1"),
        )
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    let waited = web
        .request("agent.wait", json!({"runId": run, "timeoutMs": 30000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let text = waited["payload"]["text"].as_str().unwrap_or_default();
    assert!(text.contains("no operator is connected"), "{waited}");
    assert!(setup.workspace.join("build").exists());
    chat.say("remove build");
    chat.wait_for("approval needed: exec wants to run:");
    chat.wait_for("rm -r build");
    assert!(setup.workspace.join("build").exists());
    chat.say("y");
    chat.wait_for("allow-once");
    chat.wait_for("RESULT: ");
    assert!(!setup.workspace.join("build").exists());
    assert!(chat.finish().success());
    // Whatever the bystander printed by now.
    std::thread::sleep(Duration::from_millis(300));
    let bystander: Vec<String> = other.lines.try_iter().collect();
    assert!(
        !bystander
            .iter()
            .chain(&other.seen)
            .any(|line| line.contains("approval needed")),
        "{bystander:#?}"
    );
    assert!(other.finish().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_have_titles_and_the_history_says_how_each_turn_ended() {
    let server =
        LlmServer::start_routed(|body| answer(&format!("about {}", last_user(body).0))).await;
    let setup = Setup::new(server.url());
    let gateway = Gateway::with_token(&setup);
    let (mut client, hello) = GatewayClient::connect(gateway.addr, TOKEN).await;
    assert!(
        hello["payload"]["features"]
            .to_string()
            .contains("sessions.rename"),
        "{hello}"
    );

    // Only subscribing to a session, or reading its history, does not make it a session.
    let idle = "agent:main:web:idle";
    client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": idle, "since": 0}),
        )
        .await;
    client
        .request("chat.history", json!({"sessionKey": idle}))
        .await;
    let listed = client.request("sessions.list", json!({})).await;
    assert!(
        !listed.to_string().contains(idle),
        "an empty session is not listed: {listed}"
    );

    let key = "agent:main:web:titled";
    let sent = client
        .request(
            "agent",
            send_params(
                key,
                "\n  Plan the move to Lisbon in May\nwith the budget",
                "s1",
            ),
        )
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 20000}))
        .await;
    let listed = client.request("sessions.list", json!({})).await;
    let entry = listed["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .cloned()
        .unwrap();
    assert_eq!(entry["title"], "Plan the move to Lisbon in May", "{entry}");
    assert!(entry["lastActivityMs"].as_u64().unwrap() > 0);

    // The history gives each turn's end: where it ended, its usage and who answered.
    let history = client
        .request("chat.history", json!({"sessionKey": key}))
        .await;
    let turns = history["payload"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{history}");
    assert_eq!(turns[0]["afterMessage"], 2);
    assert_eq!(turns[0]["answeredBy"], "anthropic/claude-test");
    assert!(turns[0]["usage"]["inputTokens"].as_u64().unwrap() > 0);
    assert_eq!(turns[0]["aborted"], false);

    // A name set by the person wins, survives a restart, and is checked.
    let renamed = client
        .request(
            "sessions.rename",
            json!({"sessionKey": key, "title": "Lisbon"}),
        )
        .await;
    assert_eq!(renamed["payload"]["title"], "Lisbon", "{renamed}");
    // A title is kept on the disk: a secret value pasted into one is scrubbed first.
    let pasted = client
        .request(
            "sessions.rename",
            json!({"sessionKey": key, "title": "key sk-gateway-test"}),
        )
        .await;
    let shown = pasted["payload"]["title"].as_str().unwrap().to_string();
    assert!(!shown.contains("sk-gateway-test"), "{pasted}");
    let stored = std::fs::read_to_string(setup.state.join("gateway/titles.json")).unwrap();
    assert!(!stored.contains("sk-gateway-test"), "{stored}");
    client
        .request(
            "sessions.rename",
            json!({"sessionKey": key, "title": "Lisbon"}),
        )
        .await;
    let bad = client
        .request(
            "sessions.rename",
            json!({"sessionKey": key, "title": "a\u{1b}[2Jb"}),
        )
        .await;
    assert_eq!(error_code(&bad), "INVALID_PARAMS", "{bad}");
    let unknown_field = client
        .request(
            "sessions.rename",
            json!({"sessionKey": key, "title": "x", "extra": 1}),
        )
        .await;
    assert_eq!(
        error_code(&unknown_field),
        "INVALID_PARAMS",
        "{unknown_field}"
    );
    drop(client);
    gateway.kill();
    let gateway = Gateway::with_token(&setup);
    let mut client = gateway.client().await;
    let listed = client.request("sessions.list", json!({})).await;
    let entry = listed["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .cloned()
        .unwrap();
    assert_eq!(entry["title"], "Lisbon");
    // An empty title goes back to the first message's.
    let cleared = client
        .request("sessions.rename", json!({"sessionKey": key, "title": ""}))
        .await;
    assert_eq!(
        cleared["payload"]["title"],
        "Plan the move to Lisbon in May"
    );
}
