//! `clawcage chat` judged by the screen a person sees: the program runs in a pseudo-terminal
//! (`pty_driver.py`) and what it writes is rendered by a VT100 emulator (pyte), so a line
//! overwritten by a ticker, a cleared screen or a smeared prompt shows as it would. Checked: the
//! approval question stays on screen while the running call's ticker waits, one key answers it
//! and the wait is shown apart from the call's time; a "thinking" line counts while the model
//! has said nothing; a line typed during a turn is steered into it with a notice, not smeared
//! over the output; escape sequences from the model never reach the terminal raw; colour and
//! Markdown styling, and none with `NO_COLOR`; `/last` shows a tool's output; a resumed session
//! shows its last messages; a program compiled during a call is announced on a line of its own
//! above the call's line, never written into it.
//!
//! The emulator is pyte in `target/toolchains/python`, installed on first use with the examples'
//! Python toolchain (`examples/build.sh setup-python`). When it cannot be installed the tests are
//! skipped, except under CI, where they fail. It is one file (over 700 lines) because every test
//! drives the same pseudo-terminal and emulator through `drive` and reads the same `Report`, one
//! test per behaviour.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use clawcage_tests::cli_state::{private_state_dir, warm_components};
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic, text_of, tool_result_of};
use clawcage_tests::toolchains::screen_python;
use serde_json::{Value, json};

/// A workspace, a state directory and a configuration file outside both.
struct Setup {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
    config: tempfile::TempDir,
}

impl Setup {
    fn new(config: &str) -> Setup {
        let workspace = tempfile::tempdir().unwrap();
        std::fs::write(workspace.path().join("notes.txt"), "hello\n").unwrap();
        let config_dir = tempfile::tempdir().unwrap();
        std::fs::write(config_dir.path().join("clawcage.toml"), config).unwrap();
        Setup {
            workspace,
            state: private_state_dir(),
            config: config_dir,
        }
    }
}

/// The report of one run of `clawcage chat` in a pseudo-terminal through `steps`.
struct Report(Value);

impl Report {
    fn ok(&self) -> bool {
        self.0["ok"] == true
    }

    fn raw(&self) -> &str {
        self.0["output"].as_str().unwrap_or_default()
    }

    /// The screen kept under `name`, its lines' trailing blanks trimmed.
    fn screen(&self, name: &str) -> Vec<String> {
        self.0["screens"][name]
            .as_array()
            .unwrap_or_else(|| panic!("no screen {name}: {}", self.0))
            .iter()
            .map(|line| line.as_str().unwrap_or_default().trim_end().to_string())
            .collect()
    }

    fn screen_text(&self, name: &str) -> String {
        self.screen(name).join("\n")
    }

    fn assert_ok(&self) {
        assert!(
            self.ok(),
            "step {} failed; the output was:\n{}",
            self.0["failed_step"],
            self.raw()
        );
    }
}

/// Runs `clawcage chat` against `server` with `setup` in a pseudo-terminal through `steps`.
async fn drive(
    python: &Path,
    setup: &Setup,
    server: &LlmServer,
    steps: Value,
    environment: &[(&str, &str)],
) -> Report {
    drive_command(python, setup, server, &["chat"], steps, environment).await
}

/// Runs `clawcage COMMAND...` against `server` with `setup` in a pseudo-terminal through
/// `steps`.
async fn drive_command(
    python: &Path,
    setup: &Setup,
    server: &LlmServer,
    command_words: &[&str],
    steps: Value,
    environment: &[(&str, &str)],
) -> Report {
    warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty_driver.py");
    let mut command = Command::new(python);
    command
        .arg(driver)
        .arg(steps.to_string())
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_clawcage"))
        .args(command_words)
        .args([
            "--provider",
            "anthropic",
            "--model",
            "claude-test",
            "--base-url",
            server.url(),
        ])
        .arg("--workspace")
        .arg(setup.workspace.path())
        .arg("--state-dir")
        .arg(setup.state.path())
        .arg("--config")
        .arg(setup.config.path().join("clawcage.toml"))
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG");
    for (name, value) in environment {
        command.env(name, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output().expect("python runs"))
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Report(serde_json::from_slice(&output.stdout).unwrap())
}

const APPROVALS: &str =
    "[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nallow = [\"ls *\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_question_stays_on_screen_and_one_key_answers_it() {
    let Some(python) = screen_python("the_approval_question_stays_on_screen") else {
        return;
    };
    let setup = Setup::new(APPROVALS);
    std::fs::write(setup.workspace.path().join("scratch1.txt"), "x").unwrap();
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("Done: {result}."))]);
        }
        anthropic::message(&[anthropic::tool(
            "t1",
            "exec",
            json!({"command": "rm scratch1.txt"}),
        )])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Remove the scratch file.\r"},
            {"expect": "press y", "timeout": 30},
            // Long enough for a ticker to have redrawn its line twice.
            {"sleep": 2.5},
            {"screen": "asking"},
            {"send": "y"},
            {"expect": "Done", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"screen": "answered"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let asking = report.screen("asking");
    let question = asking
        .iter()
        .position(|line| line.starts_with("  approval needed: "))
        .unwrap_or_else(|| {
            panic!(
                "the question starts a line of its own:\n{}",
                asking.join("\n")
            )
        });
    assert!(
        asking[question..]
            .iter()
            .any(|line| line.contains("rm scratch1.txt")),
        "the command is shown:\n{}",
        asking.join("\n")
    );
    let last_line = asking.iter().rev().find(|line| !line.is_empty()).unwrap();
    assert_eq!(
        last_line,
        "  allow? press y (once), a (always) or n (deny)",
        "the question is the last thing on screen, no ticker over it:\n{}",
        asking.join("\n")
    );
    let answered = report.screen_text("answered");
    assert!(
        answered.contains("  allow-once"),
        "the answer is said:\n{answered}"
    );
    let verdict = answered
        .lines()
        .find(|line| line.contains("> exec {\"command\":\"rm scratch1.txt\"}  ok"))
        .unwrap_or_else(|| panic!("the call ends ok:\n{answered}"));
    assert!(
        verdict.contains("s waiting for approval)"),
        "the time a person took is shown apart: {verdict}"
    );
    let waited: f64 = verdict
        .split('(')
        .next_back()
        .and_then(|times| times.split(" s waiting").next())
        .and_then(|number| number.rsplit(' ').next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("a number of seconds waited: {verdict}"));
    assert!(waited >= 2.0, "the wait counts the 2.5 s asked: {verdict}");
    // The call's own time, when shown at all (from 1 s), leaves the wait out.
    if let Some((own, _)) = verdict.split('(').next_back().unwrap().split_once(" s; ") {
        let own: f64 = own.parse().unwrap();
        assert!(
            own < 2.0,
            "the call's own time excludes the wait: {verdict}"
        );
    }
    assert!(!setup.workspace.path().join("scratch1.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_line_counts_until_the_first_word_and_is_then_gone() {
    let Some(python) = screen_python("a_thinking_line_counts") else {
        return;
    };
    let setup = Setup::new("");
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |_| {
        held.hold(anthropic::stream(&[anthropic::text("Here I am.")], 4))
    })
    .await;
    let opener = tokio::spawn({
        let gate = gate.clone();
        async move {
            gate.reached(1).await;
            tokio::time::sleep(Duration::from_millis(4000)).await;
            gate.open();
        }
    });
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Anyone there?\r"},
            {"expect": "thinking, 2 s", "timeout": 20},
            {"screen": "waiting"},
            {"expect": "Here I am", "timeout": 20},
            {"expect": "you> ", "timeout": 10},
            {"screen": "answered"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    opener.await.unwrap();
    report.assert_ok();
    let waiting = report.screen_text("waiting");
    assert!(
        waiting.contains("  … thinking, 2 s"),
        "the wait is visible:\n{waiting}"
    );
    let answered = report.screen_text("answered");
    assert!(
        !answered.contains("thinking"),
        "the line is gone:\n{answered}"
    );
    assert!(
        answered.lines().any(|line| line == "Here I am."),
        "the answer stands on its own line:\n{answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_typed_during_a_turn_steers_it_and_is_not_smeared_over_the_output() {
    let Some(python) = screen_python("a_line_typed_during_a_turn_steers_it") else {
        return;
    };
    let setup = Setup::new("");
    let server = LlmServer::start_routed(|body| {
        let messages = body["messages"].as_array().unwrap();
        let everything: Vec<String> = messages.iter().map(text_of).collect();
        if everything.iter().any(|text| text.contains("also say bye")) {
            return anthropic::message(&[anthropic::text("Napped, and bye.")]);
        }
        if tool_result_of(messages.last().unwrap()).is_some() {
            return anthropic::message(&[anthropic::text("Napped.")]);
        }
        anthropic::message(&[anthropic::tool("n1", "exec", json!({"command": "sleep 5"}))])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Take a nap.\r"},
            {"expect": "sleep 5", "timeout": 20},
            {"sleep": 0.5},
            // Typed key by key while the call runs.
            {"send": "also "},
            {"sleep": 0.3},
            {"send": "say bye"},
            {"sleep": 1.2},
            {"screen": "typing"},
            {"send": "\r"},
            {"expect": "joins its running turn", "timeout": 10},
            {"expect": "Napped, and bye", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"screen": "after"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    // What is typed shows on the running call's line only, never in the output.
    let typing = report.screen("typing");
    let with_typed: Vec<&String> = typing
        .iter()
        .filter(|line| line.contains("also say bye"))
        .collect();
    assert_eq!(with_typed.len(), 1, "{}", typing.join("\n"));
    assert!(
        with_typed[0].starts_with("  > exec {\"command\":\"sleep 5\"} … ")
            && with_typed[0].ends_with("   you> also say bye"),
        "on the live line: {}",
        with_typed[0]
    );
    let after = report.screen_text("after");
    assert!(
        after.contains("you> also say bye"),
        "the line is shown once sent:\n{after}"
    );
    assert!(
        after.contains("(the agent is busy: the message joins its running turn)"),
        "and what became of it:\n{after}"
    );
    // One turn answered both: the line went into the running turn, not a turn after it.
    let bodies = server.bodies();
    let with_bye = bodies
        .iter()
        .filter(|body| {
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|message| text_of(message).contains("also say bye"))
        })
        .count();
    assert_eq!(with_bye, 1, "the steered line reached the model once");
    assert_eq!(
        after.matches("Napped, and bye.").count(),
        1,
        "one answer:\n{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escape_sequences_from_the_model_never_reach_the_terminal_raw() {
    let Some(python) = screen_python("escape_sequences_from_the_model") else {
        return;
    };
    let setup = Setup::new("");
    let hostile = "Hi\u{1b}[2J\u{1b}[H\u{1b}]0;pwned\u{7} there\r\u{1b}[31mX\u{9b}31m done";
    let server =
        LlmServer::start_routed(move |_| anthropic::stream(&[anthropic::text(hostile)], 3)).await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Say something.\r"},
            {"expect": "done", "timeout": 20},
            {"expect": "you> ", "timeout": 10},
            {"screen": "after"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let raw = report.raw();
    for sequence in ["\u{1b}[2J", "\u{1b}]0;", "\u{1b}[H", "\u{1b}[31m", "\u{9b}"] {
        assert!(
            !raw.contains(sequence),
            "{sequence:?} reached the terminal:\n{raw:?}"
        );
    }
    let after = report.screen_text("after");
    assert!(
        after.contains("clawcage chat:"),
        "the screen was not cleared:\n{after}"
    );
    assert!(
        after.contains("Hi␛[2J␛[H␛]0;pwned␇ there␍␛[31mX"),
        "the sequences are shown as visible symbols:\n{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_and_markdown_are_styled_and_no_color_turns_it_off() {
    let Some(python) = screen_python("verdicts_and_markdown_are_styled") else {
        return;
    };
    let setup = Setup::new("");
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if tool_result_of(&last).is_some() {
            return anthropic::stream(
                &[anthropic::text(
                    "# Notes\nThe file says **hello** in `notes.txt`.\n```\nhello\n```\n",
                )],
                5,
            );
        }
        anthropic::message(&[anthropic::tool(
            "r1",
            "read_file",
            json!({"path": "notes.txt"}),
        )])
    })
    .await;
    let steps = json!([
        {"expect": "you> ", "timeout": 60},
        {"send": "Read the notes.\r"},
        {"expect": "tokens this turn", "timeout": 30},
        {"expect": "you> ", "timeout": 10},
        {"send": "/last\r"},
        {"expect": "you> ", "timeout": 10},
        {"screen": "after"},
        {"send": "/exit\r"},
        {"sleep": 0.3},
    ]);
    let coloured = drive(&python, &setup, &server, steps.clone(), &[]).await;
    coloured.assert_ok();
    let raw = coloured.raw();
    assert!(
        raw.contains("\u{1b}[32mok\u{1b}[39m"),
        "ok is green:\n{raw:?}"
    );
    assert!(
        raw.contains("\u{1b}[1m# Notes"),
        "a heading is bold:\n{raw:?}"
    );
    assert!(
        raw.contains("\u{1b}[1mhello\u{1b}[22m"),
        "**bold** is bold:\n{raw:?}"
    );
    assert!(
        raw.contains("\u{1b}[36mnotes.txt\u{1b}[39m"),
        "`code` is coloured:\n{raw:?}"
    );
    let screen = coloured.screen_text("after");
    assert!(
        screen.contains("The file says hello in notes.txt."),
        "the markup itself is not shown:\n{screen}"
    );
    assert!(
        screen.contains("  │ hello"),
        "/last shows the tool's output:\n{screen}"
    );

    let setup = Setup::new("");
    let plain = drive(&python, &setup, &server, steps, &[("NO_COLOR", "1")]).await;
    plain.assert_ok();
    let raw = plain.raw();
    for style in [
        "\u{1b}[32m",
        "\u{1b}[31m",
        "\u{1b}[1m",
        "\u{1b}[36m",
        "\u{1b}[2m",
    ] {
        assert!(!raw.contains(style), "NO_COLOR, yet {style:?}:\n{raw:?}");
    }
    let screen = plain.screen_text("after");
    assert!(
        screen.contains("The file says **hello** in `notes.txt`."),
        "without styles the Markdown stays as written:\n{screen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_shows_its_last_messages() {
    let Some(python) = screen_python("a_resumed_session_shows_its_last_messages") else {
        return;
    };
    let setup = Setup::new("");
    let server = LlmServer::start_routed(|body| {
        let said = text_of(body["messages"].as_array().unwrap().last().unwrap());
        anthropic::message(&[anthropic::text(&format!("You said: {said}"))])
    })
    .await;
    let first = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Remember the blue door.\r"},
            {"expect": "You said", "timeout": 20},
            {"expect": "you> ", "timeout": 10},
            {"send": "/exit\r"},
            {"sleep": 0.5},
        ]),
        &[],
    )
    .await;
    first.assert_ok();
    let second = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "agent: You said", "timeout": 60},
            {"expect": "you> ", "timeout": 10},
            {"screen": "resumed"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    second.assert_ok();
    let resumed = second.screen_text("resumed");
    assert!(
        resumed.contains("2 earlier messages loaded"),
        "how much came back:\n{resumed}"
    );
    assert!(
        resumed.contains("  you> Remember the blue door.")
            && resumed.contains("  agent: You said: Remember the blue door."),
        "and what it was:\n{resumed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_that_ends_a_turn_stands_apart_from_the_retry_notes() {
    let Some(python) = screen_python("the_error_that_ends_a_turn_stands_apart") else {
        return;
    };
    let setup = Setup::new("[provider]\nmax_retries = 1\n");
    let server = LlmServer::start_routed(|_| {
        clawcage_tests::llm_server::Reply::status(500, "the model is down", &[])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Hello?\r"},
            {"expect": "error: ", "timeout": 60},
            {"expect": "you> ", "timeout": 10},
            {"screen": "failed"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let failed = report.screen("failed");
    let retry = failed
        .iter()
        .position(|line| line.starts_with("  … ") && line.contains("retrying in"))
        .unwrap_or_else(|| panic!("a retry note:\n{}", failed.join("\n")));
    let error = failed
        .iter()
        .position(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("the error from the first column:\n{}", failed.join("\n")));
    assert!(retry < error, "{}", failed.join("\n"));
    assert!(
        failed[error].contains("the model is down"),
        "{}",
        failed[error]
    );
    assert!(
        report.raw().contains("\u{1b}[31merror: "),
        "red on a colour terminal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_a_terminal_shows_the_thinking_line_on_stderr_and_clears_it() {
    let Some(python) = screen_python("run_on_a_terminal_shows_the_thinking_line") else {
        return;
    };
    let setup = Setup::new("");
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |_| {
        held.hold(anthropic::message(&[anthropic::text("The answer.")]))
    })
    .await;
    let opener = tokio::spawn({
        let gate = gate.clone();
        async move {
            gate.reached(1).await;
            tokio::time::sleep(Duration::from_millis(4000)).await;
            gate.open();
        }
    });
    let report = drive_command(
        &python,
        &setup,
        &server,
        &["run", "Answer me."],
        json!([
            {"expect": "thinking, 2 s", "timeout": 60},
            {"screen": "waiting"},
            {"expect": "The answer", "timeout": 20},
            {"sleep": 0.5},
            {"screen": "answered"},
        ]),
        &[],
    )
    .await;
    opener.await.unwrap();
    report.assert_ok();
    assert!(report.screen_text("waiting").contains("  … thinking, 2 s"));
    let answered = report.screen_text("answered");
    assert!(!answered.contains("thinking"), "cleared:\n{answered}");
    assert!(
        answered.lines().any(|line| line == "The answer."),
        "{answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_typed_and_not_sent_during_a_turn_starts_the_next_prompt() {
    let Some(python) = screen_python("what_was_typed_and_not_sent") else {
        return;
    };
    let setup = Setup::new("");
    let server = LlmServer::start_routed(|body| {
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        if tool_result_of(last).is_some() {
            return anthropic::message(&[anthropic::text("Napped.")]);
        }
        if text_of(last) == "unsent words" {
            return anthropic::message(&[anthropic::text("Got the words.")]);
        }
        anthropic::message(&[anthropic::tool("n1", "exec", json!({"command": "sleep 2"}))])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Take a nap.\r"},
            {"expect": "sleep 2", "timeout": 20},
            {"send": "unsent words"},
            {"expect": "Napped", "timeout": 30},
            {"expect": "you> unsent words", "timeout": 10},
            {"sleep": 0.3},
            {"screen": "prompt"},
            {"send": "\r"},
            {"expect": "Got the words", "timeout": 30},
            {"expect": "you> ", "timeout": 10},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let prompt = report.screen("prompt");
    let last = prompt.iter().rev().find(|line| !line.is_empty()).unwrap();
    assert_eq!(last, "you> unsent words", "{}", prompt.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_while_the_prompt_waits_is_shown_and_so_is_its_timeout() {
    let Some(python) = screen_python("a_request_while_the_prompt_waits") else {
        return;
    };
    let setup = Setup::new(
        "[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nallow = [\"ls *\"]\ntimeout_secs = 3\n",
    );
    std::fs::write(setup.workspace.path().join("scratch1.txt"), "x").unwrap();
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("Tried: {result}"))]);
        }
        anthropic::message(&[anthropic::tool(
            "t1",
            "exec",
            json!({"command": "rm scratch1.txt"}),
        )])
    })
    .await;
    // A job of this chat's session that fires while the prompt waits.
    let added = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .arg("--workspace")
        .arg(setup.workspace.path())
        .arg("--state-dir")
        .arg(setup.state.path())
        .arg("--config")
        .arg(setup.config.path().join("clawcage.toml"))
        .args(["cron", "add", "--every", "2", "--session", "chat"])
        .args(["--message", "Clean up the scratch file."])
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let jobs = setup.state.path().join("cron/jobs.json");
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "approval needed \\[apr-", "timeout": 60},
            {"sleep": 0.3},
            {"screen": "asked"},
            {"expect": ": deny \\(by timeout\\)", "timeout": 30},
            {"sleep": 0.3},
            {"screen": "expired"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    if !report.ok() {
        panic!(
            "step {} failed; jobs {}; output:\n{}",
            report.0["failed_step"],
            std::fs::read_to_string(&jobs).unwrap_or_default(),
            report.raw()
        );
    }
    let asked = report.screen_text("asked");
    assert!(
        asked.contains("rm scratch1.txt") && asked.contains("answer with /approve apr-"),
        "{asked}"
    );
    let expired = report.screen_text("expired");
    assert!(expired.contains(": deny (by timeout)"), "{expired}");
    assert!(setup.workspace.path().join("scratch1.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_turn_gives_the_terminal_its_echo_back() {
    let Some(python) = screen_python("sigterm_during_a_turn") else {
        return;
    };
    let setup = Setup::new("");
    let server = LlmServer::start_routed(|_| {
        anthropic::message(&[anthropic::tool(
            "n1",
            "exec",
            json!({"command": "sleep 20"}),
        )])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"echo": "at the prompt"},
            {"send": "Take a nap.\r"},
            {"expect": "sleep 20", "timeout": 20},
            {"sleep": 0.5},
            {"echo": "during the turn"},
            {"signal": 15},
            {"exited": 10},
            {"echo": "after"},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let echo = &report.0["echo"];
    assert_eq!(
        echo["during the turn"], false,
        "typing is not echoed: {echo}"
    );
    assert_eq!(echo["after"], true, "the shell gets its echo back: {echo}");
    // Ended as SIGTERM ends a program: exit status 143.
    let status = report.0["status"].as_i64().unwrap();
    assert_eq!(status >> 8, 143, "wait status {status}");
}

/// `bytes` with a custom section that makes them a program no cache has seen.
fn never_compiled(bytes: &[u8]) -> Vec<u8> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = b"clawcage-test";
    let payload = format!("{nanos}-{}", std::process::id()).into_bytes();
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name);
    section.extend_from_slice(&payload);
    let mut out = bytes.to_vec();
    out.push(0);
    // The section's size as unsigned LEB128.
    let mut size = section.len();
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(&section);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_compiled_during_a_call_is_announced_above_its_line() {
    let Some(python) = screen_python("a_program_compiled_during_a_call") else {
        return;
    };
    // An operator's program no cache holds: exec compiles it when the call first runs it,
    // while the call's line is on screen.
    let programs = tempfile::tempdir().unwrap();
    std::fs::write(
        programs.path().join("mygrep.wasm"),
        never_compiled(&clawcage_sandbox::components::bundled::GREP.bytes().unwrap()),
    )
    .unwrap();
    let setup = Setup::new(&format!(
        "[exec]\nprograms_dir = \"{}\"\n",
        programs.path().display()
    ));
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("Counted: {result}."))]);
        }
        anthropic::message(&[anthropic::tool(
            "t1",
            "exec",
            json!({"command": "mygrep -c hello notes.txt"}),
        )])
    })
    .await;
    let report = drive(
        &python,
        &setup,
        &server,
        json!([
            {"expect": "you> ", "timeout": 60},
            {"send": "Count the greetings.\r"},
            {"expect": "compiling `mygrep`", "timeout": 120},
            {"expect": "Counted", "timeout": 300},
            {"expect": "you> ", "timeout": 10},
            {"screen": "after"},
            {"send": "/exit\r"},
            {"sleep": 0.3},
        ]),
        &[],
    )
    .await;
    report.assert_ok();
    let after = report.screen("after");
    let compiling = after
        .iter()
        .position(|line| line.starts_with("clawcage: compiling `mygrep`"))
        .unwrap_or_else(|| {
            panic!(
                "the compile line stands on a line of its own, from the first column:\n{}",
                after.join("\n")
            )
        });
    assert!(
        !after
            .iter()
            .any(|line| line.contains("sclawcage") || line.contains("…clawcage")),
        "nothing written into the call's line:\n{}",
        after.join("\n")
    );
    let call = after
        .iter()
        .position(|line| {
            line.starts_with("  > exec {\"command\":\"mygrep -c hello notes.txt\"}  ok")
        })
        .unwrap_or_else(|| {
            panic!(
                "the call's line is whole and ends ok:\n{}",
                after.join("\n")
            )
        });
    assert!(
        call > compiling,
        "the call's line is drawn again below the compile line:\n{}",
        after.join("\n")
    );
}
