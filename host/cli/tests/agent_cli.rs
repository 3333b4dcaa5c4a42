//! `clawcage run`, `chat` and `demo` as a user runs them: the real binary with the real sandboxed
//! tools, talking to the scripted LLM server on 127.0.0.1 through `--base-url`. It is one file
//! (over 700 lines) because every test runs the binary through the same `clawcage` helper against
//! the scripted server, one test per behaviour.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai, text_of};
use serde_json::json;

// The shared state directory (its component cache reused; sessions get unique keys), and
// private ones for tests whose sub-agent records and cron jobs must not meet other tests'.
use clawcage_tests::cli_state::{private_state_dir, shared_state_dir as state_dir};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Run the binary off the async runtime (the server lives on it) with `stdin` fed in.
async fn clawcage(
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdin: Option<String>,
) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("clawcage starts");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello from the workspace\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_the_final_answer_after_real_tool_calls() {
    let dir = workspace();
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Looking."),
            anthropic::tool("t1", "list_dir", json!({})),
        ]),
        anthropic::message(&[anthropic::tool(
            "t2",
            "read_file",
            json!({"path": "hello.txt"}),
        )]),
        anthropic::message(&[anthropic::text("It says hello.")]),
    ])
    .await;
    let session = unique("run");
    let output = clawcage(
        vec![
            "run".into(),
            "What does hello.txt say?".into(),
            "--provider".into(),
            "anthropic".into(),
            "--model".into(),
            "claude-test".into(),
            "--base-url".into(),
            server.url().to_string(),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
            "--session".into(),
            session.clone(),
        ],
        vec![("ANTHROPIC_API_KEY", "sk-test-secret-value".into())],
        None,
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "It says hello.\n", "only the answer on stdout");
    assert!(stderr.contains("> list_dir {}  ok"), "{stderr}");
    assert!(
        stderr.contains(r#"> read_file {"path":"hello.txt"}  ok"#),
        "{stderr}"
    );
    assert!(
        stderr.contains("anthropic/claude-test; tokens this turn 300 in / 60 out"),
        "{stderr}"
    );

    let bodies = server.bodies();
    assert_eq!(
        server.requests()[0].header("x-api-key"),
        Some("sk-test-secret-value")
    );
    let tools: Vec<&str> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // `cron` too: a run adds, lists and removes the jobs a long-running host fires.
    assert_eq!(
        tools,
        [
            "cron",
            "edit_file",
            "exec",
            "list_dir",
            "memory",
            "message",
            "read_file",
            "spawn",
            "subagents",
            "web_fetch",
            "web_search",
            "write_file"
        ]
    );
    // The real sandboxed tools' results went back to the model.
    let listing = bodies[1]["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap();
    assert!(listing.contains("hello.txt"), "{listing}");
    assert_eq!(
        bodies[2]["messages"][4]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "t2", "content": "hello from the workspace\n", "cache_control": {"type": "ephemeral"}})
    );

    let transcript = std::fs::read_to_string(
        state_dir()
            .join("sessions")
            .join(format!("{session}.jsonl")),
    )
    .unwrap();
    assert!(transcript.contains("It says hello."), "{transcript}");
    assert!(
        !transcript.contains("sk-test-secret-value"),
        "the key never reaches a transcript"
    );
    assert!(!stderr.contains("sk-test-secret-value") && !stdout.contains("sk-test-secret-value"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_over_openai_shows_a_refused_escape_and_a_message() {
    let dir = workspace();
    let server = LlmServer::start(vec![
        openai::message(None, &[("c1", "read_file", r#"{"path":"/etc/passwd"}"#)]),
        openai::message(
            None,
            &[(
                "c2",
                "message",
                r#"{"content":"I was not allowed to read it."}"#,
            )],
        ),
        openai::message(Some("Refused by the sandbox."), &[]),
    ])
    .await;
    let output = clawcage(
        vec![
            "run".into(),
            "read /etc/passwd".into(),
            "--provider".into(),
            "openai".into(),
            "--model".into(),
            "local-model".into(),
            "--base-url".into(),
            format!("{}/v1", server.url()),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ],
        vec![],
        None,
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "Refused by the sandbox.\n");
    assert!(
        stderr.contains(r#"> read_file {"path":"/etc/passwd"}  denied: "#),
        "{stderr}"
    );
    assert!(
        stderr.contains("[message to user] I was not allowed to read it."),
        "{stderr}"
    );
    let requests = server.requests();
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(
        requests[0].header("authorization"),
        None,
        "no key, no header"
    );
    let result = requests[1].body["messages"][3].clone();
    assert_eq!(result["role"], "tool");
    assert!(
        result["content"].as_str().unwrap().starts_with("denied: "),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_failures_with_the_contracts_exit_codes() {
    let dir = workspace();
    let base = |url: &str| {
        vec![
            "--workspace".to_string(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
            "--base-url".into(),
            url.to_string(),
        ]
    };
    // No key: a usage error naming the variable, before any request.
    let mut no_key = args(&["run", "hi", "--provider", "anthropic"]);
    no_key.extend(base("http://127.0.0.1:9"));
    let output = clawcage(no_key, vec![], None).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("ANTHROPIC_API_KEY"),
        "{}",
        text(&output.stderr)
    );
    // Said before anything is compiled: a state directory with an empty cache (a first
    // start) answers at once, and `chat` and `gateway` do the same.
    let fresh = tempfile::tempdir().unwrap();
    for command in [
        args(&["run", "hi", "--provider", "anthropic"]),
        args(&["chat", "--provider", "anthropic"]),
        args(&[
            "gateway",
            "--bind",
            "127.0.0.1:0",
            "--provider",
            "anthropic",
        ]),
    ] {
        let mut command = command;
        command.extend([
            "--workspace".to_string(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            fresh.path().display().to_string(),
        ]);
        let started = std::time::Instant::now();
        let output = clawcage(command.clone(), vec![], None).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains("ANTHROPIC_API_KEY"),
            "{command:?}: {stderr}"
        );
        assert!(!stderr.contains("compiling"), "{command:?}: {stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{command:?} took {:?}",
            started.elapsed()
        );
    }

    // The server keeps failing: exit 1 with the server's message.
    // Configuration lives outside the workspace, where no tool can change it.
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[provider]\nkind = \"anthropic\"\nmax_retries = 0\n[agent]\nmax_iterations = 2\n",
    )
    .unwrap();
    let server = LlmServer::start(vec![Reply::status(500, "the model is on fire", &[])]).await;
    let mut failing = args(&["run", "hi", "--config", config.to_str().unwrap()]);
    failing.extend(base(server.url()));
    let output = clawcage(failing, vec![("ANTHROPIC_API_KEY", "k".into())], None).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("the model is on fire"),
        "{}",
        text(&output.stderr)
    );
    assert!(output.stdout.is_empty());

    // The iteration cap from the config: exit 1 with the explanation.
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool("a", "list_dir", json!({}))]),
        anthropic::message(&[anthropic::tool("b", "list_dir", json!({"path": "."}))]),
    ])
    .await;
    let mut capped = args(&["run", "hi", "--config", config.to_str().unwrap()]);
    capped.extend(base(server.url()));
    let output = clawcage(capped, vec![("ANTHROPIC_API_KEY", "k".into())], None).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("after 2 model calls"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(server.requests().len(), 2);

    // An unknown config key is a usage error.
    std::fs::write(&config, "[provider]\napi_key = \"sk-in-a-file\"\n").unwrap();
    let mut bad = args(&["run", "hi", "--config", config.to_str().unwrap()]);
    bad.extend(base("http://127.0.0.1:9"));
    let output = clawcage(bad, vec![], None).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("unknown field `api_key`"),
        "{}",
        text(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_plays_a_script_and_says_so() {
    let dir = workspace();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"title": "t", "exchanges": [{"replies": [
            {"tool_calls": [{"name": "read_file", "input": {"path": "hello.txt"}}]},
            {"text": "scripted answer"}
        ]}]})
        .to_string(),
    )
    .unwrap();
    let output = clawcage(
        vec![
            "run".into(),
            "anything".into(),
            "--provider".into(),
            "scripted".into(),
            "--script".into(),
            script.display().to_string(),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ],
        vec![],
        None,
    )
    .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "scripted answer\n");
    assert!(
        text(&output.stderr).contains("recorded script (scripted/t)"),
        "{}",
        text(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_narrates_a_session_without_a_key() {
    let output = clawcage(
        vec![
            "demo".into(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ],
        vec![],
        None,
    )
    .await;
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{}",
        stdout,
        text(&output.stderr)
    );
    assert!(
        stdout.contains("scripted provider (scripted/demo)"),
        "{stdout}"
    );
    assert!(stdout.contains("> list_dir {}  ok"), "{stdout}");
    assert!(
        stdout.contains(r#"> read_file {"path":"notes/todo.txt"}  ok"#),
        "{stdout}"
    );
    // The refusals come from the sandbox, not from the script.
    assert!(
        stdout.contains(r#"> read_file {"path":"/etc/passwd"}  denied: "#),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"> read_file {"path":"../../../../etc/passwd"}  denied: "#),
        "{stdout}"
    );
    assert!(
        stdout.contains("[message to user] Reminder: water the plants today."),
        "{stdout}"
    );
    // exec runs a real command line inside the sandbox.
    assert!(
        stdout.contains("> exec {\"command\":\"wc -l notes/todo.txt\"}  ok"),
        "{stdout}"
    );
    // The approval step: the whole folder is denied, the single file allowed once.
    assert!(
        stdout.contains("approval needed: rm -r notes → the script answers: deny"),
        "{stdout}"
    );
    assert!(
        stdout.contains("> exec {\"command\":\"rm -r notes\"}  denied: denied by the operator"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "approval needed: rm notes/draft.txt; ls notes → the script answers: allow-once"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("todo.txt"), "{stdout}");
    assert!(!stdout.contains("(skipped"), "{stdout}");
    assert!(
        !stdout.contains("root:"),
        "nothing of /etc/passwd leaks: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reads_lines_streams_replies_and_handles_commands() {
    let dir = workspace();
    let server = LlmServer::start(vec![
        anthropic::stream(
            &[
                anthropic::text("Let me check."),
                anthropic::tool("t1", "list_dir", json!({})),
            ],
            9,
        ),
        anthropic::stream(&[anthropic::text("There is hello.txt.")], 9),
        anthropic::stream(&[anthropic::text("Fresh start.")], 9),
    ])
    .await;
    let output = clawcage(
        vec![
            "chat".into(),
            "--session".into(),
            unique("chat"),
            "--provider".into(),
            "anthropic".into(),
            "--base-url".into(),
            server.url().to_string(),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ],
        vec![("ANTHROPIC_API_KEY", "k".into())],
        Some("/help\n/tools\nWhat is here?\n/reset\nhello again\n/nope\n/exit\n".into()),
    )
    .await;
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(stdout.contains("/reset"), "help: {stdout}");
    assert!(
        stdout
            .contains("read_file  — Read a text file in the workspace\n      reaches: workspace "),
        "tools: {stdout}"
    );
    assert!(
        stdout.contains("Let me check.\n  > list_dir {} …\n  > list_dir {}  ok"),
        "{stdout}"
    );
    assert!(stdout.contains("There is hello.txt."), "{stdout}");
    assert!(stdout.contains("history cleared"), "{stdout}");
    assert!(stdout.contains("unknown command /nope"), "{stdout}");
    assert_eq!(server.requests().len(), 3);
    // After /reset the model sees only the new line.
    assert_eq!(server.bodies()[2]["messages"].as_array().unwrap().len(), 1);
    assert_eq!(server.bodies()[0]["stream"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_over_along_the_configured_chain() {
    let dir = workspace();
    let primary = LlmServer::start(vec![Reply::status(503, "primary overloaded", &[])]).await;
    let fallback =
        LlmServer::start(vec![openai::message(Some("answered by the fallback"), &[])]).await;
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("chain.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{}\"\nmax_retries = 0\n\n[[provider.fallback]]\nkind = \"openai\"\nmodel = \"local-model\"\nbase_url = \"{}/v1\"\n",
            primary.url(),
            fallback.url()
        ),
    )
    .unwrap();
    let output = clawcage(
        vec![
            "run".into(),
            "hello".into(),
            "--config".into(),
            config.display().to_string(),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ],
        vec![("ANTHROPIC_API_KEY", "k".into())],
        None,
    )
    .await;
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(text(&output.stdout), "answered by the fallback\n");
    assert!(
        stderr.contains("anthropic/claude-test failed (anthropic/claude-test answered HTTP 503: primary overloaded); trying openai/local-model"),
        "{stderr}"
    );
    assert!(
        stderr.contains("(openai/local-model; tokens this turn 50 in / 10 out"),
        "{stderr}"
    );
    assert_eq!(primary.requests().len(), 1);
    assert_eq!(fallback.bodies()[0]["model"], "local-model");
}

/// `clawcage run` with a task that delegates: the parent spawns a child, the child works with the
/// workspace read-only, and the answer printed is the parent's after the child's announcement.
/// Every tool call of both is in the audit log under its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_its_sub_agents_and_children_cannot_write() {
    let dir = workspace();
    let state = private_state_dir();
    let server = LlmServer::start_routed(|body| {
        // The system prompt is one text block marked for the prompt cache.
        let system = body["system"][0]["text"].as_str().unwrap_or_default();
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let results: Vec<String> = last["content"]
            .as_array()
            .map(|blocks| {
                blocks
                    .iter()
                    .filter(|b| b["type"] == "tool_result")
                    .map(|b| b["content"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        if system.contains("You are a sub-agent") {
            return match messages.len() {
                1 => anthropic::message(&[
                    anthropic::tool(
                        "w",
                        "write_file",
                        json!({"path": "child.txt", "content": "x"}),
                    ),
                    anthropic::tool("r", "read_file", json!({"path": "hello.txt"})),
                ]),
                _ => anthropic::message(&[anthropic::text(&format!(
                    "write: {} | read: {}",
                    results[0],
                    results[1].trim()
                ))]),
            };
        }
        let text = text_of(last);
        if text.starts_with("Check hello.txt") {
            anthropic::message(&[anthropic::tool(
                "s",
                "spawn",
                json!({"task": "Read hello.txt and try to write child.txt", "label": "reader"}),
            )])
        } else if text.starts_with("[notification") {
            let report = text.lines().last().unwrap_or_default().to_string();
            anthropic::message(&[anthropic::text(&format!("The helper reports: {report}"))])
        } else {
            anthropic::message(&[anthropic::text("A helper is on it.")])
        }
    })
    .await;
    let session = unique("delegate");
    let output = clawcage(
        args(&[
            "run",
            "Check hello.txt with a helper.",
            "--provider",
            "anthropic",
            "--model",
            "claude-test",
            "--base-url",
            server.url(),
            "--workspace",
            &dir.path().display().to_string(),
            "--state-dir",
            &state.path().display().to_string(),
            "--session",
            &session,
        ]),
        vec![("ANTHROPIC_API_KEY", "sk-test".into())],
        None,
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("The helper reports: write: denied: the workspace is read-only")
            && stdout
                .trim_end()
                .ends_with("| read: hello from the workspace"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("[subagent:sub-1] Sub-agent sub-1 (reader) completed"),
        "{stderr}"
    );
    assert!(!dir.path().join("child.txt").exists());

    let audit = std::fs::read_to_string(state.path().join("audit.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = audit
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seen: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r["session"].as_str().unwrap().to_string(),
                r["tool"].as_str().unwrap().to_string(),
                r["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let child = format!("{session}/sub-1");
    assert!(
        seen.contains(&(session.clone(), "spawn".into(), "ok".into())),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(child.clone(), "write_file".into(), "denied".into())),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(child, "read_file".into(), "ok".into())),
        "{seen:?}"
    );
    assert!(
        !audit.contains("hello from the workspace"),
        "no results in the audit log"
    );
}

/// `clawcage chat` with cron: the agent schedules a job with the sandboxed `cron` tool, the job
/// fires while the REPL waits for input, the firing enters the session's lane through the bus,
/// and the agent's reply to it is printed. The job is in `<state>/cron/jobs.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_runs_a_cron_job_the_agent_scheduled() {
    use std::io::BufRead as _;

    let dir = workspace();
    let state = private_state_dir();
    let server = LlmServer::start_routed(|body| {
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let text = text_of(last);
        if text == "Remind me to stretch every second." {
            anthropic::message(&[anthropic::tool(
                "c1",
                "cron",
                json!({"action": "add", "every_seconds": 1, "message": "stretch", "name": "stretch"}),
            )])
        } else if text.contains("[cron job stretch] stretch") {
            anthropic::message(&[anthropic::text("Time to stretch!")])
        } else if text.contains("[cron job water] drink water") {
            anthropic::message(&[anthropic::text("Time to drink!")])
        } else {
            anthropic::message(&[anthropic::text("Scheduled.")])
        }
    })
    .await;
    let url = server.url().to_string();
    let workspace_path = dir.path().display().to_string();
    let state_path = state.path().display().to_string();
    // `clawcage cron` manages the same jobs outside a chat; run first, it also loads (and on a
    // first start compiles) the cron component, so the chat's deadline below counts only the
    // chat's own work.
    let cron_cli = {
        let (workspace_path, state_path) = (workspace_path.clone(), state_path.clone());
        move |args: &[&str]| {
            let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
                .args(["cron"])
                .args(args)
                .args(["--workspace", &workspace_path, "--state-dir", &state_path])
                .env_remove("RUST_LOG")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "cron {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            stdout
        }
    };
    assert!(cron_cli(&["list"]).contains("No scheduled jobs"));
    let (stdout, exit) = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args([
                "chat",
                "--session",
                "cron-test",
                "--provider",
                "anthropic",
                "--model",
                "claude-test",
                "--base-url",
                &url,
                "--workspace",
                &workspace_path,
                "--state-dir",
                &state_path,
            ])
            .env_remove("RUST_LOG")
            .env("ANTHROPIC_API_KEY", "sk-test")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("clawcage starts");
        let mut input = child.stdin.take().unwrap();
        let (lines, receive) = std::sync::mpsc::channel();
        let output = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(output).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        input
            .write_all(b"Remind me to stretch every second.\n")
            .unwrap();
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            match receive.recv_timeout(std::time::Duration::from_millis(200)) {
                Ok(line) => {
                    let done = line.contains("Time to stretch!");
                    seen.push(line);
                    if done {
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // A job added from outside while the chat runs fires in the chat.
        let added = cron_cli(&[
            "add",
            "--every",
            "1",
            "--message",
            "drink water",
            "--name",
            "water",
            "--session",
            "cron-test",
        ]);
        assert!(added.contains("Scheduled job"), "{added}");
        let listed = cron_cli(&["list"]);
        assert!(
            listed.contains("(stretch)") && listed.contains("(water)"),
            "{listed}"
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            match receive.recv_timeout(std::time::Duration::from_millis(200)) {
                Ok(line) => {
                    let done = line.contains("Time to drink!");
                    seen.push(line);
                    if done {
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        input.write_all(b"/exit\n").unwrap();
        drop(input);
        let status = child.wait().unwrap();
        (seen.join("\n"), status)
    })
    .await
    .unwrap();
    assert!(exit.success(), "{stdout}");
    assert!(stdout.contains("> cron "), "the call is shown: {stdout}");
    assert!(
        stdout.contains("[cron:") && stdout.contains("Time to stretch!"),
        "the firing was answered while the REPL was idle: {stdout}"
    );
    assert!(
        stdout.contains("Time to drink!"),
        "the job added with `clawcage cron add` fired in the running chat: {stdout}"
    );
    let jobs = std::fs::read_to_string(state.path().join("cron/jobs.json")).unwrap();
    assert!(
        jobs.contains("stretch") && jobs.contains("cron-test"),
        "{jobs}"
    );
}

/// `run` without `--session` says which session it saved, so it can be continued; `sessions`
/// lists it; a stream without reported usage says so instead of "0 tokens".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_names_its_session_and_sessions_lists_it() {
    let dir = workspace();
    let state = private_state_dir();
    let no_usage = || {
        Reply::json(json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "First answer."}, "finish_reason": "stop"}],
        }))
    };
    let server = LlmServer::start(vec![no_usage(), no_usage()]).await;
    let common = |extra: &[&str]| {
        let mut list = args(extra);
        list.extend(args(&[
            "--provider",
            "openai",
            "--model",
            "m",
            "--base-url",
            server.url(),
            "--workspace",
            dir.path().to_str().unwrap(),
            "--state-dir",
            state.path().to_str().unwrap(),
        ]));
        list
    };
    let first = clawcage(common(&["run", "Start something."]), vec![], None).await;
    let stderr = text(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(
        stderr.contains("reported no token usage"),
        "usage unknown is said so: {stderr}"
    );
    let key = stderr
        .lines()
        .find_map(|line| line.strip_prefix("session "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("the session key is printed: {stderr}"))
        .to_string();

    let listed = clawcage(
        args(&[
            "sessions",
            "--json",
            "--state-dir",
            state.path().to_str().unwrap(),
        ]),
        vec![],
        None,
    )
    .await;
    let sessions: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(sessions[0]["key"], key, "{sessions}");
    assert!(sessions[0]["bytes"].as_u64().unwrap() > 0);
    assert!(sessions[0]["last_active"].as_str().unwrap().ends_with('Z'));

    // Continued, the model sees the earlier turn.
    let second = clawcage(
        common(&["run", "And then?", "--session", &key]),
        vec![],
        None,
    )
    .await;
    assert!(second.status.success(), "{}", text(&second.stderr));
    let requests = server.requests();
    let messages = requests[1].body["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|message| message["content"] == "Start something."),
        "{messages:?}"
    );
}

/// The log (`-v`) goes through the redactor too: a server that echoes the key in its error
/// page, logged by the retry as it waits, never shows the key on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verbose_log_never_shows_a_key_a_server_echoed() {
    let workspace = workspace();
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[provider]\nkind = \"anthropic\"\nmax_retries = 1\n[agent]\nmax_iterations = 2\n",
    )
    .unwrap();
    let key = "sk-ant-echoed-0123456789abcdefghij";
    let echoed = format!("overloaded; your key {key} is fine");
    let server = LlmServer::start(vec![
        Reply::status(503, &echoed, &[]),
        Reply::status(503, &echoed, &[]),
    ])
    .await;
    let command = args(&[
        "-v",
        "run",
        "hi",
        "--config",
        config.to_str().unwrap(),
        "--workspace",
        workspace.path().to_str().unwrap(),
        "--state-dir",
        &state_dir().display().to_string(),
        "--base-url",
        server.url(),
    ]);
    let output = clawcage(command, vec![("ANTHROPIC_API_KEY", key.into())], None).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("retrying"),
        "the retry was logged: {stderr}"
    );
    assert!(stderr.contains("your key"), "{stderr}");
    assert!(!stderr.contains(key), "the key reached stderr: {stderr}");
    assert!(!text(&output.stdout).contains(key));
}

/// `/compact` asks the model for a summary, so with the session's budget used up it says so
/// and calls nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_with_the_budget_used_up_says_so_and_calls_no_model() {
    let dir = workspace();
    let config = tempfile::tempdir().unwrap();
    let config_file = config.path().join("clawcage.toml");
    std::fs::write(&config_file, "[budget]\nsession_tokens = 50\n").unwrap();
    let server = LlmServer::start(vec![anthropic::message(&[anthropic::text("Noted.")])]).await;
    let output = clawcage(
        vec![
            "chat".into(),
            "--session".into(),
            unique("budget"),
            "--provider".into(),
            "anthropic".into(),
            "--base-url".into(),
            server.url().to_string(),
            "--workspace".into(),
            dir.path().display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
            "--config".into(),
            config_file.display().to_string(),
        ],
        vec![("ANTHROPIC_API_KEY", "k".into())],
        Some("Remember this.\n/compact\n/exit\n".into()),
    )
    .await;
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(stdout.contains("Noted."), "{stdout}");
    assert!(
        stdout.contains("not compacted: a summary needs a model call")
            && stdout.contains("[budget] session_tokens"),
        "{stdout}"
    );
    assert_eq!(server.requests().len(), 1, "only the turn called the model");
}
