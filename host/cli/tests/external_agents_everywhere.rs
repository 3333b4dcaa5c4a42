//! External ACP agents are attached by the runtime, so every front end whose agent has
//! sub-agents can `spawn` one: here `clawcage chat` (lines on stdin) and the gateway (a client
//! over WebSocket), each spawning `acp_reporting_agent.py` and taking its result back as a
//! notification turn through the one notification route. (`run` and `acp` have their own tests
//! in `external_agent_limits.rs` and `acp.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, anthropic, last_user};
use serde_json::json;

const TOKEN: &str = "external-agents-token";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

/// A model that spawns the external agent `reporter` when asked to delegate, and relays what
/// comes back.
async fn delegating_model() -> LlmServer {
    LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        if text.starts_with("delegate") {
            anthropic::message(&[anthropic::tool(
                "s1",
                "spawn",
                json!({"task": "do the thing", "runtime": "acp", "agent": "reporter"}),
            )])
        } else if text.contains("the work is done") {
            anthropic::message(&[anthropic::text("Relayed: the helper is done.")])
        } else {
            anthropic::message(&[anthropic::text("A helper is on it.")])
        }
    })
    .await
}

/// A workspace, a state directory and a configuration allowing the external agent `reporter`.
struct Setup {
    root: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Setup {
    fn new(model: &LlmServer) -> Setup {
        clawcage_tests::cli_state::warm_components(binary());
        let root = tempfile::tempdir().expect("a temporary directory");
        let state = clawcage_tests::cli_state::private_state_dir();
        std::fs::create_dir_all(root.path().join("ws")).expect("the workspace");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp_reporting_agent.py");
        std::fs::write(
            root.path().join("clawcage.toml"),
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{url}\"\nmax_retries = 0\n\n\
                 [acp]\nallowed_agents = [\"reporter\"]\n\n\
                 [acp.agents.reporter]\ncommand = \"python3\"\nargs = [{script}]\ntimeout_secs = 30\n\
                 env = {{ SECRET_TO_LEAK = \"nothing\", REPORTED_TOKENS = \"0\" }}\n",
                url = model.url(),
                script = json!(script.display().to_string()),
            ),
        )
        .expect("the configuration");
        Setup { root, state }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(binary());
        command
            .arg("--config")
            .arg(self.root.path().join("clawcage.toml"))
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--workspace")
            .arg(self.root.path().join("ws"))
            .env_remove("RUST_LOG")
            .env("ANTHROPIC_API_KEY", "sk-test");
        command
    }
}

/// Waits (at most 60 s) until the model was sent the external agent's result.
async fn result_reaches_the_model(model: &LlmServer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bodies = model.bodies();
        if bodies
            .iter()
            .any(|body| body.to_string().contains("the work is done"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the external agent's result never reached the model; requests: {bodies:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_spawns_an_external_agent_and_takes_its_result_as_a_notification() {
    let model = delegating_model().await;
    let setup = Setup::new(&model);
    let mut chat = setup
        .command()
        .args(["chat", "--session", "external-chat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("clawcage chat starts");
    let mut input = chat.stdin.take().unwrap();
    let output = chat.stdout.take().unwrap();
    let (lines, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    input.write_all(b"delegate this\n").unwrap();
    result_reaches_the_model(&model).await;
    // The notification turn's answer is printed under the sub-agent's name.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while Instant::now() < deadline && !seen.iter().any(|line: &String| line.contains("Relayed")) {
        if let Ok(line) = heard.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
    }
    drop(input);
    let status = chat.wait().unwrap();
    let mut errors = String::new();
    std::io::Read::read_to_string(&mut chat.stderr.take().unwrap(), &mut errors).unwrap();
    assert!(
        seen.iter()
            .any(|line| line.contains("Relayed: the helper is done.")),
        "{seen:#?}\n{errors}"
    );
    assert!(status.success(), "{errors}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_spawns_an_external_agent_and_takes_its_result_as_a_run() {
    let model = delegating_model().await;
    let setup = Setup::new(&model);
    let mut command = setup.command();
    command
        .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .env_remove("CLAWCAGE_GATEWAY_TOKEN");
    let gateway = GatewayProcess::start(command);
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    let session = "agent:main:test:external";
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "delegate this", "idempotencyKey": "d1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    result_reaches_the_model(&model).await;
    // The answer to the result is the session's history.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let history = client
            .request("chat.history", json!({"sessionKey": session}))
            .await;
        if history.to_string().contains("Relayed: the helper is done.") {
            break;
        }
        assert!(Instant::now() < deadline, "{history}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, output) = gateway.terminate();
    assert!(status.success(), "{output}");
}
