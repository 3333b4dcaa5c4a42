//! The guest crates' own unit tests (argument parsing, path rules, the shell's parser and
//! globbing, HTML to text, the programs' option handling, cron checks), run natively from the
//! host's test suite so that `cargo test --workspace` runs every test of the project. The guest
//! workspace is not a member of the host's (it targets wasm32-wasip2), so it is tested here with
//! its own target directory under `target/`.

use std::process::Command;

use clawcage_tests::toolchains::repo_root;

/// The guest crates that have unit tests (the fixtures have none). coreutils is upstream's
/// uutils, but its `mv`, `cp -r`, `realpath` and `readlink -f` are clawcage's own, with tests.
const GUEST_CRATES: &[&str] = &[
    "clawcage-coreutils",
    "clawcage-tool-sdk",
    "clawcage-file",
    "clawcage-web",
    "clawcage-exec",
    "clawcage-cron",
    "clawcage-program-support",
    "clawcage-grep",
    "clawcage-find",
    "clawcage-sed",
    "clawcage-awk",
    "clawcage-jq",
    "clawcage-diff",
    "clawcage-archive",
];

#[test]
fn the_guest_crates_unit_tests_pass() {
    let root = repo_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command
        .current_dir(root.join("tools-wasm"))
        .arg("test")
        .arg("--target-dir")
        .arg(root.join("target").join("tools-wasm-native"));
    for name in GUEST_CRATES {
        command.args(["-p", name]);
    }
    // The outer build's settings are for the host's own crates.
    for variable in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
    ] {
        command.env_remove(variable);
    }
    let output = command.output().expect("cargo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the guest crates' unit tests failed:\n{stdout}\n{stderr}"
    );
    let passed: usize = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test result: ok. "))
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert!(
        passed >= 50,
        "only {passed} guest unit tests ran:\n{stdout}"
    );
}
