//! `xargs`, the exec shell's builtin, end to end: the shell component, the bundled programs and
//! the approvals broker in a real engine, on real files. The pipelines a model writes (`find |
//! xargs rm`, `grep -l | xargs wc -l`, `-I{}`, `-0` with `find -print0`), GNU's exit statuses,
//! and the attacks: xargs never gets a program past the allowlist (the plan names the command it
//! runs, with its input arguments unknown; each run is checked by the host), an item is never a
//! redirection, a flood of input stops at the time limit, and an item too long is refused.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::ToolRegistry;
use clawcage_agent::approvals::{ApprovalBroker, ApprovalSettings, OperatorEvent, OperatorFilter};
use clawcage_core::approval::{AllowEntry, ApprovalDecision, AskMode, ExecMode};
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use clawcage_tests::{exec_registry, exec_registry_with};
use serde_json::json;

async fn run(registry: &ToolRegistry, command: &str) -> String {
    match registry
        .execute_value("exec", &json!({ "command": command }))
        .await
    {
        Ok(output) => output.text,
        Err(error) => format!("ERROR {}: {}", error.kind(), error.message()),
    }
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("src/nested")).unwrap();
    fs::create_dir_all(root.join("build/a")).unwrap();
    fs::write(root.join("src/a.rs"), "fn a() {}\n// TODO: one\n").unwrap();
    fs::write(
        root.join("src/nested/b.rs"),
        "// TODO: two\n// more\n// end\n",
    )
    .unwrap();
    fs::write(root.join("src/c.rs"), "fn c() {}\n").unwrap();
    fs::write(root.join("old.tmp"), "x").unwrap();
    fs::write(root.join("src/nested/older.tmp"), "y").unwrap();
    fs::write(root.join("keep.txt"), "keep me\n").unwrap();
    fs::write(root.join("victim.txt"), "keep me\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_grep_and_replace_pipelines_work_on_real_files() {
    let dir = workspace();
    let root = dir.path();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    let text = run(&registry, "find . -name '*.tmp' | xargs rm").await;
    assert_eq!(text, "[exit status: 0]");
    assert!(!root.join("old.tmp").exists() && !root.join("src/nested/older.tmp").exists());
    assert!(root.join("keep.txt").exists() && root.join("src/a.rs").exists());

    let text = run(&registry, "grep -l TODO -r src | sort | xargs wc -l").await;
    assert_eq!(
        text,
        " 2 src/a.rs\n 3 src/nested/b.rs\n 5 total\n[exit status: 0]"
    );
    let text = run(&registry, "printf 'a\\nb\\n' | xargs -I{} echo item {}").await;
    assert_eq!(text, "item a\nitem b\n[exit status: 0]");
    // The output of the runs goes on down the pipeline.
    let text = run(&registry, "find src -name '*.rs' | xargs cat | wc -l").await;
    assert_eq!(text, "6\n[exit status: 0]");
    let text = run(
        &registry,
        "find src -name '*.rs' | sort | xargs -n 1 head -n 1",
    )
    .await;
    assert_eq!(text, "fn a() {}\nfn c() {}\n// TODO: two\n[exit status: 0]");
    // Into a file, once for all runs; from a file with -a.
    let text = run(
        &registry,
        "find src -name '*.rs' | sort > list.txt && xargs -a list.txt -n 1 cat > all.txt",
    )
    .await;
    assert_eq!(text, "[exit status: 0]");
    assert_eq!(
        fs::read_to_string(root.join("all.txt")).unwrap(),
        "fn a() {}\n// TODO: one\nfn c() {}\n// TODO: two\n// more\n// end\n"
    );
    // -I with a program: one run per line, the line as one argument.
    let text = run(
        &registry,
        "mkdir copies && ls src/*.rs | xargs -I{} cp {} copies/ && ls copies",
    )
    .await;
    assert_eq!(text, "a.rs\nc.rs\n[exit status: 0]");
    // -t shows each command before it runs; -r runs nothing on no input.
    let text = run(&registry, "echo keep.txt | xargs -t cat").await;
    assert_eq!(text, "cat keep.txt\nkeep me\n[exit status: 0]");
    let text = run(&registry, "true | xargs -r rm; echo $?").await;
    assert_eq!(text, "0\n[exit status: 0]");
    // Without -r, GNU runs the command once: `rm` alone complains.
    let text = run(&registry, "true | xargs rm").await;
    assert!(text.contains("rm: missing operand"), "{text}");
    assert!(text.ends_with("[exit status: 123]"), "{text}");
    // The builtin is listed where builtins are.
    let text = run(&registry, "type xargs").await;
    assert_eq!(text, "xargs: shell builtin\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_separated_names_from_find_print0_keep_spaces_and_quotes() {
    let dir = workspace();
    let root = dir.path();
    for name in ["my file.log", "it's.log", "plain.log"] {
        fs::write(root.join(name), "x").unwrap();
    }
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    // Split at blanks, these names break (as with GNU xargs): the quote is unmatched.
    let text = run(&registry, "find . -name \"it*.log\" | xargs rm").await;
    assert!(text.contains("xargs: unmatched single quote"), "{text}");
    assert!(text.ends_with("[exit status: 1]"), "{text}");
    assert!(root.join("it's.log").exists());
    let text = run(
        &registry,
        "find . -name '*.log' -print0 | xargs -0 rm -v | sort",
    )
    .await;
    assert!(text.contains("removed 'my file.log'"), "{text}");
    assert!(text.contains("removed \"it's.log\""), "{text}");
    assert!(text.ends_with("[exit status: 0]"), "{text}");
    for name in ["my file.log", "it's.log", "plain.log"] {
        assert!(!root.join(name).exists(), "{name} is still there");
    }
    let text = run(&registry, "printf 'a b\\0c\\0' | xargs -0 -n 1 echo").await;
    assert_eq!(text, "a b\nc\n[exit status: 0]");
    let text = run(&registry, "printf 'a,b c' | xargs -d , -n 1 echo").await;
    assert_eq!(text, "a\nb c\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_statuses_are_gnus() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    // A run that fails: 123, and the other runs still happen.
    let text = run(&registry, "printf 'nope\\nkeep.txt\\n' | xargs -n 1 cat").await;
    assert!(
        text.contains("nope") && text.contains("keep me\n"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 123]"), "{text}");
    let text = run(&registry, "echo x | xargs nosuchprogram").await;
    assert!(
        text.contains("xargs: command not found: nosuchprogram"),
        "{text}"
    );
    assert!(text.contains("available programs:"), "{text}");
    assert!(text.ends_with("[exit status: 127]"), "{text}");
    let text = run(&registry, "echo 1 2 | xargs -n 1 sh -c 'exit 255'").await;
    assert!(text.contains("exited with status 255; aborting"), "{text}");
    assert!(text.ends_with("[exit status: 124]"), "{text}");
    let text = run(&registry, "echo x | xargs -n 0 echo").await;
    assert!(
        text.contains("value 0 for -n option should be >= 1"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 1]"), "{text}");
    let text = run(
        &registry,
        "echo x | xargs -P 4 -n 1 echo; xargs --help | head -n 1",
    )
    .await;
    assert_eq!(
        text,
        "x\nUsage: xargs [OPTION]... [COMMAND [INITIAL-ARGS]...]\n[exit status: 0]"
    );
}

fn settings(mode: ExecMode, ask: AskMode, allow: &[&str]) -> ApprovalSettings {
    let mut settings = ApprovalSettings::default();
    settings.exec.mode = mode;
    settings.ask = ask;
    settings.exec.allow = allow
        .iter()
        .map(|entry| AllowEntry::parse(entry).unwrap())
        .collect();
    settings
}

async fn approvals_registry(workspace: &Path, broker: &ApprovalBroker) -> ToolRegistry {
    let grants = clawcage_tests::grants(workspace, FsMode::ReadWrite, Limits::default()).with_exec(
        ExecGrant::new(clawcage_tests::programs().await).with_approvals(Arc::new(broker.clone())),
    );
    clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await
}

/// An allowlist entry for `rm -r build/*` does not let `xargs rm` remove what its input names:
/// the plan names `rm`, with arguments known only at run time, so nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_entry_does_not_let_xargs_run_its_program_on_input_arguments() {
    let dir = workspace();
    let root = dir.path();
    fs::write(root.join("list.txt"), "victim.txt\n").unwrap();
    let broker = ApprovalBroker::new(
        settings(
            ExecMode::Allowlist,
            AskMode::Off,
            &["rm -r build/*", "cat", "find *", "printf *", "echo *"],
        ),
        None,
        None,
    );
    let registry = approvals_registry(root, &broker).await;
    for attack in [
        "echo victim.txt | xargs rm",
        "echo victim.txt | xargs rm -r",
        "echo victim.txt | xargs rm -r build/a",
        "echo victim.txt | xargs -n 1 rm -r",
        "printf 'victim.txt\\0' | xargs -0 rm",
        "xargs rm < list.txt",
        "xargs -a list.txt rm",
        "cat list.txt | xargs -I{} rm -r build/../{}",
        "cat list.txt | xargs -I{} rm -r {}",
        "echo victim.txt | xargs nice -n 5 rm",
        "echo victim.txt | xargs /bin/rm",
        "echo victim.txt | xargs xargs rm",
        "echo victim.txt | xargs sh -c 'rm \"$0\"'",
        "echo rm victim.txt | xargs sh -c",
        "echo victim.txt | xargs -I{} sh -c 'rm {}'",
        "echo rm | xargs -I{} sh -c '{} victim.txt'",
        "C=rm; echo victim.txt | xargs $C",
        "echo victim.txt | xargs -n $(echo 1) rm",
        "find . -name victim.txt | xargs rm",
        "find . -name victim.txt -print0 | xargs -0 rm",
    ] {
        let result = run(&registry, attack).await;
        assert!(
            root.join("victim.txt").exists(),
            "`{attack}` removed the victim: {result}"
        );
        assert!(result.starts_with("ERROR denied"), "{attack}: {result}");
    }
    // The refusal names the command xargs would run and why.
    let result = run(&registry, "echo victim.txt | xargs rm").await;
    assert!(
        result.contains(
            "`xargs rm [arguments read from standard input]` has arguments known only at run time"
        ),
        "{result}"
    );
    // What the allowlist does allow runs through xargs: `cat` with any arguments.
    let result = run(&registry, "find . -name list.txt | xargs cat").await;
    assert_eq!(result, "victim.txt\n[exit status: 0]");
    // And the entry itself still works written out.
    let result = run(&registry, "rm -r build/a").await;
    assert_eq!(result, "[exit status: 0]");
    assert!(!root.join("build/a").exists());
}

/// Asked, the operator sees `xargs` and the command it runs; a denial runs nothing. An approval
/// binds what runs: a script that `xargs sh` runs, rewritten after the plan, is refused by the
/// host at run time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_the_command_xargs_runs_and_the_host_checks_each_run() {
    let dir = workspace();
    let root = dir.path();
    fs::write(root.join("run.sh"), "ls \"$@\"\n").unwrap();
    fs::write(root.join("evil.sh"), "rm victim.txt\n").unwrap();
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        None,
        None,
    );
    let registry = approvals_registry(root, &broker).await;
    let mut operator = broker.operator(OperatorFilter::All);
    let approver = tokio::spawn(async move {
        let mut seen = Vec::new();
        for decision in [ApprovalDecision::Deny, ApprovalDecision::AllowOnce] {
            while let Some(event) = operator.next().await {
                if let OperatorEvent::Requested(request) = event {
                    seen.push(request.plan.summary());
                    operator.resolve(&request.id, decision, "test").unwrap();
                    break;
                }
            }
        }
        seen
    });
    let denied = run(&registry, "echo victim.txt | xargs -0 rm -f").await;
    assert!(denied.contains("denied by the operator"), "{denied}");
    assert!(root.join("victim.txt").exists());
    let result = run(
        &registry,
        "cp evil.sh run.sh && echo keep.txt | xargs sh run.sh",
    )
    .await;
    let seen = approver.await.unwrap();
    assert_eq!(
        seen,
        [
            "xargs -0 rm -f [arguments read from standard input]".to_string(),
            "cp evil.sh run.sh\nls \"$@\"".to_string(),
        ]
    );
    assert!(
        result.contains("not part of the command that was approved"),
        "{result}"
    );
    assert!(root.join("victim.txt").exists(), "{result}");
}

/// Redirections belong to xargs itself: an item that looks like one is an argument, and a
/// command built with `-I` cannot write a file by redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_is_never_a_redirection() {
    let dir = workspace();
    let root = dir.path();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    let text = run(
        &registry,
        "echo '> pwned.txt' | xargs -I{} echo {}; printf '%s\\n' '>' pwned.txt | xargs echo x",
    )
    .await;
    assert_eq!(text, "> pwned.txt\nx > pwned.txt\n[exit status: 0]");
    let text = run(&registry, "echo keep.txt | xargs -I{} cat {} '>' pwned.txt").await;
    assert!(text.contains("keep me"), "{text}");
    assert!(text.ends_with("[exit status: 123]"), "{text}");
    assert!(!root.join("pwned.txt").exists());
    // Under an allowlist, a write through `sh -c` built by -I is not known now and is refused.
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["cat", "echo *"]),
        None,
        None,
    );
    let registry = approvals_registry(root, &broker).await;
    let result = run(&registry, "echo pwned.txt | xargs -I{} sh -c 'echo x > {}'").await;
    assert!(result.starts_with("ERROR denied"), "{result}");
    // xargs's own redirection is a write of the plan, refused like any other.
    let result = run(&registry, "echo keep.txt | xargs cat > pwned.txt").await;
    assert!(result.starts_with("ERROR denied"), "{result}");
    assert!(result.contains("`> pwned.txt` writes a file"), "{result}");
    assert!(!root.join("pwned.txt").exists());
}

/// A million short lines: each is a run, so the call stops at its time limit with an error
/// result (and the host keeps serving), whether the command is a builtin or a program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_lines_stop_at_the_time_limit() {
    let dir = workspace();
    let root = dir.path();
    let lines: String = (0..1_000_000).map(|line| format!("{line}\n")).collect();
    fs::write(root.join("big.txt"), lines).unwrap();
    let limits = Limits {
        timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let registry = exec_registry_with(root, FsMode::ReadWrite, limits).await;
    run(&registry, "echo warm | cat").await;
    for command in [
        "xargs -n 1 test -n < big.txt",
        "cat big.txt | xargs -n 1 basename",
        "xargs -n 1 true < big.txt; xargs -n 1 true < big.txt; xargs -n 1 true < big.txt; xargs -n 1 true < big.txt; xargs -n 1 true < big.txt",
    ] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(6),
            "`{command}` ran {elapsed:?} under a 3 s limit"
        );
        assert!(
            text.starts_with("ERROR failed") && text.contains("time limit"),
            "`{command}`: {}",
            &text[..300.min(text.len())]
        );
    }
    assert_eq!(
        run(&registry, "cat keep.txt").await,
        "keep me\n[exit status: 0]"
    );
}

/// An item longer than the command-line limit (128 KiB) is refused as GNU xargs refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_too_long_is_refused() {
    let dir = workspace();
    let root = dir.path();
    fs::write(
        root.join("long.txt"),
        format!("short\n{}\n", "a".repeat(200_000)),
    )
    .unwrap();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    let text = run(&registry, "xargs echo < long.txt").await;
    assert_eq!(
        text,
        "short\nxargs: argument line too long\n[exit status: 1]"
    );
    let text = run(&registry, "xargs -I{} echo {} < long.txt").await;
    assert!(
        text.ends_with("xargs: argument line too long\n[exit status: 1]"),
        "{text}"
    );
    // Many short items are split into command lines that fit.
    // 288,894 bytes of numbers with their NULs: three command lines of at most 128 KiB.
    let text = run(&registry, "seq 1 50000 | xargs echo | wc -l").await;
    assert_eq!(text, "3\n[exit status: 0]");
    let text = run(&registry, "seq 1 50000 | xargs echo | wc -w").await;
    assert_eq!(text, "50000\n[exit status: 0]");
}
