//! python3 and qjs through exec, installed from their pinned package the way
//! `clawcage programs install` does: real work on workspace files (csv, json, re, pathlib,
//! datetime, hashlib, scripts with arguments, `-m json.tool`, relative paths from the shell's
//! directory, exact exit codes), and the attacks — files outside the workspace, sockets,
//! subprocesses, a symlink out, an endless loop and a memory bomb — each ending as an error the
//! model reads, never a host crash. Both programs are WASI preview 1 modules built elsewhere (the
//! WebAssembly Language Runtimes' CPython, QuickJS-ng), so they also stand for "a program as
//! published" run unchanged.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use clawcage_tests::installed::programs_with_python;
use clawcage_tests::{grants, registry_of};
use serde_json::json;

async fn python_registry(workspace: &Path, limits: Limits) -> ToolRegistry {
    let grants = grants(workspace, FsMode::ReadWrite, limits)
        .with_exec(ExecGrant::new(programs_with_python().await));
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

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("src/deep")).unwrap();
    fs::create_dir_all(dir.path().join("tools")).unwrap();
    fs::write(
        dir.path().join("data.csv"),
        "group,item,amount\nfruit,apple,3\nveg,leek,4\nfruit,pear,5\nveg,kale,1.5\n",
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_does_real_work_on_workspace_files() {
    let dir = workspace();
    let registry = python_registry(dir.path(), Limits::default()).await;

    let text = run(
        &registry,
        "python3 -c 'import sys; print(sys.version_info[:2])'",
    )
    .await;
    assert_eq!(text, "(3, 12)\n[exit status: 0]");

    // The standard modules the issue names, in one go.
    let text = run(
        &registry,
        "python3 -c 'import csv, json, re, pathlib, datetime, hashlib, collections
rows = list(csv.DictReader(open(\"data.csv\")))
sums = collections.defaultdict(float)
for row in rows: sums[row[\"group\"]] += float(row[\"amount\"])
pathlib.Path(\"result.json\").write_text(json.dumps(sums, sort_keys=True))
print(re.sub(r\"[aeiou]\", \"_\", \"groups\"), len(rows), hashlib.sha256(b\"x\").hexdigest()[:8], datetime.date(2026, 12, 2).isoformat())'",
    )
    .await;
    assert_eq!(text, "gr__ps 4 2d711642 2026-12-02\n[exit status: 0]");
    assert_eq!(
        fs::read_to_string(dir.path().join("result.json")).unwrap(),
        r#"{"fruit": 8.0, "veg": 5.5}"#
    );

    // A script with arguments, and json.tool as a module.
    fs::write(
        dir.path().join("tools/count.py"),
        "import sys\nprint(sys.argv[1:], sum(1 for _ in open(sys.argv[1])))\n",
    )
    .unwrap();
    let text = run(&registry, "python3 tools/count.py data.csv").await;
    assert_eq!(text, "['data.csv'] 5\n[exit status: 0]");
    let text = run(&registry, "python3 -m json.tool result.json").await;
    assert_eq!(
        text,
        "{\n    \"fruit\": 8.0,\n    \"veg\": 5.5\n}\n[exit status: 0]"
    );

    // In a pipeline, both ways.
    let text = run(
        &registry,
        "cat data.csv | python3 -c 'import sys; print(sum(1 for _ in sys.stdin))' | wc -c",
    )
    .await;
    assert_eq!(text, "2\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_resolve_from_the_shells_directory() {
    let dir = workspace();
    fs::write(
        dir.path().join("tools/gen.py"),
        "import sys\nsrc = open('../data.csv').read().count('\\n')\nopen('made.txt', 'w').write(f'{src} lines\\n')\nprint(open('../tools/gen.py').readline().strip())\n",
    )
    .unwrap();
    let registry = python_registry(dir.path(), Limits::default()).await;
    // From src/, a script beside it by `..`; its own relative opens too.
    let text = run(
        &registry,
        "cd src && python3 ../tools/gen.py && cat made.txt",
    )
    .await;
    assert_eq!(text, "import sys\n5 lines\n[exit status: 0]");
    assert!(dir.path().join("src/made.txt").is_file());
    // Two levels down, two levels up; and plain relative names at the root.
    let text = run(
        &registry,
        "cd src/deep && python3 -c 'print(open(\"../../data.csv\").readline().strip())'",
    )
    .await;
    assert_eq!(text, "group,item,amount\n[exit status: 0]");
    let text = run(
        &registry,
        "python3 -c 'print(open(\"data.csv\").readline().strip())'",
    )
    .await;
    assert_eq!(text, "group,item,amount\n[exit status: 0]");
    // Climbing above the workspace finds nothing there.
    let text = run(
        &registry,
        "cd src && python3 -c 'open(\"../../outside.txt\", \"w\")'; echo $?",
    )
    .await;
    assert!(text.ends_with("1\n[exit status: 0]"), "{text}");
    assert!(!dir.path().parent().unwrap().join("outside.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_are_exact() {
    let dir = workspace();
    let registry = python_registry(dir.path(), Limits::default()).await;
    let text = run(
        &registry,
        "python3 -c 'import sys; sys.exit(3)'; echo $?; python3 -c 'raise ValueError(1)' 2>/dev/null; echo $?; python3 -c 'pass' && echo ok",
    )
    .await;
    assert_eq!(text, "3\n1\nok\n[exit status: 0]");
    let text = run(
        &registry,
        "python3 -c 'import sys; sys.exit(42)' || echo fell back",
    )
    .await;
    assert_eq!(text, "fell back\n[exit status: 0]");
    let text = run(&registry, "qjs -e 'std.exit(5)' --std; echo $?").await;
    assert_eq!(text, "5\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_runs_scripts_and_expressions() {
    let dir = workspace();
    fs::write(
        dir.path().join("tools/sum.js"),
        "const total = [1, 2, 3, 4].reduce((a, b) => a + b, 0);\nconsole.log(`total ${total}`, JSON.stringify({ ok: true }));\n",
    )
    .unwrap();
    let registry = python_registry(dir.path(), Limits::default()).await;
    let text = run(&registry, "qjs -e 'console.log(6 * 7)'").await;
    assert_eq!(text, "42\n[exit status: 0]");
    let text = run(&registry, "cd src && qjs ../tools/sum.js").await;
    assert_eq!(text, "total 10 {\"ok\":true}\n[exit status: 0]");
    let text = run(
        &registry,
        "qjs -e 'throw new Error(\"boom\")' 2>&1; echo $?",
    )
    .await;
    assert!(
        text.contains("boom") && text.ends_with("1\n[exit status: 0]"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_cannot_reach_past_the_sandbox() {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    let outside = root.path().join("outside");
    fs::create_dir_all(&workspace).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret.txt"), "the secret\n").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, workspace.join("out")).unwrap();
    let registry = python_registry(&workspace, Limits::default()).await;

    let attempts = [
        // The host's files.
        "open('/etc/passwd').read()",
        "open('../outside/secret.txt').read()",
        // Out through a symlink, reading and writing.
        "open('out/secret.txt').read()",
        "open('out/planted.txt', 'w').write('x')",
        // The network.
        "import socket; socket.create_connection(('127.0.0.1', 9))",
        // Other processes.
        "import subprocess; subprocess.run(['ls'])",
        "import os; assert os.system('ls') == 0",
        "import os; os.execv('/bin/sh', ['sh'])",
        // The host's environment.
        "import os; assert 'HOME' in os.environ or 'PATH' in os.environ, 'no host env'; print(os.environ['PATH'])",
    ];
    for attempt in attempts {
        let command = format!("python3 -c \"{attempt}\"; echo status=$?");
        let text = run(&registry, &command).await;
        assert!(
            text.contains("status=1") && !text.contains("the secret"),
            "{attempt}: {text}"
        );
        assert!(!text.starts_with("ERROR"), "{attempt}: {text}");
    }
    assert!(!outside.join("planted.txt").exists());
    // What the model is told is the program's own error.
    let text = run(
        &registry,
        "python3 -c \"import socket; socket.socket()\" 2>&1",
    )
    .await;
    assert!(text.contains("Error"), "{text}");

    // The shell's working directory swapped for a link out after `cd` took it: the directories
    // preopened for relative paths are opened beneath the workspace, so none of them is the
    // directory outside (`cd` itself refuses the link, `cd out` fails).
    let text = run(&registry, "cd out && echo entered").await;
    assert!(!text.contains("entered"), "{text}");
    for (index, attempt) in [
        "print(open('secret.txt').read())",
        "open('planted.txt', 'w').write('x')",
        "import os; print(os.listdir('.'))",
    ]
    .into_iter()
    .enumerate()
    {
        // Python itself moves its directory away and leaves a link in its place; the next
        // program starts in the same (now linked) working directory.
        let swap = format!(
            "import os; os.rename('../d{index}', '../moved{index}'); os.symlink('../outside', '../d{index}')"
        );
        let command = format!(
            "mkdir d{index} && cd d{index} && python3 -c \"{swap}\" && python3 -c \"{attempt}\"; echo status=$?"
        );
        let text = run(&registry, &command).await;
        assert!(
            !text.contains("the secret") && !text.contains("['secret.txt']"),
            "{attempt}: {text}"
        );
        assert!(text.contains("status=1"), "{attempt}: {text}");
    }
    assert!(!outside.join("planted.txt").exists());
    assert_eq!(
        fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "the secret\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_and_a_memory_bomb_stop_within_the_limits() {
    let dir = workspace();
    let limits = Limits {
        timeout: Duration::from_secs(3),
        memory_bytes: 256 << 20,
        ..Limits::default()
    };
    let registry = python_registry(dir.path(), limits).await;
    // Warm: the limit is the call's, not the first start's.
    assert_eq!(
        run(&registry, "python3 -c 'print(1)'").await,
        "1\n[exit status: 0]"
    );

    let started = Instant::now();
    let text = run(&registry, "python3 -c 'while True: pass'").await;
    let took = started.elapsed();
    assert!(text.contains("time limit"), "{text}");
    assert!(took < Duration::from_secs(4), "stopped after {took:?}");

    let started = Instant::now();
    let text = run(
        &registry,
        "python3 -c 'b = []\nwhile True: b.append(bytearray(1 << 20))'; echo status=$?",
    )
    .await;
    let took = started.elapsed();
    assert!(
        text.contains("memory") || text.contains("MemoryError"),
        "{text}"
    );
    assert!(took < Duration::from_secs(4), "stopped after {took:?}");

    let text = run(
        &registry,
        "qjs -e 'let a = []; for (;;) a.push(new Array(1e6).fill(1))'; echo status=$?",
    )
    .await;
    assert!(
        text.contains("memory") || text.contains("status=1"),
        "{text}"
    );
    // The host keeps serving.
    assert_eq!(
        run(&registry, "python3 -c 'print(2)'").await,
        "2\n[exit status: 0]"
    );
}

/// The whole task an agent is asked, run inside the sandbox through exec: Python sums a column
/// per group into result.json, sed changes one value of config.ini, diff shows the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_agent_does_a_data_task_entirely_inside_the_sandbox() {
    use clawcage_agent::provider::NoEvents;
    use clawcage_agent::{AgentConfig, AgentLoop, TurnEnd};
    use clawcage_core::ChatMessage;
    use clawcage_tests::llm_server::{LlmServer, anthropic};

    let dir = workspace();
    fs::write(
        dir.path().join("config.ini"),
        "[server]\nhost = 127.0.0.1\nport = 8080\n",
    )
    .unwrap();
    let sum = "import csv, json, collections\n\
               sums = collections.defaultdict(float)\n\
               for row in csv.reader(open('data.csv')):\n    \
                   if row[0] != 'group': sums[row[0]] += float(row[2])\n\
               json.dump(dict(sorted(sums.items())), open('result.json', 'w'))\n\
               print('groups:', len(sums))\n";
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "a",
            "exec",
            json!({"command": format!("python3 -c \"{sum}\"")}),
        )]),
        anthropic::message(&[anthropic::tool(
            "b",
            "exec",
            json!({"command": "cp config.ini config.ini.orig && sed -i 's/^port = 8080$/port = 9090/' config.ini && diff -u config.ini.orig config.ini"}),
        )]),
        anthropic::message(&[anthropic::text("Summed the groups and changed the port.")]),
    ])
    .await;
    let tools = python_registry(dir.path(), Limits::default()).await;
    let agent = AgentLoop::new(
        crate::agent_loop::anthropic_provider(&server),
        tools,
        AgentConfig::default(),
    );
    let mut history = vec![ChatMessage::user(
        "Sum column 3 of data.csv per group with Python, write result.json, then show a unified diff of config.ini before and after changing the port with sed.",
    )];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(
        fs::read_to_string(dir.path().join("result.json")).unwrap(),
        r#"{"fruit": 8.0, "veg": 5.5}"#
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("config.ini")).unwrap(),
        "[server]\nhost = 127.0.0.1\nport = 9090\n"
    );
    let bodies = server.bodies();
    let first = bodies[1]["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(first, "groups: 2\n[exit status: 0]");
    let diff = bodies[2]["messages"][4]["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(diff.starts_with("--- config.ini.orig"), "{diff}");
    assert!(
        diff.contains("\n-port = 8080\n+port = 9090\n") && diff.ends_with("[exit status: 1]"),
        "{diff}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_not_installed_says_how_to_install_it() {
    let dir = workspace();
    let registry = clawcage_tests::exec_registry(dir.path(), FsMode::ReadWrite).await;
    for (asked, program) in [
        ("python3", "python3"),
        ("python", "python3"),
        ("qjs", "qjs"),
    ] {
        let text = run(&registry, &format!("{asked} -c 'print(1)'")).await;
        assert!(
            text.contains(&format!(
                "command not found: {asked} ({program} is not installed; an operator installs it with `clawcage programs install {program}`)"
            )) && text.ends_with("[exit status: 127]"),
            "{text}"
        );
        // The host's own table agrees.
        assert!(
            clawcage_sandbox::install::install_hint(asked)
                .is_some_and(|hint| hint.contains(&format!("install {program}`"))),
            "{asked}"
        );
    }
    let text = run(&registry, "perl -e 1").await;
    assert!(text.starts_with("sh: command not found: perl\n"), "{text}");
}
