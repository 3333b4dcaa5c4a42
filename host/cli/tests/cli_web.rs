//! The web tools through the `clawcage` binary, configured as an operator would: `[network]`
//! allow-list and secrets, `[web] search_endpoint`, keys in the environment. A small HTTP server
//! on 127.0.0.1 (plain std, one thread) plays the web and the search API and records the
//! requests it gets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// The compiled-artifact cache shared with the other test binaries.
use clawcage_tests::cli_state::shared_state_dir as state_dir;

/// `clawcage trust` for the configuration the workspace `workspace` (with `args`) would use.
fn trust(workspace: &Path, args: &[&str]) {
    let mut all = vec!["trust"];
    all.extend_from_slice(args);
    let output = clawcage(workspace, &all, &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

fn clawcage(workspace: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .args(args)
        .arg("--workspace")
        .arg(workspace)
        .arg("--state-dir")
        .arg(state_dir())
        .env_remove("RUST_LOG")
        .env_remove("BRAVE_API_KEY");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("clawcage runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A one-thread HTTP/1.1 server answering every request with `content_type` and `body`, and
/// recording each request's head (request line and headers).
struct Server {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(content_type: &'static str, body: String) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = heads.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                recorded.lock().unwrap().push(head);
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        Server { port, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

#[test]
fn tools_shows_the_web_tools_with_their_network_grant() {
    let dir = tempfile::tempdir().unwrap();
    let output = clawcage(dir.path(), &["tools", "--json"], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let tools: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let web: Vec<&serde_json::Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter(|tool| tool["origin"] == "bundled:web")
        .collect();
    let names: Vec<&str> = web.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web_fetch", "web_search"]);
    for tool in web {
        let grants = tool["grants"].as_str().unwrap();
        assert!(grants.contains("no files"), "{grants}");
        assert!(
            grants.contains("network: nothing allowed (add hosts to [network] allow)"),
            "{grants}"
        );
    }

    std::fs::write(
        dir.path().join("clawcage.toml"),
        "[network]\nallow = [\"example.com\", \"*.example.org\"]\n",
    )
    .unwrap();
    trust(dir.path(), &[]);
    let listing = clawcage(
        dir.path(),
        &["tools"],
        &[("BRAVE_API_KEY", "k-listing-secret")],
    );
    let stdout = text(&listing.stdout);
    assert!(
        stdout.contains("web_fetch  (bundled:web; no files, memory 256 MiB, timeout 30s, network: example.com, *.example.org; secrets added by the host: x-subscription-token for api.search.brave.com (from BRAVE_API_KEY))"),
        "{stdout}"
    );
    assert!(!stdout.contains("k-listing-secret"));
}

#[test]
fn without_an_allow_list_every_fetch_is_refused_with_the_hint() {
    let dir = tempfile::tempdir().unwrap();
    let output = clawcage(
        dir.path(),
        &["call", "web_fetch", r#"{"url": "https://example.com/"}"#],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("web_fetch: denied:"), "{stderr}");
    assert!(
        stderr.contains("add \"example.com\" to [network] allow in clawcage.toml"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    // The refusal is said once: no log line repeats it, and nothing is coloured in a file.
    assert_eq!(stderr.lines().count(), 1, "one line, the verdict: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "no colour codes: {stderr:?}");

    // -v shows clawcage's own events, not the libraries' (wasmtime's section notes).
    let verbose = clawcage(
        dir.path(),
        &[
            "-v",
            "call",
            "web_fetch",
            r#"{"url": "https://example.com/"}"#,
        ],
        &[],
    );
    let stderr = text(&verbose.stderr);
    assert!(stderr.contains("clawcage"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no colour codes: {stderr:?}");
    for line in stderr.lines().filter(|line| line.contains(" DEBUG ")) {
        assert!(
            line.contains(" clawcage"),
            "only clawcage's own debug lines: {line}"
        );
    }

    let invalid = clawcage(
        dir.path(),
        &["call", "web_fetch", r#"{"url": "file:///etc/passwd"}"#],
        &[],
    );
    assert_eq!(invalid.status.code(), Some(2), "{}", text(&invalid.stderr));
}

#[test]
fn web_fetch_reads_an_allowed_page_from_the_config() {
    let server = Server::start(
        "text/html",
        "<title>Local</title><h1>Hello</h1><p>from the test server</p>".to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("clawcage.toml"),
        format!("[network]\nallow = [\"127.0.0.1:{}\"]\n", server.port),
    )
    .unwrap();
    trust(dir.path(), &[]);
    let url = format!("http://127.0.0.1:{}/page", server.port);
    let output = clawcage(
        dir.path(),
        &["call", "web_fetch", &format!(r#"{{"url": "{url}"}}"#)],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("Title: Local"), "{stdout}");
    assert!(
        stdout.contains("# Hello\n\nfrom the test server"),
        "{stdout}"
    );
    assert_eq!(server.heads().len(), 1);
}

#[test]
fn web_search_sends_the_key_from_the_environment_and_never_shows_it() {
    let secret = "cli-secret-91b2c3d4e5";
    let server = Server::start(
        "application/json",
        r#"{"web":{"results":[{"title":"Found","url":"https://example.com/found","description":"a <strong>match</strong>"}]}}"#
            .to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("web.toml");
    std::fs::write(
        &config,
        format!(
            "[network]\nallow = [\"127.0.0.1:{port}\"]\n\n[[network.secrets]]\nhost = \"127.0.0.1:{port}\"\nheader = \"X-Subscription-Token\"\nenv = \"CLAWCAGE_TEST_SEARCH_KEY\"\n\n[web]\nsearch_endpoint = \"http://127.0.0.1:{port}/res/v1/web/search\"\n",
            port = server.port
        ),
    )
    .unwrap();
    trust(dir.path(), &["--config", config.to_str().unwrap()]);
    let output = clawcage(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "-vv",
            "call",
            "web_search",
            r#"{"query": "clawcage"}"#,
        ],
        &[("CLAWCAGE_TEST_SEARCH_KEY", secret)],
    );
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains("1. Found\n   https://example.com/found\n   a match"),
        "{stdout}"
    );
    let heads = server.heads();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].starts_with("GET /res/v1/web/search?q=clawcage&count=5 HTTP/1.1"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("x-subscription-token: {secret}")),
        "{}",
        heads[0]
    );
    // Traced at the most verbose level, the run still shows the key nowhere.
    assert!(
        stderr.contains("sending an allowed request"),
        "trace output was captured: {stderr}"
    );
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "{stderr}"
    );
}

#[test]
fn a_bad_network_section_is_a_usage_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("clawcage.toml"),
        "[network]\nallow = [\"https://example.com/path\"]\n",
    )
    .unwrap();
    trust(dir.path(), &[]);
    let output = clawcage(dir.path(), &["tools"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("[network] allow entry"),
        "{}",
        text(&output.stderr)
    );

    std::fs::write(
        dir.path().join("clawcage.toml"),
        "[network]\nallowed = []\n",
    )
    .unwrap();
    let output = clawcage(dir.path(), &["tools"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("unknown field `allowed`"),
        "{}",
        text(&output.stderr)
    );
}

/// An allow entry that covers a whole top-level domain is accepted, with a warning that says
/// what it means.
#[test]
fn a_whole_top_level_domain_in_the_allow_list_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("wide.toml");
    std::fs::write(&config, "[network]\nallow = [\"*.com\"]\n").unwrap();
    let output = clawcage(
        dir.path(),
        &["tools", "--config", config.to_str().unwrap()],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("allows every host under the top-level domain .com"),
        "{}",
        text(&output.stderr)
    );
}
