//! Plugins as the operator meets them in the CLI: `clawcage tools` shows each tool's origin and
//! effective grants and lists refused plugins with the reason, stderr reports them too, a plugin
//! whose tool name is already taken is refused whole, and the bundled tools load whatever the
//! plugins do; `clawcage call` runs a plugin's tool and records it in the audit log.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_sandbox::components::{bundled, fixtures};
use sha2::Digest as _;

fn install(plugins: &Path, folder: &str, name: &str, component: &[u8], sha256: &str, rest: &str) {
    let dir = plugins.join(folder);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tool.wasm"), component).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        format!(
            "name = \"{name}\"\nversion = \"2.0.1\"\ncomponent = \"tool.wasm\"\nsha256 = \"{sha256}\"\n{rest}"
        ),
    )
    .unwrap();
}

fn digest(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A workspace, a plugins directory with one good, one tampered and one clashing plugin, and a
/// config granting them.
fn setup() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("workspace")).unwrap();
    let plugins = root.path().join("plugins");
    let echo = std::fs::read(fixtures::PROBE).unwrap();
    install(
        &plugins,
        "probe",
        "probe",
        &echo,
        &digest(&echo),
        "[capabilities]\nworkspace = \"rw\"\nenv = [\"PROBE_GREETING\", \"PROBE_TOKEN\"]\nnetwork = [\"api.example.com\"]\n",
    );
    install(
        &plugins,
        "tampered",
        "tampered",
        &echo,
        &digest(b"other bytes"),
        "",
    );
    install(
        &plugins,
        "clash",
        "clash",
        &bundled::FILE.bytes().unwrap(),
        bundled::FILE.sha256(),
        "",
    );
    std::fs::write(
        root.path().join("clawcage.toml"),
        "[plugins]\ndir = \"plugins\"\n\n[plugins.grants.probe]\nworkspace = \"ro\"\nenv = [\"PROBE_GREETING\", \"PROBE_TOKEN\"]\nnetwork = [\"api.example.com\"]\n\n[audit]\npath = \"audit.jsonl\"\n",
    )
    .unwrap();
    root
}

fn clawcage(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(args)
        .arg("--workspace")
        .arg(root.join("workspace"))
        .arg("--config")
        .arg(root.join("clawcage.toml"))
        .arg("--state-dir")
        .arg(clawcage_tests::cli_state::shared_state_dir())
        .env_remove("RUST_LOG")
        .env("PROBE_GREETING", "hi")
        .env("PROBE_TOKEN", "must-not-leak")
        .output()
        .expect("clawcage runs")
}

#[test]
fn tools_shows_origin_and_effective_grants_and_the_refused_plugins() {
    let root = setup();
    let output = clawcage(root.path(), &["tools"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");

    assert!(stdout.contains("read_file  (bundled:file;"), "{stdout}");
    let probe_line = stdout
        .lines()
        .find(|line| line.starts_with("probe  ("))
        .unwrap_or_else(|| panic!("probe is listed: {stdout}"));
    assert!(probe_line.contains("plugin:probe@2.0.1"), "{probe_line}");
    assert!(probe_line.contains("(ro)"), "{probe_line}");
    assert!(probe_line.contains("env PROBE_GREETING"), "{probe_line}");
    assert!(!probe_line.contains("PROBE_TOKEN"), "{probe_line}");
    assert!(probe_line.contains("api.example.com"), "{probe_line}");

    assert!(stdout.contains("plugins:"), "{stdout}");
    assert!(
        stdout.contains("asked for the workspace rw, granted ro"),
        "{stdout}"
    );
    assert!(stdout.contains("env PROBE_TOKEN refused"), "{stdout}");
    for output in [&stdout, &stderr] {
        assert!(output.contains("tampered@2.0.1"), "{output}");
        assert!(output.contains("digest mismatch"), "{output}");
        assert!(output.contains("clash@2.0.1"), "{output}");
        assert!(
            output.contains("has the name of a tool already loaded from bundled:file"),
            "{output}"
        );
    }

    let json = clawcage(root.path(), &["tools", "--json"]);
    assert!(json.status.success());
    let tools: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let probe = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "probe")
        .unwrap();
    assert_eq!(probe["origin"], "plugin:probe@2.0.1");
    assert!(probe["grants"].as_str().unwrap().contains("(ro)"));
    let origins: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["origin"].as_str().unwrap())
        .collect();
    assert_eq!(
        origins
            .iter()
            .filter(|origin| **origin == "bundled:file")
            .count(),
        4,
        "the bundled tools are unaffected: {origins:?}"
    );
}

#[test]
fn call_runs_a_plugin_tool_with_its_grant_and_audits_it() {
    let root = setup();
    std::fs::write(root.path().join("workspace/in.txt"), "readable").unwrap();
    let output = clawcage(
        root.path(),
        &["call", "probe", r#"{"read": "in.txt", "write": "out.txt"}"#],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["read"]["ok"], "readable");
    assert!(report["write"]["error"].is_string(), "read-only: {report}");
    assert_eq!(report["env"]["PROBE_GREETING"], "hi");
    assert!(report["env"].get("PROBE_TOKEN").is_none(), "{report}");
    assert!(!root.path().join("workspace/out.txt").exists());

    let audit = std::fs::read_to_string(root.path().join("audit.jsonl")).unwrap();
    let record: clawcage_agent::AuditRecord =
        serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    assert_eq!(record.tool, "probe");
    assert_eq!(record.origin.as_deref(), Some("plugin:probe@2.0.1"));
    assert_eq!(record.verdict, "ok");
    assert!(record.session.starts_with("cli-"), "{record:?}");
    assert!(!audit.contains("in.txt"), "{audit}");
}

#[test]
fn an_invalid_operator_grant_is_a_configuration_error() {
    let root = setup();
    std::fs::write(
        root.path().join("clawcage.toml"),
        "[plugins]\ndir = \"plugins\"\n[plugins.grants.probe]\nnetwork = [\"https://api.example.com/v1\"]\n",
    )
    .unwrap();
    let output = clawcage(root.path(), &["tools"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("[plugins.grants.probe] network"),
        "{stderr}"
    );
    assert!(stderr.contains("no scheme or path"), "{stderr}");
}

/// A plugin granted a host the operator also keeps a secret for reaches that host, but the
/// secret header is never added to its requests: secrets belong to the host's own tools. The
/// bundled `web_fetch` to the same server gets the header, so the test sees the difference.
#[test]
fn a_plugin_reaching_a_host_never_gets_the_hosts_secret() {
    let server = clawcage_tests::web::WebServer::start(|_| {
        clawcage_tests::web::Reply::Ok("text/plain", b"hello plugin".to_vec())
    });
    let port = server.port();
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("workspace")).unwrap();
    let fetcher = std::fs::read(fixtures::WASI_HTTP_FETCH).unwrap();
    install(
        &root.path().join("plugins"),
        "fetcher",
        "fetcher",
        &fetcher,
        &digest(&fetcher),
        &format!("[capabilities]\nnetwork = [\"127.0.0.1:{port}\"]\n"),
    );
    std::fs::write(
        root.path().join("clawcage.toml"),
        format!(
            "[plugins]\ndir = \"plugins\"\n\n[plugins.grants.fetcher]\nnetwork = [\"127.0.0.1:{port}\"]\n\n[network]\nallow = [\"127.0.0.1:{port}\"]\n\n[[network.secrets]]\nhost = \"127.0.0.1:{port}\"\nheader = \"X-Api-Key\"\nenv = \"PLUGIN_TEST_SECRET\"\n\n[audit]\nenabled = false\n"
        ),
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{port}/page");
    let call = |tool: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(["call", tool, &serde_json::json!({ "url": url }).to_string()])
            .arg("--workspace")
            .arg(root.path().join("workspace"))
            .arg("--config")
            .arg(root.path().join("clawcage.toml"))
            .arg("--state-dir")
            .arg(clawcage_tests::cli_state::shared_state_dir())
            .env_remove("RUST_LOG")
            .env("PLUGIN_TEST_SECRET", "sk-operator-only")
            .output()
            .expect("clawcage runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("hello plugin"), "{tool}: {stdout}");
        assert!(!stdout.contains("sk-operator-only"), "{tool}: {stdout}");
    };
    call("wasi_http_fetch");
    call("web_fetch");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let key = |n: usize| {
        requests[n]
            .headers
            .iter()
            .find(|(name, _)| name == "x-api-key")
            .map(|(_, value)| value.clone())
    };
    assert_eq!(key(0), None, "the plugin's request carries no secret");
    assert_eq!(
        key(1).as_deref(),
        Some("sk-operator-only"),
        "the bundled web tool's request does"
    );
}

/// Regression: a plugin that never returns kept `clawcage call` running forever, because the
/// sandbox's epoch ticker stopped once the CLI had built its registry. The call must end at the
/// operator's limit (plus a second), exit 1 and say so.
#[test]
fn a_spinning_plugin_is_stopped_at_the_operators_limit() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("workspace")).unwrap();
    let spin = std::fs::read(fixtures::SPIN).unwrap();
    install(
        &root.path().join("plugins"),
        "spin",
        "spin",
        &spin,
        &digest(&spin),
        "",
    );
    std::fs::write(
        root.path().join("clawcage.toml"),
        "[limits]\ntimeout_secs = 1\n\n[plugins]\ndir = \"plugins\"\n\n[plugins.grants.spin]\nworkspace = \"none\"\n\n[audit]\nenabled = false\n",
    )
    .unwrap();
    // The first call may compile the fixture; the second shows the limit alone.
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let output = clawcage(root.path(), &["call", "spin"]);
        let elapsed = started.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("time limit of 1 s"), "{stderr}");
        if elapsed < std::time::Duration::from_secs(2) {
            return;
        }
    }
    panic!("the spinning plugin's call did not end within its 1 s limit plus a second");
}

/// `clawcage call` allocates its one instance on its own (no pool): the operator's memory limit
/// holds there too, and a tool that allocates without bound is an error result, exit 1, not a
/// crash of the process.
#[test]
fn a_hogging_plugin_is_stopped_at_the_operators_memory_limit() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("workspace")).unwrap();
    let hog = std::fs::read(fixtures::HOG).unwrap();
    install(
        &root.path().join("plugins"),
        "hog",
        "hog",
        &hog,
        &digest(&hog),
        "",
    );
    std::fs::write(
        root.path().join("clawcage.toml"),
        "[limits]\nmemory_mib = 40\n\n[plugins]\ndir = \"plugins\"\n\n[plugins.grants.hog]\nworkspace = \"none\"\n\n[audit]\nenabled = false\n",
    )
    .unwrap();
    for _ in 0..2 {
        let output = clawcage(root.path(), &["call", "hog"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("memory limit of 40 MiB"), "{stderr}");
    }
}
