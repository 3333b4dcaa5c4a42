//! The dependency rules of ARCHITECTURE.md, checked on the real crate graph (`cargo metadata`):
//! only the sandbox knows wasmtime and the other wasm crates; the core depends on no other crate
//! of the project; the agent never depends on the sandbox (agent logic is tested without wasm);
//! the runtime depends on no front end; and the front ends do not depend on each other (the `cli`
//! binary hosts them all). A new edge that breaks a rule fails here, naming it.

use std::collections::BTreeMap;
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
            "clawcage-gateway" => Some(&["clawcage-core", "clawcage-agent", "clawcage-runtime"]),
            // The store traits on NATS JetStream: a backend of the agent's seams, no front end.
            "clawcage-cluster" => Some(&["clawcage-core", "clawcage-agent"]),
            "clawcage-acp" => Some(&["clawcage-core", "clawcage-agent", "clawcage-runtime"]),
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
