//! The model's reasoning as a user of the real binary meets it, against the scripted LLM server
//! speaking the OpenAI-compatible wire format (as llama.cpp's `llama-server` does with a thinking
//! template): `run` keeps it off stdout and shows it on stderr only with `--show-reasoning`; a
//! reply of reasoning only is exit status 1 with a message, never an empty success; `chat` shows
//! reasoning apart from the answer (dimmed in a real terminal, driven through `pty_driver.py`) and
//! says when there is no answer; a secret value in reasoning never reaches the terminal or the
//! transcript.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use clawcage_tests::cli_state::{private_state_dir, warm_components};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai};
use serde_json::{Value, json};

/// Run the binary off the async runtime (the server lives on it) with `stdin` fed in.
async fn clawcage(args: Vec<String>, env: Vec<(&'static str, String)>, stdin: &str) -> Output {
    let stdin = stdin.to_string();
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
        input.write_all(stdin.as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

/// `clawcage COMMAND... --provider openai` at `server`, in a fresh workspace and `state`.
fn command(server: &LlmServer, state: &Path, workspace: &Path, words: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = words.iter().map(|word| word.to_string()).collect();
    args.extend(
        [
            "--provider",
            "openai",
            "--model",
            "local-model",
            "--base-url",
            &format!("{}/v1", server.url()),
            "--workspace",
            &workspace.display().to_string(),
            "--state-dir",
            &state.display().to_string(),
        ]
        .map(str::to_string),
    );
    args
}

/// A scripted model server playing `replies` in order to the model requests (POSTs); any other
/// request (a question for the model's context window, `GET …/models`) is answered 404 without
/// taking a reply, as a server that does not say.
async fn model_server(replies: Vec<Reply>) -> LlmServer {
    let replies = std::sync::Mutex::new(std::collections::VecDeque::from(replies));
    LlmServer::start_routed(move |body| {
        if body.is_null() {
            return Reply::status(404, "not found", &[]);
        }
        replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Reply::status(500, "the test script has no reply left", &[]))
    })
    .await
}

/// The bodies of the model requests `server` received, in order.
fn chat_bodies(server: &LlmServer) -> Vec<Value> {
    server
        .bodies()
        .into_iter()
        .filter(|body| !body.is_null())
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every transcript in `state`, as one text.
fn transcripts(state: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(state.join("sessions")).unwrap() {
        all.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_reply_of_reasoning_only_fails_and_says_why() {
    let (state, workspace) = (private_state_dir(), tempfile::tempdir().unwrap());
    let server = model_server(vec![openai::reasoning(
        "reasoning_content",
        "The user wants a greeting. I could say",
        "",
        "length",
    )])
    .await;
    let output = clawcage(
        command(&server, state.path(), workspace.path(), &["run", "Say hi"]),
        vec![],
        "",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(stdout, "", "no answer, nothing on stdout");
    assert!(
        stderr.contains("clawcage: the model returned no answer text (only reasoning)"),
        "{stderr}"
    );
    assert!(stderr.contains("raise [provider] max_tokens"), "{stderr}");
    assert!(
        !stderr.contains("The user wants a greeting"),
        "reasoning is hidden without --show-reasoning: {stderr}"
    );
    // Stored as reasoning, never as an empty assistant message.
    let stored = transcripts(state.path());
    assert!(!stored.contains(r#""content":[]"#), "{stored}");
    assert!(stored.contains(r#""type":"reasoning""#), "{stored}");
    assert!(stored.contains(r#""cut":"max_tokens""#), "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_shows_reasoning_on_stderr_only_when_asked_and_resumes_without_it() {
    let (state, workspace) = (private_state_dir(), tempfile::tempdir().unwrap());
    let server = model_server(vec![
        openai::reasoning(
            "reasoning_content",
            "A greeting is wanted.",
            "Hello!",
            "stop",
        ),
        openai::reasoning("reasoning", "Again a greeting.", "Hi again!", "stop"),
    ])
    .await;
    let first = command(
        &server,
        state.path(),
        workspace.path(),
        &["run", "Say hi", "--show-reasoning", "--session", "greet"],
    );
    let output = clawcage(first, vec![], "").await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "Hello!\n", "only the answer on stdout");
    assert!(
        stderr.contains("A greeting is wanted.\n"),
        "reasoning on a line of its own on stderr: {stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "no escape codes when stderr is not a terminal: {stderr:?}"
    );

    let output = clawcage(
        command(
            &server,
            state.path(),
            workspace.path(),
            &["run", "Once more", "--session", "greet"],
        ),
        vec![],
        "",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "Hi again!\n");
    assert!(!stderr.contains("Again a greeting."), "{stderr}");
    let resumed = &chat_bodies(&server)[1];
    let sent = resumed.to_string();
    assert!(!sent.contains("A greeting is wanted."), "{sent}");
    assert_eq!(resumed["messages"][2]["role"], "assistant");
    assert_eq!(resumed["messages"][2]["content"], "Hello!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_help_explains_show_reasoning() {
    let output = clawcage(vec!["run".into(), "--help".into()], vec![], "").await;
    let help = text(&output.stdout);
    assert!(output.status.success(), "{help}");
    assert!(help.contains("--show-reasoning"), "{help}");
    assert!(help.contains("reasoning"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_shows_streamed_reasoning_apart_and_says_when_there_is_no_answer() {
    let (state, workspace) = (private_state_dir(), tempfile::tempdir().unwrap());
    let server = model_server(vec![
        openai::reasoning_stream(
            "reasoning_content",
            "They greet me, so I greet back.",
            "Hello there!",
            "stop",
            9,
        ),
        openai::reasoning_stream("reasoning_content", "Hmm, what to say", "", "stop", 9),
    ])
    .await;
    let output = clawcage(
        command(
            &server,
            state.path(),
            workspace.path(),
            &["chat", "--session", "c"],
        ),
        vec![],
        "hi\nand now?\n/exit\n",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("They greet me, so I greet back.\nHello there!"),
        "reasoning on its own line, then the answer: {stdout}"
    );
    assert!(
        stdout.contains("  note: the model returned no answer text (only reasoning)"),
        "{stdout}"
    );
    assert!(!stdout.contains('\x1b'), "not a terminal: {stdout:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_reasoning_reaches_neither_the_terminal_nor_the_transcript() {
    const KEY: &str = "sk-local-reasoning-4f9d2c7b1e";
    let (state, workspace) = (private_state_dir(), tempfile::tempdir().unwrap());
    // Sent in 4-byte chunks, so the value arrives split across reads.
    let server = model_server(vec![openai::reasoning_stream(
        "reasoning_content",
        &format!("The key {KEY} must stay secret."),
        "I will not tell.",
        "stop",
        4,
    )])
    .await;
    let output = clawcage(
        command(
            &server,
            state.path(),
            workspace.path(),
            &["run", "What is the key?", "--show-reasoning"],
        ),
        vec![("OPENAI_API_KEY", KEY.to_string())],
        "",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "I will not tell.\n");
    assert!(!stderr.contains(KEY), "{stderr}");
    assert!(
        stderr.contains("The key [redacted: OPENAI_API_KEY] must stay secret."),
        "{stderr}"
    );
    let stored = transcripts(state.path());
    assert!(!stored.contains(KEY), "{stored}");
    assert!(stored.contains("[redacted: OPENAI_API_KEY]"), "{stored}");
}

/// Runs `clawcage chat` over Anthropic's wire format against `server` in a pseudo-terminal
/// through `steps`; returns the driver's report (its output with the escape codes kept).
async fn drive_in_a_terminal(server: &LlmServer, steps: Value) -> Value {
    let (state, workspace) = (private_state_dir(), tempfile::tempdir().unwrap());
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty_driver.py");
    let url = server.url().to_string();
    let output = tokio::task::spawn_blocking(move || {
        let output = Command::new("python3")
            .arg(driver)
            .arg(steps.to_string())
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_clawcage"))
            .args(["chat", "--provider", "anthropic", "--model", "claude-test"])
            .arg("--base-url")
            .arg(&url)
            .arg("--workspace")
            .arg(workspace.path())
            .arg("--state-dir")
            .arg(state.path())
            .env("ANTHROPIC_API_KEY", "sk-test")
            .env("TERM", "xterm")
            .env_remove("RUST_LOG")
            .output()
            .expect("python3 runs (the pseudo-terminal driver needs it)");
        drop((state, workspace));
        output
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        text(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_in_a_terminal_dims_the_thinking_and_not_the_answer() {
    let server = model_server(vec![anthropic::stream(
        &[
            anthropic::thinking("Weighing the notes.", "sig"),
            anthropic::text("They say hello."),
        ],
        16,
    )])
    .await;
    let report = drive_in_a_terminal(
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "What do the notes say?\r"},
            {"expect": "They say hello", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"send": "/exit\r"},
            {"sleep": 0.5},
        ]),
    )
    .await;
    let output = report["output"].as_str().unwrap();
    assert_eq!(
        report["ok"], true,
        "step {}: {output:?}",
        report["failed_step"]
    );
    // Faint on before the reasoning, off after it, then the answer on a line of its own.
    assert!(
        output.contains("\x1b[2mWeighing the notes.\x1b[22m\r\nThey say hello."),
        "{output:?}"
    );
}
