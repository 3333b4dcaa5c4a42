//! The audit log: every call through an `AuditedRegistry` — allowed, refused by the sandbox,
//! refused by the schema, for an unknown tool, or abandoned by its caller — leaves one JSON line
//! with the session, tool, origin, grants, verdict, duration and the SHA-256 of the arguments, and
//! the arguments themselves never appear in the file.

use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::audit::args_digest;
use clawcage_agent::{AuditLog, AuditRecord, AuditedRegistry};
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::{FsMode, Limits};
use clawcage_tests::{fixture, grants, registry_of};
use serde_json::json;

fn records(path: &std::path::Path) -> Vec<AuditRecord> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_recorded_with_a_digest_of_its_arguments_never_the_arguments() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("secret-plans.txt"), "the plans").unwrap();
    let state = tempfile::tempdir().unwrap();
    let log_path = state.path().join("logs").join("audit.jsonl");
    let registry = registry_of(
        &[("file", bundled::FILE)],
        grants(workspace.path(), FsMode::ReadWrite, Limits::default()),
    )
    .await;
    let audited =
        AuditedRegistry::new(registry, Some(Arc::new(AuditLog::open(&log_path).unwrap())));

    let read = json!({"path": "secret-plans.txt"});
    audited
        .execute_value("session-a", "read_file", &read)
        .await
        .unwrap();
    let escape = json!({"path": "/etc/shadow-of-a-doubt"});
    audited
        .execute_value("session-a", "read_file", &escape)
        .await
        .unwrap_err();
    audited
        .execute("session-b", "read_file", r#"{"path": 42}"#)
        .await
        .unwrap_err();
    audited
        .execute(
            "session-b",
            "no_such_tool",
            r#"{"x": "unknown-tool-argument"}"#,
        )
        .await
        .unwrap_err();
    audited
        .execute("session-b", "read_file", "not json at all")
        .await
        .unwrap_err();

    let text = std::fs::read_to_string(&log_path).unwrap();
    for value in [
        "secret-plans",
        "shadow-of-a-doubt",
        "unknown-tool-argument",
        "not json at all",
        "the plans",
    ] {
        assert!(
            !text.contains(value),
            "the audit log contains {value:?}:\n{text}"
        );
    }
    let lines = records(&log_path);
    assert_eq!(lines.len(), 5, "{text}");

    let ok = &lines[0];
    assert_eq!(ok.session, "session-a");
    assert_eq!(ok.tool, "read_file");
    assert_eq!(ok.verdict, "ok");
    assert_eq!(ok.args_sha256, args_digest(&read));
    assert_eq!(ok.args_sha256.len(), 64);
    assert_eq!(ok.origin.as_deref(), Some("test:file"));
    assert!(ok.grants.as_deref().unwrap().contains("(rw)"), "{ok:?}");
    assert!(ok.duration_ms >= 0.0);
    assert!(ok.time.ends_with('Z') && ok.time.len() == 24, "{}", ok.time);

    assert_ne!(
        lines[1].verdict, "ok",
        "the escape must not succeed: {:?}",
        lines[1]
    );
    assert_eq!(lines[1].args_sha256, args_digest(&escape));
    assert_eq!(lines[2].verdict, "invalid_args");
    assert_eq!(lines[2].session, "session-b");
    assert_eq!(lines[3].tool, "no_such_tool");
    assert_eq!(lines[3].verdict, "invalid_args");
    assert_eq!(lines[3].origin, None);
    assert_eq!(lines[3].grants, None);
    assert_eq!(lines[4].verdict, "invalid_args");
    assert_eq!(lines[4].args_sha256.len(), 64);

    // Arguments that differ only in spacing or key order have one digest.
    assert_eq!(
        args_digest(&serde_json::from_str(r#"{ "path" : "secret-plans.txt" }"#).unwrap()),
        ok.args_sha256
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_abandoned_by_its_caller_is_recorded_as_cancelled() {
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let log_path = state.path().join("audit.jsonl");
    let spin = fixture(fixtures::SPIN);
    let registry = registry_of(
        &[("spin", &spin)],
        grants(workspace.path(), FsMode::ReadWrite, Limits::default()),
    )
    .await;
    let audited =
        AuditedRegistry::new(registry, Some(Arc::new(AuditLog::open(&log_path).unwrap())));
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        audited.execute("impatient", "spin", "{}"),
    )
    .await;
    assert!(gave_up.is_err(), "spin never returns");
    let lines = records(&log_path);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].verdict, "cancelled");
    assert_eq!(lines[0].session, "impatient");
}
