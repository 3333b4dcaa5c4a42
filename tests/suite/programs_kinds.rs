//! Programs as the world publishes them, in `[exec] programs_dir`: WASI preview 1 core modules
//! (written here as WebAssembly text, assembled by the `wat` crate) and preview 2 components,
//! run by the real exec tool on real files. Exit codes reach the shell exactly; the memory cap,
//! time limit, write budget, missing network and missing host environment hold for a p1 module
//! as for a component; a broken file is named and never takes the other programs down.

use std::fs;
use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;
use std::time::Duration;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::programs::{ProgramKind, p1_as_component};
use clawcage_sandbox::{ExecGrant, FsMode, Limits, ProgramCatalog};
use clawcage_tests::{grants, registry_of, sandbox};
use serde_json::json;

/// Exits with the number in its first argument (0 without one), after printing `p1 exits`.
const EXIT_WITH_ARG: &str = r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 512) "p1 exits\n")
  (func (export "_start")
    (local $p i32) (local $n i32) (local $c i32)
    (i32.store (i32.const 16) (i32.const 512))
    (i32.store (i32.const 20) (i32.const 9))
    (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
    (drop (call $args_sizes_get (i32.const 0) (i32.const 4)))
    (drop (call $args_get (i32.const 64) (i32.const 1024)))
    (if (i32.lt_u (i32.load (i32.const 0)) (i32.const 2))
      (then (call $proc_exit (i32.const 0))))
    (local.set $p (i32.load (i32.const 68)))
    (block $done
      (loop $digits
        (local.set $c (i32.load8_u (local.get $p)))
        (br_if $done (i32.lt_u (local.get $c) (i32.const 48)))
        (br_if $done (i32.gt_u (local.get $c) (i32.const 57)))
        (local.set $n (i32.add (i32.mul (local.get $n) (i32.const 10))
                               (i32.sub (local.get $c) (i32.const 48))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $digits)))
    (call $proc_exit (local.get $n))))"#;

/// Opens `p1-out.txt` beneath the first preopen (the workspace) and writes 64 KiB into it 64
/// times (4 MiB), then returns normally; a failed write exits 7.
const WRITER: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 2)
  (data (i32.const 256) "p1-out.txt")
  (func (export "_start")
    (local $fd i32) (local $i i32) (local $errno i32)
    ;; path_open(dirfd 3, lookup 0, path, len, O_CREAT|O_TRUNC, rights all, inheriting all, 0, &fd)
    (local.set $errno (call $path_open (i32.const 3) (i32.const 0) (i32.const 256) (i32.const 10)
      (i32.const 9) (i64.const -1) (i64.const -1) (i32.const 0) (i32.const 0)))
    (if (local.get $errno) (then (call $proc_exit (i32.add (i32.const 100) (local.get $errno)))))
    (local.set $fd (i32.load (i32.const 0)))
    (i32.store (i32.const 16) (i32.const 65536))
    (i32.store (i32.const 20) (i32.const 65536))
    (block $done
      (loop $more
        (br_if $done (i32.ge_u (local.get $i) (i32.const 64)))
        (local.set $errno (call $fd_write (local.get $fd) (i32.const 16) (i32.const 1) (i32.const 24)))
        (if (local.get $errno) (then (call $proc_exit (i32.const 7))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $more)))))"#;

/// Never returns.
const SPINNER: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (loop $forever (br $forever))))"#;

/// Grows its memory by 16 MiB at a time until refused, then reports "still here" by exit 9.
const HOG: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (block $refused
      (loop $grow
        (br_if $refused (i32.eq (memory.grow (i32.const 256)) (i32.const -1)))
        (br $grow)))
    (call $proc_exit (i32.const 9))))"#;

/// Accepts on descriptor 3 (the workspace, not a socket) and exits with the errno it got, or
/// 0 if the call succeeded.
const SOCKETS: &str = r#"(module
  (import "wasi_snapshot_preview1" "sock_accept" (func $sock_accept (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (call $proc_exit (call $sock_accept (i32.const 3) (i32.const 0) (i32.const 0)))))"#;

/// Writes its environment (NUL-separated) to stdout.
const ENVIRON: &str = r#"(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (drop (call $environ (i32.const 64) (i32.const 4096)))
    (i32.store (i32.const 16) (i32.const 4096))
    (i32.store (i32.const 20) (i32.load (i32.const 4)))
    (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))))"#;

/// Imports a function no WASI host has.
const FOREIGN: &str = r#"(module
  (import "env" "launch_rockets" (func (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")))"#;

fn wasm(text: &str) -> Vec<u8> {
    wat::parse_str(text).expect("the test's WebAssembly text assembles")
}

/// A programs directory holding `files`.
fn programs_dir(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        fs::write(dir.path().join(name), bytes).unwrap();
    }
    dir
}

async fn catalog_of(dir: &Path) -> ProgramCatalog {
    sandbox()
        .programs(Some(dir))
        .await
        .expect("a programs directory with broken files still gives a catalog")
}

async fn exec_with(
    workspace: &Path,
    catalog: ProgramCatalog,
    limits: Limits,
    write_limit_bytes: u64,
) -> ToolRegistry {
    let grants = grants(workspace, FsMode::ReadWrite, limits).with_exec(ExecGrant {
        write_limit_bytes,
        ..ExecGrant::new(catalog)
    });
    registry_of(&[("exec", bundled::EXEC)], grants).await
}

/// The call's text, or its error's message.
async fn run(registry: &ToolRegistry, command: &str) -> String {
    match registry
        .execute_value("exec", &json!({ "command": command }))
        .await
    {
        Ok(output) => output.text,
        Err(error) => format!("ERROR {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_exit_codes_reach_the_shell_exactly() {
    let workspace = tempfile::tempdir().unwrap();
    let exit_with = wasm(EXIT_WITH_ARG);
    let programs = programs_dir(&[("code.wasm", &exit_with)]);
    let registry = exec_with(
        workspace.path(),
        catalog_of(programs.path()).await,
        Limits::default(),
        1 << 20,
    )
    .await;
    for code in [0, 1, 2, 3, 42, 255] {
        assert_eq!(
            run(&registry, &format!("code {code} > /dev/null; echo $?")).await,
            format!("{code}\n[exit status: 0]")
        );
    }
    assert_eq!(run(&registry, "code 3").await, "p1 exits\n[exit status: 3]");
    assert_eq!(
        run(&registry, "code 42 > /dev/null || echo fallback").await,
        "fallback\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "code 0 > /dev/null && echo went on").await,
        "went on\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "set -e; code 0 > /dev/null; echo first; code 2 > /dev/null; echo never"
        )
        .await,
        "first\n[exit status: 2]"
    );
    assert_eq!(
        run(
            &registry,
            "if code 1 > /dev/null; then echo yes; else echo no $?; fi"
        )
        .await,
        "no 1\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_components_keep_their_exit_with_code_and_rust_programs_run_beside_p1() {
    let workspace = tempfile::tempdir().unwrap();
    fs::write(workspace.path().join("notes.txt"), "TODO one\n").unwrap();
    // A component that calls `wasi:cli/exit.exit-with-code` (the p1 program made into one).
    let component = p1_as_component(&wasm(EXIT_WITH_ARG)).expect("adapted");
    assert_eq!(ProgramKind::of(&component), ProgramKind::P2Component);
    let programs = programs_dir(&[
        ("p2code.wasm", &component),
        ("mygrep.wasm", &bundled::GREP.bytes().unwrap()),
    ]);
    let registry = exec_with(
        workspace.path(),
        catalog_of(programs.path()).await,
        Limits::default(),
        1 << 20,
    )
    .await;
    assert_eq!(
        run(&registry, "p2code 42 > /dev/null; echo $?").await,
        "42\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "mygrep -q TODO notes.txt && echo found").await,
        "found\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "mygrep -q DONE notes.txt || echo fallback").await,
        "fallback\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_file_does_not_take_exec_down_and_is_named() {
    let workspace = tempfile::tempdir().unwrap();
    let exit_with = wasm(EXIT_WITH_ARG);
    let foreign = wasm(FOREIGN);
    let ungranted = fs::read(fixtures::UNGRANTED).unwrap();
    let programs = programs_dir(&[
        ("code.wasm", &exit_with),
        ("junk.wasm", b"#!/bin/sh\necho not wasm\n"),
        ("foreign.wasm", &foreign),
        ("ungranted.wasm", &ungranted),
        ("bad name.wasm", &exit_with),
    ]);
    let catalog = catalog_of(programs.path()).await;
    let registry = exec_with(
        workspace.path(),
        catalog.clone(),
        Limits::default(),
        1 << 20,
    )
    .await;
    // The others keep working, bundled and the operator's.
    assert_eq!(
        run(&registry, "code 3 > /dev/null; echo $?").await,
        "3\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "echo hi | wc -l").await,
        "1\n[exit status: 0]"
    );
    // Running a broken one says which and why, once (no repeated wrapping).
    let junk = run(&registry, "junk").await;
    assert!(junk.contains("junk: cannot be loaded"), "{junk}");
    assert!(junk.contains("not a WebAssembly file"), "{junk}");
    assert_eq!(junk.matches("cannot be loaded").count(), 1, "{junk}");
    let text = run(&registry, "foreign || echo fallback").await;
    assert!(text.contains("foreign: cannot be loaded"), "{text}");
    assert!(text.contains("env"), "{text}");
    assert!(text.contains("fallback"), "{text}");
    let text = run(&registry, "ungranted").await;
    assert!(text.contains("ungranted: cannot be loaded"), "{text}");
    assert!(text.contains("fixture:ungranted/telemetry"), "{text}");

    // The listing shows every program with its kind, size, digest, source and problem.
    let listing = catalog.describe().await.unwrap();
    let find = |name: &str| {
        listing
            .iter()
            .find(|program| program.name == name)
            .unwrap_or_else(|| panic!("{name} not listed: {listing:?}"))
    };
    let code = find("code");
    assert_eq!(code.kind, ProgramKind::P1Module);
    assert_eq!(code.bytes, exit_with.len() as u64);
    assert_eq!(code.sha256.len(), 64);
    assert!(code.source.ends_with("code.wasm"), "{}", code.source);
    assert!(code.problem.is_none(), "{:?}", code.problem);
    assert_eq!(find("junk").kind, ProgramKind::NotWasm);
    assert!(
        find("junk")
            .problem
            .as_deref()
            .unwrap()
            .contains("not a WebAssembly file")
    );
    assert!(find("foreign").problem.as_deref().unwrap().contains("env"));
    assert_eq!(find("ungranted").kind, ProgramKind::P2Component);
    assert!(
        find("ungranted")
            .problem
            .as_deref()
            .unwrap()
            .contains("fixture:ungranted/telemetry")
    );
    assert!(
        find("bad name")
            .problem
            .as_deref()
            .unwrap()
            .contains("rename the file")
    );
    let coreutils = find("coreutils");
    assert_eq!(coreutils.kind, ProgramKind::Multicall);
    assert!(coreutils.names.contains(&"cat".to_string()));
    assert_eq!(coreutils.source, "bundled:coreutils");
    assert_eq!(find("grep").kind, ProgramKind::P2Component);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p1_module_is_held_to_the_same_limits() {
    let workspace = tempfile::tempdir().unwrap();
    let programs = programs_dir(&[
        ("writer.wasm", &wasm(WRITER)),
        ("spinner.wasm", &wasm(SPINNER)),
        ("hog.wasm", &wasm(HOG)),
        ("sockets.wasm", &wasm(SOCKETS)),
        ("environ.wasm", &wasm(ENVIRON)),
    ]);
    let limits = Limits {
        memory_bytes: 64 << 20,
        timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    // 1 MiB of budget: the writer's 4 MiB passes it.
    let registry = exec_with(
        workspace.path(),
        catalog_of(programs.path()).await,
        limits,
        1 << 20,
    )
    .await;
    run(&registry, "echo warm").await;

    let text = run(&registry, "writer").await;
    assert!(text.contains("write limit"), "{text}");
    let written = fs::metadata(workspace.path().join("p1-out.txt"))
        .unwrap()
        .len();
    assert!(
        written <= 1 << 20,
        "{written} bytes written past a 1 MiB budget"
    );

    let text = run(&registry, "hog").await;
    assert!(text.contains("memory limit of 64 MiB"), "{text}");
    assert!(!text.contains("[exit status: 9]"), "{text}");

    let text = run(&registry, "spinner").await;
    assert!(text.contains("time limit"), "{text}");

    // No socket: exec hands a p1 program none, so every socket call answers ENOTSOCK (57)
    // instead of trapping in the adapter.
    assert_eq!(
        run(&registry, "sockets; echo $?").await,
        "57\n[exit status: 0]"
    );

    let text = run(&registry, "environ").await;
    assert!(text.contains("PWD="), "{text}");
    assert!(
        !text.contains("PATH="),
        "the host's environment leaked: {text}"
    );
    assert!(
        !text.contains("HOME="),
        "the host's environment leaked: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p1_module_is_refused_a_fifo_like_any_program() {
    let workspace = tempfile::tempdir().unwrap();
    let fifo = crate::file_attacks::Fifo::make(&workspace.path().join("p1-out.txt"));
    // Only a hang is a failure: the watchdog then opens the other end.
    let _watchdog = fifo.watchdog(Duration::from_secs(20));
    let programs = programs_dir(&[("writer.wasm", &wasm(WRITER))]);
    let registry = exec_with(
        workspace.path(),
        catalog_of(programs.path()).await,
        Limits::default(),
        1 << 20,
    )
    .await;
    // The writer exits 100 + errno when its open fails.
    let text = run(&registry, "writer; echo $?").await;
    let code: u32 = text.lines().next().unwrap_or_default().parse().unwrap_or(0);
    assert!(code > 100, "the FIFO was opened: {text}");
    assert!(
        fs::symlink_metadata(workspace.path().join("p1-out.txt"))
            .unwrap()
            .file_type()
            .is_fifo(),
        "{text}"
    );
}

/// Programs built elsewhere, unchanged: a p2 command component made by componentize-py and the
/// p1 CPython module of the installable package, both dropped into `programs_dir`, run from a
/// subdirectory with relative paths and report their exact exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_built_elsewhere_run_with_relative_paths_and_exact_exit_codes() {
    let component = match clawcage_tests::toolchains::python_command_program() {
        Ok(path) => fs::read(path).unwrap(),
        Err(reason) => {
            clawcage_tests::toolchains::skip("programs_built_elsewhere", &reason);
            return;
        }
    };
    assert_eq!(ProgramKind::of(&component), ProgramKind::P2Component);
    let installed = clawcage_tests::installed::install_python_and_qjs().await;
    let python = fs::read(installed.join("python3.wasm")).unwrap();
    assert_eq!(ProgramKind::of(&python), ProgramKind::P1Module);
    let programs = programs_dir(&[("pynotes.wasm", &component), ("py.wasm", &python)]);
    let workspace = tempfile::tempdir().unwrap();
    fs::create_dir_all(workspace.path().join("src/lib")).unwrap();
    fs::write(workspace.path().join("src/notes.txt"), "notes of src\n").unwrap();
    fs::write(workspace.path().join("src/lib/notes.txt"), "notes of lib\n").unwrap();
    fs::write(
        workspace.path().join("gen.py"),
        "print(open('notes.txt').read().strip())\n",
    )
    .unwrap();
    let registry = exec_with(
        workspace.path(),
        catalog_of(programs.path()).await,
        Limits::default(),
        1 << 20,
    )
    .await;
    let text = run(
        &registry,
        "cd src && pynotes; echo status=$?; pynotes 7; echo status=$?; cd lib && pynotes 255 || echo failed",
    )
    .await;
    assert_eq!(
        text,
        "args []\nnotes of src\nstatus=0\nargs ['7']\nnotes of src\nstatus=7\nargs ['255']\nnotes of lib\nfailed\n[exit status: 0]"
    );
    let text = run(
        &registry,
        "cd src/lib && py ../../gen.py; cd .. && py -c 'import sys; sys.exit(4)'; echo status=$?",
    )
    .await;
    assert_eq!(text, "notes of lib\nstatus=4\n[exit status: 0]");
}
