//! `clawcage chat` in a pseudo-terminal, driven as a person types: pasted text (many characters
//! in one write) is submitted by Enter, a running tool call is shown when it starts and counts
//! its seconds, and Ctrl-C during a turn says `interrupted` once and gives the prompt back once.
//! The terminal is Python's `pty` (`pty_driver.py`), which makes it the controlling terminal, so
//! Ctrl-C is a real SIGINT.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::Command;

use clawcage_tests::llm_server::{LlmServer, anthropic, text_of};
use serde_json::{Value, json};

use clawcage_tests::cli_state::{private_state_dir, warm_components};

/// The last message's text blocks, joined.
fn last_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .map(text_of)
        .unwrap_or_default()
}

/// Output with ANSI escape sequences and carriage returns removed.
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for next in chars.by_ref() {
                    if next.is_ascii_alphabetic() || next == '~' {
                        break;
                    }
                }
            }
            continue;
        }
        if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// Runs `clawcage chat` against `server` in a pseudo-terminal through `steps`; returns the
/// driver's report.
async fn drive(server: &LlmServer, steps: Value) -> Value {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "hello\n").unwrap();
    let state = private_state_dir();
    // Load the components first, so the steps' timeouts count only the chat's own work.
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty_driver.py");
    let url = server.url().to_string();
    let workspace_path = workspace.path().to_path_buf();
    let state_path = state.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(driver)
            .arg(steps.to_string())
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_clawcage"))
            .args([
                "chat",
                "--provider",
                "anthropic",
                "--model",
                "claude-test",
                "--base-url",
                &url,
            ])
            .arg("--workspace")
            .arg(&workspace_path)
            .arg("--state-dir")
            .arg(&state_path)
            .env("ANTHROPIC_API_KEY", "sk-test")
            .env("TERM", "xterm")
            .env_remove("RUST_LOG")
            .output()
            .expect("python3 runs (the pseudo-terminal driver needs it)")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pasted_text_and_commands_are_submitted_by_enter() {
    let server = LlmServer::start_routed(|body| {
        if last_text(body) == "What do the notes say?" {
            anthropic::message(&[anthropic::text("The notes say hello.")])
        } else {
            anthropic::message(&[anthropic::text("Something else.")])
        }
    })
    .await;
    // Each send is one write, as a paste or `tmux send-keys "text" Enter` delivers it.
    let report = drive(
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "What do the notes say?\r"},
            {"expect": "The notes say hello", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"send": "/tools\r"},
            {"expect": "read_file", "timeout": 10},
            {"expect": "you> ", "timeout": 10},
            {"send": "/exit\r"},
            {"sleep": 0.5},
        ]),
    )
    .await;
    let output = plain(report["output"].as_str().unwrap());
    assert_eq!(
        report["ok"], true,
        "step {} failed:\n{output}",
        report["failed_step"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_call_is_shown_and_ctrl_c_says_interrupted_once() {
    let server = LlmServer::start_routed(|body| {
        if last_text(body) == "Take a nap." {
            anthropic::message(&[anthropic::tool(
                "n1",
                "exec",
                json!({"command": "sleep 20"}),
            )])
        } else {
            anthropic::message(&[anthropic::text("Rested.")])
        }
    })
    .await;
    let report = drive(
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Take a nap.\r"},
            // Shown when it starts, long before it could end.
            {"expect": "> exec \\{\"command\":\"sleep 20\"\\}", "timeout": 10},
            // The elapsed time counts on a terminal.
            {"expect": "2 s", "timeout": 10},
            {"send": "\u{3}"},
            {"expect": "interrupted", "timeout": 10},
            {"expect": "you> ", "timeout": 10},
            {"sleep": 1.5},
            {"send": "/exit\r"},
            {"sleep": 0.5},
        ]),
    )
    .await;
    let raw = report["output"].as_str().unwrap();
    let output = plain(raw);
    assert_eq!(
        report["ok"], true,
        "step {} failed:\n{output}",
        report["failed_step"]
    );
    let marks = report["marks"].as_array().unwrap();
    // The output from the interrupt on.
    let at_interrupt = marks[4][2].as_u64().unwrap() as usize;
    let after = plain(&raw[at_interrupt.min(raw.len())..]);
    assert_eq!(
        after.matches("interrupted").count(),
        1,
        "said once:\n{after}"
    );
    assert!(
        !after.contains("error"),
        "an interrupt is no error:\n{after}"
    );
    let before_exit = after.split("/exit").next().unwrap_or_default();
    assert_eq!(
        before_exit.matches("you> ").count(),
        1,
        "the prompt comes back once:\n{after}"
    );
    assert!(
        after.contains("> exec {\"command\":\"sleep 20\"}"),
        "the interrupted call is shown with its fate:\n{after}"
    );
}
