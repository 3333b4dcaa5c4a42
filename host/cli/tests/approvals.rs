//! Approvals as an operator meets them: `clawcage chat` asking inline before a command the
//! allowlist does not cover (answered through standard input: y, a, n), an allow-always answer
//! kept across a restart and removed with `clawcage approvals revoke`, `clawcage call` with no
//! operator to ask (the fallback decides), every request and decision in the audit log, and a
//! read-only workspace whose writes are asked (`[approvals] write = "ask"`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use clawcage_tests::cli_state::{private_state_dir, warm_components};
use clawcage_tests::llm_server::{LlmServer, anthropic, text_of, tool_result_of};
use serde_json::{Value, json};

const CONFIG: &str = "[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nallow = [\"ls *\"]\n";

/// A model that runs `rm -r <dir>` for "remove <dir>" and then repeats the tool's result.
async fn model() -> LlmServer {
    LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("RESULT: {result}"))]);
        }
        let text = text_of(&last);
        match text.strip_prefix("remove ") {
            Some(dir) => anthropic::message(&[anthropic::tool(
                "t1",
                "exec",
                json!({"command": format!("rm -r {dir}")}),
            )]),
            None => anthropic::message(&[anthropic::text("ok")]),
        }
    })
    .await
}

struct Setup {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
    config_dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Self::with_config(CONFIG)
    }

    /// A workspace with `build/`, `dist/`, `cache/`, and `config` as the configuration file.
    fn with_config(config: &str) -> Setup {
        let workspace = tempfile::tempdir().unwrap();
        for dir in ["build", "dist", "cache"] {
            std::fs::create_dir(workspace.path().join(dir)).unwrap();
            std::fs::write(workspace.path().join(dir).join("file"), "x").unwrap();
        }
        let config_dir = tempfile::tempdir().unwrap();
        std::fs::write(config_dir.path().join("clawcage.toml"), config).unwrap();
        let state = private_state_dir();
        Setup {
            workspace,
            state,
            config_dir,
        }
    }

    fn exists(&self, dir: &str) -> bool {
        self.workspace.path().join(dir).exists()
    }

    fn common(&self) -> Vec<String> {
        vec![
            "--workspace".into(),
            self.workspace.path().display().to_string(),
            "--state-dir".into(),
            self.state.path().display().to_string(),
            "--config".into(),
            self.config_dir
                .path()
                .join("clawcage.toml")
                .display()
                .to_string(),
        ]
    }

    fn state(&self) -> &Path {
        self.state.path()
    }
}

fn clawcage(args: Vec<String>, stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(&args)
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "k")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("clawcage starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

async fn chat(setup: &Setup, server: &LlmServer, session: &str, stdin: &str) -> String {
    let mut args: Vec<String> = vec![
        "chat".into(),
        "--session".into(),
        session.into(),
        "--provider".into(),
        "anthropic".into(),
        "--base-url".into(),
        server.url().to_string(),
    ];
    args.extend(setup.common());
    let stdin = stdin.to_string();
    let output = tokio::task::spawn_blocking(move || clawcage(args, &stdin))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn approvals_cli(setup: &Setup, args: &[&str]) -> Output {
    let mut all: Vec<String> = vec!["approvals".into()];
    all.extend(args.iter().map(|arg| arg.to_string()));
    all.extend(setup.common());
    clawcage(all, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_asks_inline_and_runs_only_what_the_operator_allowed() {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let setup = Setup::new();
    let server = model().await;
    // y: once; n: deny; then an unparseable answer, asked again, and the end of the input.
    let stdout = chat(
        &setup,
        &server,
        "approve-inline",
        "remove build\ny\nremove dist\nn\nremove cache\nmaybe\n",
    )
    .await;
    assert!(
        stdout.contains("approval needed: exec wants to run:"),
        "{stdout}"
    );
    assert!(stdout.contains("\n    rm -r build\n"), "{stdout}");
    assert!(
        stdout.contains("(why: `rm -r build` is not on the allowlist)"),
        "{stdout}"
    );
    assert!(!setup.exists("build"), "allowed once, then ran: {stdout}");
    assert!(setup.exists("dist"), "denied, yet ran: {stdout}");
    assert!(
        stdout.contains("RESULT: denied: denied by the operator"),
        "{stdout}"
    );
    assert!(stdout.contains("answer y, a or n"), "{stdout}");
    assert!(setup.exists("cache"), "no answer, yet ran: {stdout}");
    // Nothing was kept for good.
    let listed = approvals_cli(&setup, &["list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("no kept approvals"));
    // Every request and decision is in the audit log, as digests only.
    let audit = std::fs::read_to_string(setup.state().join("audit.jsonl")).unwrap();
    assert_eq!(
        audit.matches("\"approval-requested\"").count(),
        3,
        "{audit}"
    );
    assert!(audit.contains("\"allow-once by chat\""), "{audit}");
    assert_eq!(audit.matches("\"deny by chat\"").count(), 2, "{audit}");
    assert!(
        !audit.contains("rm -r"),
        "the audit log holds a command: {audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_always_survives_a_restart_until_it_is_revoked() {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let setup = Setup::new();
    let server = model().await;
    let stdout = chat(&setup, &server, "approve-always", "remove build\na\n").await;
    assert!(stdout.contains("approval needed"), "{stdout}");
    assert!(!setup.exists("build"));
    let listed = approvals_cli(&setup, &["list", "--json"]);
    let kept: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["program"], "rm");
    assert_eq!(kept[0]["args"], "-r build");
    let id = kept[0]["id"].as_str().unwrap().to_string();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(setup.state().join("approvals.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // A new process runs the same command without asking; another one still asks.
    std::fs::create_dir(setup.workspace.path().join("build")).unwrap();
    let stdout = chat(
        &setup,
        &server,
        "approve-always-2",
        "remove build\nremove dist\n",
    )
    .await;
    assert!(!setup.exists("build"), "{stdout}");
    assert_eq!(stdout.matches("approval needed").count(), 1, "{stdout}");
    assert!(stdout.contains("rm -r dist"), "{stdout}");
    assert!(setup.exists("dist"));

    // Revoked: asked again (and, with nobody answering, denied).
    let revoked = approvals_cli(&setup, &["revoke", &id]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    assert!(String::from_utf8_lossy(&revoked.stdout).contains("revoked"));
    std::fs::create_dir(setup.workspace.path().join("build")).unwrap();
    let stdout = chat(&setup, &server, "approve-always-3", "remove build\n").await;
    assert!(stdout.contains("approval needed"), "{stdout}");
    assert!(setup.exists("build"));
    // An unknown id is an error that says where to look.
    let unknown = approvals_cli(&setup, &["revoke", "apv-nothing"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("clawcage approvals list"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_without_an_operator_follows_the_fallback() {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let setup = Setup::new();
    let call = |command: &str| {
        let mut args: Vec<String> = vec![
            "call".into(),
            "exec".into(),
            json!({"command": command}).to_string(),
        ];
        args.extend(setup.common());
        clawcage(args, "")
    };
    let listed = call("ls");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains("build"));
    let refused = call("rm -r build");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("no operator is connected"), "{stderr}");
    assert!(
        stderr.contains("exec: denied: this command") && !stderr.contains("denied: denied"),
        "the verdict is said once: {stderr}"
    );
    assert!(setup.exists("build"));
    // A bad [approvals] value is a configuration error (exit 2) naming the key.
    std::fs::write(
        setup.config_dir.path().join("clawcage.toml"),
        "[approvals]\nexec = \"sometimes\"\n",
    )
    .unwrap();
    let bad = call("ls");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("[approvals] exec"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sets_its_own_approvals_with_the_approvals_command() {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    // The configuration asks nothing: exec runs whatever the sandbox allows.
    let setup = Setup::with_config("");
    let server = model().await;
    let stdout = chat(
        &setup,
        &server,
        "own-approvals",
        "/approvals\n/approvals exec allowlist ask on-miss\nremove build\nn\n/approvals exec sometimes\n/approvals reset\nremove dist\n",
    )
    .await;
    assert!(
        stdout.contains(
            "approvals for this session: exec full, ask off (the configuration's [approvals])"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "approvals for this session: exec allowlist, ask on-miss (this session's own"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("approval needed: exec wants to run:"),
        "{stdout}"
    );
    assert!(setup.exists("build"), "denied, yet ran: {stdout}");
    assert!(
        stdout.contains("exec \"sometimes\" is not a mode"),
        "{stdout}"
    );
    // Back to the configuration's: `rm -r dist` runs without a question.
    assert_eq!(stdout.matches("approval needed").count(), 1, "{stdout}");
    assert!(!setup.exists("dist"), "{stdout}");
    let audit = std::fs::read_to_string(setup.state().join("audit.jsonl")).unwrap();
    assert_eq!(
        audit.matches("\"session-policy-set\"").count(),
        2,
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_asks_before_each_write_in_a_read_only_workspace() {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let setup = Setup::with_config("[workspace]\nmode = \"ro\"\n\n[approvals]\nwrite = \"ask\"\n");
    // "save NAME" writes NAME with write_file; the tool's result is repeated.
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("RESULT: {result}"))]);
        }
        match text_of(&last).strip_prefix("save ") {
            Some(name) => anthropic::message(&[anthropic::tool(
                "t1",
                "write_file",
                json!({"path": name, "content": "saved\n"}),
            )]),
            None => anthropic::message(&[anthropic::text("ok")]),
        }
    })
    .await;
    let workspace = setup.workspace.path().canonicalize().unwrap();
    let stdout = chat(
        &setup,
        &server,
        "write-ask",
        "save a.txt\ny\nsave b.txt\nn\nsave c.txt\na\n",
    )
    .await;
    assert!(
        stdout.contains("approval needed: a tool wants to write in the read-only workspace:"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("create or change {}/a.txt", workspace.display())),
        "{stdout}"
    );
    assert!(setup.exists("a.txt") && setup.exists("c.txt"), "{stdout}");
    assert!(!setup.exists("b.txt"), "denied, yet written: {stdout}");
    assert!(stdout.contains("RESULT: denied:"), "{stdout}");
    assert!(stdout.contains("denied by the operator"), "{stdout}");
    // Allow-always keeps that path, listed as the path alone.
    let listed = approvals_cli(&setup, &["list", "--json"]);
    let kept: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["kind"], "write");
    assert_eq!(kept[0]["program"], format!("{}/c.txt", workspace.display()));
    // A new process writes that path without asking; another path is still asked.
    let stdout = chat(
        &setup,
        &server,
        "write-ask-2",
        "save c.txt\nsave d.txt\nn\n",
    )
    .await;
    assert_eq!(stdout.matches("approval needed").count(), 1, "{stdout}");
    assert!(stdout.contains("d.txt"), "{stdout}");
    assert!(!setup.exists("d.txt"));
    // Without an operator (`call`), the fallback refuses.
    let mut args: Vec<String> = vec![
        "call".into(),
        "write_file".into(),
        json!({"path": "e.txt", "content": "x"}).to_string(),
    ];
    args.extend(setup.common());
    let refused = clawcage(args, "");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("no operator is connected"), "{stderr}");
    assert!(!setup.exists("e.txt"));
    // `tools` says so.
    let mut args: Vec<String> = vec!["tools".into()];
    args.extend(setup.common());
    let tools = String::from_utf8_lossy(&clawcage(args, "").stdout).into_owned();
    assert!(tools.contains("(ro, writes asked)"), "{tools}");
}
