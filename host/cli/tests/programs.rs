//! `clawcage programs list` as an operator runs it: a real programs directory holding a WASI
//! preview 1 module, a p2 component and a file that is not WebAssembly, named in a real
//! configuration file; the broken file is listed with its problem and the others still run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_tests::cli_state::shared_state_dir as state_dir;

/// A WASI preview 1 command module, byte by byte: imports `proc_exit`, exports `memory` and a
/// `_start` that exits 3.
const EXIT_THREE: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x60, 0x01, 0x7f, 0x00, 0x60,
    0x00, 0x00, 0x02, 0x24, 0x01, 0x16, 0x77, 0x61, 0x73, 0x69, 0x5f, 0x73, 0x6e, 0x61, 0x70, 0x73,
    0x68, 0x6f, 0x74, 0x5f, 0x70, 0x72, 0x65, 0x76, 0x69, 0x65, 0x77, 0x31, 0x09, 0x70, 0x72, 0x6f,
    0x63, 0x5f, 0x65, 0x78, 0x69, 0x74, 0x00, 0x00, 0x03, 0x02, 0x01, 0x01, 0x05, 0x03, 0x01, 0x00,
    0x01, 0x07, 0x13, 0x02, 0x06, 0x6d, 0x65, 0x6d, 0x6f, 0x72, 0x79, 0x02, 0x00, 0x06, 0x5f, 0x73,
    0x74, 0x61, 0x72, 0x74, 0x00, 0x01, 0x0a, 0x08, 0x01, 0x06, 0x00, 0x41, 0x03, 0x10, 0x00, 0x0b,
];

fn clawcage(config: &Path, workspace: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(args)
        .arg("--config")
        .arg(config)
        .arg("--workspace")
        .arg(workspace)
        .arg("--state-dir")
        .arg(state_dir())
        .env_remove("RUST_LOG")
        .output()
        .expect("clawcage runs")
}

#[test]
fn programs_list_shows_each_kind_and_what_is_wrong_with_a_broken_file() {
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let programs = outside.path().join("programs");
    std::fs::create_dir(&programs).unwrap();
    std::fs::write(programs.join("three.wasm"), EXIT_THREE).unwrap();
    std::fs::write(programs.join("junk.wasm"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(
        programs.join("mygrep.wasm"),
        clawcage_sandbox::components::bundled::GREP.bytes().unwrap(),
    )
    .unwrap();
    let config = outside.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[exec]\nprograms_dir = {:?}\n",
            programs.display().to_string()
        ),
    )
    .unwrap();

    let output = clawcage(&config, workspace.path(), &["programs", "list", "--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let find = |name: &str| {
        listed
            .iter()
            .find(|program| program["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {listed:?}"))
            .clone()
    };
    let three = find("three");
    assert_eq!(three["kind"], "p1-module");
    assert_eq!(three["bytes"], EXIT_THREE.len());
    assert_eq!(three["problem"], serde_json::Value::Null);
    assert_eq!(find("mygrep")["kind"], "p2-component");
    assert_eq!(find("coreutils")["kind"], "multicall");
    assert_eq!(find("coreutils")["source"], "bundled:coreutils");
    let junk = find("junk");
    assert_eq!(junk["kind"], "not-wasm");
    assert!(
        junk["problem"]
            .as_str()
            .unwrap()
            .contains("not a WebAssembly file"),
        "{junk}"
    );

    let output = clawcage(&config, workspace.path(), &["programs", "list"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("three  (p1 module, 96 bytes, runs)"),
        "{text}"
    );
    assert!(text.contains("junk  (not wasm,"), "{text}");

    // The broken file does not take exec down: the p1 program runs and its code is exact.
    let output = clawcage(
        &config,
        workspace.path(),
        &[
            "call",
            "exec",
            r#"{"command": "three; echo $?; junk || echo fallback"}"#,
        ],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.starts_with("3\n"), "{text}");
    assert!(text.contains("junk: cannot be loaded"), "{text}");
    assert!(text.contains("fallback"), "{text}");
}
