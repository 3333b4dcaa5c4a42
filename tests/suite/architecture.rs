//! The dependency rules of ARCHITECTURE.md, checked on the real crate graph (`cargo metadata`):
//! only the sandbox knows wasmtime and the other wasm crates; the core depends on no other crate
//! of the project; the agent never depends on the sandbox (agent logic is tested without wasm);
//! the runtime depends on no front end; and the front ends do not depend on each other (the `cli`
//! binary hosts them all). A new edge that breaks a rule fails here, naming it. And one job per
//! file: a Rust file of `host/` or `tools-wasm/` longer than [`LONG_FILE_LINES`] lines (its inline
//! `#[cfg(test)]` module not counted) says in its module doc why it is not split, in a sentence
//! holding "over 700 lines".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clawcage_tests::toolchains::repo_root;

/// Each package of the host workspace and its normal (not dev, not build) dependencies.
fn dependency_graph() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .current_dir(repo_root())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dependency| dependency["kind"].is_null())
                .map(|dependency| dependency["name"].as_str().unwrap().to_string())
                .collect();
            (package["name"].as_str().unwrap().to_string(), dependencies)
        })
        .collect()
}

/// The crates that compile or read WebAssembly: the sandbox's alone.
fn is_wasm_crate(name: &str) -> bool {
    name.starts_with("wasmtime")
        || name.starts_with("cranelift")
        || name.starts_with("wit-")
        || matches!(name, "wasmparser" | "wasm-encoder" | "wat" | "wast")
        || name.starts_with("wasi-preview1")
}

const FRONT_ENDS: &[&str] = &[
    "clawcage-cli",
    "clawcage-mcp",
    "clawcage-gateway",
    "clawcage-acp",
];

#[test]
fn the_crate_graph_keeps_the_architecture_rules() {
    let graph = dependency_graph();
    assert!(graph.len() >= 9, "the workspace's packages: {graph:?}");
    for package in [
        "clawcage-core",
        "clawcage-sandbox",
        "clawcage-agent",
        "clawcage-runtime",
    ] {
        assert!(
            graph.contains_key(package),
            "{package} is missing from {graph:?}"
        );
    }
    let broken = violations(&graph);
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
}

/// Every edge of `graph` that breaks a rule, worded.
fn violations(graph: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut broken = Vec::new();
    for (package, dependencies) in graph {
        let ours: Vec<&str> = dependencies
            .iter()
            .map(String::as_str)
            .filter(|name| name.starts_with("clawcage-"))
            .collect();
        for dependency in dependencies {
            if is_wasm_crate(dependency) && package != "clawcage-sandbox" {
                broken.push(format!(
                    "{package} depends on {dependency}: only clawcage-sandbox may know wasmtime and the wasm crates"
                ));
            }
        }
        let allowed: Option<&[&str]> = match package.as_str() {
            "clawcage-core" => Some(&[]),
            "clawcage-sandbox" | "clawcage-agent" => Some(&["clawcage-core"]),
            "clawcage-runtime" => Some(&["clawcage-core", "clawcage-agent", "clawcage-sandbox"]),
            "clawcage-mcp" => Some(&["clawcage-core", "clawcage-agent"]),
            // The one front end that joins a cluster (its stores on JetStream).
            "clawcage-gateway" => Some(&[
                "clawcage-core",
                "clawcage-agent",
                "clawcage-runtime",
                "clawcage-cluster",
            ]),
            // The store traits on NATS JetStream: a backend of the agent's seams, no front end.
            "clawcage-cluster" => Some(&["clawcage-core", "clawcage-agent"]),
            "clawcage-acp" => Some(&["clawcage-core", "clawcage-agent", "clawcage-runtime"]),
            // Installing plugins: the network policy and the plugin lock, no agent or front end.
            "clawcage-registry" => Some(&["clawcage-core", "clawcage-sandbox"]),
            _ => None,
        };
        if let Some(allowed) = allowed {
            for dependency in &ours {
                if !allowed.contains(dependency) {
                    broken.push(format!(
                        "{package} depends on {dependency}; it may depend only on {allowed:?}"
                    ));
                }
            }
        }
        if FRONT_ENDS.contains(&package.as_str()) && package != "clawcage-cli" {
            for dependency in &ours {
                if FRONT_ENDS.contains(dependency) {
                    broken.push(format!(
                        "the front end {package} depends on the front end {dependency}"
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn each_kind_of_forbidden_edge_is_named() {
    let graph: BTreeMap<String, Vec<String>> = [
        ("clawcage-agent", vec!["clawcage-core", "clawcage-sandbox"]),
        ("clawcage-core", vec!["serde"]),
        ("clawcage-mcp", vec!["clawcage-agent", "clawcage-gateway"]),
        ("clawcage-runtime", vec!["clawcage-sandbox", "wasmtime"]),
        (
            "clawcage-sandbox",
            vec!["clawcage-core", "wasmtime", "wit-component"],
        ),
    ]
    .into_iter()
    .map(|(name, deps)| {
        (
            name.to_string(),
            deps.into_iter().map(str::to_string).collect(),
        )
    })
    .collect();
    let broken = violations(&graph);
    assert_eq!(broken.len(), 4, "{broken:#?}");
    assert!(
        broken[0].starts_with("clawcage-agent depends on clawcage-sandbox"),
        "{broken:#?}"
    );
    assert!(
        broken[1].starts_with("clawcage-mcp depends on clawcage-gateway"),
        "{broken:#?}"
    );
    assert_eq!(
        broken[2],
        "the front end clawcage-mcp depends on the front end clawcage-gateway"
    );
    assert!(
        broken[3].starts_with("clawcage-runtime depends on wasmtime"),
        "{broken:#?}"
    );
}

/// Lines of code (before the inline test module) a file may hold without saying why.
const LONG_FILE_LINES: usize = 700;

/// The lines of `text` that count towards [`LONG_FILE_LINES`]: those before a top-level
/// `#[cfg(test)]` (the inline unit tests sit apart from the code they test).
fn code_lines(text: &str) -> usize {
    text.lines()
        .take_while(|line| !line.starts_with("#[cfg(test)]"))
        .count()
}

/// Whether the leading `//!` doc of `text` says why the file is long.
fn says_why_it_is_long(text: &str) -> bool {
    let doc: String = text
        .lines()
        .take_while(|line| line.starts_with("//!") || line.starts_with("#!") || line.is_empty())
        .filter(|line| line.starts_with("//!"))
        .map(|line| line.trim_start_matches("//!"))
        .collect::<Vec<_>>()
        .join(" ");
    // Words wrapped across doc lines count as written on one.
    let words: Vec<&str> = doc.split_whitespace().collect();
    words.join(" ").to_lowercase().contains("over 700 lines")
}

/// The long files of `files` (path and text) whose module doc does not say why.
fn long_files_without_a_reason(files: &[(PathBuf, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(_, text)| code_lines(text) > LONG_FILE_LINES && !says_why_it_is_long(text))
        .map(|(path, text)| format!("{} ({} lines)", path.display(), code_lines(text)))
        .collect()
}

/// Every `.rs` file under `dir`, skipping build output.
fn rust_files(dir: &Path, found: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path
            .file_name()
            .is_some_and(|name| name == "target" || name == "node_modules")
        {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn every_long_file_says_why_it_is_one_job() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("host"), &mut files);
    rust_files(&root.join("tools-wasm"), &mut files);
    assert!(files.len() > 200, "only {} Rust files found", files.len());
    let unexplained = long_files_without_a_reason(&files);
    assert!(
        unexplained.is_empty(),
        "split these files by job, or say in their module doc why they are one job (a sentence with \"over 700 lines\"):\n{}",
        unexplained.join("\n")
    );
}

#[test]
fn a_long_file_without_a_reason_is_named_and_one_with_a_reason_is_not() {
    let body = "fn f() {}\n".repeat(LONG_FILE_LINES);
    let tests = "#[cfg(test)]\nmod tests {\n".to_string() + &"// a test\n".repeat(500) + "}\n";
    let files = vec![
        (
            PathBuf::from("long.rs"),
            format!("//! Several jobs.\n\n{body}"),
        ),
        (
            PathBuf::from("explained.rs"),
            format!("//! One parser (over 700 lines: the grammar is one table).\n\n{body}"),
        ),
        (
            PathBuf::from("short_with_tests.rs"),
            format!("//! Short.\n{}{tests}", "fn g() {}\n".repeat(600)),
        ),
    ];
    assert_eq!(
        long_files_without_a_reason(&files),
        vec!["long.rs (702 lines)".to_string()]
    );
}
