//! `clawcage chat --gateway` in a pseudo-terminal, judged by the rendered screen (pyte, as in
//! terminal.rs), beside a running `clawcage gateway` started with the provider flags alone: an
//! approval request another client's turn raised is shown while it waits and its decision
//! replaces it, and the next line typed is a message, not an answer; after the gateway restarts
//! the terminal says it lost the connection, connects again and goes on. The restarted gateway
//! prints the address to open with the token it read from its file. A terminal attached to a
//! standby of a cluster (which relays it to the active host) goes on the same way when the
//! active host is killed and the standby takes over.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clawcage_tests::cli_state::{shared_state_dir, warm_components};
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, anthropic, text_of, tool_result_of};
use clawcage_tests::toolchains::screen_python;
use serde_json::{Value, json};

/// The session a terminal attached to a gateway uses by default.
const SESSION: &str = "agent:main:cli:main";

struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(config: &str) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
        std::os::unix::fs::symlink(shared_state_dir().join("cache"), state.join("cache")).unwrap();
        std::fs::write(workspace.join("scratch.txt"), "x\n").unwrap();
        let config_path = root.path().join("clawcage.toml");
        std::fs::write(
            &config_path,
            format!("[subagents]\nenabled = false\n{config}"),
        )
        .unwrap();
        Setup {
            _root: root,
            state,
            workspace,
            config: config_path,
        }
    }

    /// `clawcage gateway` on `bind`, the model chosen by flags alone.
    fn gateway(&self, server: &LlmServer, bind: &str) -> GatewayProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--workspace")
            .arg(&self.workspace)
            .args(["gateway", "--bind", bind])
            .args(["--provider", "anthropic", "--model", "claude-test"])
            .args(["--base-url", server.url()])
            .env_remove("RUST_LOG")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-gateway-test");
        GatewayProcess::start(command)
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.state.join("gateway/token"))
            .unwrap()
            .trim()
            .to_string()
    }
}

/// The model: `remove the scratch file` runs `rm scratch.txt`; a tool result is answered
/// `Removed.`; anything else `Hi there, <text>.`.
async fn model() -> LlmServer {
    LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if tool_result_of(&last).is_some() {
            return anthropic::message(&[anthropic::text("Removed.")]);
        }
        let said = text_of(&last);
        if said.contains("remove the scratch file") {
            return anthropic::message(&[anthropic::tool(
                "t1",
                "exec",
                json!({"command": "rm scratch.txt"}),
            )]);
        }
        anthropic::message(&[anthropic::text(&format!("Hi there, {said}"))])
    })
    .await
}

/// The terminal's steps across a lost connection: a line answered, the connection lost and made
/// again (the screen `back`), the next line answered (the screen `after`), then `/exit`.
fn across_a_reconnection() -> Value {
    json!([
        {"expect": "you> ", "timeout": 60},
        {"send": "First.\r"},
        {"expect": "Hi there, First", "timeout": 30},
        {"expect": "you> ", "timeout": 10},
        {"expect": "connecting again", "timeout": 60},
        {"expect": "connected again", "timeout": 90},
        {"sleep": 0.3},
        {"screen": "back"},
        {"send": "Second.\r"},
        {"expect": "Hi there, Second", "timeout": 30},
        {"expect": "you> ", "timeout": 10},
        {"screen": "after"},
        {"send": "/exit\r"},
        {"sleep": 0.3},
    ])
}

/// Waits until `server` was asked the terminal's first line, "First." (up to a minute),
/// then a moment more for its answer to reach the terminal.
async fn answered_first(server: &LlmServer) {
    for _ in 0..600 {
        if server
            .bodies()
            .iter()
            .any(|body| body.to_string().contains("First."))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Runs `clawcage chat --gateway` in a pseudo-terminal through `steps` (on a blocking thread,
/// so the test can act meanwhile); the driver's report.
fn drive(python: &Path, state: &Path, addr: SocketAddr, steps: Value) -> Value {
    drive_with(python, state, addr, &[], steps)
}

/// [`drive`] with `extra` arguments to `chat`.
fn drive_with(
    python: &Path,
    state: &Path,
    addr: SocketAddr,
    extra: &[&str],
    steps: Value,
) -> Value {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty_driver.py");
    let output = Command::new(python)
        .arg(driver)
        .arg(steps.to_string())
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_clawcage"))
        .arg("--state-dir")
        .arg(state)
        .args(["chat", "--gateway", &format!("ws://{addr}")])
        .args(extra)
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn screen(report: &Value, name: &str) -> String {
    report["screens"][name]
        .as_array()
        .unwrap_or_else(|| panic!("no screen {name}: {report}"))
        .iter()
        .map(|line| line.as_str().unwrap_or_default().trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_ok(report: &Value) {
    assert!(
        report["ok"] == true,
        "step {} failed; the output was:\n{}",
        report["failed_step"],
        report["output"].as_str().unwrap_or_default()
    );
}

/// An approver connection of the session, as another terminal or the web chat is.
async fn approver(addr: SocketAddr, token: &str) -> GatewayClient {
    let (mut client, challenge) = GatewayClient::open(addr, None).await.unwrap();
    assert_eq!(challenge["event"], "connect.challenge");
    let hello = client
        .request(
            "connect",
            json!({
                "minProtocol": 1,
                "maxProtocol": 1,
                "client": {"id": "second-terminal", "version": "1", "mode": "test"},
                "auth": {"token": token},
                "scopes": ["operator.approvals"],
                "approvalSession": SESSION,
            }),
        )
        .await;
    assert_eq!(hello["ok"], true, "{hello}");
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_from_another_client_is_shown_while_it_waits_and_eats_no_line() {
    let Some(python) = screen_python("an_approval_from_another_client_is_shown") else {
        return;
    };
    let server = model().await;
    let setup =
        Setup::new("[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nallow = [\"ls *\"]\n");
    let gateway = setup.gateway(&server, "127.0.0.1:0");
    let addr = gateway.addr;
    let token = setup.token();
    let terminal = {
        let steps = json!([
            {"expect": "you> ", "timeout": 60},
            {"expect": "approval needed \\[apr-", "timeout": 60},
            {"sleep": 0.5},
            {"screen": "live"},
            {"expect": "allow-once \\(by gateway:second-terminal\\)", "timeout": 60},
            {"sleep": 0.3},
            {"screen": "decided"},
            {"send": "Say hi.\r"},
            {"expect": "Hi there, Say hi", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"screen": "after"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]);
        let (python, state) = (python.clone(), setup.state.clone());
        tokio::task::spawn_blocking(move || drive(&python, &state, addr, steps))
    };
    // The terminal attaches (two connections: it and the approver below).
    let mut second = approver(addr, &token).await;
    for _ in 0..600 {
        let status = second.request("status", json!({})).await;
        if status["payload"]["connections"].as_u64() >= Some(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = second
        .request(
            "chat.send",
            json!({"sessionKey": SESSION, "message": "remove the scratch file", "idempotencyKey": "second-1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let request = loop {
        let event = second
            .next_event(Duration::from_secs(60))
            .await
            .expect("the request reaches the approver");
        if event["event"] == "exec.approval.requested" {
            break event["payload"].clone();
        }
    };
    // Long enough for the terminal to show it and the screen to be kept.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resolved = second
        .request(
            "exec.approval.resolve",
            json!({"id": request["id"], "decision": "allow-once"}),
        )
        .await;
    assert_eq!(resolved["ok"], true, "{resolved}");
    let report = terminal.await.unwrap();
    assert_ok(&report);
    let live = screen(&report, "live");
    let id = request["id"].as_str().unwrap();
    assert!(
        live.contains(&format!("approval needed [{id}]")) && live.contains("rm scratch.txt"),
        "the live request is shown:\n{live}"
    );
    assert!(
        live.contains(&format!("/approve {id}")),
        "with how to answer it:\n{live}"
    );
    let decided = screen(&report, "decided");
    assert!(
        decided.contains(&format!("{id}: allow-once (by gateway:second-terminal)")),
        "its decision replaces it:\n{decided}"
    );
    let after = screen(&report, "after");
    assert!(
        after.contains("Hi there, Say hi."),
        "the next line is a message:\n{after}"
    );
    assert!(
        !after.contains("no approval request"),
        "nothing took the line as an answer:\n{after}"
    );
    assert!(!setup.workspace.join("scratch.txt").exists());
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_connects_again_after_the_gateway_restarts() {
    let Some(python) = screen_python("the_terminal_connects_again") else {
        return;
    };
    let server = model().await;
    let setup = Setup::new("");
    let first = setup.gateway(&server, "127.0.0.1:0");
    let addr = first.addr;
    let terminal = {
        let python = python.clone();
        let steps = across_a_reconnection();
        let state = setup.state.clone();
        tokio::task::spawn_blocking(move || drive(&python, &state, addr, steps))
    };
    // The first turn is answered before the restart.
    answered_first(&server).await;
    let (_, printed) = first.terminate();
    assert!(
        printed.contains("client connected") && printed.contains("turn started"),
        "connections and turns are logged at info:\n{printed}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = setup.gateway(&server, &addr.to_string());
    let report = terminal.await.unwrap();
    assert_ok(&report);
    let back = screen(&report, "back");
    assert!(
        back.contains("connecting again") && back.contains("connected again"),
        "it says what happened:\n{back}"
    );
    assert!(
        screen(&report, "after").contains("Hi there, Second."),
        "and goes on"
    );
    // Restarted, the gateway read its token from the file: the address is ready to open.
    let printed = second.output();
    let token = setup.token();
    assert!(
        printed.contains(&format!("open http://{addr}/#token={token}")),
        "{printed}"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_typed_during_a_turn_joins_it_through_the_gateway() {
    let Some(python) = screen_python("a_line_typed_during_a_turn_joins_it") else {
        return;
    };
    let server = LlmServer::start_routed(|body| {
        let messages = body["messages"].as_array().unwrap();
        if messages
            .iter()
            .any(|message| text_of(message).contains("also say bye"))
        {
            return anthropic::message(&[anthropic::text("Napped, and bye.")]);
        }
        if tool_result_of(messages.last().unwrap()).is_some() {
            return anthropic::message(&[anthropic::text("Napped.")]);
        }
        anthropic::message(&[anthropic::tool("n1", "exec", json!({"command": "sleep 5"}))])
    })
    .await;
    let setup = Setup::new("");
    let gateway = setup.gateway(&server, "127.0.0.1:0");
    let addr = gateway.addr;
    let steps = json!([
        {"expect": "you> ", "timeout": 60},
        {"send": "Take a nap.\r"},
        {"expect": "sleep 5", "timeout": 30},
        {"sleep": 0.5},
        {"send": "also say bye"},
        {"sleep": 0.8},
        {"screen": "typing"},
        {"send": "\r"},
        {"expect": "joins its running turn", "timeout": 10},
        {"expect": "Napped, and bye", "timeout": 30},
        {"expect": "you> ", "timeout": 10},
        {"screen": "after"},
        {"send": "/exit\r"},
        {"sleep": 0.3},
    ]);
    let state = setup.state.clone();
    let report = tokio::task::spawn_blocking(move || drive(&python, &state, addr, steps))
        .await
        .unwrap();
    assert_ok(&report);
    let typing = screen(&report, "typing");
    let with_typed: Vec<&str> = typing
        .lines()
        .filter(|line| line.contains("also say bye"))
        .collect();
    assert!(
        with_typed.len() == 1 && with_typed[0].contains("> exec {\"command\":\"sleep 5\"} … "),
        "what is typed shows on the live line only:\n{typing}"
    );
    let after = screen(&report, "after");
    assert!(after.contains("you> also say bye"), "{after}");
    assert!(
        after.contains("(the agent is busy: the message joins its running turn)"),
        "{after}"
    );
    assert_eq!(after.matches("Napped, and bye.").count(), 1, "{after}");
    assert!(
        !after.contains("Napped.\n"),
        "one turn answered both: {after}"
    );
    drop(gateway);
}

/// A local chat beside a running gateway says the gateway fires the cron jobs (not "another
/// chat"), that its own cron tool changes them there, and how to attach to the gateway instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_beside_a_gateway_says_the_gateway_runs_the_cron_jobs() {
    let server = model().await;
    let setup = Setup::new("");
    let gateway = setup.gateway(&server, "127.0.0.1:0");
    let addr = gateway.addr;
    let output = tokio::task::spawn_blocking({
        let (state, workspace, config) = (
            setup.state.clone(),
            setup.workspace.clone(),
            setup.config.clone(),
        );
        let url = server.url().to_string();
        move || {
            Command::new(env!("CARGO_BIN_EXE_clawcage"))
                .arg("--config")
                .arg(config)
                .arg("--state-dir")
                .arg(state)
                .arg("--workspace")
                .arg(workspace)
                .args(["chat", "--provider", "anthropic", "--base-url", &url])
                .env("ANTHROPIC_API_KEY", "sk-test")
                .env_remove("RUST_LOG")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the gateway running at http://{addr}/ fires the cron jobs"
        )),
        "{stderr}"
    );
    // The chat still has the cron tool: it changes the jobs the gateway fires.
    assert!(
        stderr.contains("this chat's cron tool changes them there"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("clawcage chat --gateway ws://{addr}")),
        "{stderr}"
    );
    assert!(!stderr.contains("another clawcage chat"), "{stderr}");
    drop(gateway);
}

#[path = "cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "shared with the failover tests, which use all of it"
)]
mod cluster_host;

/// A terminal attached to a standby of a cluster is relayed to the active host and answered
/// there; when the active host is killed, the standby carries the terminal's connection over to
/// itself once it serves: the terminal never loses its connection (nothing about one is on the
/// screen) and goes on in the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_attached_to_a_standby_goes_on_when_the_standby_takes_over() {
    let Some(python) = screen_python("a_terminal_attached_to_a_standby") else {
        return;
    };
    let Some(nats) = clawcage_tests::nats::NatsServer::start("a_terminal_attached_to_a_standby")
    else {
        return;
    };
    let server = model().await;
    let workspace = tempfile::tempdir().unwrap();
    let first = cluster_host::Host::new(&nats.url(), server.url(), "host-a");
    let second = cluster_host::Host::new(&nats.url(), server.url(), "host-b");
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let (standby, relay) = second.standby_relaying(workspace.path()).await;
    // Once the standby has seen the active host, the terminal attaches through it.
    drop(cluster_host::relayed_client(relay, cluster_host::TOKEN).await);
    let state = tempfile::tempdir().unwrap();
    let taken_over = state.path().join("taken-over");
    let terminal = {
        let state = state.path().to_path_buf();
        let steps = json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "First.\r"},
            {"expect": "Hi there, First", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"wait_file": taken_over.display().to_string(), "timeout": 90},
            {"send": "Second.\r"},
            {"expect": "Hi there, Second", "timeout": 60},
            {"expect": "you> ", "timeout": 10},
            {"screen": "after"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]);
        tokio::task::spawn_blocking(move || {
            drive_with(
                &python,
                &state,
                relay,
                &["--token", cluster_host::TOKEN],
                steps,
            )
        })
    };
    // The first turn is answered (by the active host) before it is killed.
    answered_first(&server).await;
    let said = active.kill();
    assert!(!said.contains("panicked"), "{said}");
    let standby = tokio::time::timeout(Duration::from_secs(60), standby)
        .await
        .expect("the standby took over within 60 s")
        .unwrap()
        .expect("the standby serves");
    std::fs::write(&taken_over, "").unwrap();
    let report = terminal.await.unwrap();
    assert_ok(&report);
    let after = screen(&report, "after");
    assert!(after.contains("Hi there, Second."), "it goes on:\n{after}");
    let unwrapped = after.replace('\n', "");
    assert!(
        !unwrapped.contains("connecting again") && !unwrapped.contains("went away"),
        "the terminal never lost its connection:\n{after}"
    );
    assert_eq!(standby.addr, relay, "the standby serves where it relayed");
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}
