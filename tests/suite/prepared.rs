//! Instances made ahead of their calls (the sandbox's `prepared` module): a call takes an
//! instance that was made and instantiated before it was asked for, and every guarantee of a
//! fresh instance per call still holds on that path — nothing of one call reaches the next, the
//! time and memory limits count from the call, a replaced workspace is seen, the waiting
//! instances and the background work are bounded and an idle one is dropped.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clawcage_core::ToolError;
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::{
    ArtifactCache, FsMode, Limits, Sandbox, SandboxOptions, WasmTool, WorkspaceGrant,
};
use clawcage_tests::{cache_dir, fixture};

/// How long an instance may wait unused in this file's sandbox: short, so the trimming is seen.
const IDLE: Duration = Duration::from_millis(400);

/// This file's sandbox: its own engine, so its waiting instances are counted apart from the
/// other tests'.
fn sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX.get_or_init(|| sandbox_with_idle(IDLE)).clone()
}

fn sandbox_with_idle(idle: Duration) -> Arc<Sandbox> {
    Sandbox::new(SandboxOptions {
        idle_instances: idle,
        ..SandboxOptions::new(ArtifactCache::in_dir(cache_dir()))
    })
    .unwrap()
}

/// The tools of the component `bytes` granted `dir` read-write with `limits`.
async fn load<'a>(
    sandbox: &Arc<Sandbox>,
    name: &str,
    code: impl Into<clawcage_sandbox::ComponentCode<'a>>,
    dir: &std::path::Path,
    limits: Limits,
) -> Vec<WasmTool> {
    let grants =
        clawcage_sandbox::Grants::workspace(WorkspaceGrant::new(dir, FsMode::ReadWrite).unwrap())
            .with_limits(limits);
    sandbox
        .load(name, &format!("test:{name}"), code, grants)
        .await
        .unwrap()
        .into_tools()
}

/// The echo fixture's tools (`echo`, `leftovers`) in this file's sandbox, granted `dir`.
async fn echo_fixture(dir: &std::path::Path) -> Vec<WasmTool> {
    load(
        &sandbox(),
        "echo",
        &fixture(fixtures::ECHO),
        dir,
        Limits::default(),
    )
    .await
}

fn tool<'a>(tools: &'a [WasmTool], name: &str) -> &'a WasmTool {
    tools
        .iter()
        .find(|tool| clawcage_core::Tool::spec(*tool).name == name)
        .unwrap()
}

async fn call(tool: &WasmTool, args: serde_json::Value) -> Result<String, ToolError> {
    tool.call_json(&args.to_string())
        .await
        .map(|output| output.text)
}

/// Waits until `count` instances wait for `tool`'s component.
async fn until_waiting(tool: &WasmTool, count: usize) {
    let started = Instant::now();
    while tool.waiting_instances() != count {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} instances wait, not {count}",
            tool.waiting_instances()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The invariant: an instance serves one call. The `leftovers` tool counts its calls in a global
/// and marks a zeroed buffer; taken from the waiting instances, alone or eight at once, it always
/// finds itself fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_made_ahead_serves_exactly_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let tools = echo_fixture(dir.path()).await;
    let leftovers = tool(&tools, "leftovers");
    let fresh = serde_json::json!({"earlier_calls": 0, "marked_bytes": 0});
    let first = call(leftovers, serde_json::json!({})).await.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&first).unwrap(),
        fresh
    );
    for round in 0..10 {
        until_waiting(leftovers, 1).await;
        let seen = call(leftovers, serde_json::json!({})).await.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
            fresh,
            "round {round}"
        );
    }
    until_waiting(leftovers, 1).await;
    let mut calls = Vec::new();
    for _ in 0..8 {
        let leftovers = leftovers.clone();
        calls.push(tokio::spawn(async move {
            call(&leftovers, serde_json::json!({})).await.unwrap()
        }));
    }
    for seen in calls {
        let seen = seen.await.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
            fresh
        );
    }
    // Never more than two wait for one component, however many calls came at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(leftovers.waiting_instances() <= 2);
}

/// Calls back to back, more than the engine's pool has slots (200), on a runtime whose one
/// worker is held meanwhile: every call succeeds in a fresh instance (once the preparation
/// cannot keep up, each makes its own and drops its own store, and at most two background jobs
/// are under way per component, so used stores never pile up), and once the calls stop an
/// instance is made ahead again.
#[test]
fn calls_back_to_back_never_exhaust_the_pool() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = runtime.block_on(echo_fixture(dir.path()));
    let leftovers = tool(&tools, "leftovers").clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    runtime.spawn(async move {
        held_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(60));
    });
    held_rx.recv().unwrap();
    let fresh = serde_json::json!({"earlier_calls": 0, "marked_bytes": 0});
    runtime.block_on(async {
        for index in 0..300 {
            let seen = call(&leftovers, serde_json::json!({}))
                .await
                .unwrap_or_else(|error| panic!("call {index}: {error}"));
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
                fresh,
                "call {index}"
            );
            assert!(leftovers.waiting_instances() <= 2);
        }
    });
    release_tx.send(()).unwrap();
    // Once the calls stop, instances are made ahead again (one or two; they are trimmed again
    // after `IDLE` unused, so it is seen while they wait).
    let started = Instant::now();
    while leftovers.waiting_instances() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no instance was made ahead again after the calls stopped"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let seen = runtime
        .block_on(call(&leftovers, serde_json::json!({})))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
        fresh
    );
}

/// The time limit starts when the call starts: an instance that waited twice the limit still
/// has all of it, and a guest that never returns is stopped at the limit on this path too; the
/// memory limit holds on it as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_count_from_the_call_not_from_the_making() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        timeout: Duration::from_millis(300),
        memory_bytes: 48 << 20,
        ..Limits::default()
    };
    // Its own sandbox: the instance must wait longer than this file's idle time.
    let sandbox = sandbox_with_idle(Duration::from_secs(60));
    let echo = load(
        &sandbox,
        "echo",
        &fixture(fixtures::ECHO),
        dir.path(),
        limits,
    )
    .await;
    let echo = tool(&echo, "echo");
    assert_eq!(
        call(echo, serde_json::json!({"text": "a"})).await.unwrap(),
        "a"
    );
    until_waiting(echo, 1).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        call(echo, serde_json::json!({"text": "b"})).await.unwrap(),
        "b"
    );

    let spin = load(
        &sandbox,
        "spin",
        &fixture(fixtures::SPIN),
        dir.path(),
        limits,
    )
    .await;
    let spin = tool(&spin, "spin");
    for round in 0..2 {
        if round > 0 {
            until_waiting(spin, 1).await;
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let started = Instant::now();
        let error = call(spin, serde_json::json!({})).await.unwrap_err();
        assert!(error.message().contains("time limit"), "{error}");
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "round {round}"
        );
        // The first call also loads (perhaps compiles) the component: only the second, on an
        // instance made ahead, is held to a bound of its own.
        if round > 0 {
            assert!(started.elapsed() < Duration::from_secs(10), "round {round}");
        }
    }

    let hog = load(&sandbox, "hog", &fixture(fixtures::HOG), dir.path(), limits).await;
    let hog = tool(&hog, "hog");
    for round in 0..2 {
        if round > 0 {
            until_waiting(hog, 1).await;
        }
        let error = call(hog, serde_json::json!({})).await.unwrap_err();
        assert!(
            error.message().contains("memory limit of 48 MiB"),
            "{error}"
        );
    }
}

/// An instance opens the workspace when it is made; if the directory at the granted path is
/// replaced before the call, the call does not use it and sees the new directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_replaced_at_its_path_is_what_the_next_call_sees() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("workspace");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "before\n").unwrap();
    let tools = load(&sandbox(), "file", bundled::FILE, &dir, Limits::default()).await;
    let read = tool(&tools, "read_file");
    let text = call(read, serde_json::json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert!(text.contains("before"), "{text}");
    until_waiting(read, 1).await;
    std::fs::rename(&dir, parent.path().join("moved-away")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "after\n").unwrap();
    let text = call(read, serde_json::json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert!(text.contains("after"), "{text}");
    // A write lands in the directory at the path, not in the one moved away.
    let write = tool(&tools, "write_file");
    until_waiting(write, 1).await;
    call(
        write,
        serde_json::json!({"path": "b.txt", "content": "new"}),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("b.txt")).unwrap(), "new");
    assert!(!parent.path().join("moved-away").join("b.txt").exists());
}

/// A waiting instance nobody calls is dropped after the idle time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_left_unused_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let tools = echo_fixture(dir.path()).await;
    let echo = tool(&tools, "echo");
    call(echo, serde_json::json!({"text": "a"})).await.unwrap();
    until_waiting(echo, 1).await;
    let started = Instant::now();
    until_waiting(echo, 0).await;
    assert!(started.elapsed() >= IDLE / 2, "{:?}", started.elapsed());
}

/// At most two instances wait per loaded component and 32 in the process, whatever is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_instances_are_bounded_in_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_with_idle(Duration::from_secs(60));
    let echo_bytes = fixture(fixtures::ECHO);
    let mut echoes = Vec::new();
    for _ in 0..40 {
        let tools = load(&sandbox, "echo", &echo_bytes, dir.path(), Limits::default()).await;
        echoes.push(tool(&tools, "echo").clone());
    }
    for round in 0..3 {
        for echo in &echoes {
            call(echo, serde_json::json!({"text": "x"})).await.unwrap();
            assert!(sandbox.waiting_instances() <= 32, "round {round}");
        }
    }
    // Once the preparations under way have ended, exactly the process's bound waits.
    let started = Instant::now();
    while echoes
        .iter()
        .map(WasmTool::waiting_instances)
        .sum::<usize>()
        < 32
    {
        assert!(started.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sandbox.waiting_instances(), 32);
    assert!(echoes.iter().all(|echo| echo.waiting_instances() <= 2));
    // Dropping the tools drops what waits for them.
    drop(echoes);
    assert_eq!(sandbox.waiting_instances(), 0);
}
