//! Attacks through the exec tool. Each command runs in a workspace next to a secret file in the
//! same parent directory; afterwards the host checks that nothing outside the workspace was read
//! into the output, changed or created, and that the host keeps serving.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use clawcage_tests::outside::{Layout, SECRET, assert_outside_untouched, exec_text as run};
use clawcage_tests::{exec_registry, exec_registry_with, sandbox};
use serde_json::json;

use crate::file_attacks::{Fifo, RESCUE_AFTER, assert_within_limit};

/// The shared layout, with `inside.txt` in the workspace.
fn layout() -> Layout {
    let layout = clawcage_tests::outside::layout();
    fs::write(layout.workspace.join("inside.txt"), "inside\n").unwrap();
    layout
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "the secret leaked: {text}");
    assert!(!text.contains("root:x:0"), "/etc/passwd leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_outside_the_workspace_fails() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let secret = layout.parent.join("secret.txt");
    for command in [
        "cat /etc/passwd".to_string(),
        "cat ../secret.txt".to_string(),
        format!("cat {}", secret.display()),
        "cd / && ls".to_string(),
        "ls ../..".to_string(),
        "sh -c 'cat /etc/shadow'".to_string(),
        "cat < ../secret.txt".to_string(),
        "grep -r TOP ..".to_string(),
        "find / -name passwd".to_string(),
    ] {
        let text = run(&registry, &command).await;
        assert_no_secret(&text);
        assert!(
            !text.ends_with("[exit status: 0]") || command.starts_with("find"),
            "{command}: {text}"
        );
    }
    let text = run(&registry, "cd / && ls").await;
    assert!(text.contains("outside the workspace"), "{text}");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_to_the_root_leads_nowhere() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(&registry, "ln -s / root && cat root/etc/passwd").await;
    assert_no_secret(&text);
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    std::os::unix::fs::symlink(&layout.parent, layout.workspace.join("up")).unwrap();
    let text = run(
        &registry,
        "cat up/secret.txt; echo pwned > up/new.txt; ls up",
    )
    .await;
    assert_no_secret(&text);
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_outside_the_workspace_fails() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for command in [
        "echo pwned > ../secret.txt",
        "echo pwned >> ../new.txt",
        "cp inside.txt ../copied.txt",
        "sed -i 's/TOP/PWNED/' ../secret.txt",
        "touch /tmp/clawcage-exec-escape",
        "mv inside.txt ../moved.txt",
    ] {
        let text = run(&registry, command).await;
        assert!(!text.ends_with("[exit status: 0]"), "{command}: {text}");
    }
    assert!(!Path::new("/tmp/clawcage-exec-escape").exists());
    assert!(layout.workspace.join("inside.txt").exists());
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rm_rf_root_and_home_leave_the_parent_untouched() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(&registry, "rm -rf /").await;
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    // `~` has no HOME to expand to, so it names a file `~` that does not exist (-f: silent).
    let text = run(&registry, "rm -rf ~").await;
    assert_eq!(text, "[exit status: 0]");
    assert!(layout.workspace.join("inside.txt").exists());
    // `..` of the workspace is outside every preopen: for the program it does not exist, and
    // `-f` keeps that quiet. What matters is checked below: nothing was removed.
    run(&registry, "rm -rf ..").await;
    assert!(layout.workspace.join("inside.txt").exists());
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_bomb_and_background_jobs_are_refused_before_running() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(&registry, ":(){ :|:& };:").await;
    assert!(text.starts_with("ERROR invalid_args"), "{text}");
    assert!(text.contains("functions are not supported"), "{text}");
    let text = run(&registry, "touch made.txt; sleep 1 &").await;
    assert!(text.contains("background jobs"), "{text}");
    assert!(
        !layout.workspace.join("made.txt").exists(),
        "nothing runs when the line is refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_compound_commands_are_refused_not_a_trap() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for (open, close) in [
        ("if true; then ", "; fi"),
        ("while true; do ", "; break; done"),
        ("case a in a) ", ";; esac"),
    ] {
        let command = format!(
            "touch made.txt; {}echo deep{}",
            open.repeat(400),
            close.repeat(400)
        );
        let text = run(&registry, &command).await;
        assert!(text.starts_with("ERROR invalid_args"), "{open}: {text}");
        assert!(text.contains("nested too deeply"), "{open}: {text}");
        assert!(!layout.workspace.join("made.txt").exists());
    }
    // The host serves on, and real nesting runs.
    let text = run(
        &registry,
        "if true; then for x in a b; do echo $x; done; fi",
    )
    .await;
    assert_eq!(text, "a\nb\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_loops_stop_at_the_time_limit() {
    let layout = layout();
    let limits = Limits {
        timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    for command in [
        "while true; do :; done",
        "while true; do true; done",
        "sleep 100",
    ] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        assert!(text.starts_with("ERROR failed"), "{command}: {text}");
        assert!(text.contains("time limit"), "{command}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{command} did stop"
        );
    }
    // The host keeps serving.
    assert_eq!(
        run(&registry, "cat inside.txt").await,
        "inside\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_cut_and_stops_at_the_timeout() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = registry
        .execute_value("exec", &json!({"command": "yes", "timeout_secs": 2}))
        .await
        .unwrap_err()
        .message()
        .to_string();
    assert!(
        text.contains("time limit"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(text.contains("bytes in total"), "the cut states the total");
    assert!(
        text.chars().count() < 11_000,
        "{} characters",
        text.chars().count()
    );
    // A large output that ends is cut too, and the program finished normally.
    let text = run(&registry, "seq 1 200000").await;
    assert!(text.starts_with("1\n2\n3\n"), "{}", &text[..50]);
    assert!(
        text.ends_with("200000\n[exit status: 0]"),
        "{}",
        &text[text.len() - 100..]
    );
    assert!(text.contains("bytes in total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_gigabytes_hits_the_write_limit() {
    let layout = layout();
    // The mechanism is the same for any limit; 64 MiB keeps the test inside its time limit on a
    // slow machine (the default is 1 GiB).
    const LIMIT: u64 = 64 << 20;
    let catalog = clawcage_tests::programs().await;
    let grants = clawcage_tests::grants(&layout.workspace, FsMode::ReadWrite, Limits::default())
        .with_exec(ExecGrant {
            write_limit_bytes: LIMIT,
            ..ExecGrant::new(catalog)
        });
    let registry = clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await;
    for (command, file) in [
        (
            "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx > big.txt",
            "big.txt",
        ),
        (
            "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | tee big2.txt > /dev/null",
            "big2.txt",
        ),
    ] {
        let text = run(&registry, command).await;
        assert!(text.starts_with("ERROR failed"), "{command}: {text}");
        assert!(text.contains("write limit"), "{command}: {text}");
        let size = fs::metadata(layout.workspace.join(file)).unwrap().len();
        assert!(size <= LIMIT + (1 << 20), "{file} is {size} bytes");
        fs::remove_file(layout.workspace.join(file)).unwrap();
    }
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_environment_is_invisible() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(&registry, "env; printenv").await;
    for line in text.lines().filter(|line| line.contains('=')) {
        let name = line.split('=').next().unwrap();
        assert!(
            [
                "CLAWCAGE_WORKSPACE",
                "CLAWCAGE_WORKSPACE_MODE",
                "CLAWCAGE_TIME_LIMIT_MS",
                "PWD"
            ]
            .contains(&name),
            "unexpected variable {line}"
        );
    }
    assert!(!text.contains("PATH=") && !text.contains("HOME="), "{text}");
    // What a program sees is the same.
    let text = run(&registry, "printenv HOME PATH USER; echo $?").await;
    assert!(text.contains("1\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_programs_exist() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for command in [
        "curl https://example.com",
        "wget http://127.0.0.1/",
        "nc -l 8080",
    ] {
        let text = run(&registry, command).await;
        assert!(text.contains("command not found"), "{command}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_substitution_cannot_escape_either() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for command in [
        "echo $(cat /etc/passwd)",
        "echo `cat ../secret.txt`",
        "x=$(cd / && ls); echo \"$x\"",
        "echo $(sh -c 'cat ../secret.txt')",
    ] {
        let text = run(&registry, command).await;
        assert_no_secret(&text);
    }
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_workspace_stays_unchanged() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadOnly).await;
    for command in [
        "echo x > new.txt",
        "rm inside.txt",
        "sed -i 's/i/o/' inside.txt",
        "touch t",
    ] {
        let text = run(&registry, command).await;
        assert!(!text.ends_with("[exit status: 0]"), "{command}: {text}");
    }
    assert_eq!(
        fs::read_to_string(layout.workspace.join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert_eq!(fs::read_dir(&layout.workspace).unwrap().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_are_refused_at_once_as_redirections_and_to_programs() {
    let layout = layout();
    let fifo = Fifo::make(&layout.workspace.join("fifo"));
    let limits = Limits {
        timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    // Programs are loaded when they first run: load these before the calls that are timed.
    let warm_up = "cat inside.txt | grep inside | wc -l | head -1 && ln -s inside.txt l && rm l";
    assert_eq!(run(&registry, warm_up).await, "1\n[exit status: 0]");
    let _watchdog = fifo.watchdog(RESCUE_AFTER);
    let redirection =
        "fifo: not a regular file (a FIFO); redirections work with regular files only";
    for command in [
        "cat < fifo",
        "echo hi > fifo",
        "echo hi >> fifo",
        "cat inside.txt > fifo",
    ] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        assert_within_limit(started, &limits, command);
        assert!(text.contains(redirection), "{command}: {text}");
        assert!(!text.ends_with("[exit status: 0]"), "{command}: {text}");
    }
    // The programs meet the FIFO themselves: some refuse it after a look, the others' open is
    // refused by the host ("not supported").
    for command in [
        "cat fifo",
        "grep x fifo",
        "wc -l fifo",
        "head -1 fifo",
        "cat inside.txt fifo",
        "ln -s fifo link && cat link",
    ] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        assert_within_limit(started, &limits, command);
        assert!(!text.contains("time limit"), "{command}: {text}");
        assert!(
            text.contains("fifo") || text.contains("link"),
            "{command}: {text}"
        );
        assert!(!text.ends_with("[exit status: 0]"), "{command}: {text}");
    }
    fifo.assert_still_a_fifo();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regular_files_still_work_as_redirections_and_arguments() {
    let layout = layout();
    let limits = Limits {
        timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    assert_eq!(
        run(&registry, "cat inside.txt").await,
        "inside\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "cat < inside.txt").await,
        "inside\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "echo one > out.txt && echo two >> out.txt && wc -l < out.txt"
        )
        .await,
        "2\n[exit status: 0]"
    );
    assert_eq!(
        fs::read_to_string(layout.workspace.join("out.txt")).unwrap(),
        "one\ntwo\n"
    );
    let text = run(&registry, "cat < .").await;
    assert!(text.contains("Is a directory"), "{text}");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_the_programs_directory_does_not_block_start_up() {
    let programs = tempfile::tempdir().unwrap();
    let fifo = Fifo::make(&programs.path().join("blocker.wasm"));
    // Compiling the bundled programs can take a while: only a hang is a failure here.
    let _watchdog = fifo.watchdog(Duration::from_secs(120));
    let catalog = sandbox().programs(Some(programs.path())).await.unwrap();
    assert!(catalog.origin("blocker").is_none(), "{:?}", catalog.names());
    assert!(catalog.origin("cat").is_some());
    fifo.assert_still_a_fifo();
}

/// Every way a command line can run long ends within the operator's limit plus a second: a
/// `timeout_secs` above the operator's limit (the argument may shorten it, never lengthen it),
/// a flood inside a pipeline, nested shells, a program that never reads its input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_time_limit_holds_on_every_path() {
    let layout = layout();
    let limits = Limits {
        timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    // Load the programs first: the limit is the call's, not the first start's.
    run(&registry, "echo warm | cat").await;
    for command in [
        "while true; do :; done",
        "yes | cat | wc -l",
        "yes | sort",
        "yes > flood.txt",
        "sh -c 'sh -c \"sh -c \\\"while true; do :; done\\\"\"'",
        "cat | cat",
        "for i in $(seq 1 100000000); do echo $i; done",
    ] {
        let started = Instant::now();
        let result = registry
            .execute_value("exec", &json!({"command": command, "timeout_secs": 60}))
            .await;
        let elapsed = started.elapsed();
        let text = match result {
            Ok(output) => output.text,
            Err(error) => error.message().to_string(),
        };
        assert!(
            elapsed < Duration::from_secs(3),
            "{command} ran {elapsed:?} under a 2 s limit: {}",
            &text[..300.min(text.len())]
        );
        assert!(
            text.contains("time limit") || text.contains("exit status"),
            "{command}: {}",
            &text[..300.min(text.len())]
        );
    }
    let _ = std::fs::remove_file(layout.workspace.join("flood.txt"));
    assert_eq!(
        run(&registry, "cat inside.txt").await,
        "inside\n[exit status: 0]"
    );
}
