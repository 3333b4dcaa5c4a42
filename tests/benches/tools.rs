//! Benchmarks of the sandboxed tool path, each beside a native baseline measured in the same
//! run: `read_file` through the registry (fresh store and instance per call) against
//! `std::fs::read` of the same file — with the call's instance made ahead of it (the default) and
//! made during the call (a sandbox that keeps none waiting), latency and calls per CPU-second —
//! and the start-up time to the first tool call with a cold and a warm compiled-artifact cache.
//! Prints medians, p99 and ratios.
//!
//! Run: `cargo bench --workspace --bench tools` (or `just bench`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use clawcage_tests::bench::report;
use std::time::Instant;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{
    ArtifactCache, ComponentCode, FsMode, Grants, Limits, Sandbox, SandboxOptions, WasmTool,
    WorkspaceGrant,
};
use std::sync::Arc;
use std::time::Duration;

const CALLS: usize = 3_000;

/// Calls per tight loop of the throughput measurement.
const LOOP_CALLS: usize = 20_000;

async fn registry_with(sandbox: &Arc<Sandbox>, grants: Grants) -> ToolRegistry {
    registry_of(sandbox, bundled::FILE, grants).await
}

async fn registry_of<'a>(
    sandbox: &Arc<Sandbox>,
    component: impl Into<ComponentCode<'a>>,
    grants: Grants,
) -> ToolRegistry {
    tools_of(sandbox, "file", component, grants).await.0
}

/// The registry of the component `bytes` and its first tool (to see its waiting instances).
async fn tools_of<'a>(
    sandbox: &Arc<Sandbox>,
    name: &str,
    component: impl Into<ComponentCode<'a>>,
    grants: Grants,
) -> (ToolRegistry, WasmTool) {
    let loaded = sandbox
        .load(name, &format!("bench:{name}"), component, grants)
        .await
        .unwrap();
    let first = loaded.tools()[0].clone();
    let mut registry = ToolRegistry::new();
    for tool in loaded.into_tools() {
        registry.register(Arc::new(tool)).unwrap();
    }
    (registry, first)
}

/// Waits (untimed) until an instance waits for `tool`: the state a call finds in a session,
/// where model turns separate calls.
async fn until_ready(tool: &WasmTool) {
    while tool.waiting_instances() == 0 {
        tokio::task::yield_now().await;
    }
}

/// CPU time used by every thread of this process so far (`/proc/self/task/*/schedstat`).
fn process_cpu() -> Duration {
    threads_cpu("")
}

/// CPU time used so far by the threads whose name starts with `prefix` (as the kernel keeps it:
/// at most 15 bytes).
fn threads_cpu(prefix: &str) -> Duration {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += stat
                .split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(total)
}

/// Calls of `read_file` made ahead, `gap` apart (the caller sleeps between them): the call's
/// p50 and what the sandbox's background thread (drops, preparations, looking for the next
/// job) spent per call.
async fn spaced(registry: &ToolRegistry, tool: &WasmTool, args: &str, gap: Duration, calls: usize) {
    let mut samples = Vec::with_capacity(calls);
    until_ready(tool).await;
    let cpu = threads_cpu("clawcage-instan");
    for _ in 0..calls {
        std::thread::sleep(gap);
        until_ready(tool).await;
        let started = Instant::now();
        std::hint::black_box(registry.execute("read_file", args).await.unwrap());
        samples.push(started.elapsed());
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let background = threads_cpu("clawcage-instan") - cpu;
    samples.sort();
    println!(
        "calls {:>6.2} ms apart: p50 {:>7.2} µs   background thread {:>6.1} µs of CPU per call",
        gap.as_secs_f64() * 1e3,
        samples[samples.len() / 2].as_secs_f64() * 1e6,
        background.as_secs_f64() * 1e6 / calls as f64
    );
}

/// `LOOP_CALLS` calls of `read_file` back to back: calls per second of wall time and per
/// second of CPU time (all threads, the background preparation included).
async fn throughput(label: &str, registry: &ToolRegistry, args: &str) -> f64 {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cpu = process_cpu();
    let started = Instant::now();
    for _ in 0..LOOP_CALLS {
        std::hint::black_box(registry.execute("read_file", args).await.unwrap());
    }
    let wall = started.elapsed();
    // Let the last background drop and preparation finish: they are part of the cost.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cpu = process_cpu() - cpu;
    let per_cpu_second = LOOP_CALLS as f64 / cpu.as_secs_f64();
    println!(
        "{label:<52} {:>8.0} calls/s   {per_cpu_second:>8.0} calls per CPU-second",
        LOOP_CALLS as f64 / wall.as_secs_f64()
    );
    per_cpu_second
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let workspace = tempfile::tempdir().unwrap();
        let text: String = (0..100)
            .map(|i| format!("line {i} of the benchmark file\n"))
            .collect();
        std::fs::write(workspace.path().join("bench.txt"), &text).unwrap();
        let grants =
            Grants::workspace(WorkspaceGrant::new(workspace.path(), FsMode::ReadOnly).unwrap())
                .with_limits(Limits::default());

        println!(
            "== read_file: sandboxed call vs native read ({} bytes, {CALLS} calls each)",
            text.len()
        );
        let sandbox = clawcage_tests::sandbox();
        // The same engine settings with no instance made ahead: every call makes its own.
        let during = Sandbox::new(SandboxOptions {
            idle_instances: Duration::ZERO,
            ..SandboxOptions::new(ArtifactCache::in_dir(clawcage_tests::cache_dir()))
        })
        .unwrap();
        let (registry, read_tool) = tools_of(&sandbox, "file", bundled::FILE, grants.clone()).await;
        let (registry_during, _) = tools_of(&during, "file", bundled::FILE, grants.clone()).await;
        let args = r#"{"path":"bench.txt"}"#;
        for _ in 0..200 {
            registry.execute("read_file", args).await.unwrap();
            registry_during.execute("read_file", args).await.unwrap();
        }
        // The same path with a tool that does no file work: where the time of a bare fresh
        // instance goes.
        let echo_bytes = std::fs::read(clawcage_sandbox::components::fixtures::ECHO).unwrap();
        let (echo_registry, echo_tool) =
            tools_of(&sandbox, "echo", &echo_bytes, grants.clone()).await;
        let (echo_registry_during, _) =
            tools_of(&during, "echo", &echo_bytes, grants.clone()).await;
        let echo_args = r#"{"text":"x"}"#;
        // Instances are made ahead once a tool has been called.
        for _ in 0..200 {
            echo_registry.execute("echo", echo_args).await.unwrap();
            echo_registry_during
                .execute("echo", echo_args)
                .await
                .unwrap();
        }
        // For a profiler: `CLAWCAGE_BENCH_PROFILE_CALLS=N` makes N calls of `read_file` (of
        // `echo` with `CLAWCAGE_BENCH_PROFILE_TOOL=echo`) back to back, which are made during
        // the call, and stops; with `CLAWCAGE_BENCH_PROFILE_SPACED=1` each call waits (untimed)
        // until an instance is ready, so every call is one made ahead.
        if let Some(calls) = std::env::var("CLAWCAGE_BENCH_PROFILE_CALLS")
            .ok()
            .and_then(|calls| calls.parse::<usize>().ok())
        {
            let (registry, tool, args, waiting_for) =
                match std::env::var("CLAWCAGE_BENCH_PROFILE_TOOL").as_deref() {
                    Ok("echo") => (&echo_registry, "echo", echo_args, &echo_tool),
                    _ => (&registry, "read_file", args, &read_tool),
                };
            let spaced = std::env::var_os("CLAWCAGE_BENCH_PROFILE_SPACED").is_some();
            for _ in 0..calls {
                if spaced {
                    until_ready(waiting_for).await;
                }
                std::hint::black_box(registry.execute(tool, args).await.unwrap());
            }
            return;
        }
        // `CLAWCAGE_BENCH_BASELINE_FILE=PATH`: another build of the file component (e.g. the
        // one before a change), measured interleaved with this one.
        let baseline = match std::env::var_os("CLAWCAGE_BENCH_BASELINE_FILE") {
            Some(path) => {
                let bytes = std::fs::read(&path).unwrap();
                let baseline = registry_of(&sandbox, &bytes, grants.clone()).await;
                for _ in 0..200 {
                    baseline.execute("read_file", args).await.unwrap();
                }
                Some(baseline)
            }
            None => None,
        };
        let mut baseline_samples = Vec::with_capacity(CALLS);
        let path = workspace.path().join("bench.txt");
        let mut native = Vec::with_capacity(CALLS);
        let mut sandboxed = Vec::with_capacity(CALLS);
        let mut sandboxed_during = Vec::with_capacity(CALLS);
        // Interleave them so that machine noise hits all alike.
        for _ in 0..CALLS {
            let started = Instant::now();
            let bytes = std::fs::read(&path).unwrap();
            std::hint::black_box(String::from_utf8(bytes).unwrap());
            native.push(started.elapsed());

            until_ready(&read_tool).await;
            let started = Instant::now();
            std::hint::black_box(registry.execute("read_file", args).await.unwrap());
            sandboxed.push(started.elapsed());

            let started = Instant::now();
            std::hint::black_box(registry_during.execute("read_file", args).await.unwrap());
            sandboxed_during.push(started.elapsed());

            if let Some(baseline) = &baseline {
                let started = Instant::now();
                std::hint::black_box(baseline.execute("read_file", args).await.unwrap());
                baseline_samples.push(started.elapsed());
            }
        }
        let native_p50 = report("native std::fs::read", native);
        let sandboxed_p50 = report("read_file, fresh instance made ahead (default)", sandboxed);
        let during_p50 = report(
            "read_file, fresh instance made during the call",
            sandboxed_during,
        );
        println!(
            "ratio made ahead / native at p50: {:.1}x; made during the call / native: {:.1}x",
            sandboxed_p50.as_secs_f64() / native_p50.as_secs_f64(),
            during_p50.as_secs_f64() / native_p50.as_secs_f64()
        );
        if baseline.is_some() {
            let baseline_p50 = report(
                "registry.execute(\"read_file\"), baseline component",
                baseline_samples,
            );
            println!(
                "ratio this / baseline component at p50: {:.2}x",
                sandboxed_p50.as_secs_f64() / baseline_p50.as_secs_f64()
            );
        }

        let mut echo_samples = Vec::with_capacity(CALLS);
        let mut echo_during = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            until_ready(&echo_tool).await;
            let started = Instant::now();
            std::hint::black_box(echo_registry.execute("echo", echo_args).await.unwrap());
            echo_samples.push(started.elapsed());

            let started = Instant::now();
            std::hint::black_box(
                echo_registry_during
                    .execute("echo", echo_args)
                    .await
                    .unwrap(),
            );
            echo_during.push(started.elapsed());
        }
        report("echo (no file work), made ahead", echo_samples);
        report("echo (no file work), made during the call", echo_during);

        println!("\n== read_file made ahead, calls spaced (the caller sleeps between them)");
        for (gap, calls) in [
            (Duration::ZERO, 2000),
            (Duration::from_micros(100), 1000),
            (Duration::from_millis(1), 500),
            (Duration::from_millis(20), 100),
        ] {
            spaced(&registry, &read_tool, args, gap, calls).await;
        }

        println!("\n== read_file back to back ({LOOP_CALLS} calls each)");
        let mut ahead = Vec::new();
        let mut made_during = Vec::new();
        for _ in 0..2 {
            ahead.push(throughput("made ahead (default)", &registry, args).await);
            made_during.push(throughput("made during the call", &registry_during, args).await);
        }
        println!(
            "calls per CPU-second, made ahead / made during the call: {:.2}x",
            ahead.iter().sum::<f64>() / made_during.iter().sum::<f64>()
        );

        println!("\n== start-up to the first tool call (new engine, load, call)");
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        let cache = tempfile::tempdir().unwrap();
        for round in 0..3 {
            let fresh = tempfile::tempdir().unwrap();
            for (dir, samples) in [(fresh.path(), &mut cold), (cache.path(), &mut warm)] {
                let started = Instant::now();
                let sandbox =
                    Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(dir))).unwrap();
                let registry = registry_with(&sandbox, grants.clone()).await;
                registry.execute("read_file", args).await.unwrap();
                let elapsed = started.elapsed();
                // The first round fills the warm cache; it is a cold start, not a warm one.
                if round > 0 || dir == fresh.path() {
                    samples.push(elapsed);
                }
            }
        }
        for _ in 0..5 {
            let started = Instant::now();
            let sandbox =
                Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(cache.path()))).unwrap();
            let registry = registry_with(&sandbox, grants.clone()).await;
            registry.execute("read_file", args).await.unwrap();
            warm.push(started.elapsed());
        }
        let cold_p50 = report("cold cache (compile with Cranelift)", cold);
        let warm_p50 = report("warm cache (load the compiled artifact)", warm);
        println!(
            "ratio cold / warm at p50: {:.1}x",
            cold_p50.as_secs_f64() / warm_p50.as_secs_f64()
        );
    });
}
