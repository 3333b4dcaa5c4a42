//! Misbehaving components built only for the tests: one that never returns, one that allocates
//! without bound, one that panics. Each becomes a failed result for the model, and the next call
//! on the same registry succeeds.

use std::time::{Duration, Instant};

use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::{ComponentCode, FsMode, Limits};
use clawcage_tests::{fixture, grants, registry_of};

async fn registry(dir: &std::path::Path, limits: Limits) -> clawcage_agent::ToolRegistry {
    let spin = fixture(fixtures::SPIN);
    let hog = fixture(fixtures::HOG);
    let crash = fixture(fixtures::CRASH);
    let echo = fixture(fixtures::ECHO);
    registry_of(
        &[
            ("file", ComponentCode::from(bundled::FILE)),
            ("spin", ComponentCode::from(&spin)),
            ("hog", ComponentCode::from(&hog)),
            ("crash", ComponentCode::from(&crash)),
            ("echo", ComponentCode::from(&echo)),
        ],
        grants(dir, FsMode::ReadWrite, limits),
    )
    .await
}

async fn still_serving(registry: &clawcage_agent::ToolRegistry) {
    let echoed = registry
        .execute("echo", r#"{"text": "still here"}"#)
        .await
        .unwrap()
        .text;
    assert_eq!(echoed, "still here");
    registry
        .execute("read_file", r#"{"path": "a.txt"}"#)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_at_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let limits = Limits {
        timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let registry = registry(dir.path(), limits).await;
    let started = Instant::now();
    let error = registry.execute("spin", "{}").await.unwrap_err();
    assert_eq!(error.kind(), "failed");
    assert!(error.message().contains("time limit"), "{error}");
    // Generous bound: only checks that the call was stopped rather than left to run.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped, not left running"
    );
    still_serving(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_allocation_hits_the_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let limits = Limits {
        memory_bytes: 32 << 20,
        ..Limits::default()
    };
    let registry = registry(dir.path(), limits).await;
    let error = registry.execute("hog", "{}").await.unwrap_err();
    assert_eq!(error.kind(), "failed");
    assert!(
        error.message().contains("memory limit of 32 MiB"),
        "{error}"
    );
    still_serving(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_a_failed_result_with_the_panic_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let registry = registry(dir.path(), Limits::default()).await;
    let error = registry.execute("crash", "{}").await.unwrap_err();
    assert_eq!(error.kind(), "failed");
    assert!(error.message().contains("crashed"), "{error}");
    assert!(
        error
            .message()
            .contains("deliberate panic for the crash test"),
        "{error}"
    );
    still_serving(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_each_get_a_fresh_instance() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let registry = std::sync::Arc::new(registry(dir.path(), Limits::default()).await);
    let mut calls = Vec::new();
    for i in 0..50 {
        let registry = registry.clone();
        calls.push(tokio::spawn(async move {
            let args = serde_json::json!({"text": format!("call {i}")});
            registry.execute_value("echo", &args).await.unwrap().text
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap(), format!("call {i}"));
    }
}

/// The engine resets a pooled memory slot with `memset` (the low part) and `madvise` (the rest)
/// when an instance ends, and reuses the slot for the next one: a call never finds what an
/// earlier call of any tool left in memory — neither a counter in its data nor a marked buffer in
/// its zeroed data — also after a call that grew the memory to near its limit and one that
/// trapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_an_earlier_call_left_in_memory_is_seen_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let registry = registry(dir.path(), Limits::default()).await;
    let fresh = serde_json::json!({"earlier_calls": 0, "marked_bytes": 0});
    for round in 0..20 {
        let text = registry.execute("leftovers", "{}").await.unwrap().text;
        let seen: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(seen, fresh, "round {round}");
        match round % 4 {
            1 => {
                registry.execute("hog", "{}").await.unwrap_err();
            }
            2 => {
                registry.execute("crash", "{}").await.unwrap_err();
            }
            _ => {}
        }
    }
}

/// Regression: the epoch ticker belonged to the `Sandbox` value and stopped when it was dropped,
/// so every tool loaded by a front end that let it go (the CLI did) lost its time limit: a guest
/// that never returned was never interrupted. The ticker now lives as long as any tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_keep_their_time_limit_after_the_sandbox_value_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = clawcage_sandbox::Sandbox::new(clawcage_sandbox::SandboxOptions::new(
        clawcage_sandbox::ArtifactCache::in_dir(clawcage_tests::cache_dir()),
    ))
    .unwrap();
    let limits = Limits {
        timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let spin = fixture(fixtures::SPIN);
    let loaded = sandbox
        .load(
            "spin",
            "test:spin",
            &spin,
            grants(dir.path(), FsMode::ReadWrite, limits),
        )
        .await
        .unwrap();
    let tool = loaded.tools()[0].clone();
    drop(loaded);
    drop(sandbox);
    let started = Instant::now();
    let call = tokio::time::timeout(Duration::from_secs(10), tool.call_json("{}")).await;
    let error = call
        .expect("the call ends at its own limit, not never")
        .unwrap_err();
    assert!(error.message().contains("time limit"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2) + Duration::from_secs(1),
        "ended within its limit plus a second (and the component's loading): {:?}",
        started.elapsed()
    );
}
