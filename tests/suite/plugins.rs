//! Plugins: real components with manifests in a real plugins directory, loaded with the operator's
//! grants. Each way a plugin can be refused (digest mismatch, an import that is not granted, a
//! malformed manifest, a component that is not a tool, a missing manifest, a duplicate name) is
//! reported with a clear reason while the good plugins beside it load and run; the effective grant
//! is the intersection of manifest and operator grant, observed from inside the component.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawcage_agent::ToolRegistry;
use clawcage_core::Tool as _;
use clawcage_sandbox::components::fixtures;
use clawcage_sandbox::plugin::HOST_SECRET_ENV;
use clawcage_sandbox::{FsMode, Limits, PluginLoader, PluginReport, PluginsSection};
use clawcage_tests::web::{Reply as WebReply, WebServer};
use clawcage_tests::{fixture, grants, sandbox};
use serde_json::Value;

use crate::file_attacks::Fifo;

/// Installs a plugin directory `folder` in `plugins`: the component as `tool.wasm` and a manifest
/// naming `name`, with `sha256` (the component's real digest when `None`) and `rest` appended.
fn install(
    plugins: &Path,
    folder: &str,
    name: &str,
    component: &[u8],
    sha256: Option<&str>,
    rest: &str,
) -> PathBuf {
    let dir = plugins.join(folder);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tool.wasm"), component).unwrap();
    let digest = sha256.map_or_else(|| sha256_hex(component), str::to_string);
    std::fs::write(
        dir.join("plugin.toml"),
        format!(
            "name = \"{name}\"\nversion = \"1.0.0\"\ncomponent = \"tool.wasm\"\nsha256 = \"{digest}\"\n{rest}"
        ),
    )
    .unwrap();
    dir
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The host environment the loader sees in these tests.
fn host_env(name: &str) -> Option<String> {
    match name {
        "GREETING" => Some("hello from the host".to_string()),
        "OTHER" => Some("never granted".to_string()),
        "GITHUB_TOKEN" => Some("ghp_not_for_plugins".to_string()),
        "OPENAI_API_KEY" => Some("sk-host-credential".to_string()),
        _ => None,
    }
}

async fn load(
    plugins: &Path,
    operator: &str,
    workspace: &Path,
    mode: FsMode,
) -> (PluginReport, ToolRegistry) {
    let mut config: PluginsSection = toml::from_str(operator).unwrap();
    config.dir = Some(plugins.to_path_buf());
    config.validate().unwrap();
    let base = grants(workspace, mode, Limits::default());
    let loader = PluginLoader {
        sandbox: &sandbox(),
        config: &config,
        base: &base,
        host_secrets: HOST_SECRET_ENV.iter().map(|s| s.to_string()).collect(),
        host_env: &host_env,
    };
    let report = loader.load_all().await;
    let mut registry = ToolRegistry::new();
    for plugin in &report.loaded {
        // Several probe plugins offer a tool named `probe`: the first one is registered, and the
        // tests call the others through the report.
        for tool in &plugin.tools {
            if !registry.contains(&tool.spec().name) {
                registry.register(Arc::new(tool.clone())).unwrap();
            }
        }
    }
    (report, registry)
}

fn refusal<'a>(report: &'a PluginReport, folder: &str) -> &'a str {
    report
        .refused
        .iter()
        .find(|refused| refused.path.to_string_lossy().contains(folder))
        .map(|refused| refused.reason.as_str())
        .unwrap_or_else(|| panic!("no refusal for {folder}: {report:#?}"))
}

async fn probe(report: &PluginReport, plugin: &str, args: Value) -> Value {
    let loaded = report
        .loaded
        .iter()
        .find(|loaded| loaded.name == plugin)
        .unwrap_or_else(|| panic!("{plugin} did not load: {report:#?}"));
    let output = loaded.tools[0]
        .wasm()
        .call_json(&args.to_string())
        .await
        .unwrap();
    serde_json::from_str(&output.text).unwrap()
}

const OPERATOR: &str = r#"
[grants.granted]
workspace = "rw"
network = ["api.example.com"]
env = ["GREETING"]

[grants.partial]
workspace = "ro"
network = ["api.example.com"]
env = ["GREETING", "GITHUB_TOKEN", "OPENAI_API_KEY"]
allow_secret_env = ["OPENAI_API_KEY"]

[grants.tampered]
workspace = "rw"

[grants.ungranted]
workspace = "rw"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_plugins_load_with_the_intersection_and_bad_ones_are_refused_with_the_reason() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "inside").unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let probe_bytes = fixture(fixtures::PROBE);
    let echo_bytes = fixture(fixtures::ECHO);
    let asks_everything = "[capabilities]\nworkspace = \"rw\"\nnetwork = [\"api.example.com\", \"evil.example\"]\nenv = [\"GREETING\", \"OTHER\", \"GITHUB_TOKEN\", \"OPENAI_API_KEY\"]\n";
    install(
        plugins.path(),
        "a-granted",
        "granted",
        &probe_bytes,
        None,
        asks_everything,
    );
    install(
        plugins.path(),
        "b-partial",
        "partial",
        &probe_bytes,
        None,
        asks_everything,
    );
    install(
        plugins.path(),
        "c-nogrant",
        "nogrant",
        &probe_bytes,
        None,
        asks_everything,
    );
    install(
        plugins.path(),
        "d-tampered",
        "tampered",
        &echo_bytes,
        Some(&sha256_hex(b"the component the author published")),
        "",
    );
    install(
        plugins.path(),
        "e-ungranted",
        "ungranted",
        &fixture(fixtures::UNGRANTED),
        None,
        "",
    );
    install(
        plugins.path(),
        "f-command",
        "command",
        &fixture(fixtures::NOT_A_TOOL),
        None,
        "",
    );
    let malformed = plugins.path().join("g-malformed");
    std::fs::create_dir_all(&malformed).unwrap();
    std::fs::write(
        malformed.join("plugin.toml"),
        "name = \"malformed\"\nversion = 1.0\n[[[",
    )
    .unwrap();
    std::fs::create_dir_all(plugins.path().join("h-no-manifest")).unwrap();
    install(
        plugins.path(),
        "i-duplicate",
        "granted",
        &echo_bytes,
        None,
        "",
    );
    // A file pair at the top level: echo.toml beside echo.wasm.
    std::fs::write(plugins.path().join("echo.wasm"), &echo_bytes).unwrap();
    std::fs::write(
        plugins.path().join("echo.toml"),
        format!(
            "name = \"echo\"\nversion = \"0.3.0\"\ncomponent = \"echo.wasm\"\nsha256 = \"{}\"\n",
            sha256_hex(&echo_bytes)
        ),
    )
    .unwrap();

    let (report, registry) = load(
        plugins.path(),
        OPERATOR,
        workspace.path(),
        FsMode::ReadWrite,
    )
    .await;

    let loaded: Vec<&str> = report.loaded.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        loaded,
        ["granted", "partial", "nogrant", "echo"],
        "{report:#?}"
    );
    assert_eq!(report.refused.len(), 6, "{report:#?}");

    // Refusals, each with a reason that says what is wrong.
    let tampered = refusal(&report, "d-tampered");
    assert!(tampered.contains("digest mismatch"), "{tampered}");
    assert!(tampered.contains(&sha256_hex(&echo_bytes)), "{tampered}");
    let ungranted = refusal(&report, "e-ungranted");
    assert!(
        ungranted.contains("fixture:ungranted/telemetry"),
        "{ungranted}"
    );
    assert!(ungranted.contains("not granted"), "{ungranted}");
    let command = refusal(&report, "f-command");
    assert!(
        command.contains("does not export the tool interface"),
        "{command}"
    );
    let malformed = refusal(&report, "g-malformed");
    assert!(
        malformed.contains("the manifest is malformed"),
        "{malformed}"
    );
    let missing = refusal(&report, "h-no-manifest");
    assert!(missing.contains("there is no plugin.toml"), "{missing}");
    let duplicate = refusal(&report, "i-duplicate");
    assert!(
        duplicate.contains("another plugin named `granted`"),
        "{duplicate}"
    );

    // Fully granted: the workspace read-write, the granted variable and nothing else.
    let granted = probe(
        &report,
        "granted",
        serde_json::json!({"read": "notes.txt", "write": "from-granted.txt"}),
    )
    .await;
    assert_eq!(granted["env"]["GREETING"], "hello from the host");
    assert!(granted["env"].get("OTHER").is_none(), "{granted}");
    assert!(granted["env"].get("GITHUB_TOKEN").is_none(), "{granted}");
    assert_eq!(granted["read"]["ok"], "inside");
    assert_eq!(granted["write"]["ok"], true, "{granted}");
    assert!(workspace.path().join("from-granted.txt").exists());
    let granted_plugin = &report.loaded[0];
    assert!(
        granted_plugin.grants.contains("(rw)"),
        "{}",
        granted_plugin.grants
    );
    assert!(
        granted_plugin.grants.contains("env GREETING"),
        "{}",
        granted_plugin.grants
    );
    assert!(
        granted_plugin.grants.contains("network: api.example.com"),
        "{}",
        granted_plugin.grants
    );

    // Partially granted: read-only, GREETING only; the token-like name and the host credential
    // are refused even though the operator listed them.
    let partial = probe(
        &report,
        "partial",
        serde_json::json!({"read": "notes.txt", "write": "from-partial.txt"}),
    )
    .await;
    assert_eq!(partial["read"]["ok"], "inside");
    assert!(partial["write"]["error"].is_string(), "{partial}");
    assert!(!workspace.path().join("from-partial.txt").exists());
    let env = partial["env"].as_object().unwrap();
    assert_eq!(env["GREETING"], "hello from the host");
    for absent in ["OTHER", "GITHUB_TOKEN", "OPENAI_API_KEY"] {
        assert!(!env.contains_key(absent), "{absent} leaked: {partial}");
    }
    let partial_plugin = &report.loaded[1];
    assert!(
        partial_plugin.grants.contains("(ro)"),
        "{}",
        partial_plugin.grants
    );
    assert!(
        !partial_plugin.grants.contains("evil.example"),
        "{}",
        partial_plugin.grants
    );
    let notes = partial_plugin.notes.join("\n");
    assert!(
        notes.contains("asked for the workspace rw, granted ro"),
        "{notes}"
    );
    assert!(notes.contains("env OTHER, not granted"), "{notes}");
    assert!(
        notes.contains("env GITHUB_TOKEN refused: its name looks like a secret"),
        "{notes}"
    );
    assert!(
        notes.contains("env OPENAI_API_KEY refused: it holds one of clawcage's own credentials"),
        "{notes}"
    );
    assert!(
        notes.contains("network host evil.example, not granted"),
        "{notes}"
    );

    // No grant at all: it runs, but sees no file and no variable.
    let nogrant = probe(&report, "nogrant", serde_json::json!({"read": "notes.txt"})).await;
    assert!(nogrant["read"]["error"].is_string(), "{nogrant}");
    let names: Vec<&String> = nogrant["env"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["CLAWCAGE_TIME_LIMIT_MS"], "{nogrant}");
    assert!(
        report.loaded[2].grants.starts_with("no files"),
        "{}",
        report.loaded[2].grants
    );

    // The file-pair plugin works, and its origin names it.
    let echo = registry.get("echo").unwrap();
    assert_eq!(echo.origin(), "plugin:echo@0.3.0");
    let echoed = registry
        .execute("echo", r#"{"text":"still serving"}"#)
        .await
        .unwrap();
    assert_eq!(echoed.text, "still serving");
    let probe_tool = registry.get("probe").unwrap();
    assert_eq!(probe_tool.origin(), "plugin:granted@1.0.0");
}

/// A plugin's network grant is the hosts both its manifest and the operator list, enforced by
/// the host's network policy: it reaches exactly those, and a plugin without a network grant that
/// imports `wasi:http` does not load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_reaches_only_the_hosts_both_sides_grant() {
    let server = WebServer::start(|_| WebReply::Ok("text/plain", b"hello plugin".to_vec()));
    let other = WebServer::start(|_| WebReply::Ok("text/plain", b"not for plugins".to_vec()));
    let (port, other_port) = (server.port(), other.port());
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let fetcher = fixture(fixtures::WASI_HTTP_FETCH);
    let asks =
        format!("[capabilities]\nnetwork = [\"127.0.0.1:{port}\", \"127.0.0.1:{other_port}\"]\n");
    install(plugins.path(), "fetcher", "fetcher", &fetcher, None, &asks);
    install(plugins.path(), "offline", "offline", &fetcher, None, &asks);
    let operator =
        format!("[grants.fetcher]\nnetwork = [\"127.0.0.1:{port}\"]\n\n[grants.offline]\n");
    let (report, _) = load(
        plugins.path(),
        &operator,
        workspace.path(),
        FsMode::ReadWrite,
    )
    .await;

    let fetcher = report
        .loaded
        .iter()
        .find(|plugin| plugin.name == "fetcher")
        .unwrap_or_else(|| panic!("{report:#?}"));
    assert!(
        fetcher
            .grants
            .contains(&format!("network: 127.0.0.1:{port}")),
        "{}",
        fetcher.grants
    );
    let call = |url: String| {
        let tool = fetcher.tools[0].wasm().clone();
        async move {
            tool.call_json(&serde_json::json!({ "url": url }).to_string())
                .await
        }
    };
    let allowed = call(format!("http://127.0.0.1:{port}/")).await.unwrap();
    assert!(allowed.text.contains("hello plugin"), "{}", allowed.text);
    let refused = call(format!("http://127.0.0.1:{other_port}/"))
        .await
        .unwrap_err();
    assert!(
        !refused.to_string().contains("not for plugins"),
        "the host the operator did not grant stays closed: {refused}"
    );
    assert_eq!(
        other.requests().len(),
        0,
        "nothing reached the ungranted host"
    );

    let offline = refusal(&report, "offline");
    assert!(
        offline.contains("wasi:http") && offline.contains("network"),
        "{offline}"
    );
    // What it asked for, what it got, and the exact key that would change it.
    assert!(
        offline.contains(&format!("its manifest asks for 127.0.0.1:{port}")),
        "{offline}"
    );
    assert!(
        offline.contains("list the host in [plugins.grants.offline] network in clawcage.toml"),
        "{offline}"
    );
    assert!(!offline.contains("[network] allow"), "{offline}");
    assert!(!offline.contains("refused: "), "said once: {offline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_run_narrows_a_read_write_plugin_grant() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    install(
        plugins.path(),
        "granted",
        "granted",
        &fixture(fixtures::PROBE),
        None,
        "[capabilities]\nworkspace = \"rw\"\n",
    );
    let (report, _) = load(plugins.path(), OPERATOR, workspace.path(), FsMode::ReadOnly).await;
    let result = probe(&report, "granted", serde_json::json!({"write": "x.txt"})).await;
    assert!(result["write"]["error"].is_string(), "{result}");
    assert!(!workspace.path().join("x.txt").exists());
    let plugin = &report.loaded[0];
    assert!(plugin.grants.contains("(ro)"), "{}", plugin.grants);
    assert!(
        plugin
            .notes
            .iter()
            .any(|note| note.contains("narrowed to ro")),
        "{:?}",
        plugin.notes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_plugins_directory_and_stray_grants_are_reported() {
    let workspace = tempfile::tempdir().unwrap();
    let missing = workspace.path().join("no-such-plugins");
    let (report, registry) = load(&missing, OPERATOR, workspace.path(), FsMode::ReadWrite).await;
    assert!(report.loaded.is_empty() && registry.names().is_empty());
    assert!(
        report.refused[0]
            .reason
            .contains("the plugins directory cannot be read"),
        "{report:#?}"
    );

    let empty = tempfile::tempdir().unwrap();
    let (report, _) = load(empty.path(), OPERATOR, workspace.path(), FsMode::ReadWrite).await;
    assert!(
        report
            .warnings
            .iter()
            .any(|warning| warning.contains("[plugins.grants.granted] names no plugin")),
        "{report:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_as_manifest_or_component_is_refused_at_once_and_the_others_load() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let echo = fixture(fixtures::ECHO);
    install(plugins.path(), "a-good", "good", &echo, None, "");
    // A plugin directory whose manifest is a FIFO, and a loose manifest that is one.
    let folder = plugins.path().join("b-fifo-manifest");
    std::fs::create_dir(&folder).unwrap();
    let manifest = Fifo::make(&folder.join("plugin.toml"));
    let loose = Fifo::make(&plugins.path().join("c-loose.toml"));
    // A manifest whose component is a FIFO (the digest is that of real bytes).
    let dir = install(plugins.path(), "d-fifo-component", "piped", &echo, None, "");
    std::fs::remove_file(dir.join("tool.wasm")).unwrap();
    let component = Fifo::make(&dir.join("tool.wasm"));

    // Without the fix the loader would wait on a FIFO forever: the watchdogs end that wait (a
    // manifest then reads as empty), so the assertions below fail instead of the suite hanging.
    let _watchdogs = [&manifest, &loose, &component]
        .map(|fifo| fifo.watchdog(std::time::Duration::from_secs(10)));
    let (report, registry) = load(plugins.path(), "", workspace.path(), FsMode::ReadWrite).await;

    let loaded: Vec<&str> = report
        .loaded
        .iter()
        .map(|plugin| plugin.name.as_str())
        .collect();
    assert_eq!(loaded, ["good"], "{report:#?}");
    assert!(registry.contains("echo"), "{:?}", registry.names());
    for (folder, fifo) in [
        ("b-fifo-manifest", &manifest),
        ("c-loose", &loose),
        ("d-fifo-component", &component),
    ] {
        let reason = refusal(&report, folder);
        assert!(
            reason.contains(&fifo.path.display().to_string()),
            "{folder}: the path is named: {reason}"
        );
        assert!(reason.contains("FIFO"), "{folder}: {reason}");
        fifo.assert_still_a_fifo();
    }
}

/// A plugin's request to a host outside its grant is refused with the key that would allow it:
/// the plugin's own grant, never `[network] allow`, which does not apply to plugins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_refused_a_host_is_told_its_own_grant_key() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    install(
        plugins.path(),
        "webby",
        "webby",
        &clawcage_sandbox::components::bundled::WEB.bytes().unwrap(),
        None,
        "[capabilities]\nnetwork = [\"api.example.com\"]\n",
    );
    let (report, registry) = load(
        plugins.path(),
        "[grants.webby]\nnetwork = [\"api.example.com\"]\n",
        workspace.path(),
        FsMode::ReadWrite,
    )
    .await;
    assert_eq!(report.loaded.len(), 1, "{report:#?}");
    let error = registry
        .execute("web_fetch", r#"{"url":"https://other.example/"}"#)
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .contains("add \"other.example\" to [plugins.grants.webby] network in clawcage.toml"),
        "{error}"
    );
    assert!(!error.message().contains("[network] allow"), "{error}");
}
