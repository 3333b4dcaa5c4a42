//! `[approvals] write = "ask"`: a change under a read-only workspace is asked, through the real
//! component in the real engine. A hostile fixture calls each mutating `wasi:filesystem`
//! function itself (no SDK between it and the host): refused, each leaves the workspace as it
//! was; approved, exactly that one operation happens and the next one is asked again. Escapes
//! stay refused whatever the answer. The exec tool's programs and redirections ask the same way,
//! the file tools ask once per file, the call's time limit stands still while a person decides,
//! and the broker keeps allow-always answers by path.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_agent::ToolRegistry;
use clawcage_agent::approvals::{ApprovalBroker, ApprovalSettings, ApprovalStore};
use clawcage_core::approval::{
    ApprovalDecision, ApprovalGate, ExecPlan, GateAnswer, GateFuture, RequestGateFuture,
    WriteRequest, WriteReviewer,
};
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::{ExecGrant, FsMode, Grants, Limits, WorkspaceGrant};
use serde_json::{Value, json};

/// What a [`ScriptedGate`] answers and what it was asked.
#[derive(Debug, Default)]
struct Script {
    /// Answers still to give, the next one last (`true` allows).
    answers: Vec<bool>,
    asked: Vec<String>,
}

/// A gate that answers writes from a script (then refuses) and records each question.
#[derive(Debug, Default)]
struct ScriptedGate {
    script: Arc<Mutex<Script>>,
    /// How long each answer takes.
    delay: Duration,
}

impl ScriptedGate {
    fn new(answers: &[bool]) -> Arc<ScriptedGate> {
        Self::slow(answers, Duration::ZERO)
    }

    fn slow(answers: &[bool], delay: Duration) -> Arc<ScriptedGate> {
        Arc::new(ScriptedGate {
            script: Arc::new(Mutex::new(Script {
                answers: answers.iter().rev().copied().collect(),
                asked: Vec::new(),
            })),
            delay,
        })
    }

    fn allowing_everything() -> Arc<ScriptedGate> {
        Self::new(&[true; 64])
    }

    fn asked(&self) -> Vec<String> {
        self.script.lock().unwrap().asked.clone()
    }
}

impl ApprovalGate for ScriptedGate {
    fn active(&self) -> bool {
        false
    }

    fn review(&self, _tool: &str, _plan: Option<ExecPlan>) -> GateFuture {
        Box::pin(async { GateAnswer::Denied("exec is not reviewed here".into()) })
    }

    fn write_reviewer(&self) -> Option<WriteReviewer> {
        let script = self.script.clone();
        let delay = self.delay;
        Some(Arc::new(
            move |request: WriteRequest| -> RequestGateFuture {
                let script = script.clone();
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    let mut script = script.lock().unwrap();
                    script.asked.push(request.describe());
                    match script.answers.pop() {
                        Some(true) => Ok(()),
                        _ => Err(format!(
                            "denied by the operator: the user refused {}",
                            request.describe()
                        )),
                    }
                })
            },
        ))
    }
}

/// A read-only workspace whose writes `gate` decides.
fn asking_grants(dir: &Path, gate: Arc<dyn ApprovalGate>, limits: Limits) -> Grants {
    Grants::workspace(
        WorkspaceGrant::new(dir, FsMode::ReadOnly)
            .unwrap()
            .with_write_approvals(gate),
    )
    .with_limits(limits)
}

async fn hostile(dir: &Path, gate: Arc<dyn ApprovalGate>, limits: Limits) -> ToolRegistry {
    let rawfs = clawcage_tests::fixture(fixtures::RAWFS);
    clawcage_tests::registry_of(&[("rawfs", &rawfs)], asking_grants(dir, gate, limits)).await
}

/// Runs `ops` through the fixture; one line per operation, `OP ARGS: ok` or `...: error: ...`.
async fn ops(registry: &ToolRegistry, ops: &[&[&str]]) -> Vec<String> {
    let output = registry
        .execute_value("raw_ops", &json!({ "ops": ops }))
        .await
        .unwrap_or_else(|error| panic!("raw_ops failed as a call: {error}"));
    // A note about refused writes may follow the fixture's own lines.
    output
        .text
        .lines()
        .take(ops.len())
        .map(str::to_string)
        .collect()
}

async fn exec_registry(dir: &Path, gate: Arc<ScriptedGate>, limits: Limits) -> ToolRegistry {
    let grants = asking_grants(dir, gate, limits)
        .with_exec(ExecGrant::new(clawcage_tests::programs().await));
    clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await
}

async fn call(registry: &ToolRegistry, tool: &str, args: Value) -> String {
    match registry.execute_value(tool, &args).await {
        Ok(output) => output.text,
        Err(error) => format!("ERROR {}: {}", error.kind(), error.message()),
    }
}

/// Every entry under `dir` with its content (`->` target for a link, `/` for a directory).
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            let kind = fs::symlink_metadata(&path).unwrap();
            let value = if kind.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&path).unwrap().display())
            } else if kind.is_dir() {
                pending.push(path.clone());
                "/".to_string()
            } else {
                format!(
                    "{} (mtime {:?})",
                    fs::read_to_string(&path).unwrap(),
                    kind.modified().unwrap()
                )
            };
            entries.insert(name, value);
        }
    }
    entries
}

/// A workspace `ws/` with a file, an empty directory and a link out, beside `outside/`.
struct Layout {
    _root: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn layout() -> Layout {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    let outside = root.path().join("outside");
    fs::create_dir_all(ws.join("empty")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(ws.join("keep.txt"), "keep me\n").unwrap();
    symlink(&outside, ws.join("out")).unwrap();
    let ws = ws.canonicalize().unwrap();
    Layout {
        _root: root,
        ws,
        outside,
    }
}

/// Every mutating operation, one `wasi:filesystem` function each, on paths inside `ws`.
const EVERY_CHANGE: &[&[&str]] = &[
    &["create-new", "new.txt"],
    &["write", "keep.txt", "overwritten"],
    &["open-write", "keep.txt"],
    &["append", "keep.txt", "more"],
    &["truncate", "keep.txt"],
    &["mkdir", "dir"],
    &["rmdir", "empty"],
    &["unlink", "keep.txt"],
    &["rename", "keep.txt", "moved.txt"],
    &["symlink", "keep.txt", "alias"],
    &["link", "keep.txt", "hard.txt"],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_filesystem_function_asks_and_a_refusal_changes_nothing() {
    let layout = layout();
    let before = snapshot(&layout.ws);
    let gate = ScriptedGate::new(&[]);
    let registry = hostile(&layout.ws, gate.clone(), Limits::default()).await;
    let lines = ops(&registry, EVERY_CHANGE).await;
    for line in &lines {
        assert!(line.contains(": error:"), "{lines:#?}");
    }
    assert_eq!(snapshot(&layout.ws), before, "{lines:#?}");
    let ws = layout.ws.display();
    assert_eq!(
        gate.asked(),
        [
            format!("create or change {ws}/new.txt"),
            format!("create or change {ws}/keep.txt"),
            format!("create or change {ws}/keep.txt"),
            format!("create or change {ws}/keep.txt"),
            format!("create or change {ws}/keep.txt"),
            format!("create the directory {ws}/dir"),
            format!("remove the directory {ws}/empty"),
            format!("remove {ws}/keep.txt"),
            format!("rename {ws}/keep.txt to {ws}/moved.txt"),
            format!("create the symbolic link {ws}/alias -> keep.txt"),
            format!("create the hard link {ws}/hard.txt to {ws}/keep.txt"),
        ]
    );
    // The model learns why: the operator's words follow the fixture's report.
    let output = registry
        .execute_value("raw_ops", &json!({"ops": [["write", "x.txt", "x"]]}))
        .await
        .unwrap();
    assert!(
        output.text.contains("denied by the operator"),
        "{}",
        output.text
    );
    // Reading is never asked.
    let asked = gate.asked().len();
    let read = call(&registry, "raw_read", json!({"path": "keep.txt"})).await;
    assert_eq!(read, "keep me\n");
    assert_eq!(gate.asked().len(), asked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_allows_exactly_one_operation_and_the_next_is_asked_again() {
    let layout = layout();
    // Approved one by one, each operation does what it says.
    let gate = ScriptedGate::allowing_everything();
    let registry = hostile(&layout.ws, gate.clone(), Limits::default()).await;
    let lines = ops(
        &registry,
        &[
            &["create-new", "new.txt"],
            &["write", "new.txt", "written"],
            &["append", "new.txt", "+more"],
            &["mkdir", "dir"],
            &["rename", "new.txt", "dir/moved.txt"],
            &["symlink", "dir/moved.txt", "alias"],
            &["link", "dir/moved.txt", "hard.txt"],
            &["rmdir", "empty"],
            &["unlink", "alias"],
        ],
    )
    .await;
    for line in &lines {
        assert!(line.ends_with(": ok"), "{lines:#?}");
    }
    let ws = &layout.ws;
    assert_eq!(
        fs::read_to_string(ws.join("dir/moved.txt")).unwrap(),
        "written+more"
    );
    assert_eq!(
        fs::read_to_string(ws.join("hard.txt")).unwrap(),
        "written+more"
    );
    assert!(!ws.join("empty").exists() && !ws.join("alias").exists());
    assert_eq!(gate.asked().len(), 9);

    // One yes, then no: the first write happens, the second (same directory, same call) does
    // not, and neither does anything after it.
    let gate = ScriptedGate::new(&[true]);
    let registry = hostile(&layout.ws, gate.clone(), Limits::default()).await;
    let lines = ops(
        &registry,
        &[
            &["write", "a.txt", "approved"],
            &["write", "b.txt", "refused"],
            &["unlink", "a.txt"],
            &["mkdir", "dir/sub"],
            &["write", "dir/c.txt", "refused"],
        ],
    )
    .await;
    assert!(lines[0].ends_with(": ok"), "{lines:#?}");
    for line in &lines[1..] {
        assert!(line.contains(": error:"), "{lines:#?}");
    }
    assert_eq!(fs::read_to_string(ws.join("a.txt")).unwrap(), "approved");
    assert!(!ws.join("b.txt").exists() && !ws.join("dir/sub").exists());
    assert!(!ws.join("dir/c.txt").exists());
    assert_eq!(gate.asked().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_stay_refused_whatever_the_operator_answers() {
    let layout = layout();
    let gate = ScriptedGate::allowing_everything();
    let registry = hostile(&layout.ws, gate.clone(), Limits::default()).await;
    let outside = layout.outside.display().to_string();
    let lines = ops(
        &registry,
        &[
            &["write", "../outside/escape.txt", "x"],
            &["write", &format!("{outside}/escape.txt"), "x"],
            &["write", "out/escape.txt", "x"],
            &["mkdir", "out/dir"],
            &["rename", "keep.txt", "out/keep.txt"],
            &["link", "keep.txt", "out/hard.txt"],
            &["symlink", "/etc/passwd", "out/link"],
            &["unlink", "out"],
            &["rmdir", "."],
            &["mkdir", "."],
            &["mkdir-all", "empty"],
        ],
    )
    .await;
    for line in &lines[..7] {
        assert!(line.contains(": error:"), "{lines:#?}");
    }
    assert_eq!(
        fs::read_dir(&layout.outside).unwrap().count(),
        0,
        "{lines:#?}"
    );
    assert_eq!(
        fs::read_to_string(layout.ws.join("keep.txt")).unwrap(),
        "keep me\n"
    );
    // A path that leaves the workspace by name is refused without a question.
    for asked in gate.asked() {
        assert!(!asked.contains("outside"), "{asked}");
    }
    // Removing the link itself (not what it points to) is a change inside the workspace.
    assert!(lines[7].ends_with(": ok"), "{lines:#?}");
    assert!(layout.outside.exists());
    assert!(lines[8].contains(": error:"), "{lines:#?}");
    // What exists is reported as existing, unasked (`create_dir_all` of a parent relies on it).
    assert!(lines[9].contains("exists"), "{lines:#?}");
    assert!(lines[10].ends_with(": ok"), "{lines:#?}");
    assert!(
        gate.asked()
            .iter()
            .all(|asked| !asked.contains("directory") || asked.contains("out/dir")),
        "{:#?}",
        gate.asked()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gate_or_with_a_writable_workspace_nothing_is_asked() {
    let layout = layout();
    // Read-only without a gate: refused, nobody asked.
    let rawfs = clawcage_tests::fixture(fixtures::RAWFS);
    let plain = clawcage_tests::registry_of(
        &[("rawfs", &rawfs)],
        clawcage_tests::grants(&layout.ws, FsMode::ReadOnly, Limits::default()),
    )
    .await;
    let lines = ops(&plain, &[&["write", "a.txt", "x"]]).await;
    assert!(lines[0].contains(": error:"), "{lines:#?}");
    let env = call(&plain, "raw_env", json!({})).await;
    assert!(env.contains("CLAWCAGE_WORKSPACE_MODE=ro\n"), "{env}");
    // Read-write: the gate is not attached, writes go ahead unasked.
    let gate = ScriptedGate::new(&[]);
    let writable = clawcage_tests::registry_of(
        &[("rawfs", &rawfs)],
        Grants::workspace(
            WorkspaceGrant::new(&layout.ws, FsMode::ReadWrite)
                .unwrap()
                .with_write_approvals(gate.clone()),
        ),
    )
    .await;
    let lines = ops(&writable, &[&["write", "a.txt", "x"]]).await;
    assert!(lines[0].ends_with(": ok"), "{lines:#?}");
    assert!(gate.asked().is_empty());
    // With the gate, the guest is told it may try.
    let asking = hostile(&layout.ws, ScriptedGate::new(&[]), Limits::default()).await;
    let env = call(&asking, "raw_env", json!({})).await;
    assert!(env.contains("CLAWCAGE_WORKSPACE_MODE=ro-ask"), "{env}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_tools_ask_once_per_file_and_a_refusal_is_the_models_denial() {
    let layout = layout();
    let gate = ScriptedGate::new(&[true, true, false]);
    let grants = asking_grants(&layout.ws, gate.clone(), Limits::default());
    let registry = clawcage_tests::registry_of(&[("file", bundled::FILE)], grants).await;
    let ws = layout.ws.display();

    let written = call(
        &registry,
        "write_file",
        json!({"path": "notes.txt", "content": "one\ntwo\n"}),
    )
    .await;
    assert!(
        written.starts_with("wrote 8 bytes"),
        "{written}; asked: {:?}",
        gate.asked()
    );
    let edited = call(
        &registry,
        "edit_file",
        json!({"path": "notes.txt", "old_text": "two", "new_text": "deux"}),
    )
    .await;
    assert!(!edited.starts_with("ERROR"), "{edited}");
    assert_eq!(
        fs::read_to_string(layout.ws.join("notes.txt")).unwrap(),
        "one\ndeux\n"
    );
    assert_eq!(
        gate.asked(),
        [
            format!("create or change {ws}/notes.txt"),
            format!("create or change {ws}/notes.txt"),
        ]
    );
    // Refused: a denial in the operator's words (which the agent loop counts), nothing written,
    // no temporary file left.
    let refused = call(
        &registry,
        "write_file",
        json!({"path": "keep.txt", "content": "gone"}),
    )
    .await;
    assert!(refused.starts_with("ERROR denied"), "{refused}");
    assert!(refused.contains("denied by the operator"), "{refused}");
    assert_eq!(
        fs::read_to_string(layout.ws.join("keep.txt")).unwrap(),
        "keep me\n"
    );
    assert_eq!(fs::read_dir(&layout.ws).unwrap().count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_programs_and_redirections_ask_for_each_write() {
    let layout = layout();
    let ws = layout.ws.display().to_string();

    let script = "echo hi > out.txt; echo more >> keep.txt; cp keep.txt copy.txt; mkdir made; \
                  touch -c keep.txt; mv keep.txt moved.txt; rm keep.txt; ln -s keep.txt alias; \
                  ls";
    // Every write refused: nothing changed, and each program said so.
    let before = snapshot(&layout.ws);
    let gate = ScriptedGate::new(&[]);
    let registry = exec_registry(&layout.ws, gate.clone(), Limits::default()).await;
    let output = call(&registry, "exec", json!({ "command": script })).await;
    assert_eq!(snapshot(&layout.ws), before, "{output}");
    assert!(output.contains("keep.txt"), "ls still ran: {output}");
    assert!(output.contains("denied by the operator"), "{output}");
    let asked = gate.asked();
    for expected in [
        format!("create or change {ws}/out.txt"),
        format!("create or change {ws}/keep.txt"),
        format!("create or change {ws}/copy.txt"),
        format!("create the directory {ws}/made"),
        format!("change the times of {ws}/keep.txt"),
        format!("rename {ws}/keep.txt to {ws}/moved.txt"),
        format!("remove {ws}/keep.txt"),
        format!("create the symbolic link {ws}/alias -> keep.txt"),
    ] {
        assert!(
            asked.contains(&expected),
            "{expected} not in {asked:#?}; the output: {output}"
        );
    }

    // Approved: the same line does it all.
    let gate = ScriptedGate::allowing_everything();
    let registry = exec_registry(&layout.ws, gate.clone(), Limits::default()).await;
    let output = call(
        &registry,
        "exec",
        json!({ "command": "echo hi > out.txt && mkdir made && cp keep.txt made/copy.txt && rm keep.txt && echo done" }),
    )
    .await;
    assert!(output.contains("done"), "{output}");
    assert_eq!(
        fs::read_to_string(layout.ws.join("out.txt")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        fs::read_to_string(layout.ws.join("made/copy.txt")).unwrap(),
        "keep me\n"
    );
    assert!(!layout.ws.join("keep.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_stands_still_while_a_person_decides() {
    let layout = layout();
    // Each answer takes 1.5 s; the call may run 1 s. Two questions: 3 s of waiting.
    let gate = ScriptedGate::slow(&[true, true], Duration::from_millis(1_500));
    let limits = Limits {
        timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let registry = hostile(&layout.ws, gate.clone(), limits).await;
    let lines = ops(
        &registry,
        &[&["write", "a.txt", "first"], &["write", "b.txt", "second"]],
    )
    .await;
    assert_eq!(lines, ["write a.txt first: ok", "write b.txt second: ok"]);
    // The same for exec, whose shell measures its own budget on the guest's clock.
    let exec = exec_registry(
        &layout.ws,
        ScriptedGate::slow(&[true], Duration::from_millis(1_500)),
        Limits {
            timeout: Duration::from_secs(3),
            ..Limits::default()
        },
    )
    .await;
    let output = call(
        &exec,
        "exec",
        json!({ "command": "echo one > c.txt; sleep 2; echo finished" }),
    )
    .await;
    assert!(output.contains("finished"), "{output}");
    // Work past the limit is still stopped after a pause.
    let output = call(
        &exec,
        "exec",
        json!({ "command": "echo two > d.txt; sleep 10; echo never" }),
    )
    .await;
    assert!(!output.contains("never"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_asks_an_operator_and_keeps_allow_always_by_path() {
    let layout = layout();
    let state = tempfile::tempdir().unwrap();
    let broker = ApprovalBroker::new(
        ApprovalSettings {
            write_ask: true,
            ..ApprovalSettings::default()
        },
        Some(ApprovalStore::in_state_dir(state.path())),
        None,
    );
    let registry = hostile(&layout.ws, Arc::new(broker.clone()), Limits::default()).await;
    let ws = layout.ws.display().to_string();

    // Nobody to ask: the fallback (deny) refuses.
    let lines = ops(&registry, &[&["write", "a.txt", "x"]]).await;
    assert!(lines[0].contains(": error:"), "{lines:#?}");

    let answering = clawcage_tests::answer_in_order(
        &broker,
        vec![ApprovalDecision::AllowAlways, ApprovalDecision::Deny],
    );
    let lines = ops(
        &registry,
        &[&["write", "a.txt", "kept"], &["write", "b.txt", "refused"]],
    )
    .await;
    let asked = answering.await.unwrap();
    assert_eq!(
        asked,
        [
            ("write".to_string(), format!("create or change {ws}/a.txt")),
            ("write".to_string(), format!("create or change {ws}/b.txt")),
        ]
    );
    assert!(
        lines[0].ends_with(": ok") && lines[1].contains(": error:"),
        "{lines:#?}"
    );
    // Kept: that path passes without an operator; another path does not.
    let lines = ops(
        &registry,
        &[&["write", "a.txt", "again"], &["write", "c.txt", "no"]],
    )
    .await;
    assert!(
        lines[0].ends_with(": ok") && lines[1].contains(": error:"),
        "{lines:#?}"
    );
    assert_eq!(
        fs::read_to_string(layout.ws.join("a.txt")).unwrap(),
        "again"
    );
    let kept = ApprovalStore::in_state_dir(state.path()).list().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].kind, "write");
    assert_eq!(kept[0].rule(), format!("{ws}/a.txt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_names_the_real_file_and_a_link_cannot_redirect_the_answer() {
    let layout = layout();
    let ws = &layout.ws;
    fs::create_dir(ws.join("real")).unwrap();
    symlink("real", ws.join("docs")).unwrap();
    symlink("keep.txt", ws.join("alias")).unwrap();
    let gate = ScriptedGate::allowing_everything();
    let registry = hostile(ws, gate.clone(), Limits::default()).await;
    let lines = ops(
        &registry,
        &[
            // Through a linked directory: the question names where the file really goes.
            &["write", "docs/x.txt", "through the link"],
            // A last link would be followed: refused without a question.
            &["write", "alias", "through a final link"],
            &["open-write", "alias"],
            // The link itself may be removed (that names no other file).
            &["unlink", "alias"],
        ],
    )
    .await;
    assert!(lines[0].ends_with(": ok"), "{lines:#?}");
    assert!(
        lines[1].contains(": error:") && lines[2].contains(": error:"),
        "{lines:#?}"
    );
    assert!(lines[3].ends_with(": ok"), "{lines:#?}");
    assert_eq!(
        fs::read_to_string(ws.join("real/x.txt")).unwrap(),
        "through the link"
    );
    assert_eq!(
        fs::read_to_string(ws.join("keep.txt")).unwrap(),
        "keep me\n"
    );
    let shown = ws.display();
    assert_eq!(
        gate.asked(),
        [
            format!("create or change {shown}/real/x.txt"),
            format!("remove {shown}/alias"),
        ]
    );
    // The same for exec's redirections and programs.
    symlink("keep.txt", ws.join("alias")).unwrap();
    let gate = ScriptedGate::allowing_everything();
    let exec = exec_registry(ws, gate.clone(), Limits::default()).await;
    let output = call(
        &exec,
        "exec",
        json!({ "command": "echo y > docs/y.txt; echo z > alias; cp keep.txt docs/copy.txt" }),
    )
    .await;
    assert_eq!(fs::read_to_string(ws.join("real/y.txt")).unwrap(), "y\n");
    assert_eq!(
        fs::read_to_string(ws.join("real/copy.txt")).unwrap(),
        "keep me\n"
    );
    assert_eq!(
        fs::read_to_string(ws.join("keep.txt")).unwrap(),
        "keep me\n",
        "{output}"
    );
    assert!(output.contains("alias: a symbolic link"), "{output}");
    assert_eq!(
        gate.asked(),
        [
            format!("create or change {shown}/real/y.txt"),
            format!("create or change {shown}/real/copy.txt"),
        ]
    );
}
