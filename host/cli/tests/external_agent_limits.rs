//! An external ACP agent's own time limit (`[acp.agents.NAME] timeout_secs`) covers its whole
//! run, its start included: an agent that never answers `initialize`, one that never answers
//! `session/new`, and one that hangs in its prompt and ignores `session/cancel` each end with a
//! result naming what went unanswered, well inside the sub-agents' own (much longer) limit, and
//! the process is killed and reaped before that result is announced. The agent is a small
//! Python program (`acp_hung_agent.py`) that ignores SIGTERM and outlives its closed stdin. The
//! tokens an agent reports count against its parent session's budget, and its streamed text is
//! scrubbed of the host's secrets (`acp_reporting_agent.py`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::sync::{Arc, Mutex};

use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user};
use serde_json::{Value, json};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

fn answer(text: &str) -> Reply {
    anthropic::stream(&[anthropic::text(text)], 48)
}

/// Whether process `pid` still exists (a zombie counts: it has not been reaped).
fn process_exists(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// What one run of a hung agent showed.
struct Hung {
    /// The sub-agent's result as announced to the model.
    announcement: String,
    /// Whether the agent's process still existed when its result was announced.
    alive_at_announcement: bool,
    /// The methods the agent received.
    received: Vec<String>,
}

/// `clawcage run` whose model spawns the hung agent (hanging at `hang_at`) with `timeout_secs`
/// `limit` (long enough for the steps before `hang_at`) under a sub-agent limit of 60 s, and
/// reports what came of it.
async fn run_hung_agent(hang_at: &str, limit: u64) -> Hung {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let state = clawcage_tests::cli_state::private_state_dir();
    let workspace = root.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let pid_file = root.path().join("agent.pid");
    let log_file = root.path().join("agent.log");
    // Recorded when the announcement arrives, while clawcage still runs.
    let alive: Arc<Mutex<Option<bool>>> = Arc::default();
    let seen = alive.clone();
    let pid_path = pid_file.clone();
    let server = LlmServer::start_routed(move |body| {
        let (text, results) = last_user(body);
        if text.contains("[notification") {
            let pid: u32 = std::fs::read_to_string(&pid_path)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .expect("the agent wrote its pid before its result was announced");
            *seen.lock().unwrap() = Some(process_exists(pid));
            answer("All reported.")
        } else if results {
            answer("Started it.")
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "s1",
                    "spawn",
                    json!({"task": "do the thing", "runtime": "acp", "agent": "hung"}),
                )],
                40,
            )
        }
    })
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/acp_hung_agent.py");
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{url}\"\nmax_retries = 0\n\n\
             [subagents]\ntimeout_secs = 60\n\n\
             [acp]\nallowed_agents = [\"hung\"]\n\n\
             [acp.agents.hung]\ncommand = \"python3\"\nargs = [{script}]\ntimeout_secs = {limit}\n\
             env = {{ HUNG_AT = \"{hang_at}\", HUNG_PID_FILE = {pid}, HUNG_LOG_FILE = {log} }}\n",
            url = server.url(),
            script = json!(script.display().to_string()),
            pid = json!(pid_file.display().to_string()),
            log = json!(log_file.display().to_string()),
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
        .env("ANTHROPIC_API_KEY", "sk-limits-test-secret-value")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    let bodies = server.bodies();
    let announcement = last_user(bodies.last().unwrap()).0;
    assert!(
        announcement.contains("[notification"),
        "{announcement}\n{stderr}"
    );
    let alive_at_announcement = alive
        .lock()
        .unwrap()
        .expect("the announcement reached the model");
    let received = std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    Hung {
        announcement,
        alive_at_announcement,
        received,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_initialize_is_stopped_at_its_own_limit_and_killed() {
    let hung = run_hung_agent("initialize", 1).await;
    assert!(
        hung.announcement
            .contains("did not answer `initialize` within its time limit of 1 s"),
        "{}",
        hung.announcement
    );
    assert!(!hung.announcement.contains("60 s"), "{}", hung.announcement);
    assert!(
        !hung.alive_at_announcement,
        "the hung agent's process was still there when its result was announced"
    );
    // (What follows may be the SDK's `$/cancel_request` for the abandoned request.)
    assert!(
        hung.received.starts_with(&["initialize".to_string()])
            && !hung.received.iter().any(|method| method == "session/new"),
        "{:?}",
        hung.received
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_session_new_is_stopped_at_its_own_limit_and_killed() {
    let hung = run_hung_agent("session/new", 5).await;
    assert!(
        hung.announcement
            .contains("did not answer `session/new` within its time limit of 5 s"),
        "{}",
        hung.announcement
    );
    assert!(
        !hung.alive_at_announcement,
        "the hung agent's process was still there when its result was announced"
    );
    assert!(
        hung.received
            .starts_with(&["initialize".to_string(), "session/new".to_string()])
            && !hung
                .received
                .iter()
                .any(|method| method == "session/prompt"),
        "{:?}",
        hung.received
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_session_cancel_is_killed_after_the_grace_period() {
    let hung = run_hung_agent("cancel", 5).await;
    assert!(
        hung.announcement
            .contains("stopped after its time limit of 5 s ([acp.agents.hung] timeout_secs); it did not answer session/cancel"),
        "{}",
        hung.announcement
    );
    assert!(
        !hung.alive_at_announcement,
        "the hung agent's process was still there when its result was announced"
    );
    assert!(
        hung.received
            .starts_with(&["initialize", "session/new", "session/prompt"].map(str::to_string))
            && hung
                .received
                .iter()
                .any(|method| method == "session/cancel"),
        "{:?}",
        hung.received
    );
}

const SECRET: &str = "sk-ant-external-agent-secret-0123456789";

/// The agent (`acp_reporting_agent.py`) streams the provider's API key cut across two chunks and
/// reports 500 tokens in ACP's `usage`: the key reaches neither the terminal nor the state
/// directory, the tokens are in the day's record, and under `session_tokens = 300` the parent's
/// next model call is refused naming the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_reported_usage_counts_against_the_budget_and_its_text_is_scrubbed() {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let state = clawcage_tests::cli_state::private_state_dir();
    let workspace = root.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let server = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
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
    for (path, bytes) in clawcage_tests::files_beneath(&[state.path()]) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(half),
            "{} holds the key",
            path.display()
        );
    }
}
