//! `run` and `chat` take up a turn their killed process left open, the same way the gateway
//! does: the real binary is killed with SIGKILL in the middle of a real `exec` call, and the
//! next `run --session` (or `chat --session`) on that session resumes it first — the call is
//! answered "may have partly run" and not run again, the model is asked once more — then goes
//! on with the new message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use clawcage_tests::llm_server::{LlmServer, anthropic, last_user};
use serde_json::{Value, json};

/// First task: an `exec` call that writes its mark and then takes long; a message of tool
/// results: the answer; the second task: its own answer.
fn model(body: &Value) -> clawcage_tests::llm_server::Reply {
    let (text, results) = last_user(body);
    if results {
        return anthropic::message(&[anthropic::text("It may have run; I checked: done.")]);
    }
    if text.contains("first task") {
        return anthropic::message(&[anthropic::tool(
            "toolu_1",
            "exec",
            json!({"command": "echo ran >> effects.log && sleep 60"}),
        )]);
    }
    anthropic::message(&[anthropic::text("second done")])
}

fn command(server: &LlmServer, state: &Path, workspace: &Path, args: &[&str]) -> Command {
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .args(args)
        .args(["--provider", "anthropic", "--model", "claude-test"])
        .arg("--base-url")
        .arg(server.url())
        .arg("--workspace")
        .arg(workspace)
        .arg("--state-dir")
        .arg(state)
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-durable-test");
    command
}

/// A state directory sharing the tests' compiled components.
fn state_dir() -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    let cache = clawcage_tests::cli_state::shared_state_dir().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(&cache, state.path().join("cache")).unwrap();
    state
}

/// Starts `first` (given `input` on a standard input kept open) and kills it once the call has
/// written its mark.
async fn killed_during_the_call(mut first: Command, input: &[u8], workspace: &Path) {
    let mut child = first
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, input).unwrap();
    let effects = workspace.join("effects.log");
    let ran = tokio::time::timeout(Duration::from_secs(120), async {
        while !std::fs::read_to_string(&effects).is_ok_and(|text| text.contains("ran")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    ran.expect("the call ran");
}

fn transcript_turns(state: &Path, key: &str) -> usize {
    let name = clawcage_agent::transcript::key_file_stem(key);
    std::fs::read_to_string(state.join("sessions").join(format!("{name}.jsonl")))
        .unwrap()
        .lines()
        .filter(|line| line.contains("\"kind\":\"turn\""))
        .count()
}

fn check_resumed(server: &LlmServer, workspace: &Path) {
    assert_eq!(
        std::fs::read_to_string(workspace.join("effects.log")).unwrap(),
        "ran\n",
        "the call is never run twice"
    );
    let bodies = server.bodies();
    assert_eq!(
        bodies.len(),
        3,
        "first call, the resumed step, the second task"
    );
    let resumed = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        resumed.to_string().contains("may have partly run"),
        "{resumed}"
    );
    let (second, _) = last_user(&bodies[2]);
    assert_eq!(second, "second task");
    assert!(
        bodies[2]
            .to_string()
            .contains("It may have run; I checked: done."),
        "the second task sees the resumed turn's answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_resumes_the_turn_its_killed_process_left_open() {
    let server = LlmServer::start_routed(model).await;
    let state = state_dir();
    let workspace = tempfile::tempdir().unwrap();
    let key = "agent:main:cli:durable-run";
    killed_during_the_call(
        command(
            &server,
            state.path(),
            workspace.path(),
            &["run", "first task", "--session", key],
        ),
        b"",
        workspace.path(),
    )
    .await;
    let output = command(
        &server,
        state.path(),
        workspace.path(),
        &["run", "second task", "--session", key],
    )
    .output()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "second done\n", "{stderr}");
    assert!(
        stderr.contains("resuming the turn a stopped process left open"),
        "{stderr}"
    );
    check_resumed(&server, workspace.path());
    assert_eq!(transcript_turns(state.path(), key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_resumes_the_turn_its_killed_process_left_open() {
    let server = LlmServer::start_routed(model).await;
    let state = state_dir();
    let workspace = tempfile::tempdir().unwrap();
    let key = "agent:main:cli:durable-chat";
    // The first chat is killed while its turn runs the call (its input stays open: it waits).
    killed_during_the_call(
        command(
            &server,
            state.path(),
            workspace.path(),
            &["chat", "--session", key],
        ),
        b"first task\n",
        workspace.path(),
    )
    .await;

    let mut second = command(
        &server,
        state.path(),
        workspace.path(),
        &["chat", "--session", key],
    );
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = second
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(b"second task\n/exit\n").unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("second done"), "{stdout}");
    check_resumed(&server, workspace.path());
    assert_eq!(transcript_turns(state.path(), key), 2);
}
