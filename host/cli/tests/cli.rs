//! The `clawcage` binary as a user runs it: real process, real files, exit codes per the
//! command-line contract (0 ok, 1 tool failed, 2 usage or config error).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

/// The compiled-artifact cache shared with the other test binaries.
use clawcage_tests::cli_state::shared_state_dir as state_dir;

fn clawcage(workspace: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(args)
        .arg("--workspace")
        .arg(workspace)
        .arg("--state-dir")
        .arg(state_dir())
        .env_remove("RUST_LOG")
        .output()
        .expect("clawcage runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn tools_lists_each_tool_with_schema_origin_and_grants() {
    let dir = tempfile::tempdir().unwrap();
    let output = clawcage(dir.path(), &["tools", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let tools: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let file_tools: Vec<&serde_json::Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["origin"] == "bundled:file")
        .collect();
    let names: Vec<&str> = file_tools
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["edit_file", "list_dir", "read_file", "write_file"]);
    for tool in file_tools {
        assert_eq!(tool["input_schema"]["type"], "object");
        let grants = tool["grants"].as_str().unwrap();
        assert!(grants.contains("(rw)"), "{tool}");
        assert!(!grants.contains("exec ("), "{tool}");
    }
    let exec = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "exec")
        .expect("exec is registered by default");
    assert_eq!(exec["origin"], "bundled:exec");
    let grants = exec["grants"].as_str().unwrap();
    assert!(
        grants.contains("(rw)") && grants.contains("exec ("),
        "{exec}"
    );

    let text = clawcage(dir.path(), &["tools", "--long"]);
    assert!(text.status.success());
    assert!(
        stdout(&text).contains("read_file  (bundled:file;"),
        "{}",
        stdout(&text)
    );
}

#[test]
fn call_runs_each_file_tool() {
    let dir = tempfile::tempdir().unwrap();
    let write = clawcage(
        dir.path(),
        &[
            "call",
            "write_file",
            r#"{"path":"a/b.txt","content":"hello\nworld\n"}"#,
        ],
    );
    assert!(write.status.success(), "{}", stderr(&write));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/b.txt")).unwrap(),
        "hello\nworld\n"
    );

    let read = clawcage(dir.path(), &["call", "read_file", r#"{"path":"a/b.txt"}"#]);
    assert!(read.status.success(), "{}", stderr(&read));
    assert_eq!(stdout(&read), "hello\nworld\n\n");

    let edit = clawcage(
        dir.path(),
        &[
            "call",
            "edit_file",
            r#"{"path":"a/b.txt","old_text":"world","new_text":"there"}"#,
        ],
    );
    assert!(edit.status.success(), "{}", stderr(&edit));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/b.txt")).unwrap(),
        "hello\nthere\n"
    );

    let list = clawcage(dir.path(), &["call", "list_dir", "{}"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(stdout(&list).contains("[folder] a"), "{}", stdout(&list));
}

#[test]
fn exit_codes_follow_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    // A refused escape: the tool failed, exit 1, message on stderr, nothing on stdout.
    let escape = clawcage(
        dir.path(),
        &["call", "read_file", r#"{"path":"/etc/passwd"}"#],
    );
    assert_eq!(escape.status.code(), Some(1), "{}", stderr(&escape));
    assert!(
        stderr(&escape).contains("outside the workspace"),
        "{}",
        stderr(&escape)
    );
    assert!(stdout(&escape).is_empty());

    // Usage errors: exit 2.
    for args in [
        vec!["call", "no_such_tool", "{}"],
        vec!["call", "read_file", "{not json"],
        vec!["call", "read_file", r#"{"path": 1}"#],
        vec!["frobnicate"],
    ] {
        let output = clawcage(dir.path(), &args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).is_empty());
    }

    let missing = clawcage(&dir.path().join("missing"), &["tools"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("--workspace"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn config_errors_are_usage_errors_and_read_only_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("clawcage.toml"),
        "[workspace]\nmode = \"ro\"\n",
    )
    .unwrap();
    // A configuration inside the workspace is used only once trusted as it is.
    let untrusted = clawcage(dir.path(), &["tools"]);
    assert_eq!(untrusted.status.code(), Some(2));
    assert!(
        stderr(&untrusted).contains("clawcage trust"),
        "{}",
        stderr(&untrusted)
    );
    let trusted = clawcage(dir.path(), &["trust"]);
    assert!(trusted.status.success(), "{}", stderr(&trusted));
    let write = clawcage(
        dir.path(),
        &["call", "write_file", r#"{"path":"x.txt","content":"x"}"#],
    );
    assert_eq!(write.status.code(), Some(1), "{}", stderr(&write));
    assert!(stderr(&write).contains("read-only"), "{}", stderr(&write));
    assert!(!dir.path().join("x.txt").exists());

    std::fs::write(
        dir.path().join("clawcage.toml"),
        "[workspace]\nmdoe = \"ro\"\n",
    )
    .unwrap();
    let bad = clawcage(dir.path(), &["tools"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("unknown field `mdoe`"),
        "{}",
        stderr(&bad)
    );
}

/// A wrong value is refused when the configuration is loaded, the same way by every command,
/// whether or not the command goes on to use that section.
#[test]
fn every_command_refuses_a_wrong_value_at_load_with_the_same_message() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let wrong = [
        (
            "[queue]\nmode = \"bogus\"\n",
            "[queue] mode = \"bogus\" is not valid",
        ),
        (
            "[context]\ncompact_threshold = 5.0\n",
            "[context] compact_threshold = 5 is out of range",
        ),
        (
            "[models.\"tiny\"]\ncontext_window = 10\n",
            "context_window = 10 is too small",
        ),
    ];
    for (text, said) in wrong {
        let config = dir.path().join("clawcage.toml");
        std::fs::write(&config, text).unwrap();
        let config = config.display().to_string();
        let commands: [&[&str]; 6] = [
            &["call", "read_file", r#"{"path":"a"}"#],
            &["tools"],
            &["run", "hello"],
            &["mcp"],
            &["acp"],
            &["gateway", "--bind", "127.0.0.1:0"],
        ];
        for command in commands {
            let mut args = vec!["--config", config.as_str()];
            args.extend_from_slice(command);
            let output = clawcage(&workspace, &args);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{command:?} with {text:?}: {}",
                stderr(&output)
            );
            assert!(
                stderr(&output).contains("is not valid:") && stderr(&output).contains(said),
                "{command:?} with {text:?}: {}",
                stderr(&output)
            );
        }
    }
}

/// Policy is never read from where tools can write: a configuration a tool wrote into the
/// workspace is not used (it would grant the next run the network and move the audit log onto a
/// host file), a planted symlink is refused without its target's content being shown, and a
/// state directory or plugins directory inside the workspace is refused.
#[test]
fn a_configuration_a_tool_wrote_grants_nothing() {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let planted = r#"{"path":"clawcage.toml","content":"[network]\nallow = [\"evil.example\"]\n[audit]\npath = \"../hijacked.log\"\n"}"#;
    let wrote = clawcage(&workspace, &["call", "write_file", planted]);
    assert!(wrote.status.success(), "{}", stderr(&wrote));

    let next = clawcage(&workspace, &["call", "list_dir", "{}"]);
    assert_eq!(next.status.code(), Some(2), "{}", stderr(&next));
    assert!(stderr(&next).contains("not trusted"), "{}", stderr(&next));
    assert!(!root.path().join("hijacked.log").exists());
    let tools = clawcage(&workspace, &["tools"]);
    assert_eq!(tools.status.code(), Some(2));
    assert!(!stdout(&tools).contains("evil.example"));

    // Trusted as it is, it is used; changed by a tool afterwards, it is refused again.
    std::fs::write(
        workspace.join("clawcage.toml"),
        "[limits]\nmemory_mib = 64\n",
    )
    .unwrap();
    assert!(clawcage(&workspace, &["trust"]).status.success());
    let listed = clawcage(&workspace, &["tools"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        stdout(&listed).contains("memory 64 MiB"),
        "{}",
        stdout(&listed)
    );
    let changed = r#"{"path":"clawcage.toml","content":"[limits]\nmemory_mib = 4096\n"}"#;
    assert!(
        clawcage(&workspace, &["call", "write_file", changed])
            .status
            .success()
    );
    let refused = clawcage(&workspace, &["tools"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("not trusted"),
        "{}",
        stderr(&refused)
    );
    std::fs::remove_file(workspace.join("clawcage.toml")).unwrap();

    // A symlink planted as the configuration is refused, its target never shown.
    let secret = root.path().join("id_rsa");
    std::fs::write(
        &secret,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAAB3NzaC1yc2E\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(&secret, workspace.join("clawcage.toml")).unwrap();
    let linked = clawcage(&workspace, &["tools"]);
    assert_eq!(linked.status.code(), Some(2));
    assert!(
        stderr(&linked).contains("symbolic link"),
        "{}",
        stderr(&linked)
    );
    assert!(
        !stderr(&linked).contains("AAAAB3NzaC1yc2E"),
        "{}",
        stderr(&linked)
    );
    assert!(
        !stderr(&linked).contains("PRIVATE KEY"),
        "{}",
        stderr(&linked)
    );
    std::fs::remove_file(workspace.join("clawcage.toml")).unwrap();

    // The state directory (compiled code, trust records) inside the workspace is refused.
    let inside = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["tools", "--workspace"])
        .arg(&workspace)
        .arg("--state-dir")
        .arg(workspace.join(".state"))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(inside.status.code(), Some(2));
    assert!(
        stderr(&inside).contains("state directory"),
        "{}",
        stderr(&inside)
    );

    // So is a plugins directory inside it, even from a configuration outside.
    let config = root.path().join("outside.toml");
    std::fs::write(&config, "[plugins]\ndir = \"ws/plugins\"\n").unwrap();
    let plugins = clawcage(&workspace, &["tools", "--config", config.to_str().unwrap()]);
    assert_eq!(plugins.status.code(), Some(2));
    assert!(
        stderr(&plugins).contains("plugins directory"),
        "{}",
        stderr(&plugins)
    );
}

/// Regression: `clawcage tools | head -1` exited 101 with a panic on the broken pipe in about
/// one run of four. Output closed early ends the command quietly with status 0.
#[test]
fn output_closed_early_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..10 {
        let output = Command::new("bash")
            .arg("-c")
            .arg(r#"set -o pipefail; "$0" tools --workspace "$1" --state-dir "$2" | true"#)
            .arg(env!("CARGO_BIN_EXE_clawcage"))
            .arg(dir.path())
            .arg(state_dir())
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(stderr(&output).is_empty(), "{}", stderr(&output));
    }
}

/// Regression: `clawcage run … 2>&1 | head -2` exited 101, a panic writing the final error to
/// a stderr nobody reads any more. With stderr a pipe whose reader is gone (every write fails
/// with EPIPE), the contract's exit code stays: 2 for a usage error, 1 for a failed tool.
#[test]
fn a_closed_stderr_keeps_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], i32); 2] = [
        (&["run", "hi", "--provider", "scripted"], 2),
        (&["call", "read_file", r#"{"path":"missing.txt"}"#], 1),
    ];
    for (args, code) in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(args)
            .arg("--workspace")
            .arg(dir.path())
            .arg("--state-dir")
            .arg(state_dir())
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(code), "{args:?}");
    }
}

/// `edit_file` with several matches changes nothing: `call` says so with exit 1, so a script
/// never believes the edit happened.
#[test]
fn an_edit_that_changed_nothing_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "x\nx\n").unwrap();
    let output = clawcage(
        dir.path(),
        &[
            "call",
            "edit_file",
            r#"{"path":"a.txt","old_text":"x","new_text":"y"}"#,
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("occurs 2 times"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "x\nx\n"
    );
}

/// `tools` prints one line per tool: its name, the first sentence of its description and what
/// it reaches; no schema, no second line.
#[test]
fn tools_prints_one_line_per_tool_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let listing = clawcage(dir.path(), &["tools"]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let text = stdout(&listing);
    let lines: Vec<&str> = text.lines().collect();
    let read = lines
        .iter()
        .find(|line| line.starts_with("read_file "))
        .unwrap_or_else(|| panic!("read_file is listed: {text}"));
    assert!(
        read.starts_with("read_file  (bundled:file; workspace") && read.contains("  — Read"),
        "its origin, what it reaches and what it does: {read}"
    );
    assert!(!text.contains("schema:"), "no schemas: {text}");
    assert!(!text.contains("\"type\""), "no JSON: {text}");
    let listed = lines.iter().filter(|line| !line.starts_with(' ')).count();
    let names = ["read_file", "write_file", "exec", "web_fetch", "cron"];
    for name in names {
        assert_eq!(
            lines
                .iter()
                .filter(|line| line.starts_with(&format!("{name} ")))
                .count(),
            1,
            "{name} once: {text}"
        );
    }
    assert!(listed >= names.len(), "{text}");
    assert!(
        lines.iter().all(|line| line.len() < 400),
        "no whole descriptions: {text}"
    );
    assert!(
        text.contains("--long"),
        "says where the details are: {text}"
    );
}

/// Every schema a model is offered is a valid JSON Schema: bundled tools, host tools (`message`,
/// `remember`, `spawn`, `subagents`) and `cron`. The registry compiles a schema only when its
/// tool is first called (a one-call start compiles one), so a broken schema we ship would
/// otherwise show only as that tool's first call failing.
#[test]
fn every_listed_tool_has_a_schema_that_compiles() {
    let dir = tempfile::tempdir().unwrap();
    let listing = clawcage(dir.path(), &["tools", "--json"]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let tools: Vec<serde_json::Value> = serde_json::from_slice(&listing.stdout).unwrap();
    let mut names = Vec::new();
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        jsonschema::validator_for(&tool["input_schema"])
            .unwrap_or_else(|error| panic!("the schema of `{name}` does not compile: {error}"));
        names.push(name);
    }
    for expected in ["read_file", "exec", "web_fetch", "message", "spawn", "cron"] {
        assert!(names.contains(&expected), "{expected} is listed: {names:?}");
    }
}

/// `tools --long` lists every tool with where it is available (the agent's `message`, `spawn`
/// and `cron` too), and `--json` gives the grants as fields beside the prose.
#[test]
fn tools_lists_every_tool_with_where_and_structured_grants() {
    let dir = tempfile::tempdir().unwrap();
    let listing = clawcage(dir.path(), &["tools", "--long"]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let text = stdout(&listing);
    for name in [
        "read_file",
        "exec",
        "web_fetch",
        "message",
        "spawn",
        "subagents",
        "cron",
    ] {
        assert!(
            text.lines()
                .any(|line| line.starts_with(&format!("{name}  ("))),
            "{name} is listed: {text}"
        );
    }
    assert!(
        text.contains("available in: call, mcp, run, chat"),
        "{text}"
    );
    assert!(text.contains("clawcage cron"), "{text}");

    let json = clawcage(dir.path(), &["tools", "--json"]);
    let tools: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let read = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "read_file")
        .unwrap();
    let detail = &read["grants_detail"];
    assert_eq!(detail["workspace"]["mode"], "rw", "{detail}");
    assert_eq!(
        detail["workspace"]["path"],
        dir.path().canonicalize().unwrap().to_str().unwrap(),
        "{detail}"
    );
    assert_eq!(detail["memory_mib"], 256);
    assert_eq!(detail["timeout_secs"], 30.0);
    assert!(detail["network"].is_null());
    let fetch = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "web_fetch")
        .unwrap();
    assert!(
        fetch["grants_detail"]["network"]["allow"].is_array(),
        "{fetch}"
    );
    let message = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "message")
        .unwrap();
    assert_eq!(message["grants_detail"]["sandboxed"], false);
}

/// `mcp --http localhost:PORT` listens: names resolve (to loopback addresses only).
#[test]
fn mcp_http_takes_a_loopback_name() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["mcp", "--http", "localhost:0", "--workspace"])
        .arg(dir.path())
        .arg("--state-dir")
        .arg(state_dir())
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        first.contains("streamable HTTP at http://127.0.0.1:")
            || first.contains("streamable HTTP at http://[::1]:"),
        "{first}"
    );
    let refused = clawcage(dir.path(), &["mcp", "--http", "example.invalid:80"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}

/// `--help` tells global options apart from the command's own and shows no `[env: NAME=]` for
/// an unset variable; with `CLAWCAGE_STATE_DIR` set, a usage error does not show `--state-dir`
/// as if it were required, and the variable is still used.
#[test]
fn help_sets_global_options_apart_and_the_state_dir_variable_stays_out_of_usage() {
    let help = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["chat", "--help"])
        .env_remove("CLAWCAGE_STATE_DIR")
        .output()
        .unwrap();
    let text = stdout(&help);
    assert!(help.status.success(), "{text}");
    let global = text
        .find("Global options:")
        .unwrap_or_else(|| panic!("a heading of its own: {text}"));
    let own = text.find("--gateway").unwrap();
    let state_dir = text.find("--state-dir").unwrap();
    assert!(own < global && global < state_dir, "{text}");
    assert!(!text.contains("=]"), "no empty variable value: {text}");
    assert!(text.contains("$CLAWCAGE_STATE_DIR"), "{text}");

    let state = tempfile::tempdir().unwrap();
    let usage = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .arg("run")
        .env("CLAWCAGE_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    let said = stderr(&usage);
    assert!(said.contains("<TASK>"), "{said}");
    assert!(!said.contains("--state-dir"), "not shown as given: {said}");

    // The variable still chooses the state directory.
    let workspace = tempfile::tempdir().unwrap();
    let sessions = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["sessions", "--workspace"])
        .arg(workspace.path())
        .env("CLAWCAGE_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(
        stdout(&sessions).contains(&state.path().display().to_string()),
        "{}{}",
        stdout(&sessions),
        stderr(&sessions)
    );
}

/// The gateway takes the provider flags `chat` and `run` take.
#[test]
fn gateway_takes_the_provider_flags() {
    let help = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["gateway", "--help"])
        .output()
        .unwrap();
    let text = stdout(&help);
    for flag in ["--base-url <URL>", "--provider <NAME>", "--model <MODEL>"] {
        assert!(text.contains(flag), "{flag}: {text}");
    }
}
