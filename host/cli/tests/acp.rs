//! `clawcage acp` driven by clients nobody here wrote — the official ACP Rust SDK's client role
//! and the official TypeScript SDK (`acp_client.mjs`) — against the scripted LLM server: a
//! prompt with tool calls streamed as `tool_call` / `tool_call_update`, a read outside the
//! workspace reported as a failed tool call, a `cwd` outside `[acp] allowed_roots` refused,
//! cancel mid-turn, a session loaded after a restart, and malformed and oversized lines answered
//! with errors. External agents: the scripted fake agent (`acp_fake_agent.mjs`, on the
//! TypeScript SDK's agent role) driven as a sub-agent: its write outside the grant and into the
//! read-only workspace are refused, its permission request under `deny-all` is rejected, its
//! terminal command runs in the sandbox, it sees no credential of clawcage's, and a stop cancels
//! it and reaps its process. The TypeScript SDK is installed by `examples/build.sh setup-acp`;
//! under CI a missing toolchain fails the tests that need it. It is one file (over 700 lines)
//! because every test drives `clawcage acp` through the same `Setup` and the same SDK client or
//! fake-agent harness, one test per behaviour.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, StopReason,
    TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use clawcage_tests::llm_server::{LlmServer, Reply, ReplyGate, anthropic, last_user};
use clawcage_tests::toolchains::skip;
use serde_json::{Value, json};
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

/// A root with `projects/ws` (the workspace, holding `hello.txt`), `outside.txt` next to
/// `projects`, a private state directory and a configuration allowing `projects` only.
struct Setup {
    root: tempfile::TempDir,
    state: tempfile::TempDir,
    config: PathBuf,
}

impl Setup {
    fn new(llm: &str, extra: &str) -> Setup {
        clawcage_tests::cli_state::warm_components(binary());
        let root = tempfile::tempdir().unwrap();
        let workspace = root.path().join("projects").join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(root.path().join("elsewhere")).unwrap();
        std::fs::write(workspace.join("hello.txt"), "hello from the workspace\n").unwrap();
        std::fs::write(root.path().join("outside.txt"), "TOP SECRET outside").unwrap();
        let config = root.path().join("clawcage.toml");
        std::fs::write(
            &config,
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n[acp]\nallowed_roots = [\"projects\"]\n{extra}"
            ),
        )
        .unwrap();
        Setup {
            root,
            state: clawcage_tests::cli_state::private_state_dir(),
            config,
        }
    }

    fn workspace(&self) -> PathBuf {
        self.root
            .path()
            .join("projects")
            .join("ws")
            .canonicalize()
            .unwrap()
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--config".into(),
            self.config.display().to_string(),
            "--state-dir".into(),
            self.state.path().display().to_string(),
        ]
    }

    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(binary());
        command
            .arg("acp")
            .args(self.args())
            .current_dir(self.root.path())
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env("ANTHROPIC_API_KEY", "sk-acp-test-secret-value")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        command
    }
}

fn answer(text: &str) -> Reply {
    anthropic::stream(&[anthropic::text(text)], 48)
}

/// Updates received by a client, as JSON.
type Updates = Arc<Mutex<Vec<Value>>>;

/// Runs `body` as an ACP client (the Rust SDK) of a fresh `clawcage acp`, then closes its stdin
/// and waits for it to exit.
async fn with_client<T>(
    setup: &Setup,
    updates: Updates,
    body: impl AsyncFnOnce(ConnectionTo<Agent>) -> Result<T, agent_client_protocol::Error>,
) -> T {
    let mut child = setup.command().spawn().expect("clawcage acp starts");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let permissions = updates.clone();
    let result = Client
        .v1()
        .name("acp-test")
        // Approval requests: a command mentioning `first` is allowed once, anything else
        // rejected. Each request is recorded among the updates as `{"permission": …}`.
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _connection| {
                let seen = serde_json::to_value(&request).unwrap();
                let allow = seen["toolCall"]["title"]
                    .as_str()
                    .is_some_and(|title| title.contains("first"));
                let kind = if allow {
                    PermissionOptionKind::AllowOnce
                } else {
                    PermissionOptionKind::RejectOnce
                };
                let option = request
                    .options
                    .iter()
                    .find(|option| option.kind == kind)
                    .map(|option| option.option_id.clone())
                    .expect("allow-once and reject-once are offered");
                permissions
                    .lock()
                    .unwrap()
                    .push(json!({"permission": seen}));
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option)),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: SessionNotification, _connection| {
                updates
                    .lock()
                    .unwrap()
                    .push(serde_json::to_value(&notification).unwrap());
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, body)
        .await
        .expect("the ACP exchange succeeds");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("clawcage acp exits when its stdin closes")
        .unwrap();
    assert!(status.success(), "clawcage acp exited with {status}");
    result
}

fn text(prompt: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text(TextContent::new(prompt))]
}

fn updates_of_kind<'a>(updates: &'a [Value], kind: &str) -> Vec<&'a Value> {
    updates
        .iter()
        .map(|notification| &notification["update"])
        .filter(|update| update["sessionUpdate"] == kind)
        .collect()
}

fn agent_text(updates: &[Value]) -> String {
    updates_of_kind(updates, "agent_message_chunk")
        .iter()
        .filter_map(|update| update["content"]["text"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_sees_tool_calls_a_refused_read_and_loads_the_session_after_a_restart() {
    let outside = Arc::new(Mutex::new(String::new()));
    let outside_path = outside.clone();
    let server = LlmServer::start_routed(move |body| {
        let (text, results) = last_user(body);
        if text.contains("and again") {
            answer("Still here.")
        } else if results {
            answer("Done reading.")
        } else {
            anthropic::stream(
                &[
                    anthropic::text("Reading."),
                    anthropic::tool("t1", "read_file", json!({"path": "hello.txt"})),
                    anthropic::tool(
                        "t2",
                        "read_file",
                        json!({"path": outside_path.lock().unwrap().clone()}),
                    ),
                ],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(server.url(), "[subagents]\nenabled = false\n");
    *outside.lock().unwrap() = setup.root.path().join("outside.txt").display().to_string();
    let workspace = setup.workspace();
    let elsewhere = setup.root.path().join("elsewhere");

    let updates: Updates = Arc::default();
    let (session_id, refused) = with_client(&setup, updates.clone(), async |cx| {
        let init = cx
            .send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        let init = serde_json::to_value(&init).unwrap();
        assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
        assert_eq!(init["agentInfo"]["name"], "clawcage", "{init}");
        let refused = cx
            .send_request(NewSessionRequest::new(elsewhere.clone()))
            .block_task()
            .await
            .expect_err("a cwd outside [acp] allowed_roots is refused");
        let session = cx
            .send_request(NewSessionRequest::new(workspace.clone()))
            .block_task()
            .await?;
        let response = cx
            .send_request(PromptRequest::new(
                session.session_id.clone(),
                text("read hello.txt please"),
            ))
            .block_task()
            .await?;
        assert_eq!(response.stop_reason, StopReason::EndTurn);
        Ok((session.session_id.0.to_string(), refused))
    })
    .await;
    let refusal = format!("{refused} {refused:?}");
    assert!(refusal.contains("allowed_roots"), "{refusal}");
    assert!(!refusal.contains("TOP SECRET"));

    let seen = updates.lock().unwrap().clone();
    assert!(seen.iter().all(|n| n["sessionId"] == session_id.as_str()));
    let calls = updates_of_kind(&seen, "tool_call");
    assert_eq!(calls.len(), 2, "{seen:#?}");
    assert_eq!(calls[0]["toolCallId"], "t1");
    assert_eq!(calls[0]["kind"], "read");
    assert_eq!(calls[0]["status"], "in_progress");
    assert_eq!(calls[0]["title"], "read_file hello.txt");
    let ends = updates_of_kind(&seen, "tool_call_update");
    let end = |id: &str| {
        ends.iter()
            .find(|update| update["toolCallId"] == id)
            .unwrap_or_else(|| panic!("no tool_call_update for {id}: {seen:#?}"))
    };
    assert_eq!(end("t1")["status"], "completed");
    assert!(
        end("t1")["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("hello from the workspace")
    );
    // The read outside the workspace: refused by the sandbox, reported as a failed call.
    assert_eq!(end("t2")["status"], "failed", "{:#}", end("t2"));
    let refused_text = end("t2")["content"][0]["content"]["text"].as_str().unwrap();
    assert!(!refused_text.contains("TOP SECRET"), "{refused_text}");
    assert!(!refused_text.is_empty());
    assert_eq!(agent_text(&seen), "Reading.Done reading.");
    let usage = updates_of_kind(&seen, "usage_update");
    assert_eq!(usage.len(), 1, "{seen:#?}");
    assert!(usage[0]["used"].as_u64().unwrap() > 0);
    assert!(usage[0]["size"].as_u64().unwrap() > 0);

    // A new process loads the session: its history is replayed, and the next prompt continues it.
    let replayed: Updates = Arc::default();
    let id = session_id.clone();
    with_client(&setup, replayed.clone(), async |cx| {
        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        let unknown = cx
            .send_request(LoadSessionRequest::new(
                "agent:main:acp:no-such-session",
                workspace.clone(),
            ))
            .block_task()
            .await;
        assert!(unknown.is_err(), "an unknown session cannot be loaded");
        // Loading names a cwd too, and it is checked like a new session's.
        let outside_cwd = cx
            .send_request(LoadSessionRequest::new(id.clone(), elsewhere.clone()))
            .block_task()
            .await
            .expect_err("a cwd outside [acp] allowed_roots is refused on load as well");
        let refusal = format!("{outside_cwd} {outside_cwd:?}");
        assert!(refusal.contains("allowed_roots"), "{refusal}");
        cx.send_request(LoadSessionRequest::new(id.clone(), workspace.clone()))
            .block_task()
            .await?;
        let response = cx
            .send_request(PromptRequest::new(id.clone(), text("and again")))
            .block_task()
            .await?;
        assert_eq!(response.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
    let replayed = replayed.lock().unwrap().clone();
    let users: String = updates_of_kind(&replayed, "user_message_chunk")
        .iter()
        .filter_map(|update| update["content"]["text"].as_str())
        .collect();
    assert!(users.contains("read hello.txt please"), "{replayed:#?}");
    assert!(agent_text(&replayed).starts_with("Reading.Done reading."));
    assert!(agent_text(&replayed).ends_with("Still here."));
    let last = server.bodies().last().cloned().unwrap();
    let history = last["messages"].to_string();
    assert!(
        history.contains("read hello.txt please"),
        "the loaded history reached the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_running_turn() {
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |body| {
        let (text, _) = last_user(body);
        // After the stopped turn the next message may join the unanswered one: check it first.
        if text.contains("quick") {
            answer("quick answer")
        } else {
            held.hold(answer("too late"))
        }
    })
    .await;
    let setup = Setup::new(server.url(), "[subagents]\nenabled = false\n");
    let workspace = setup.workspace();
    let updates: Updates = Arc::default();
    with_client(&setup, updates.clone(), async |cx| {
        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        let session = cx
            .send_request(NewSessionRequest::new(workspace.clone()))
            .block_task()
            .await?;
        let id = session.session_id.clone();
        let prompt = cx
            .send_request(PromptRequest::new(id.clone(), text("a slow question")))
            .block_task();
        let cancel = async {
            // The model has the request: the turn is running.
            gate.reached(1).await;
            cx.send_notification(CancelNotification::new(id.clone()))
        };
        let (response, sent) = tokio::join!(prompt, cancel);
        sent?;
        assert_eq!(response?.stop_reason, StopReason::Cancelled);
        gate.open();
        // The session still works after the cancel.
        let next = cx
            .send_request(PromptRequest::new(id.clone(), text("a quick one")))
            .block_task()
            .await?;
        assert_eq!(next.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
    assert!(agent_text(&updates.lock().unwrap()).contains("quick answer"));
}

#[test]
fn malformed_and_oversized_lines_are_answered_with_errors() {
    let setup = Setup::new("http://127.0.0.1:9", "");
    let mut child = Command::new(binary())
        .arg("acp")
        .args(setup.args())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };

    // Before initialize: refused.
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/new\",\"params\":{\"cwd\":\"/\",\"mcpServers\":[]}}\n")
        .unwrap();
    let early = next();
    assert_eq!(early["id"], 1);
    assert!(early["error"].is_object(), "{early}");
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n")
        .unwrap();
    let reply = next();
    assert_eq!(reply["id"], 2);
    assert_eq!(reply["result"]["protocolVersion"], 1, "{reply}");

    stdin.write_all(b"this is not json\n").unwrap();
    let error = next();
    assert_eq!(error["error"]["code"], -32700, "{error}");

    let mut huge =
        b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{\"pad\":\"".to_vec();
    huge.resize(9 << 20, b'a');
    huge.extend_from_slice(b"\"}}\n");
    stdin.write_all(&huge).unwrap();
    let error = next();
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert!(
        error.to_string().len() < 4096,
        "the oversized line is not echoed back"
    );

    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"no/such_method\",\"params\":{}}\n")
        .unwrap();
    let error = next();
    assert_eq!(error["id"], 8);
    assert_eq!(error["error"]["code"], -32601, "{error}");

    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"agent:main:acp:nope\",\"prompt\":[]}}\n")
        .unwrap();
    let error = next();
    assert_eq!(error["id"], 9);
    assert!(error["error"].is_object(), "{error}");

    // A cwd outside [acp] allowed_roots, after all that: refused, and the server still answers.
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"session/new\",\"params\":{\"cwd\":\"/\",\"mcpServers\":[]}}\n")
        .unwrap();
    let refused = next();
    assert_eq!(refused["id"], 10);
    assert!(refused.to_string().contains("allowed_roots"), "{refused}");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// The ACP TypeScript SDK's `node_modules`, with the test scripts copied beside it (so that
/// their `import` finds the SDK); `None` when the toolchain is missing outside CI.
fn typescript_sdk(test: &str) -> Option<PathBuf> {
    // Installed once per process, so that concurrent tests never run two npm installs into
    // one directory.
    let modules = match clawcage_tests::toolchains::acp_sdk() {
        Ok(modules) => modules,
        Err(reason) => {
            skip(test, &reason);
            return None;
        }
    };
    let dir = modules.parent().unwrap().to_path_buf();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    // Replaced by a rename, so a node of a concurrent test reads the old file or the new one,
    // never a half-written one.
    for script in ["acp_client.mjs", "acp_fake_agent.mjs"] {
        let staging = dir.join(format!(
            ".{script}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::copy(tests.join(script), &staging).unwrap();
        std::fs::rename(&staging, dir.join(script)).unwrap();
    }
    Some(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_prompts_and_sees_the_outside_cwd_refused() {
    let Some(sdk) = typescript_sdk("typescript_client_prompts_and_sees_the_outside_cwd_refused")
    else {
        return;
    };
    let server = LlmServer::start_routed(|body| {
        if last_user(body).1 {
            answer("It says hello.")
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "t1",
                    "read_file",
                    json!({"path": "hello.txt"}),
                )],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(server.url(), "[subagents]\nenabled = false\n");
    let output = tokio::process::Command::new("node")
        .arg(sdk.join("acp_client.mjs"))
        .arg(binary())
        .arg(setup.workspace())
        .arg(setup.root.path().join("elsewhere"))
        .arg("--")
        .args(setup.args())
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-acp-test-secret-value")
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("node runs");
    assert!(output.status.success(), "the TypeScript client failed");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["initialize"]["protocolVersion"], 1, "{report:#}");
    assert_eq!(
        report["initialize"]["agentCapabilities"]["loadSession"],
        true
    );
    assert_eq!(report["stopReason"], "end_turn", "{report:#}");
    let updates = report["updates"].as_array().unwrap().clone();
    let call = updates_of_kind(&updates, "tool_call");
    assert_eq!(call.len(), 1, "{report:#}");
    assert_eq!(call[0]["kind"], "read");
    let end = updates_of_kind(&updates, "tool_call_update");
    assert_eq!(end[0]["status"], "completed");
    assert_eq!(agent_text(&updates), "It says hello.");
    assert_eq!(report["outside"]["refused"], true, "{report:#}");
    assert!(
        report["outside"]["message"]
            .as_str()
            .unwrap()
            .contains("allowed_roots"),
        "{report:#}"
    );
    assert_eq!(report["exitCode"], 0);
}

/// The configuration of the fake external agent, `permission_mode` deny-all by default.
fn fake_agent_section(sdk: &Path, logs: &Path) -> String {
    format!(
        "allowed_agents = [\"fake\"]\n\n[acp.agents.fake]\ncommand = \"node\"\nargs = [\"{}\"]\nenv = {{ FAKE_VISIBLE = \"yes\", FAKE_ACP_PID_FILE = \"{}\", FAKE_ACP_LOG_FILE = \"{}\" }}\n",
        sdk.join("acp_fake_agent.mjs").display(),
        logs.join("pid").display(),
        logs.join("log").display(),
    )
}

/// Runs `clawcage run` whose model spawns the fake external agent (its section ending with
/// `extra`) with the script `script` writes, which may make files in the setup first; returns
/// the setup, the run's stderr and the agent's results as announced to the model.
async fn run_fake_agent(
    sdk: &Path,
    extra: &str,
    script: impl FnOnce(&Setup) -> Vec<String>,
) -> (Setup, String, String) {
    let logs = tempfile::tempdir().unwrap();
    let task = Arc::new(Mutex::new(String::new()));
    let shared = task.clone();
    let server = LlmServer::start_routed(move |body| {
        let (text, results) = last_user(body);
        if text.contains("[notification") {
            answer("All reported.")
        } else if results {
            answer("Started it.")
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "s1",
                    "spawn",
                    json!({"task": shared.lock().unwrap().clone(), "runtime": "acp", "agent": "fake"}),
                )],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(
        server.url(),
        &format!("{}{extra}", fake_agent_section(sdk, logs.path())),
    );
    *task.lock().unwrap() = script(&setup).join("\n");
    let output = tokio::process::Command::new(binary())
        .args(setup.args())
        .args(["run", "delegate this", "--workspace"])
        .arg(setup.workspace())
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-acp-test-secret-value")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "All reported."
    );
    let bodies = server.bodies();
    let announcement = last_user(bodies.last().unwrap()).0;
    assert!(announcement.contains("completed"), "{announcement}");
    (setup, stderr, announcement)
}

/// The line of `announcement` that reports `command`.
fn result_of(announcement: &str, command: &str) -> String {
    announcement
        .lines()
        .find(|line| line.starts_with(&format!("{command} =>")))
        .unwrap_or_else(|| panic!("no result for `{command}` in {announcement}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_works_only_through_the_sandbox() {
    let Some(sdk) = typescript_sdk("an_external_agent_works_only_through_the_sandbox") else {
        return;
    };
    let (setup, stderr, announcement) = run_fake_agent(&sdk, "", |setup| {
        let outside = setup.root.path().join("projects").join("escape.txt");
        vec![
            "write ../escape.txt pwned".to_string(),
            format!("write {} pwned", outside.display()),
            "write inside.txt changed".to_string(),
            "read hello.txt".to_string(),
            format!("read {}", setup.root.path().join("outside.txt").display()),
            "permission edit Edit the files".to_string(),
            "terminal echo sandboxed".to_string(),
            "terminal cat /etc/hostname".to_string(),
            format!(
                "terminal cat {}",
                setup.root.path().join("outside.txt").display()
            ),
            "terminal touch made.txt".to_string(),
            "env ANTHROPIC_API_KEY".to_string(),
            "env FAKE_VISIBLE".to_string(),
        ]
    })
    .await;
    let outside = setup.root.path().join("projects").join("escape.txt");
    // Its text streamed to the parent's front end as it came.
    assert!(stderr.contains("] read hello.txt => ok"), "{stderr}");
    let result = |command: &str| result_of(&announcement, command);
    assert!(result("write ../escape.txt pwned").contains("=> error"));
    assert!(result(&format!("write {} pwned", outside.display())).contains("=> error"));
    assert!(!outside.exists(), "the write outside the grant was refused");
    // Read-only unless configured.
    assert!(result("write inside.txt changed").contains("=> error"));
    assert!(!setup.workspace().join("inside.txt").exists());
    assert!(result("read hello.txt").contains("hello from the workspace"));
    let secret = result(&format!(
        "read {}",
        setup.root.path().join("outside.txt").display()
    ));
    assert!(
        secret.contains("=> error") && !secret.contains("TOP SECRET"),
        "{secret}"
    );
    assert_eq!(
        result("permission edit Edit the files"),
        "permission edit Edit the files => selected no"
    );
    let echo = result("terminal echo sandboxed");
    assert!(
        echo.contains("exit 0") && echo.contains("sandboxed"),
        "{echo}"
    );
    // The sandbox has no /etc: the terminal is the sandboxed exec, not a host shell.
    let host_file = result("terminal cat /etc/hostname");
    assert!(host_file.contains("exit 1"), "{host_file}");
    // A file beside the workspace is not there for the terminal either, and the workspace is
    // read-only for it as for the file requests.
    let beside = result(&format!(
        "terminal cat {}",
        setup.root.path().join("outside.txt").display()
    ));
    assert!(
        beside.contains("exit 1") && !beside.contains("TOP SECRET"),
        "{beside}"
    );
    let made = result("terminal touch made.txt");
    assert!(made.contains("exit 1"), "{made}");
    assert!(!setup.workspace().join("made.txt").exists(), "{made}");
    assert_eq!(
        result("env ANTHROPIC_API_KEY"),
        "env ANTHROPIC_API_KEY => unset"
    );
    assert_eq!(result("env FAKE_VISIBLE"), "env FAKE_VISIBLE => set");
}

/// An agent that reads a file and writes it back gets its exact text: not `read_file`'s answer
/// for a model, which is cut at 2,000 lines or 50,000 characters with a note, says "empty" of an
/// empty file and replaces what is not UTF-8 (a copy made from that would be cut or changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_reads_a_file_exactly_and_writes_it_back_whole() {
    let Some(sdk) =
        typescript_sdk("an_external_agent_reads_a_file_exactly_and_writes_it_back_whole")
    else {
        return;
    };
    let big: String = (1..=3000)
        .map(|line| format!("line {line}: {}\n", "x".repeat(40)))
        .collect();
    let (setup, _stderr, announcement) = run_fake_agent(&sdk, "workspace = \"rw\"\n", |setup| {
        let workspace = setup.workspace();
        std::fs::write(workspace.join("big.txt"), &big).unwrap();
        std::fs::write(workspace.join("empty.txt"), "").unwrap();
        std::fs::write(workspace.join("no-end.txt"), "last line without end").unwrap();
        std::fs::write(workspace.join("latin1.txt"), b"caf\xe9\n").unwrap();
        std::fs::write(
            workspace.join("key.txt"),
            "ANTHROPIC_API_KEY=sk-acp-test-secret-value\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(
            setup.root.path().join("outside.txt"),
            workspace.join("out-link.txt"),
        )
        .unwrap();
        vec![
            "copy big.txt big-copy.txt".to_string(),
            "copy empty.txt empty-copy.txt".to_string(),
            "copy no-end.txt no-end-copy.txt".to_string(),
            "lines big.txt 2999 5".to_string(),
            "lines big.txt 2 1".to_string(),
            "read latin1.txt".to_string(),
            "read key.txt".to_string(),
            "read out-link.txt".to_string(),
            "read .".to_string(),
        ]
    })
    .await;
    let result = |command: &str| result_of(&announcement, command);
    let workspace = setup.workspace();
    assert_eq!(
        result("copy big.txt big-copy.txt"),
        format!("copy big.txt big-copy.txt => ok {} characters", big.len())
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("big-copy.txt")).unwrap(),
        big
    );
    assert!(result("copy empty.txt empty-copy.txt").ends_with("=> ok 0 characters"));
    assert_eq!(
        std::fs::read_to_string(workspace.join("empty-copy.txt")).unwrap(),
        ""
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("no-end-copy.txt")).unwrap(),
        "last line without end"
    );
    let tail = format!("line 2999: {x}\nline 3000: {x}\n", x = "x".repeat(40));
    assert_eq!(
        result("lines big.txt 2999 5"),
        format!("lines big.txt 2999 5 => ok {}", json!(tail))
    );
    assert_eq!(
        result("lines big.txt 2 1"),
        format!(
            "lines big.txt 2 1 => ok {}",
            json!(format!("line 2: {}\n", "x".repeat(40)))
        )
    );
    // Refused, never changed: text that is not UTF-8, a credential of clawcage's, a link out
    // of the workspace, a directory.
    for (command, why) in [
        ("read latin1.txt", "not UTF-8"),
        ("read key.txt", "credential"),
        ("read out-link.txt", "outside the workspace"),
        ("read .", "not a regular file"),
    ] {
        let line = result(command);
        assert!(line.contains("=> error") && line.contains(why), "{line}");
    }
    assert!(!announcement.contains("TOP SECRET"), "{announcement}");
    assert!(
        !announcement.contains("sk-acp-test-secret-value"),
        "{announcement}"
    );
    // Each read is in the audit log under the child's session, as the method it was.
    let audit = std::fs::read_to_string(setup.state.path().join("audit.jsonl")).unwrap();
    let reads = audit
        .lines()
        .filter(|line| line.contains("\"tool\":\"fs/read_text_file\""))
        .count();
    assert_eq!(reads, 9, "{audit}");
}

/// Whether process `pid` still exists (a zombie counts: it has not been reaped).
fn process_exists(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_an_external_agent_cancels_it_and_reaps_its_process() {
    let Some(sdk) = typescript_sdk("stopping_an_external_agent_cancels_it_and_reaps_its_process")
    else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let server = LlmServer::start_routed(move |body| {
        let (text, results) = last_user(body);
        if results {
            answer("Ok.")
        } else if text.contains("stop it") {
            anthropic::stream(
                &[anthropic::tool(
                    "s2",
                    "subagents",
                    json!({"action": "stop", "id": "sub-1"}),
                )],
                40,
            )
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "s1",
                    "spawn",
                    json!({"task": "hang", "runtime": "acp", "agent": "fake"}),
                )],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(server.url(), &fake_agent_section(&sdk, logs.path()));
    let workspace = setup.workspace();
    let pid_file = logs.path().join("pid");
    let updates: Updates = Arc::default();
    let pid = with_client(&setup, updates.clone(), async |cx| {
        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        let session = cx
            .send_request(NewSessionRequest::new(workspace.clone()))
            .block_task()
            .await?;
        let id = session.session_id.clone();
        cx.send_request(PromptRequest::new(id.clone(), text("start the fake agent")))
            .block_task()
            .await?;
        // The agent runs when it has written its pid.
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid: u32 = loop {
            if let Ok(text) = std::fs::read_to_string(&pid_file)
                && let Ok(pid) = text.trim().parse()
            {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "the external agent never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(process_exists(pid));
        cx.send_request(PromptRequest::new(id.clone(), text("stop it")))
            .block_task()
            .await?;
        // While clawcage acp still runs: the agent is cancelled, then killed and reaped.
        let deadline = Instant::now() + Duration::from_secs(30);
        while process_exists(pid) {
            assert!(
                Instant::now() < deadline,
                "the stopped external agent {pid} was not reaped"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(pid)
    })
    .await;
    assert!(!process_exists(pid));
    let log = std::fs::read_to_string(logs.path().join("log")).unwrap_or_default();
    assert!(
        log.contains("cancelled"),
        "session/cancel reached the agent: {log:?}"
    );
    let stop_result = updates_of_kind(&updates.lock().unwrap(), "tool_call_update")
        .iter()
        .find(|update| update["toolCallId"] == "s2")
        .map(|update| update["status"].clone());
    assert_eq!(stop_result, Some(json!("completed")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_become_permission_requests_the_editor_answers() {
    let server = LlmServer::start_routed(|body| {
        if last_user(body).1 {
            answer("Ran what was allowed.")
        } else {
            anthropic::stream(
                &[
                    anthropic::tool("e1", "exec", json!({"command": "cat first.txt"})),
                    anthropic::tool("e2", "exec", json!({"command": "cat second.txt"})),
                ],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(
        server.url(),
        "[subagents]\nenabled = false\n\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n",
    );
    let workspace = setup.workspace();
    std::fs::write(workspace.join("first.txt"), "content of the first file\n").unwrap();
    std::fs::write(workspace.join("second.txt"), "content of the second file\n").unwrap();
    let updates: Updates = Arc::default();
    with_client(&setup, updates.clone(), async |cx| {
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
                text("run both"),
            ))
            .block_task()
            .await?;
        assert_eq!(response.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
    let seen = updates.lock().unwrap().clone();
    let asked: Vec<&Value> = seen
        .iter()
        .filter_map(|entry| entry.get("permission"))
        .collect();
    assert_eq!(asked.len(), 2, "{seen:#?}");
    let kinds: Vec<&str> = asked[0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|option| option["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"]);
    assert_eq!(asked[0]["toolCall"]["kind"], "execute");
    // The question is asked on the tool call it gates, so the editor shows it on that card.
    assert_eq!(asked[0]["toolCall"]["toolCallId"], "e1", "{:#}", asked[0]);
    assert_eq!(asked[1]["toolCall"]["toolCallId"], "e2", "{:#}", asked[1]);
    assert!(
        asked[0]["toolCall"]["title"]
            .as_str()
            .unwrap()
            .contains("cat first.txt")
    );
    let end = |id: &str| {
        updates_of_kind(&seen, "tool_call_update")
            .into_iter()
            .find(|update| update["toolCallId"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no end of {id}: {seen:#?}"))
    };
    assert_eq!(end("e1")["status"], "completed", "{:#}", end("e1"));
    assert!(end("e1").to_string().contains("content of the first file"));
    assert_eq!(end("e2")["status"], "failed", "{:#}", end("e2"));
    assert!(!end("e2").to_string().contains("content of the second file"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_asks_the_editor_of_its_parent_session_under_ask() {
    let Some(sdk) =
        typescript_sdk("an_external_agent_asks_the_editor_of_its_parent_session_under_ask")
    else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let server = LlmServer::start_routed(|body| {
        let (text, results) = last_user(body);
        if text.contains("[notification") {
            answer("Reported.")
        } else if results {
            answer("Started.")
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "s1",
                    "spawn",
                    json!({
                        "task": "permission edit Edit first files\npermission edit Edit second files",
                        "runtime": "acp",
                        "agent": "fake",
                    }),
                )],
                40,
            )
        }
    })
    .await;
    let setup = Setup::new(
        server.url(),
        &format!(
            "{}permission_mode = \"ask\"\n",
            fake_agent_section(&sdk, logs.path())
        ),
    );
    let workspace = setup.workspace();
    let updates: Updates = Arc::default();
    let session_id = with_client(&setup, updates.clone(), async |cx| {
        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        let session = cx
            .send_request(NewSessionRequest::new(workspace.clone()))
            .block_task()
            .await?;
        cx.send_request(PromptRequest::new(
            session.session_id.clone(),
            text("ask the agent"),
        ))
        .block_task()
        .await?;
        // The child's result comes back as a notification turn of this session.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !server
            .bodies()
            .iter()
            .any(|body| last_user(body).0.contains("[notification"))
        {
            assert!(
                Instant::now() < deadline,
                "the external agent never reported"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(session.session_id.0.to_string())
    })
    .await;
    let seen = updates.lock().unwrap().clone();
    // The child's text streamed to the editor as it came, named by the child.
    let streamed: String = updates_of_kind(&seen, "agent_thought_chunk")
        .iter()
        .filter_map(|update| update["content"]["text"].as_str())
        .collect();
    assert!(
        streamed.contains("] permission edit Edit first files => selected yes"),
        "{streamed}"
    );
    let asked: Vec<&Value> = seen
        .iter()
        .filter_map(|entry| entry.get("permission"))
        .collect();
    assert_eq!(asked.len(), 2, "{seen:#?}");
    for request in &asked {
        assert_eq!(request["sessionId"], session_id.as_str());
        assert!(
            request["toolCall"]["title"]
                .as_str()
                .unwrap()
                .starts_with("external agent: Edit"),
            "{request}"
        );
    }
    let announcement = server
        .bodies()
        .iter()
        .map(|body| last_user(body).0)
        .find(|text| text.contains("[notification"))
        .unwrap();
    assert!(
        announcement.contains("permission edit Edit first files => selected yes"),
        "{announcement}"
    );
    assert!(
        announcement.contains("permission edit Edit second files => selected no"),
        "{announcement}"
    );
}

/// `clawcage acp` killed with SIGKILL while its prompt runs a real `exec` call: the next process
/// loads the session and, at its next prompt, takes the open turn up first (the call answered
/// "may have partly run", not run again), then answers the new prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_acp_process_leaves_its_turn_to_the_next_one() {
    let server = LlmServer::start_routed(|body| {
        let (text, results) = last_user(body);
        if results {
            answer("It may have run; I checked.")
        } else if text.contains("first task") {
            anthropic::stream(
                &[anthropic::tool(
                    "x1",
                    "exec",
                    json!({"command": "echo ran >> effects.log && sleep 60"}),
                )],
                40,
            )
        } else {
            answer("second done")
        }
    })
    .await;
    let setup = Setup::new(server.url(), "[subagents]\nenabled = false\n");
    let workspace = setup.workspace();
    let effects = workspace.join("effects.log");

    // The first process: killed once the call has written its mark.
    let mut child = setup.command().spawn().expect("clawcage acp starts");
    let pid = child.id().unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let cwd = workspace.clone();
    let marked = effects.clone();
    // Kept before the kill: the kill may cut the pipe before the exchange can return it.
    let opened: Arc<Mutex<Option<agent_client_protocol::v1::schema::SessionId>>> = Arc::default();
    let opened_inside = opened.clone();
    let exchange = Client
        .v1()
        .name("acp-test")
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let id = session.session_id.clone();
            *opened_inside.lock().unwrap() = Some(id.clone());
            let prompt = cx
                .send_request(PromptRequest::new(id.clone(), text("first task")))
                .block_task();
            let ran = tokio::time::timeout(Duration::from_secs(120), async {
                while !std::fs::read_to_string(&marked).is_ok_and(|text| text.contains("ran")) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            tokio::select! {
                _ = prompt => panic!("the prompt ended before the kill"),
                waited = ran => waited.expect("the tool call ran within 120 s"),
            }
            // Killed while the connection is still open (closing it first would let the
            // process stop the turn itself).
            let killed = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap();
            assert!(killed.success());
            Ok(id)
        })
        .await;
    let session_id = match exchange {
        Ok(id) => id,
        // The kill cut the pipe while the connection was still writing: expected.
        Err(error) if format!("{error:?}").contains("Broken pipe") => opened
            .lock()
            .unwrap()
            .clone()
            .expect("the session was opened before the kill"),
        Err(error) => panic!("the first exchange: {error:?}"),
    };
    child.wait().await.unwrap();

    let replayed: Updates = Arc::default();
    let id = session_id.0.to_string();
    with_client(&setup, replayed.clone(), async |cx| {
        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await?;
        cx.send_request(LoadSessionRequest::new(id.clone(), workspace.clone()))
            .block_task()
            .await?;
        let response = cx
            .send_request(PromptRequest::new(id.clone(), text("second task")))
            .block_task()
            .await?;
        assert_eq!(response.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&effects).unwrap(),
        "ran\n",
        "the call is never run twice"
    );
    let bodies = server.bodies();
    assert_eq!(
        bodies.len(),
        3,
        "first call, the resumed step, the second prompt"
    );
    assert!(bodies[1].to_string().contains("may have partly run"));
    assert_eq!(last_user(&bodies[2]).0, "second task");
    assert!(
        bodies[2]
            .to_string()
            .contains("It may have run; I checked.")
    );
    let seen = replayed.lock().unwrap().clone();
    assert!(agent_text(&seen).ends_with("second done"), "{seen:#?}");
}
