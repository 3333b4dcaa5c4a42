//! The sandbox itself, not the guest's good manners, keeps a component inside its grant: a
//! hostile fixture touches paths with plain `std::fs`, skipping the SDK's checks, and every
//! escape still fails. Checked on the host side afterwards.

use std::fs;
use std::os::unix::fs::symlink;

use clawcage_sandbox::components::fixtures;
use clawcage_sandbox::{FsMode, Limits};
use clawcage_tests::{SecretLayout, fixture, grants, registry_of};
use serde_json::json;

const SECRET: &str = "HOST-ONLY-SECRET";

/// The workspace with a symlink to the secret and one to the directory above.
fn layout() -> SecretLayout {
    let layout = SecretLayout::new(SECRET);
    symlink(&layout.secret, layout.workspace.join("link")).unwrap();
    symlink(
        layout.workspace.parent().unwrap(),
        layout.workspace.join("parent"),
    )
    .unwrap();
    layout
}

async fn hostile(layout: &SecretLayout, mode: FsMode) -> clawcage_agent::ToolRegistry {
    let rawfs = fixture(fixtures::RAWFS);
    registry_of(
        &[("rawfs", &rawfs)],
        grants(&layout.workspace, mode, Limits::default()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_component_cannot_read_outside_the_workspace() {
    let layout = layout();
    let registry = hostile(&layout, FsMode::ReadWrite).await;
    let inside = registry
        .execute_value("raw_read", &json!({"path": "inside.txt"}))
        .await
        .unwrap();
    assert_eq!(inside.text, "inside", "the fixture works inside the grant");

    let secret = layout.secret.to_str().unwrap();
    for path in [
        "../secret.txt",
        secret,
        "link",
        "parent/secret.txt",
        "/etc/passwd",
        "/proc/self/environ",
    ] {
        let result = registry
            .execute_value("raw_read", &json!({"path": path}))
            .await;
        let error = result.expect_err(path);
        assert!(!error.message().contains(SECRET), "{path}: {error}");
        assert!(!error.message().contains("root:x"), "{path}: {error}");
    }
    for path in ["/", "..", "parent", "/tmp"] {
        let result = registry
            .execute_value("raw_list", &json!({"path": path}))
            .await;
        assert!(result.is_err(), "listing {path} must fail: {result:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_component_cannot_write_or_remove_outside_the_workspace() {
    let layout = layout();
    let registry = hostile(&layout, FsMode::ReadWrite).await;
    let parent = layout.workspace.parent().unwrap().to_path_buf();
    let outside_new = parent.join("planted.txt");
    for path in [
        "../planted.txt".to_string(),
        outside_new.to_str().unwrap().to_string(),
        "parent/planted.txt".to_string(),
        "link".to_string(),
        "/tmp/clawcage-planted.txt".to_string(),
    ] {
        let args = json!({"path": path, "content": "planted"});
        let result = registry.execute_value("raw_write", &args).await;
        assert!(result.is_err(), "writing {path} must fail: {result:?}");
    }
    for path in ["..", "/", "/tmp"] {
        let result = registry
            .execute_value("raw_remove", &json!({"path": path}))
            .await;
        assert!(result.is_err(), "removing {path} must fail: {result:?}");
    }
    // Removing a symlink that points out removes the link inside the workspace, never its target.
    let _ = registry
        .execute_value("raw_remove", &json!({"path": "parent"}))
        .await;
    assert_eq!(fs::read_to_string(&layout.secret).unwrap(), SECRET);
    assert!(!outside_new.exists());
    assert!(!std::path::Path::new("/tmp/clawcage-planted.txt").exists());
    assert!(layout.workspace.join("inside.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_grant_holds_against_a_hostile_component() {
    let layout = layout();
    let registry = hostile(&layout, FsMode::ReadOnly).await;
    let args = json!({"path": "inside.txt", "content": "changed"});
    assert!(registry.execute_value("raw_write", &args).await.is_err());
    assert!(
        registry
            .execute_value("raw_write", &json!({"path": "new.txt", "content": "x"}))
            .await
            .is_err()
    );
    assert!(
        registry
            .execute_value("raw_remove", &json!({"path": "."}))
            .await
            .is_err()
    );
    assert_eq!(
        fs::read_to_string(layout.workspace.join("inside.txt")).unwrap(),
        "inside"
    );
    assert!(!layout.workspace.join("new.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_sees_no_host_environment() {
    let layout = layout();
    let registry = hostile(&layout, FsMode::ReadOnly).await;
    let env = registry.execute("raw_env", "{}").await.unwrap().text;
    let mut names: Vec<&str> = env
        .lines()
        .filter_map(|line| line.split('=').next())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "CLAWCAGE_TIME_LIMIT_MS",
            "CLAWCAGE_WORKSPACE",
            "CLAWCAGE_WORKSPACE_MODE",
            "PWD"
        ],
        "{env}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_excluded_tool_is_never_instantiated() {
    let layout = layout();
    let sandbox = clawcage_tests::sandbox();
    let rawfs = fixture(fixtures::RAWFS);
    let echo = fixture(fixtures::ECHO);
    let grants = grants(&layout.workspace, FsMode::ReadWrite, Limits::default());
    let hostile = sandbox
        .load("rawfs", "test:rawfs", &rawfs, grants.clone())
        .await
        .unwrap();
    let friendly = sandbox
        .load("echo", "test:echo", &echo, grants)
        .await
        .unwrap();
    let mut registry = clawcage_agent::ToolRegistry::new();
    for tool in hostile.tools().iter().chain(friendly.tools()) {
        registry
            .register(std::sync::Arc::new(tool.clone()))
            .unwrap();
    }
    let before = hostile.instantiations();
    let narrowed =
        registry.exclude(&["raw_read", "raw_write", "raw_list", "raw_remove", "raw_env"]);
    for name in ["raw_read", "raw_write", "raw_env"] {
        let error = narrowed
            .execute_value(name, &json!({"path": "inside.txt", "content": "x"}))
            .await
            .unwrap_err();
        assert!(error.message().contains("unknown tool"), "{error}");
    }
    narrowed.execute("echo", r#"{"text": "ok"}"#).await.unwrap();
    assert_eq!(
        hostile.instantiations(),
        before,
        "the excluded component was never instantiated"
    );
    registry.execute("raw_env", "{}").await.unwrap();
    assert_eq!(
        hostile.instantiations(),
        before + 1,
        "the original registry still has it"
    );
}

/// No component opens a socket: every WASI context starts with sockets and name lookup denied
/// (`wasi_context::denied`), and a network grant opens only the host's policed HTTP, not raw
/// TCP. A plain `TcpStream::connect` to a listener on loopback, even one the network grant
/// allows, fails, and the listener never sees a connection; a name lookup fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_component_opens_a_socket_or_resolves_a_name_even_with_a_network_grant() {
    use clawcage_sandbox::network::{AllowList, NetworkPolicy};

    let layout = layout();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    let policy = NetworkPolicy::new(
        AllowList::parse([address.to_string(), "localhost:*".to_string()]).unwrap(),
    );
    let probe = fixture(fixtures::PROBE);
    let registry = registry_of(
        &[("probe", &probe)],
        grants(&layout.workspace, FsMode::ReadWrite, Limits::default()).with_network(policy),
    )
    .await;
    let output = registry
        .execute_value(
            "probe",
            &json!({"connect": address.to_string(), "lookup": format!("localhost:{}", address.port())}),
        )
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&output.text).unwrap();
    assert!(report["connect"]["error"].is_string(), "{report}");
    assert!(report["lookup"]["error"].is_string(), "{report}");
    match listener.accept() {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the listener got a connection from the sandbox: {other:?}"),
    }
}
