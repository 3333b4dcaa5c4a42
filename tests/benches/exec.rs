//! Benchmarks of the exec tool, each beside the native program measured in the same run: `ls` of
//! a directory, `wc -l` of a 10,000-line file, and `grep -rn` and `find -name` over a generated
//! tree of 2,000 files. The sandboxed side is the whole tool call: schema validation, a fresh instance of the
//! shell component, parsing, and one fresh instance of each program through the `process`
//! import. The native side starts the program in `/usr/bin` as a process and collects its
//! output. Also the start-up of the bundled program catalog with a warm and a cold
//! compiled-artifact cache. Prints medians, p99 and ratios.
//!
//! Run: `cargo bench --workspace --bench exec`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use clawcage_tests::bench::report;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::{ArtifactCache, FsMode, Sandbox, SandboxOptions};
use serde_json::json;

/// Files in the generated tree.
const TREE_FILES: usize = 2_000;

/// 2,000 source-like files in 40 directories; every third file has a TODO line.
fn generate_tree(root: &Path) {
    for file in 0..TREE_FILES {
        let dir = root.join(format!("tree/mod{:02}", file % 40));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        for line in 0..40 {
            if line == 7 && file % 3 == 0 {
                text.push_str(&format!("    // TODO: revisit item {file}\n"));
            } else {
                text.push_str(&format!(
                    "    let value_{line} = compute({file}, {line});\n"
                ));
            }
        }
        std::fs::write(dir.join(format!("file{file:04}.rs")), text).unwrap();
    }
}

async fn sandboxed(registry: &ToolRegistry, command: &str) -> String {
    let output = registry
        .execute_value("exec", &json!({ "command": command }))
        .await
        .unwrap_or_else(|error| panic!("`{command}` failed: {error}"));
    assert!(
        output.text.ends_with("[exit status: 0]"),
        "`{command}`: {}",
        output.text
    );
    output.text
}

fn native(workspace: &Path, program: &str, args: &[&str]) -> Vec<u8> {
    let output = Command::new(program)
        .args(args)
        .current_dir(workspace)
        .env_clear()
        .output()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(output.status.success(), "{program} {args:?} failed");
    output.stdout
}

/// Runs `command` in clawcage and `program args` natively, interleaved, `rounds` times each, and
/// prints both and their ratio.
async fn compare(
    registry: &ToolRegistry,
    workspace: &Path,
    command: &str,
    (program, args): (&str, &[&str]),
    rounds: usize,
) {
    println!("\n== {command}  ({rounds} runs each, interleaved)");
    // Both must agree before they are timed (counted inside, as the output shown is cut to
    // 10,000 characters).
    let counted = sandboxed(registry, &format!("{command} | wc -l")).await;
    let outside = String::from_utf8(native(workspace, program, args)).unwrap();
    assert_eq!(
        counted.lines().next().unwrap().trim(),
        outside.lines().count().to_string(),
        "clawcage and {program} disagree"
    );
    for _ in 0..3 {
        sandboxed(registry, command).await;
    }
    let mut native_samples = Vec::with_capacity(rounds);
    let mut sandboxed_samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        std::hint::black_box(native(workspace, program, args));
        native_samples.push(started.elapsed());

        let started = Instant::now();
        std::hint::black_box(sandboxed(registry, command).await);
        sandboxed_samples.push(started.elapsed());
    }
    let native_p50 = report(&format!("native {program}"), native_samples);
    let sandboxed_p50 = report("clawcage exec (whole tool call)", sandboxed_samples);
    println!(
        "ratio clawcage / native at p50: {:.1}x",
        sandboxed_p50.as_secs_f64() / native_p50.as_secs_f64()
    );
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path().canonicalize().unwrap();
        generate_tree(&root);
        let lines: String = (0..10_000)
            .map(|i| format!("line {i} of the file that wc counts\n"))
            .collect();
        std::fs::write(root.join("lines.txt"), lines).unwrap();

        // For a profiler: `CLAWCAGE_BENCH_PROFILE_COMMAND=...` runs that command line 200 times
        // and stops.
        if let Ok(command) = std::env::var("CLAWCAGE_BENCH_PROFILE_COMMAND") {
            let registry = clawcage_tests::exec_registry(&root, FsMode::ReadWrite).await;
            for _ in 0..200 {
                std::hint::black_box(sandboxed(&registry, &command).await);
            }
            return;
        }
        println!("== start-up of the bundled programs (new engine, Sandbox::programs)");
        let cold_cache = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let cold = Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(
            cold_cache.path(),
        )))
        .unwrap();
        cold.programs(None).await.unwrap();
        report(
            "cold cache (Cranelift compiles all)",
            vec![started.elapsed()],
        );
        drop(cold);
        let mut warm = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let sandbox = Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(
                cold_cache.path(),
            )))
            .unwrap();
            sandbox.programs(None).await.unwrap();
            warm.push(started.elapsed());
        }
        report("warm cache (compiled artifacts loaded)", warm);

        let registry = clawcage_tests::exec_registry(&root, FsMode::ReadWrite).await;
        compare(&registry, &root, "ls", ("/usr/bin/ls", &[]), 200).await;
        compare(
            &registry,
            &root,
            "wc -l lines.txt",
            ("/usr/bin/wc", &["-l", "lines.txt"]),
            200,
        )
        .await;
        compare(
            &registry,
            &root,
            "grep -rn TODO tree",
            ("/usr/bin/grep", &["-rn", "TODO", "tree"]),
            20,
        )
        .await;
        compare(
            &registry,
            &root,
            "find . -name '*.rs'",
            ("/usr/bin/find", &[".", "-name", "*.rs"]),
            20,
        )
        .await;
    });
}
