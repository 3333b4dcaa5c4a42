//! Token budgets hold for a session's sub-agents: `clawcage run` with `[budget] session_tokens`
//! or `daily_tokens`, a parent that spawns four children that would each keep calling tools, and
//! a scripted Anthropic server on 127.0.0.1 where every reply costs 50 tokens. The children's
//! calls count against the parent session's budget and the day's, they stop with a message
//! naming the budget, and the day's record on disk holds their tokens.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::process::{Command, Output, Stdio};

use clawcage_tests::cli_state::{private_state_dir, warm_components};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, text_of};
use serde_json::{Value, json};

const CHILDREN: usize = 4;

/// Every reply costs 50 tokens.
fn costly(blocks: &[anthropic::Block]) -> Reply {
    anthropic::message_with_usage(blocks, json!({"input_tokens": 40, "output_tokens": 10}))
}

/// The parent spawns four children at once; each child reads a file again and again (a new
/// offset each time, so no loop detection stops it); the parent answers notifications briefly.
fn route(body: &Value) -> Reply {
    let system = body["system"][0]["text"].as_str().unwrap_or_default();
    let messages = body["messages"].as_array().unwrap();
    if system.contains("You are a sub-agent") {
        return costly(&[anthropic::tool(
            "r",
            "read_file",
            json!({"path": "hello.txt", "offset": 1, "limit": messages.len()}),
        )]);
    }
    let last = text_of(messages.last().unwrap());
    if last.starts_with("Survey the workspace") {
        let spawns: Vec<anthropic::Block> = (0..CHILDREN)
            .map(|n| {
                anthropic::tool(
                    &format!("s{n}"),
                    "spawn",
                    json!({"task": format!("Keep reading hello.txt, part {n}"), "label": format!("reader{n}")}),
                )
            })
            .collect();
        costly(&spawns)
    } else {
        costly(&[anthropic::text("Noted.")])
    }
}

fn run(config: &str) -> (Output, LlmServerRun) {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_clawcage"));
    warm_components(binary);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(LlmServer::start_routed(route));
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("hello.txt"), "hello\n").unwrap();
    let state = private_state_dir();
    let config_file = state.path().join("budget.toml");
    std::fs::write(
        &config_file,
        format!("{config}\n[subagents]\nmax_concurrent = {CHILDREN}\ntimeout_secs = 120\n"),
    )
    .unwrap();
    let output = Command::new(binary)
        .args(["run", "Survey the workspace with four helpers."])
        .args(["--provider", "anthropic", "--model", "claude-test"])
        .args(["--base-url", server.url()])
        .arg("--workspace")
        .arg(workspace.path())
        .arg("--state-dir")
        .arg(state.path())
        .arg("--config")
        .arg(&config_file)
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-test")
        .stdin(Stdio::null())
        .output()
        .expect("clawcage runs");
    (
        output,
        LlmServerRun {
            server,
            _runtime: runtime,
            state,
            _workspace: workspace,
        },
    )
}

/// The server with what it must outlive.
struct LlmServerRun {
    server: LlmServer,
    _runtime: tokio::runtime::Runtime,
    state: tempfile::TempDir,
    _workspace: tempfile::TempDir,
}

impl LlmServerRun {
    fn child_requests(&self) -> usize {
        self.server
            .bodies()
            .iter()
            .filter(|body| {
                body["system"][0]["text"]
                    .as_str()
                    .is_some_and(|system| system.contains("You are a sub-agent"))
            })
            .count()
    }
}

#[test]
fn children_spend_their_parent_sessions_budget_and_stop_when_it_is_spent() {
    let (output, served) = run("[budget]\nsession_tokens = 150\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let requests = served.server.bodies().len();
    // 150 tokens are three replies; at most one call per running agent can be on its way when
    // the budget runs out. Without the children counted, each would run to its iteration limit.
    assert!(
        requests <= 3 + CHILDREN + 1,
        "{requests} model calls under a 150-token budget\n{stderr}"
    );
    assert!(served.child_requests() >= 1, "{stderr}");
    assert!(
        stderr.contains("[budget] session_tokens") && stderr.contains("its sub-agents included"),
        "a child stops with a message naming the budget:\n{stderr}"
    );
}

#[test]
fn children_count_in_the_days_budget_and_its_record() {
    let (output, served) = run("[budget]\ndaily_tokens = 200\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let requests = served.server.bodies().len();
    assert!(
        requests <= 4 + CHILDREN + 1,
        "{requests} model calls under a 200-token daily budget\n{stderr}"
    );
    assert!(
        stderr.contains("[budget] daily_tokens"),
        "a child stops with a message naming the budget:\n{stderr}"
    );
    let daily: Value = serde_json::from_str(
        &std::fs::read_to_string(served.state.path().join("usage").join("daily.json")).unwrap(),
    )
    .unwrap();
    let recorded = daily["tokens"].as_u64().unwrap();
    // The day was spent, so the record holds at least its 200 tokens: the parent's own call is
    // 50, the rest are the children's. Every request cost 50; one still on its way when the run
    // ended (it ends at the refusal) was answered but never counted.
    assert!(
        (200..=50 * requests as u64).contains(&recorded),
        "{daily} after {requests} requests"
    );
    assert!(served.child_requests() >= 1);
}
