//! `clawcage mcp` driven by a real MCP client — the official Python SDK (`mcp` from PyPI), run by
//! `mcp_client.py` — over stdio and over streamable HTTP: the client lists the tools with their
//! schemas, calls `read_file` and `exec`, and sees escapes refused as
//! tool errors; the audit log records each call by digest. The example plugins written in Python
//! and JavaScript are called through MCP too; over HTTP an exec approval request is asked, through
//! MCP elicitation, of the client whose session raised it and of no other. Tests skip with a
//! printed reason only when the Python toolchain cannot be installed. One test needs no Python:
//! it writes raw JSON-RPC lines to the binary's stdin, as a hostile client would, and every
//! request is answered. It is one file (over 700 lines) because every test drives `clawcage mcp`
//! through the same `Fixture` and client runner (or the raw stdio and HTTP harnesses), one test per
//! behaviour.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clawcage_agent::AuditRecord;
use clawcage_tests::toolchains::{example_plugin, python_with_mcp, skip};
use serde_json::{Value, json};

/// The state directory shared with the other CLI tests (it holds the compiled-component cache).
use clawcage_tests::cli_state::shared_state_dir as state_dir;

/// A workspace with a file to read, a file outside it to try to reach, and a config that puts the
/// audit log (and, if given, a plugins section) into the test's own directory.
struct Fixture {
    root: tempfile::TempDir,
}

impl Fixture {
    fn new(plugins_section: &str) -> Fixture {
        // Components compiled before any call's deadline (the server's and the client's) starts.
        clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("workspace")).unwrap();
        std::fs::write(
            root.path().join("workspace/hello.txt"),
            "hello over mcp\nsecond line\n",
        )
        .unwrap();
        std::fs::write(root.path().join("outside.txt"), "TOP SECRET outside").unwrap();
        std::fs::write(
            root.path().join("clawcage.toml"),
            format!("[audit]\npath = \"audit.jsonl\"\n{plugins_section}"),
        )
        .unwrap();
        Fixture { root }
    }

    fn workspace(&self) -> PathBuf {
        self.root.path().join("workspace")
    }

    /// The arguments that start `clawcage mcp` on this fixture.
    fn server_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "mcp".into(),
            "--workspace".into(),
            self.workspace().display().to_string(),
            "--config".into(),
            self.root.path().join("clawcage.toml").display().to_string(),
            "--state-dir".into(),
            state_dir().display().to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    }

    fn audit(&self) -> (String, Vec<AuditRecord>) {
        let text =
            std::fs::read_to_string(self.root.path().join("audit.jsonl")).unwrap_or_default();
        let records = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        (text, records)
    }
}

/// Runs the Python MCP client with `calls` over `transport` and returns its report.
fn run_client(python: &Path, calls: &Value, transport: &[String]) -> Value {
    run_client_answering(python, calls, transport, None)
}

/// [`run_client`], the client declaring elicitation and answering with `answers` when given.
fn run_client_answering(
    python: &Path,
    calls: &Value,
    transport: &[String],
    answers: Option<&[&str]>,
) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let mut command = Command::new(python);
    command
        .arg(&script)
        .arg(calls.to_string())
        .args(transport)
        .env_remove("RUST_LOG")
        .env_remove("MCP_ELICIT_ANSWERS");
    if let Some(answers) = answers {
        command.env("MCP_ELICIT_ANSWERS", json!(answers).to_string());
    }
    let output = command.output().expect("the MCP client runs");
    assert!(
        output.status.success(),
        "the MCP client failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "the MCP client printed no report ({error}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The calls every transport test makes, with the `exec` calls shaped after the listed schema
/// when the tool exists (it is a separate component that not every build has).
fn standard_calls(fixture: &Fixture) -> Value {
    json!([
        {"name": "read_file", "arguments": {"path": "hello.txt"}},
        {"name": "read_file", "arguments": {"path": fixture.root.path().join("outside.txt")}},
        {"name": "read_file", "arguments": {"path": "../outside.txt"}},
        {"name": "read_file", "arguments": {"path": 5}},
        {"name": "list_dir", "arguments": {}},
    ])
}

/// The first required string property of a tool's schema (how `exec` names its command).
fn command_field(tool: &Value) -> Option<String> {
    let schema = &tool["input_schema"];
    schema["required"].as_array()?.iter().find_map(|name| {
        let name = name.as_str()?;
        (schema["properties"][name]["type"] == "string").then(|| name.to_string())
    })
}

/// Checks the report of `standard_calls` (and runs the `exec` calls when `exec` is listed).
fn check_standard_report(report: &Value, fixture: &Fixture, python: &Path, transport: &[String]) {
    assert_eq!(report["server"]["name"], "clawcage");
    assert!(
        report["server"]["instructions"]
            .as_str()
            .unwrap()
            .contains("WebAssembly sandbox"),
        "{report}"
    );
    let tools = report["tools"].as_object().unwrap();
    for name in ["read_file", "write_file", "edit_file", "list_dir"] {
        assert!(tools.contains_key(name), "{name} is listed: {report}");
    }
    assert_eq!(tools["read_file"]["input_schema"]["type"], "object");
    assert!(
        tools["read_file"]["input_schema"]["properties"]["path"].is_object(),
        "the schema is passed through: {report}"
    );

    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], false, "{report}");
    assert!(
        calls[0]["text"]
            .as_str()
            .unwrap()
            .contains("hello over mcp"),
        "{report}"
    );
    for escape in &calls[1..=2] {
        assert_eq!(
            escape["is_error"], true,
            "an escape is a tool error: {report}"
        );
        let text = escape["text"].as_str().unwrap();
        assert!(
            text.starts_with("denied:") || text.starts_with("failed:"),
            "{text}"
        );
        assert!(!text.contains("TOP SECRET"), "{text}");
    }
    assert_eq!(calls[3]["is_error"], true);
    assert!(
        calls[3]["text"]
            .as_str()
            .unwrap()
            .starts_with("invalid arguments:"),
        "{report}"
    );
    assert_eq!(calls[4]["is_error"], false);
    assert!(
        calls[4]["text"].as_str().unwrap().contains("hello.txt"),
        "{report}"
    );

    let field = tools
        .get("exec")
        .and_then(command_field)
        .unwrap_or_else(|| panic!("exec is listed with a command field: {report}"));
    let exec_calls = json!([
        {"name": "exec", "arguments": {field.clone(): "cat hello.txt"}},
        {"name": "exec", "arguments": {field: format!("cat {}", fixture.root.path().join("outside.txt").display())}},
    ]);
    let exec_report = run_client(python, &exec_calls, transport);
    let results = exec_report["calls"].as_array().unwrap();
    assert!(
        results[0]["text"]
            .as_str()
            .unwrap()
            .contains("hello over mcp"),
        "{exec_report}"
    );
    let escape = results[1]["text"].as_str().unwrap();
    assert!(!escape.contains("TOP SECRET"), "{exec_report}");
    assert!(
        escape.contains("[exit status: 1]"),
        "cat of a path outside the workspace fails inside the sandbox: {exec_report}"
    );
}

/// Checks that the audit log holds one line per `read_file`/`list_dir` call of `session_prefix`
/// sessions and no argument value.
fn check_audit(fixture: &Fixture, session_prefix: &str) {
    let (text, records) = fixture.audit();
    let standard: Vec<&AuditRecord> = records
        .iter()
        .filter(|record| record.tool != "exec")
        .collect();
    assert_eq!(standard.len(), 5, "{text}");
    let verdicts: Vec<&str> = standard
        .iter()
        .map(|record| record.verdict.as_str())
        .collect();
    assert_eq!(verdicts[0], "ok");
    assert_ne!(verdicts[1], "ok");
    assert_ne!(verdicts[2], "ok");
    assert_eq!(verdicts[3], "invalid_args");
    assert_eq!(verdicts[4], "ok");
    for record in &standard {
        assert!(record.session.starts_with(session_prefix), "{record:?}");
        assert_eq!(
            record.session, standard[0].session,
            "one client, one session"
        );
        assert_eq!(record.args_sha256.len(), 64);
    }
    assert_eq!(standard[0].origin.as_deref(), Some("bundled:file"));
    assert!(standard[0].grants.as_deref().unwrap().contains("(rw)"));
    for value in ["hello.txt", "outside.txt"] {
        assert!(
            !text.contains(value),
            "the audit log holds {value}:\n{text}"
        );
    }
}

#[test]
fn an_mcp_client_over_stdio_lists_tools_calls_them_and_sees_escapes_refused() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("mcp over stdio", &reason),
    };
    let fixture = Fixture::new("");
    let mut transport = vec![
        "stdio".to_string(),
        env!("CARGO_BIN_EXE_clawcage").to_string(),
    ];
    transport.extend(fixture.server_args(&[]));
    let report = run_client(&python, &standard_calls(&fixture), &transport);
    check_standard_report(&report, &fixture, &python, &transport);
    check_audit(&fixture, "mcp-stdio-");
}

/// A running `clawcage mcp --http` child, killed on drop.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(fixture: &Fixture) -> HttpServer {
        Self::launch(fixture, None, true)
    }

    /// A server that logs every call (`RUST_LOG=debug`) into a stderr closed as soon as the
    /// address is read.
    fn start_with_stderr_closed(fixture: &Fixture) -> HttpServer {
        Self::launch(fixture, Some("debug"), false)
    }

    fn launch(fixture: &Fixture, rust_log: Option<&str>, keep_reading: bool) -> HttpServer {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .args(fixture.server_args(&["--http", "127.0.0.1:0"]))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(filter) = rust_log {
            command.env("RUST_LOG", filter);
        }
        let mut child = command.spawn().expect("clawcage mcp --http starts");
        let stderr = child.stderr.take().unwrap();
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let address = line.contains("http://");
                // Read on once the address is found, unless the test closes stderr on purpose.
                if lines.send(line).is_err() || (address && !keep_reading) {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            // Generous: the first start may compile the components.
            match received.recv_timeout(Duration::from_secs(300)) {
                Ok(line) => {
                    if let Some(start) = line.find("http://") {
                        let url = line[start..].split_whitespace().next().unwrap().to_string();
                        return HttpServer { child, url };
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "clawcage mcp --http printed no address:\n{}",
                        seen.join("\n")
                    );
                }
            }
        }
    }

    fn authority(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_string()
    }

    /// Sends one raw HTTP/1.1 request and returns the status line.
    fn raw_status(&self, request: &str) -> String {
        let mut stream = TcpStream::connect(self.authority()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        String::from_utf8_lossy(&response)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_mcp_client_over_streamable_http_does_the_same_and_strangers_are_turned_away() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("mcp over http", &reason),
    };
    let fixture = Fixture::new("");
    let server = HttpServer::start(&fixture);
    assert!(server.url.ends_with("/mcp"), "{}", server.url);
    let transport = vec!["http".to_string(), server.url.clone()];
    let report = run_client(&python, &standard_calls(&fixture), &transport);
    check_standard_report(&report, &fixture, &python, &transport);
    check_audit(&fixture, "mcp-http-");

    // Another path is not the endpoint.
    let authority = server.authority();
    let elsewhere = server.raw_status(&format!(
        "GET /elsewhere HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    ));
    assert!(elsewhere.contains(" 404 "), "{elsewhere}");
    // A page on another site that resolves its name to 127.0.0.1 (DNS rebinding) is refused.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    let rebinding = server.raw_status(&format!(
        "POST /mcp HTTP/1.1\r\nHost: attacker.example\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert!(rebinding.contains(" 403 "), "{rebinding}");
    // The server is still serving.
    let again = run_client(
        &python,
        &json!([{"name": "read_file", "arguments": {"path": "hello.txt"}}]),
        &transport,
    );
    assert_eq!(again["calls"][0]["is_error"], false, "{again}");
}

#[test]
fn mcp_refuses_to_listen_beyond_loopback() {
    let fixture = Fixture::new("");
    let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(fixture.server_args(&["--http", "0.0.0.0:0"]))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("loopback only"), "{stderr}");
}

#[test]
fn the_python_and_javascript_examples_are_called_through_mcp() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("examples through mcp", &reason),
    };
    let mut examples = Vec::new();
    for language in ["python", "js"] {
        match example_plugin(language) {
            Ok(dir) => examples.push(dir),
            Err(reason) => skip(&format!("the {language} example through mcp"), &reason),
        }
    }
    if examples.is_empty() {
        return;
    }
    let fixture = Fixture::new(
        "[plugins]\ndir = \"plugins\"\n[plugins.grants.py-text-stats]\nworkspace = \"ro\"\n",
    );
    let plugins = fixture.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for example in &examples {
        std::os::unix::fs::symlink(example, plugins.join(example.file_name().unwrap())).unwrap();
    }
    let calls = json!([
        {"name": "text_stats", "arguments": {"path": "hello.txt", "top": 1}},
        {"name": "text_stats", "arguments": {"path": "../outside.txt"}},
        {"name": "slugify", "arguments": {"text": "Sandboxed Tools, Any Language"}},
        {"name": "json_pick", "arguments": {"document": "[1, 2]", "path": "5"}},
    ]);
    let mut transport = vec![
        "stdio".to_string(),
        env!("CARGO_BIN_EXE_clawcage").to_string(),
    ];
    transport.extend(fixture.server_args(&[]));
    let report = run_client(&python, &calls, &transport);
    let results = report["calls"].as_array().unwrap();
    let tools = report["tools"].as_object().unwrap();
    if tools.contains_key("text_stats") {
        assert_eq!(results[0]["is_error"], false, "{report}");
        let stats: Value = serde_json::from_str(results[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(stats["words"], 5, "{stats}");
        assert_eq!(stats["top_words"][0]["word"], "hello", "{stats}");
        assert_eq!(results[1]["is_error"], true, "{report}");
        assert!(!results[1]["text"].as_str().unwrap().contains("TOP SECRET"));
    }
    if tools.contains_key("slugify") {
        assert_eq!(
            results[2]["text"], "sandboxed-tools-any-language",
            "{report}"
        );
        assert_eq!(results[3]["is_error"], true, "{report}");
        assert_eq!(
            results[3]["text"], "failed: the document has no key or index `5`",
            "{report}"
        );
    }
    let (_, records) = fixture.audit();
    let origins: Vec<&str> = records
        .iter()
        .filter_map(|record| record.origin.as_deref())
        .collect();
    assert!(
        origins
            .iter()
            .all(|origin| origin.starts_with("plugin:py-text-stats@")
                || origin.starts_with("plugin:js-tools@")),
        "{origins:?}"
    );
    assert_eq!(records.len(), examples.len() * 2, "{records:?}");
}

/// A `clawcage mcp` child over stdio, driven line by line; killed on drop.
struct RawStdio {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl RawStdio {
    fn start(fixture: &Fixture) -> RawStdio {
        let mut child = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(fixture.server_args(&[]))
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("clawcage mcp starts");
        let stdin = child.stdin.take();
        let lines = forward_lines(child.stdout.take().unwrap());
        let stderr = forward_lines(child.stderr.take().unwrap());
        RawStdio {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `initialize` (id 1) and returns the answer.
    fn initialize(&mut self) -> Value {
        self.send(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw-lines", "version": "1"}
            }})
            .to_string(),
        );
        // Generous: the first start may compile the components.
        let answer = self.next(Duration::from_secs(300));
        assert_eq!(answer["id"], 1, "{answer}");
        answer
    }

    /// The next message from the server, within `patience`.
    fn next(&mut self, patience: Duration) -> Value {
        match self.lines.recv_timeout(patience) {
            Ok(line) => serde_json::from_str(&line).unwrap_or_else(|error| {
                panic!("the server wrote a line that is not JSON ({error}): {line}")
            }),
            Err(error) => panic!(
                "no answer from clawcage mcp within {patience:?} ({error}); its stderr:\n{}",
                self.stderr.try_iter().collect::<Vec<_>>().join("\n")
            ),
        }
    }
}

impl Drop for RawStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `stream`, read on a thread of their own.
fn forward_lines(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    received
}

#[test]
fn mcp_over_stdio_answers_a_deeply_nested_call_and_garbage_and_keeps_serving() {
    let fixture = Fixture::new("");
    let mut server = RawStdio::start(&fixture);
    let initialized = server.initialize();
    assert_eq!(initialized["id"], 1, "{initialized}");
    assert_eq!(initialized["result"]["serverInfo"]["name"], "clawcage");
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    // Far deeper than serde_json's limit of 128 levels, which rmcp dropped without an answer.
    let depth = 10_000;
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"read_file","arguments":{{"path":"hello.txt","x":{}{}}}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let started = Instant::now();
    server.send(&deep);
    let refused = server.next(Duration::from_secs(60));
    assert_eq!(refused["id"], 2, "{refused}");
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("arguments nested deeper than 64 levels"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));

    // Under serde_json's limit but over the server's own bound: refused the same way.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"read_file","arguments":{{"path":"hello.txt","x":{}{}}}}}}}"#,
        "[".repeat(120),
        "]".repeat(120)
    );
    server.send(&deep);
    let refused = server.next(Duration::from_secs(60));
    assert_eq!(refused["id"], 3, "{refused}");
    assert_eq!(refused["error"]["code"], -32602, "{refused}");

    server.send("this line is not JSON");
    let garbage = server.next(Duration::from_secs(60));
    assert_eq!(garbage["id"], Value::Null, "{garbage}");
    assert_eq!(garbage["error"]["code"], -32700, "{garbage}");

    server.send(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"hello.txt"}}}"#,
    );
    let read = server.next(Duration::from_secs(120));
    assert_eq!(read["id"], 4, "{read}");
    assert_eq!(read["result"]["isError"], false, "{read}");
    assert!(
        read["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("hello over mcp"),
        "{read}"
    );

    // Closing stdin ends the server normally.
    drop(server.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "clawcage mcp did not exit after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");

    // The refused calls never reached the registry: the audit log has the one call that ran.
    let (text, records) = fixture.audit();
    assert_eq!(records.len(), 1, "{text}");
    assert_eq!(records[0].tool, "read_file");
    assert_eq!(records[0].verdict, "ok");
}

/// CPU time (user + system) the process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A flood inside a pipeline and a loop in nested shells end at the operator's limit, the
/// server answers other requests meanwhile, and once a call is answered its programs use no more
/// CPU (a stage left running would burn a core for ever).
#[test]
fn a_call_ends_at_its_limit_and_its_programs_stop_using_cpu() {
    let fixture = Fixture::new("[limits]\ntimeout_secs = 2\n");
    let mut server = RawStdio::start(&fixture);
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let call = |id: u64, command: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "exec", "arguments": {"command": command, "timeout_secs": 600}
        }})
        .to_string()
    };
    // Warm: the programs are loaded (and compiled on a first start) before any clock runs.
    server.send(&call(2, "echo warm | cat"));
    assert_eq!(server.next(Duration::from_secs(600))["id"], 2);

    for (id, command) in [
        (3, "yes | cat | cat | wc -l"),
        (4, "sh -c 'sh -c \"while true; do :; done\"'"),
    ] {
        let started = Instant::now();
        server.send(&call(id, command));
        // A second request is answered while the first runs.
        server.send(r#"{"jsonrpc":"2.0","id":99,"method":"tools/list"}"#);
        let first = server.next(Duration::from_secs(30));
        assert_eq!(first["id"], 99, "tools/list answered first: {first}");
        let ended = server.next(Duration::from_secs(30));
        let elapsed = started.elapsed();
        assert_eq!(ended["id"], id, "{ended}");
        assert_eq!(ended["result"]["isError"], true, "{ended}");
        let text = ended["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("time limit"), "{command}: {text}");
        assert!(
            elapsed < Duration::from_secs(3),
            "{command} was answered after {elapsed:?} under a 2 s limit"
        );
        let pid = server.child.id();
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_ticks(pid) - before;
        // Clock ticks are 1/100 s: a stage still running would use about 100 per second.
        assert!(
            used < 30,
            "{command}: the server used {used} ticks of CPU in the second after the call ended"
        );
    }
}

#[test]
fn exec_approvals_are_asked_through_elicitation_and_without_it_the_fallback_decides() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("mcp elicitation", &reason),
    };
    let fixture =
        Fixture::new("[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nallow = [\"ls *\"]\n");
    for dir in ["build", "dist"] {
        std::fs::create_dir(fixture.workspace().join(dir)).unwrap();
    }
    let mut transport = vec![
        "stdio".to_string(),
        env!("CARGO_BIN_EXE_clawcage").to_string(),
    ];
    transport.extend(fixture.server_args(&[]));
    let exec = |command: &str| json!({"name": "exec", "arguments": {"command": command}});
    let calls = json!([exec("rm -r build"), exec("rm -r dist"), exec("ls")]);
    let report = run_client_answering(&python, &calls, &transport, Some(&["allow-once", "deny"]));
    let results = report["calls"].as_array().unwrap();
    assert_eq!(results[0]["is_error"], false, "{report:#}");
    assert!(!fixture.workspace().join("build").exists());
    assert_eq!(results[1]["is_error"], true, "{report:#}");
    assert!(
        results[1]["text"]
            .as_str()
            .unwrap()
            .contains("denied by the operator"),
        "{report:#}"
    );
    assert!(fixture.workspace().join("dist").exists());
    // `ls` is on the allowlist: nobody is asked.
    assert_eq!(results[2]["is_error"], false, "{report:#}");
    let asked = report["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "{report:#}");
    assert!(
        asked[0]["message"]
            .as_str()
            .unwrap()
            .contains("rm -r build"),
        "{report:#}"
    );
    assert_eq!(
        asked[0]["schema"]["properties"]["decision"]["enum"],
        json!(["allow-once", "allow-always", "deny"])
    );

    // Two calls of one session running at once, each asking: each request is asked once (one
    // asker per session, not one per call hearing the other's requests too).
    for dir in ["one", "two"] {
        std::fs::create_dir(fixture.workspace().join(dir)).unwrap();
    }
    let together = json!([[exec("rm -r one"), exec("rm -r two")]]);
    let report = run_client_answering(
        &python,
        &together,
        &transport,
        Some(&["allow-once", "allow-once"]),
    );
    let asked = report["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "{report:#}");
    let messages = format!("{}{}", asked[0]["message"], asked[1]["message"]);
    assert!(
        messages.contains("rm -r one") && messages.contains("rm -r two"),
        "{report:#}"
    );
    for result in report["calls"].as_array().unwrap() {
        assert_eq!(result["is_error"], false, "{report:#}");
    }
    assert!(!fixture.workspace().join("one").exists());
    assert!(!fixture.workspace().join("two").exists());

    // A client without elicitation: nobody can be asked, the fallback (deny) decides.
    let report = run_client(&python, &json!([exec("rm -r dist")]), &transport);
    let result = &report["calls"][0];
    assert_eq!(result["is_error"], true, "{report:#}");
    assert!(
        result["text"]
            .as_str()
            .unwrap()
            .contains("no operator is connected"),
        "{report:#}"
    );
    assert!(fixture.workspace().join("dist").exists());
}

/// `[approvals]` for the per-session tests: exec runs allowlisted programs only and asks about
/// the rest (`rm` is never on the list); the waiting client's loop is on it.
const PER_SESSION_APPROVALS: &str = concat!(
    "[limits]\ntimeout_secs = 300\n",
    "[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\ntimeout_secs = 30\n",
    "allow = [\"touch *\", \"test *\", \"sleep *\"]\n",
);

/// Runs the MCP client on a thread of its own, declaring elicitation and answering with
/// `answers`.
fn spawn_client(
    python: &Path,
    calls: Value,
    transport: &[String],
    answers: &'static [&'static str],
) -> std::thread::JoinHandle<Value> {
    let python = python.to_path_buf();
    let transport = transport.to_vec();
    std::thread::spawn(move || run_client_answering(&python, &calls, &transport, Some(answers)))
}

/// Waits until `path` exists; fails if `client` ends first or it takes too long.
fn wait_for_file(
    path: &Path,
    client: std::thread::JoinHandle<Value>,
) -> std::thread::JoinHandle<Value> {
    // Generous: the machine may be loaded.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !path.exists() {
        if client.is_finished() {
            let report = client.join().expect("the MCP client thread ends normally");
            panic!(
                "the client ended before {} appeared: {report:#}",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within 300 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    client
}

/// One round: the asking client runs two commands off the allowlist (answering allow-once, then
/// deny) while the waiting client, also declaring elicitation, has a call running the whole time
/// (so its session has an operator registered with the approvals broker). With `asker_first`
/// the asking client connects first, else the waiting one does.
fn asking_round(
    python: &Path,
    fixture: &Fixture,
    transport: &[String],
    round: u32,
    asker_first: bool,
) {
    let once = format!("asked-{round}-once");
    let denied = format!("asked-{round}-denied");
    for dir in [&once, &denied] {
        std::fs::create_dir(fixture.workspace().join(dir)).unwrap();
    }
    let waiting = format!("waiting-{round}");
    let release = format!("release-{round}");
    let asker_ready = format!("asker-ready-{round}");
    let exec = |command: String| json!({"name": "exec", "arguments": {"command": command, "timeout_secs": 300}});
    let asker_calls = json!([
        exec(format!(
            "touch {asker_ready}; until test -e {waiting}; do sleep 0.2; done"
        )),
        exec(format!("rm -r {once} && echo removed {once}")),
        exec(format!("rm -r {denied}")),
        exec(format!("test -e {denied} && echo {denied} is still there")),
    ]);
    let waiter_calls = json!([exec(format!(
        "touch {waiting}; until test -e {release}; do sleep 0.2; done; echo released {round}"
    ))]);
    let workspace = fixture.workspace();
    let (asker, waiter) = if asker_first {
        let asker = spawn_client(python, asker_calls, transport, &["allow-once", "deny"]);
        let asker = wait_for_file(&workspace.join(&asker_ready), asker);
        let waiter = spawn_client(python, waiter_calls, transport, &[]);
        (asker, waiter)
    } else {
        let waiter = spawn_client(python, waiter_calls, transport, &[]);
        let waiter = wait_for_file(&workspace.join(&waiting), waiter);
        let asker = spawn_client(python, asker_calls, transport, &["allow-once", "deny"]);
        (asker, waiter)
    };
    // The waiter's call runs until the asker is done: its session follows the broker throughout.
    let asker = asker.join().expect("the asking client ends normally");
    assert!(
        !waiter.is_finished(),
        "round {round}: the waiting client ended before the asking client was done"
    );
    std::fs::write(workspace.join(&release), "").unwrap();
    let waiter = waiter.join().expect("the waiting client ends normally");

    // The asking client was asked about its own two commands, and only about them.
    let asked = asker["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "round {round}: {asker:#}");
    for (question, dir) in asked.iter().zip([&once, &denied]) {
        let message = question["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("rm -r {dir}")),
            "round {round}: {asker:#}"
        );
    }
    let results = asker["calls"].as_array().unwrap();
    assert_eq!(results.len(), 4, "round {round}: {asker:#}");
    assert_eq!(results[1]["is_error"], false, "round {round}: {asker:#}");
    assert!(
        results[1]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("removed {once}")),
        "round {round}: {asker:#}"
    );
    assert!(!workspace.join(&once).exists());
    assert_eq!(results[2]["is_error"], true, "round {round}: {asker:#}");
    assert!(
        results[2]["text"]
            .as_str()
            .unwrap()
            .contains("denied by the operator"),
        "round {round}: {asker:#}"
    );
    assert!(workspace.join(&denied).exists());
    assert!(
        results[3]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("{denied} is still there")),
        "round {round}: {asker:#}"
    );

    // The waiting client, connected with elicitation and mid-call all along, was asked nothing.
    assert_eq!(
        waiter["elicitations"],
        json!([]),
        "round {round}: the other session's client was asked: {waiter:#}"
    );
    assert_eq!(
        waiter["calls"][0]["is_error"], false,
        "round {round}: {waiter:#}"
    );
    assert!(
        waiter["calls"][0]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("released {round}")),
        "round {round}: {waiter:#}"
    );
}

/// Two clients on one `clawcage mcp --http` server, both declaring elicitation: an exec approval
/// request raised by one session's call is asked of that session's client only, never of the
/// other's, even while the other has a call running (an idle session has no operator registered
/// with the broker, so only a session mid-call could wrongly be asked). The audit log holds each
/// request and decision under the asking session.
#[test]
fn over_http_an_exec_approval_is_asked_only_of_the_client_whose_call_raised_it() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("mcp elicitation per http session", &reason),
    };
    let fixture = Fixture::new(PER_SESSION_APPROVALS);
    let server = HttpServer::start(&fixture);
    let transport = vec!["http".to_string(), server.url.clone()];
    // First the waiting client connects before the asking one, then the other way round: a
    // question sent to every session, to the first one or to the latest one fails a round.
    asking_round(&python, &fixture, &transport, 1, false);
    asking_round(&python, &fixture, &transport, 2, true);

    // The audit log: each asking session has its two requests, decided through elicitation;
    // the waiting sessions have their one call and no approval at all.
    let (text, records) = fixture.audit();
    let mut sessions: Vec<&str> = records
        .iter()
        .map(|record| record.session.as_str())
        .collect();
    sessions.sort_unstable();
    sessions.dedup();
    assert_eq!(sessions.len(), 4, "two clients a round: {text}");
    let mut asking = 0;
    for session in sessions {
        assert!(session.starts_with("mcp-http-"), "{session}");
        let verdicts: Vec<&str> = records
            .iter()
            .filter(|record| record.session == session)
            .map(|record| record.verdict.as_str())
            .collect();
        if verdicts.contains(&"approval-requested") {
            asking += 1;
            let mut sorted = verdicts.clone();
            sorted.sort_unstable();
            // Its four calls (the wait, the allowed `rm`, the denied one, the check) and the two
            // requests with their decisions.
            assert_eq!(
                sorted,
                [
                    "allow-once by mcp-elicitation",
                    "approval-requested",
                    "approval-requested",
                    "denied",
                    "deny by mcp-elicitation",
                    "ok",
                    "ok",
                    "ok",
                ],
                "{session}: {text}"
            );
        } else {
            assert_eq!(verdicts, ["ok"], "{session}: {text}");
        }
    }
    assert_eq!(asking, 2, "{text}");
    assert!(
        !text.contains("rm -r"),
        "the audit log holds a command: {text}"
    );
}

#[test]
fn a_server_whose_stderr_is_closed_goes_on_answering() {
    let python = match python_with_mcp() {
        Ok(python) => python,
        Err(reason) => return skip("mcp over http, stderr closed", &reason),
    };
    let fixture = Fixture::new("");
    // Every call logs into the closed pipe; a failed log write must not fail the call.
    let server = HttpServer::start_with_stderr_closed(&fixture);
    let transport = vec!["http".to_string(), server.url.clone()];
    let calls = json!([
        {"name": "read_file", "arguments": {"path": "hello.txt"}},
        {"name": "exec", "arguments": {"command": "echo still here"}},
    ]);
    let (done, report) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(run_client(&python, &calls, &transport));
    });
    let report = report
        .recv_timeout(Duration::from_secs(240))
        .expect("the server answered within 240 s");
    assert_eq!(report["calls"][0]["is_error"], false, "{report}");
    assert_eq!(report["calls"][1]["is_error"], false, "{report}");
    assert!(report.to_string().contains("still here"), "{report}");
}
