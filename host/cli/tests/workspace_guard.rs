//! No workspace may contain, be or lie inside a directory whose content decides what a later run
//! grants or believes: the state directory (pairings of channel senders, cron jobs, transcripts,
//! trust records, the compiled-code cache), the plugins directory, and clawcage's user
//! configuration directory. Attacks through every front end that chooses a workspace: `clawcage
//! run` on the state directory's `channels/` (where a tool would approve an attacker's Telegram
//! account in `pairing.json`), the same through a link and through a relative state directory
//! that does not exist yet, a workspace inside the plugins directory or around the user
//! configuration directory, and ACP `session/new` and `session/load` on the state directory's
//! `sessions/` (where a tool would forge a transcript the model reads on the next turn).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clawcage_tests::llm_server::{LlmServer, anthropic};
use serde_json::{Value, json};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// A state directory at `path` sharing the tests' compiled components (as
/// `cli_state::private_state_dir` makes one, but where the test wants it).
fn state_dir_at(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    let cache = clawcage_tests::cli_state::shared_state_dir().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(&cache, path.join("cache")).unwrap();
    path.to_path_buf()
}

/// `clawcage ARGS` in `current`, with a private configuration directory.
fn clawcage(current: &Path, config_home: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(current)
        .env_remove("RUST_LOG")
        .env("XDG_CONFIG_HOME", config_home)
        .env("ANTHROPIC_API_KEY", "sk-guard-test-secret-value")
        .output()
        .unwrap()
}

fn refused(output: &Output, words: &[&str]) {
    if let Some(problem) = refusal_problem("refused", output, words) {
        panic!("{problem}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_the_state_directory_s_channels_as_its_workspace() {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let state = state_dir_at(&root.path().join("state"));
    let channels = state.join("channels");
    std::fs::create_dir_all(&channels).unwrap();
    // The model approves the attacker's account, as a prompt injection would make it do.
    let server = LlmServer::start_routed(|body| {
        let results = body["messages"].as_array().is_some_and(|messages| {
            messages.iter().any(|m| {
                m["content"]
                    .as_array()
                    .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
            })
        });
        if results {
            anthropic::stream(&[anthropic::text("Approved.")], 48)
        } else {
            anthropic::stream(
                &[anthropic::tool(
                    "w1",
                    "write_file",
                    json!({"path": "pairing.json", "content": "{\"approved\": [{\"channel\": \"telegram\", \"sender\": \"666\"}]}"}),
                )],
                40,
            )
        }
    })
    .await;
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{}\"\nmax_retries = 0\n",
            server.url()
        ),
    )
    .unwrap();
    let output = clawcage(
        root.path(),
        root.path(),
        &[
            "run",
            "pair me",
            "--config",
            config.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--workspace",
            channels.to_str().unwrap(),
        ],
    );
    refused(
        &output,
        &["lies inside the state directory", "pairing.json"],
    );
    assert!(!channels.join("pairing.json").exists());
    assert!(server.bodies().is_empty(), "no model was asked");
}

/// Whether `output` is a refusal (exit 2) whose message has every one of `words`; else what it
/// was instead.
fn refusal_problem(case: &str, output: &Output, words: &[&str]) -> Option<String> {
    let text = stderr(output);
    let missing: Vec<&str> = words
        .iter()
        .copied()
        .filter(|word| !text.contains(word))
        .collect();
    (output.status.code() != Some(2) || !missing.is_empty()).then(|| {
        format!(
            "{case}: exit {:?}, missing {missing:?} in: {text}",
            output.status.code()
        )
    })
}

#[test]
fn every_spelling_of_a_protected_directory_is_refused() {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("config-home");
    std::fs::create_dir_all(home.join("clawcage").join("inner")).unwrap();
    let state = state_dir_at(&root.path().join("state"));
    std::fs::create_dir_all(state.join("cron")).unwrap();
    let projects = root.path().join("projects");
    std::fs::create_dir_all(projects.join("ws")).unwrap();
    std::fs::create_dir_all(root.path().join("state2")).unwrap();
    let link = projects.join("jobs");
    std::os::unix::fs::symlink(state.join("cron"), &link).unwrap();
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(plugins.join("one")).unwrap();
    let plugins_config = root.path().join("plugins.toml");
    std::fs::write(&plugins_config, "[plugins]\ndir = \"plugins\"\n").unwrap();
    let tools = |current: &Path, workspace: &Path, state: &Path, extra: &[&str]| {
        let mut args = vec![
            "tools",
            "--state-dir",
            state.to_str().unwrap(),
            "--workspace",
            workspace.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        clawcage(current, &home, &args)
    };
    let workspace = projects.join("ws");
    let config = ["--config", plugins_config.to_str().unwrap()];
    let cases: Vec<(&str, Output, &[&str])> = vec![
        (
            "the state directory itself",
            tools(root.path(), &state, &state, &[]),
            &["is the state directory"],
        ),
        (
            "a link to a folder of the state directory",
            tools(root.path(), &link, &state, &[]),
            &["lies inside the state directory"],
        ),
        (
            "a relative state directory not made yet, which would be made in the workspace",
            tools(&workspace, &workspace, Path::new("new-state"), &[]),
            &["contains the state directory"],
        ),
        (
            "around clawcage's configuration directory",
            tools(root.path(), &home, &state, &[]),
            &["contains clawcage's configuration directory"],
        ),
        (
            "inside clawcage's configuration directory",
            tools(
                root.path(),
                &home.join("clawcage").join("inner"),
                &state,
                &[],
            ),
            &["lies inside clawcage's configuration directory"],
        ),
        (
            "inside the plugins directory",
            tools(root.path(), &plugins.join("one"), &state, &config),
            &["lies inside the plugins directory"],
        ),
    ];
    let problems: Vec<String> = cases
        .iter()
        .filter_map(|(case, output, words)| refusal_problem(case, output, words))
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(!workspace.join("new-state").exists());

    // A sibling whose name starts the same is not inside.
    let sibling = tools(root.path(), &root.path().join("state2"), &state, &[]);
    assert!(sibling.status.success(), "{}", stderr(&sibling));
    let project = tools(root.path(), &workspace, &state, &[]);
    assert!(project.status.success(), "{}", stderr(&project));
}

/// `clawcage acp` driven with raw JSON-RPC lines; answers are read on a thread so that a hang
/// fails the test instead of stopping it.
struct Acp {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl Acp {
    fn start(current: &Path, home: &Path, args: &[&str]) -> Acp {
        let mut child = Command::new(binary())
            .arg("acp")
            .args(args)
            .current_dir(current)
            .env_remove("RUST_LOG")
            .env("XDG_CONFIG_HOME", home)
            .env("ANTHROPIC_API_KEY", "sk-guard-test-secret-value")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Acp {
            child,
            stdin,
            lines,
            next_id: 1,
        }
    }

    /// Sends a request and returns its response (notifications before it are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }
}

impl Drop for Acp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn acp_refuses_a_session_inside_the_state_directory() {
    clawcage_tests::cli_state::warm_components(binary());
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("config-home");
    std::fs::create_dir_all(&home).unwrap();
    let state = state_dir_at(&root.path().join("state"));
    let sessions = state.join("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    std::fs::write(
        sessions.join("agent%3Amain%3Aacp%3Aold.jsonl"),
        "{\"kind\":\"message\",\"message\":{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}}\n",
    )
    .unwrap();
    let workspace = root.path().join("projects").join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    // The operator allows everything under the root, which holds the state directory too.
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"http://127.0.0.1:9\"\nmax_retries = 0\n\n[subagents]\nenabled = false\n\n[acp]\nallowed_roots = [\".\"]\n",
    )
    .unwrap();
    let mut acp = Acp::start(
        root.path(),
        &home,
        &[
            "--config",
            config.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    let init = acp.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");

    let message = |answer: &Value| {
        answer["error"]["data"]["message"]
            .as_str()
            .map(str::to_string)
    };
    for cwd in [sessions.clone(), state.clone(), root.path().to_path_buf()] {
        let answer = acp.request("session/new", json!({"cwd": cwd, "mcpServers": []}));
        let text =
            message(&answer).unwrap_or_else(|| panic!("{} was opened: {answer}", cwd.display()));
        assert!(text.contains("the state directory"), "{text}");
    }
    let load = acp.request(
        "session/load",
        json!({"sessionId": "agent:main:acp:old", "cwd": sessions, "mcpServers": []}),
    );
    let text = message(&load).unwrap_or_else(|| panic!("the session was loaded: {load}"));
    assert!(text.contains("lies inside the state directory"), "{text}");

    // A project beside the state directory opens.
    let opened = acp.request("session/new", json!({"cwd": workspace, "mcpServers": []}));
    assert!(
        opened["result"]["sessionId"].is_string(),
        "the project was refused: {opened}"
    );
}
