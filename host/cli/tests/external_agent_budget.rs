//! An external ACP agent is held to its parent session's budget and its streamed text is
//! scrubbed: `clawcage run` whose model spawns a small Python agent (`acp_reporting_agent.py`)
//! that streams the provider's API key cut across two chunks and reports 500 tokens in ACP's
//! `usage`. The key never reaches the terminal or the state directory, the reported tokens are in
//! the day's record, and with `[budget] session_tokens = 300` the parent's next model call is
//! refused naming the budget.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;

use clawcage_tests::llm_server::{LlmServer, anthropic, text_of};
use serde_json::{Value, json};

const SECRET: &str = "sk-ant-external-agent-secret-0123456789";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
        .map(text_of)
        .unwrap_or_default()
}

/// Every file under `dir`, read.
fn every_file(dir: &Path, found: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            every_file(&path, found);
        } else if kind.is_file() {
            found.push((
                path.display().to_string(),
                std::fs::read(&path).unwrap_or_default(),
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agents_usage_counts_and_its_streamed_text_is_scrubbed() {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let state = clawcage_tests::cli_state::private_state_dir();
    let workspace = root.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let server = LlmServer::start_routed(|body| {
        let text = last_user_text(body);
        if text.starts_with("delegate") {
            anthropic::message(&[anthropic::tool(
                "s1",
                "spawn",
                json!({"task": "do the thing", "runtime": "acp", "agent": "reporter"}),
            )])
        } else {
            anthropic::message(&[anthropic::text("Noted.")])
        }
    })
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp_reporting_agent.py");
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{url}\"\nmax_retries = 0\n\n\
             [budget]\nsession_tokens = 300\n\n\
             [acp]\nallowed_agents = [\"reporter\"]\n\n\
             [acp.agents.reporter]\ncommand = \"python3\"\nargs = [{script}]\ntimeout_secs = 30\n\
             env = {{ SECRET_TO_LEAK = \"{SECRET}\", REPORTED_TOKENS = \"500\" }}\n",
            url = server.url(),
            script = json!(script.display().to_string()),
        ),
    )
    .unwrap();
    let output = tokio::process::Command::new(binary())
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(state.path())
        .args(["run", "delegate this", "--workspace"])
        .arg(&workspace)
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", SECRET)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    // The agent's text was shown, scrubbed.
    assert!(
        stderr.contains("[redacted: ANTHROPIC_API_KEY], and the work is done"),
        "{stderr}"
    );
    let half = &SECRET[..SECRET.len() / 2];
    for shown in [&stdout, &stderr] {
        assert!(
            !shown.contains(half) && !shown.contains(&SECRET[SECRET.len() / 2..]),
            "{shown}"
        );
    }
    // The agent reported 500 of a 300-token budget: the parent's next call is refused.
    assert!(stderr.contains("[budget] session_tokens"), "{stderr}");
    // The spawning turn's calls (the spawn, then the reply to its result, unless the agent's
    // report came first); the notification turn is refused before asking the model.
    let calls = server.bodies().len() as u64;
    assert!((1..=2).contains(&calls), "{calls} model calls\n{stderr}");
    let daily: Value = serde_json::from_str(
        &std::fs::read_to_string(state.path().join("usage/daily.json")).unwrap(),
    )
    .unwrap();
    // The parent's replies (100 in, 20 out each) and the agent's 500.
    assert_eq!(daily["tokens"], 120 * calls + 500, "{daily}");
    let mut files = Vec::new();
    every_file(state.path(), &mut files);
    for (path, bytes) in files {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(half),
            "{path} holds the key"
        );
    }
}
