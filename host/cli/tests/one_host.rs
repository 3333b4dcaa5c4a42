//! One host, four front ends: the same scenario — one model reply that schedules a cron job,
//! spawns a sub-agent and spawns the external ACP agent `reporter` — run through `clawcage run`,
//! `clawcage chat` in a pseudo-terminal, the gateway (a WebSocket client) and `clawcage acp` (the
//! official ACP Rust SDK as the editor). None of the front ends wires cron, sub-agents, external
//! agents or the notification route itself: each asks the runtime for its host. Every front end
//! takes both children's results back as turns; the long-running ones also fire the job and take
//! its firing as a turn, shown where a person sees it (the terminal's screen, the session's
//! history, the editor's updates); `run` leaves the job to the host that owns the jobs, and
//! `clawcage cron list` shows it there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionNotification,
    StopReason, TextContent,
};
use agent_client_protocol::{ByteStreams, Client};
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::anthropic::Block;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user};
use serde_json::{Value, json};
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

const TOKEN: &str = "one-host-gateway-token";
/// What the model says to each of the three notifications.
const RELAYED: [&str; 3] = [
    "Relayed: the helper is done.",
    "Relayed: the child counted three files.",
    "Relayed: cron fired.",
];

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

/// `blocks` as the reply the request asks for: streamed or whole.
fn reply(body: &Value, blocks: &[Block]) -> Reply {
    if body["stream"] == true {
        anthropic::stream(blocks, 64)
    } else {
        anthropic::message(blocks)
    }
}

/// The scenario's model: asked to delegate, it schedules a job every 3 s, spawns a child and
/// spawns `reporter` in one reply; the child answers its task; each notification is relayed.
async fn scenario_model() -> LlmServer {
    LlmServer::start_routed(|body| {
        let (text, results) = last_user(body);
        if text.starts_with("delegate") && !results {
            reply(
                body,
                &[
                    anthropic::tool(
                        "c1",
                        "cron",
                        json!({"action": "add", "every_seconds": 3, "message": "tick from cron", "name": "ticker"}),
                    ),
                    anthropic::tool("s1", "spawn", json!({"task": "child: count the files"})),
                    anthropic::tool(
                        "s2",
                        "spawn",
                        json!({"task": "do the thing", "runtime": "acp", "agent": "reporter"}),
                    ),
                ],
            )
        } else if text.contains("the work is done") {
            reply(body, &[anthropic::text(RELAYED[0])])
        } else if text.contains("child result: three files") {
            // The announcement quotes the task too: this comes before the child's own branch.
            reply(body, &[anthropic::text(RELAYED[1])])
        } else if text.contains("child: count the files") {
            reply(body, &[anthropic::text("child result: three files")])
        } else if text.contains("tick from cron") {
            reply(body, &[anthropic::text(RELAYED[2])])
        } else {
            reply(body, &[anthropic::text("Three helpers are on it.")])
        }
    })
    .await
}

/// A workspace `ws`, a private state directory and a configuration allowing the external agent
/// `reporter` and ACP sessions in `ws`.
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
                 [acp]\nallowed_roots = [\"ws\"]\nallowed_agents = [\"reporter\"]\n\n\
                 [acp.agents.reporter]\ncommand = \"python3\"\nargs = [{script}]\ntimeout_secs = 30\n\
                 env = {{ SECRET_TO_LEAK = \"nothing\", REPORTED_TOKENS = \"0\" }}\n",
                url = model.url(),
                script = json!(script.display().to_string()),
            ),
        )
        .expect("the configuration");
        Setup { root, state }
    }

    fn workspace(&self) -> PathBuf {
        self.root.path().join("ws").canonicalize().unwrap()
    }

    /// The configuration and state directory, and the workspace unless the front end takes it
    /// from its client (`acp`: each session's `cwd`).
    fn global_args(&self, workspace: bool) -> Vec<String> {
        let mut args = vec![
            "--config".into(),
            self.root.path().join("clawcage.toml").display().to_string(),
            "--state-dir".into(),
            self.state.path().display().to_string(),
        ];
        if workspace {
            args.extend([
                "--workspace".into(),
                self.root.path().join("ws").display().to_string(),
            ]);
        }
        args
    }

    fn command(&self) -> Command {
        self.command_with(true)
    }

    fn command_with(&self, workspace: bool) -> Command {
        let mut command = Command::new(binary());
        command
            .args(self.global_args(workspace))
            .current_dir(self.root.path())
            .env_remove("RUST_LOG")
            .env("ANTHROPIC_API_KEY", "sk-test");
        command
    }

    /// What `clawcage cron list` says of the state directory's jobs.
    fn cron_list(&self) -> String {
        let output = self.command().args(["cron", "list"]).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// Waits (at most `seconds`) until every one of `texts` was sent to the model.
async fn the_model_hears(model: &LlmServer, texts: &[&str], seconds: u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let bodies = model
            .bodies()
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>();
        let missing: Vec<&&str> = texts
            .iter()
            .filter(|text| !bodies.iter().any(|body| body.contains(**text)))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the model never heard {missing:?}; requests: {bodies:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cron tool's answer to the job's `add`, as the model was sent it.
fn cron_add_result(model: &LlmServer) -> String {
    model
        .bodies()
        .iter()
        .flat_map(|body| body["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|message| message["content"].as_array().cloned().unwrap_or_default())
        .find(|block| block["type"] == "tool_result" && block["tool_use_id"] == "c1")
        .map(|block| block["content"].to_string())
        .expect("the cron tool answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_both_results_and_leaves_the_job_to_the_host_that_owns_the_jobs() {
    let model = scenario_model().await;
    let setup = Setup::new(&model);
    let output = tokio::task::spawn_blocking({
        let mut command = setup.command();
        command.args(["run", "--session", "one-host-run", "delegate this"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    the_model_hears(
        &model,
        &["the work is done", "child result: three files"],
        5,
    )
    .await;
    // The answer is the turn that took the last result in.
    assert!(
        RELAYED[..2].iter().any(|text| stdout.trim() == *text),
        "{stdout}\n{stderr}"
    );
    let added = cron_add_result(&model);
    assert!(!added.contains("error"), "{added}");
    assert!(added.contains("ticker"), "{added}");
    // `run` manages the job; it fires in a long-running host, so none fired here.
    let listed = setup.cron_list();
    assert!(listed.contains("tick from cron"), "{listed}");
    assert!(
        listed.contains("one-host-run"),
        "the job goes to the run's session: {listed}"
    );
    assert!(
        !model
            .bodies()
            .iter()
            .any(|body| last_user(body).0.contains("tick from cron")),
        "a one-shot run fires no job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_in_a_terminal_shows_both_results_and_the_jobs_firing() {
    // The Python with pyte, the terminal emulator the screen is judged by.
    let Some(python) =
        clawcage_tests::toolchains::screen_python("chat_in_a_terminal_shows_both_results")
    else {
        return;
    };
    let model = scenario_model().await;
    let setup = Setup::new(&model);
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty_driver.py");
    // All three relayed lines, in whatever order they come.
    let all_relayed = format!(
        "(?s){}",
        RELAYED
            .iter()
            .map(|text| format!("(?=.*{})", regex_escape(text)))
            .collect::<String>()
    );
    let steps = json!([
        {"expect": "you> ", "timeout": 60},
        {"send": "delegate this\r"},
        {"expect": all_relayed, "timeout": 90},
        {"screen": "relayed"},
        {"send": "/exit\r"},
        {"exited": 15},
    ]);
    let mut command = Command::new(python);
    command
        .arg(driver)
        .arg(steps.to_string())
        .arg("--")
        .arg(binary())
        .args(setup.global_args(true))
        .args(["chat", "--session", "one-host-chat"])
        .current_dir(setup.root.path())
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("TERM", "xterm")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["ok"], true,
        "step {} failed:\n{}",
        report["failed_step"], report["output"]
    );
    // Judged as the terminal shows it: each answer on a line of its own under its sender.
    let screen: Vec<String> = report["screens"]["relayed"]
        .as_array()
        .expect("pyte renders the screen")
        .iter()
        .map(|line| line.as_str().unwrap().trim_end().to_string())
        .collect();
    for text in RELAYED {
        assert!(
            screen.iter().any(|line| line.starts_with('[')
                && line.contains(" via system] ")
                && line.ends_with(text)),
            "{text:?} is not a line of the screen:\n{}",
            screen.join("\n")
        );
    }
    assert_eq!(report["status"], 0, "{}", report["output"]);
}

/// `text` with the regular-expression metacharacters it may hold escaped.
fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if ".[]()*+?{}|^$\\".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_both_results_and_the_jobs_firing_in_the_session() {
    let model = scenario_model().await;
    let setup = Setup::new(&model);
    let mut command = setup.command();
    command
        .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .env_remove("CLAWCAGE_GATEWAY_TOKEN");
    let gateway = GatewayProcess::start(command);
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    let session = "agent:main:test:one-host";
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "delegate this", "idempotencyKey": "d1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let history = client
            .request("chat.history", json!({"sessionKey": session}))
            .await
            .to_string();
        if RELAYED.iter().all(|text| history.contains(text)) {
            break;
        }
        assert!(Instant::now() < deadline, "{history}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = client.request("status", json!({})).await;
    assert_eq!(status["payload"]["cron"], "running", "{status}");
    let (status, output) = gateway.terminate();
    assert!(status.success(), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_streams_both_results_and_the_jobs_firing_to_the_editor() {
    let model = scenario_model().await;
    let setup = Setup::new(&model);
    let workspace = setup.workspace();
    let mut child = tokio::process::Command::from(setup.command_with(false))
        .arg("acp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("clawcage acp starts");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let updates: Arc<Mutex<Vec<Value>>> = Arc::default();
    let heard = updates.clone();
    Client
        .v1()
        .name("one-host-test")
        .on_receive_notification(
            async move |notification: SessionNotification, _connection| {
                heard
                    .lock()
                    .unwrap()
                    .push(serde_json::to_value(&notification).unwrap());
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async |cx| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(workspace.clone()))
                .block_task()
                .await?;
            let response = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec![ContentBlock::Text(TextContent::new("delegate this"))],
                ))
                .block_task()
                .await?;
            assert_eq!(response.stop_reason, StopReason::EndTurn);
            // The notifications' turns stream to the editor as updates of the session.
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let said: String = updates
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|update| update["sessionId"] == session.session_id.0.as_ref())
                    .filter(|update| update["update"]["sessionUpdate"] == "agent_message_chunk")
                    .filter_map(|update| update["update"]["content"]["text"].as_str())
                    .collect();
                if RELAYED.iter().all(|text| said.contains(text)) {
                    break;
                }
                assert!(Instant::now() < deadline, "{said}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        })
        .await
        .expect("the ACP exchange succeeds");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("clawcage acp exits when its stdin closes")
        .unwrap();
    assert!(status.success(), "clawcage acp exited with {status}");
}
