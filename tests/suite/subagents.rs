//! Sub-agents: a parent spawns children that run in parallel on the real file component with the
//! workspace read-only, against a scripted LLM server on 127.0.0.1 that answers each request by
//! what it contains (children ask concurrently, so no fixed order would do). Their results come
//! back through the bus into the parent's lane; limits refuse with the limit named; a child's
//! excluded tools are unknown to it and their components never run; a restart reports the runs it
//! cut off.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::provider::NoEvents;
use clawcage_agent::subagent::{SYSTEM_CHANNEL, SubagentStatus};
use clawcage_agent::{
    AgentConfig, AgentError, AgentLoop, CronOptions, CronService, MessageBus, Sessions,
    SubagentConfig, SubagentManager, SubagentSetup, ToolRegistry,
};
use clawcage_core::{BoxFuture, InboundMessage, Tool, ToolError, ToolOutput, ToolSpec};
use clawcage_sandbox::{FsMode, Grants, Limits, LoadedComponent, components};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, text_of};
use clawcage_tests::{grants, sandbox};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::agent_loop::anthropic_provider;

/// A tool that returns only once the test opens the gate, so children stay running as long as
/// the test needs.
#[derive(Debug)]
pub struct Gate {
    spec: ToolSpec,
    open: watch::Receiver<bool>,
}

pub fn gate() -> (Arc<Gate>, watch::Sender<bool>) {
    let (sender, open) = watch::channel(false);
    let gate = Gate {
        spec: ToolSpec {
            name: "gate".into(),
            description: "Waits until the test lets it through.".into(),
            input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
        open,
    };
    (Arc::new(gate), sender)
}

impl Tool for Gate {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, _args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let mut open = self.open.clone();
            let _ = open.wait_for(|open| *open).await;
            Ok(ToolOutput::text("the gate is open"))
        })
    }
}

/// The file component loaded with `mode`, kept so its instantiations can be counted.
async fn file_component(dir: &Path, mode: FsMode) -> LoadedComponent {
    sandbox()
        .load(
            "file",
            "bundled:file",
            components::bundled::FILE,
            grants(dir, mode, Limits::default()),
        )
        .await
        .unwrap()
}

fn registry(component: &LoadedComponent, extra: &[Arc<dyn Tool>]) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for tool in component.tools() {
        registry.register(Arc::new(tool.clone())).unwrap();
    }
    for tool in extra {
        registry.register(tool.clone()).unwrap();
    }
    registry
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "apples\n").unwrap();
    std::fs::write(dir.path().join("b.txt"), "bananas\n").unwrap();
    std::fs::write(dir.path().join("c.txt"), "cherries\n").unwrap();
    dir
}

fn is_child(body: &Value) -> bool {
    body["system"]
        .as_str()
        .is_some_and(|system| system.contains("You are a sub-agent"))
}

fn messages(body: &Value) -> &Vec<Value> {
    body["messages"].as_array().unwrap()
}

/// The tool results of a message, in order.
fn results_of(message: &Value) -> Vec<String> {
    message["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|block| block["type"] == "tool_result")
                .map(|block| match &block["content"] {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A child's script: wait at the gate, read the file its task names, answer with its content.
/// A task starting with `call:` instead calls the listed tools at once and reports their results.
fn child_reply(body: &Value) -> Reply {
    let history = messages(body);
    let task = text_of(&history[0]);
    let last = history.last().unwrap();
    if let Some(names) = task.strip_prefix("call:") {
        if history.len() == 1 {
            let blocks: Vec<anthropic::Block> = names
                .split(',')
                .enumerate()
                .map(|(n, name)| {
                    let input = match name {
                        "write_file" => json!({"path": "new.txt", "content": "x"}),
                        "edit_file" => json!({"path": "a.txt", "old": "apples", "new": "pears"}),
                        "spawn" => json!({"task": "grandchild"}),
                        _ => json!({}),
                    };
                    anthropic::tool(&format!("c{n}"), name, input)
                })
                .collect();
            return anthropic::message(&blocks);
        }
        return anthropic::message(&[anthropic::text(&results_of(last).join("\n"))]);
    }
    let file = task.split_whitespace().last().unwrap().to_string();
    match history.len() {
        1 => anthropic::message(&[anthropic::tool("g", "gate", json!({}))]),
        3 => anthropic::message(&[anthropic::tool("r", "read_file", json!({"path": file}))]),
        _ => {
            let content = results_of(last).join("");
            anthropic::message(&[anthropic::text(&format!(
                "{file} holds: {}",
                content.trim()
            ))])
        }
    }
}

/// The parent's script: spawn three children, answer while they work, and summarise the
/// announcements it has received.
fn parent_reply(body: &Value) -> Reply {
    let history = messages(body);
    let last = history.last().unwrap();
    let text = text_of(last);
    if text.starts_with("Read a.txt, b.txt and c.txt") {
        return anthropic::message(&[
            anthropic::text("I'll hand each file to a helper."),
            anthropic::tool(
                "s1",
                "spawn",
                json!({"task": "Report the content of a.txt", "label": "a"}),
            ),
            anthropic::tool(
                "s2",
                "spawn",
                json!({"task": "Report the content of b.txt", "label": "b"}),
            ),
            anthropic::tool(
                "s3",
                "spawn",
                json!({"task": "Report the content of c.txt", "label": "c"}),
            ),
        ]);
    }
    if !results_of(last).is_empty() {
        return anthropic::message(&[anthropic::text("Three helpers are at work.")]);
    }
    if text == "Are you still there?" {
        return anthropic::message(&[anthropic::text("Yes; the helpers are still working.")]);
    }
    // A notification: summarise every announcement received so far.
    let reports: Vec<String> = history
        .iter()
        .map(text_of)
        .filter(|text| text.starts_with("[notification"))
        .filter_map(|text| {
            text.lines()
                .find(|line| line.contains(" holds: "))
                .map(ToString::to_string)
        })
        .collect();
    anthropic::message(&[anthropic::text(&format!(
        "{} of 3 reported. {}",
        reports.len(),
        reports.join(" ")
    ))])
}

fn route(body: &Value) -> Reply {
    if is_child(body) {
        child_reply(body)
    } else {
        parent_reply(body)
    }
}

struct Family {
    manager: Arc<SubagentManager>,
    parent_tools: ToolRegistry,
    children_file: LoadedComponent,
    cron: LoadedComponent,
    gate: watch::Sender<bool>,
    bus: MessageBus,
    _jobs: tempfile::TempDir,
}

/// A parent with the file tools read-write, the real `cron` component and the gate; children
/// get the file tools read-only.
async fn family(
    dir: &Path,
    state: Option<&Path>,
    server: &LlmServer,
    config: SubagentConfig,
) -> Family {
    let (gate, open) = gate();
    let bus = MessageBus::new();
    let jobs = tempfile::tempdir().unwrap();
    let service = CronService::open(jobs.path(), bus.clone(), CronOptions::default()).unwrap();
    let cron = sandbox()
        .load(
            "cron",
            "bundled:cron",
            components::bundled::CRON,
            Grants::none().with_scheduler(service),
        )
        .await
        .unwrap();
    let parent_file = file_component(dir, FsMode::ReadWrite).await;
    let children_file = file_component(dir, FsMode::ReadOnly).await;
    let extra: Vec<Arc<dyn Tool>> = vec![gate.clone()];
    let mut parent_tools = registry(&parent_file, &extra);
    let mut child_tools = registry(&children_file, &extra);
    for tool in cron.tools() {
        parent_tools.register(Arc::new(tool.clone())).unwrap();
        child_tools.register(Arc::new(tool.clone())).unwrap();
    }
    let manager = SubagentManager::new(
        &parent_tools,
        SubagentSetup {
            state_dir: state.map(Path::to_path_buf),
            provider: Some(anthropic_provider(server)),
            ..SubagentSetup::new(child_tools, config, bus.clone())
        },
    )
    .unwrap();
    parent_tools.register(manager.spawn_tool()).unwrap();
    parent_tools.register(manager.subagents_tool()).unwrap();
    Family {
        manager,
        parent_tools,
        children_file,
        cron,
        gate: open,
        bus,
        _jobs: jobs,
    }
}

async fn next_announcement(subscription: &mut clawcage_agent::Subscription) -> InboundMessage {
    tokio::time::timeout(Duration::from_secs(60), subscription.recv())
        .await
        .expect("an announcement within a minute")
        .expect("the bus is open")
}

async fn wait_until(mut condition: impl FnMut() -> bool) {
    for _ in 0..600 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the condition did not become true within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_children_run_in_parallel_and_the_parent_summarises_their_announcements() {
    let dir = workspace();
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start_routed(route).await;
    let family = family(
        dir.path(),
        Some(state.path()),
        &server,
        SubagentConfig::default(),
    )
    .await;
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        family.parent_tools.clone(),
        AgentConfig::default(),
    );
    let sessions = Sessions::new(agent, None, 100);
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let _router = sessions.deliver_notifications(
        family.bus.subscribe(SYSTEM_CHANNEL),
        Arc::new(NoEvents),
        Arc::new(
            move |message: &InboundMessage, outcome: Result<_, AgentError>| {
                let _ = sender.send((message.clone(), outcome.map(|o| o.text)));
            },
        ),
    );

    let first = sessions
        .send_user(
            "main",
            "Read a.txt, b.txt and c.txt with helpers.",
            Arc::new(NoEvents),
        )
        .await
        .unwrap();
    assert_eq!(first.text, "Three helpers are at work.");
    // The spawn results went back to the model: ids and the running count.
    let bodies = server.bodies();
    let parent_second = bodies.iter().filter(|body| !is_child(body)).nth(1).unwrap();
    let spawned = results_of(messages(parent_second).last().unwrap());
    assert_eq!(spawned.len(), 3);
    for (n, result) in spawned.iter().enumerate() {
        assert!(
            result.starts_with(&format!("Started sub-agent sub-{}", n + 1))
                && result.contains(&format!("({} running now)", n + 1)),
            "{result}"
        );
    }

    // All three are waiting at the gate at the same time, and the parent still answers.
    wait_until(|| family.manager.running() == 3).await;
    let reply = sessions
        .send_user("main", "Are you still there?", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(reply.text, "Yes; the helpers are still working.");
    assert_eq!(
        family.manager.running(),
        3,
        "the children are still running"
    );

    family.gate.send(true).unwrap();
    let mut summaries = Vec::new();
    for _ in 0..3 {
        let (message, outcome) = tokio::time::timeout(Duration::from_secs(60), outcomes.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.session_key, "main");
        assert!(message.sender.starts_with("subagent:sub-"), "{message:?}");
        assert!(
            message.content.contains(" completed in ")
                && message.content.contains("(3 model calls, 2 tool calls)"),
            "{}",
            message.content
        );
        summaries.push(outcome.unwrap());
    }
    let last = summaries.last().unwrap();
    assert!(last.starts_with("3 of 3 reported."), "{last}");
    for fruit in [
        "a.txt holds: apples",
        "b.txt holds: bananas",
        "c.txt holds: cherries",
    ] {
        assert!(last.contains(fruit), "{last}");
    }

    // What the children were given: the read-only file tools and the gate, no spawn, message,
    // edit_file or cron; a prompt saying they cannot spawn.
    let child = server.bodies().into_iter().find(is_child).unwrap();
    assert_eq!(
        tool_names(&child),
        ["gate", "list_dir", "read_file", "write_file"]
    );
    assert!(
        child["system"]
            .as_str()
            .unwrap()
            .contains("You cannot start sub-agents")
    );

    // The records are on disk, complete.
    let runs: Vec<Value> =
        serde_json::from_slice(&std::fs::read(state.path().join("subagents/runs.json")).unwrap())
            .unwrap();
    assert_eq!(runs.len(), 3);
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["parent_session"], "main");
        assert_eq!(run["tool_calls"], 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_does_not_have_the_excluded_tools_and_their_components_never_run() {
    let dir = workspace();
    let server = LlmServer::start_routed(route).await;
    let family = family(dir.path(), None, &server, SubagentConfig::default()).await;
    let mut announcements = family.bus.subscribe(SYSTEM_CHANNEL);
    let before = family.children_file.instantiations();
    let cron_before = family.cron.instantiations();

    family
        .manager
        .spawn("main", 1, "call:spawn,cron,edit_file,message", None)
        .unwrap();
    let announcement = next_announcement(&mut announcements).await;
    for name in ["spawn", "cron", "edit_file", "message"] {
        assert!(
            announcement
                .content
                .contains(&format!("unknown tool `{name}`")),
            "{name}: {}",
            announcement.content
        );
    }
    assert_eq!(
        family.cron.instantiations(),
        cron_before,
        "the cron component was never instantiated for the child"
    );
    // The parent has it, and its call does instantiate the component.
    family
        .parent_tools
        .execute_value("cron", &json!({"action": "list"}))
        .await
        .unwrap();
    assert_eq!(family.cron.instantiations(), cron_before + 1);
    assert_eq!(
        family.children_file.instantiations(),
        before,
        "the file component was never instantiated for edit_file"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "apples\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_write_is_refused_by_the_read_only_workspace() {
    let dir = workspace();
    let server = LlmServer::start_routed(route).await;
    let family = family(dir.path(), None, &server, SubagentConfig::default()).await;
    let mut announcements = family.bus.subscribe(SYSTEM_CHANNEL);
    let before = family.children_file.instantiations();

    family
        .manager
        .spawn("main", 1, "call:write_file", Some("writer".into()))
        .unwrap();
    let announcement = next_announcement(&mut announcements).await;
    assert!(
        announcement
            .content
            .starts_with("Sub-agent sub-1 (writer) completed"),
        "{}",
        announcement.content
    );
    assert!(
        announcement.content.contains("read-only"),
        "the sandbox refused the write: {}",
        announcement.content
    );
    assert!(!dir.path().join("new.txt").exists(), "nothing was written");
    assert_eq!(
        family.children_file.instantiations(),
        before + 1,
        "the refusal came from the sandboxed component, not from a name check"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_and_concurrency_limits_refuse_and_a_child_can_be_stopped() {
    let dir = workspace();
    let server = LlmServer::start_routed(route).await;
    let config = SubagentConfig {
        max_concurrent: 2,
        ..SubagentConfig::default()
    };
    let family = family(dir.path(), None, &server, config).await;

    let depth = family
        .manager
        .spawn("main", 2, "Report the content of a.txt", None)
        .unwrap_err();
    assert!(
        depth.to_string().starts_with("depth limit:")
            && depth.to_string().contains("1 level(s) deep"),
        "{depth}"
    );

    family
        .manager
        .spawn("main", 1, "Report the content of a.txt", None)
        .unwrap();
    family
        .manager
        .spawn("main", 1, "Report the content of b.txt", None)
        .unwrap();
    // Through the tool, as the model sees it.
    let refused = family
        .parent_tools
        .execute_value("spawn", &json!({"task": "Report the content of c.txt"}))
        .await;
    // Outside a lane there is no session; inside one, the concurrency limit speaks.
    assert!(refused.is_err());
    let concurrency = family
        .manager
        .spawn("main", 1, "Report the content of c.txt", None)
        .unwrap_err();
    assert_eq!(
        concurrency.to_string(),
        "concurrency limit: 2 sub-agents are already running (at most 2 at once); wait for one's result to be announced, or stop one with the `subagents` tool"
    );

    wait_until(|| server.bodies().iter().filter(|b| is_child(b)).count() >= 2).await;
    let stopped = family
        .parent_tools
        .execute_value("subagents", &json!({"action": "stop", "id": "sub-1"}))
        .await
        .unwrap();
    assert_eq!(stopped.text, "Stopped sub-agent sub-1.");
    assert_eq!(family.manager.running(), 1);
    let again = family
        .parent_tools
        .execute_value("subagents", &json!({"action": "stop", "id": "sub-1"}))
        .await
        .unwrap_err();
    assert!(
        again
            .message()
            .contains("no running sub-agent `sub-1`; running now: sub-2"),
        "{again}"
    );
    let list = family
        .parent_tools
        .execute_value("subagents", &json!({"action": "list"}))
        .await
        .unwrap();
    let lines: Vec<&str> = list.text.lines().collect();
    assert!(lines[0].starts_with("sub-2 — running"), "{}", list.text);
    assert!(lines[1].starts_with("sub-1 — stopped"), "{}", list.text);
    // A slot is free again.
    family
        .manager
        .spawn("main", 1, "Report the content of c.txt", None)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_past_its_time_limit_is_announced_as_timed_out() {
    let dir = workspace();
    let server = LlmServer::start_routed(route).await;
    let config = SubagentConfig {
        timeout: Duration::from_millis(500),
        ..SubagentConfig::default()
    };
    let family = family(dir.path(), None, &server, config).await;
    let mut announcements = family.bus.subscribe(SYSTEM_CHANNEL);
    family
        .manager
        .spawn(
            "main",
            1,
            "Report the content of a.txt",
            Some("slow".into()),
        )
        .unwrap();
    let announcement = next_announcement(&mut announcements).await;
    assert!(
        announcement
            .content
            .starts_with("Sub-agent sub-1 (slow) timed out")
            && announcement.content.contains("time limit of 0.5 s"),
        "{}",
        announcement.content
    );
    // It stops counting as running right after its announcement went out.
    wait_until(|| family.manager.running() == 0).await;
    assert_eq!(family.manager.records()[0].status, SubagentStatus::TimedOut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reports_interrupted_runs_and_sweeps_stale_records() {
    let dir = workspace();
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start_routed(route).await;
    let first = family(
        dir.path(),
        Some(state.path()),
        &server,
        SubagentConfig::default(),
    )
    .await;
    first
        .manager
        .spawn("main", 1, "Report the content of a.txt", Some("cut".into()))
        .unwrap();
    // A stale record from long ago, and the run above still running: as after a crash.
    let file = state.path().join("subagents/runs.json");
    let mut runs: Vec<Value> = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    runs.push(json!({
        "id": "sub-0", "parent_session": "old", "label": null, "task": "old",
        "depth": 1, "status": "completed", "started_ms": 1, "finished_ms": 2,
        "turns": 1, "tool_calls": 0, "result": "done"
    }));
    // A run of another clawcage process that is still alive (pid 1 always is), and one of a
    // process that is gone.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (id, pid) in [("sub-7", 1u32), ("sub-8", 999_999_999)] {
        runs.push(json!({
            "id": id, "parent_session": "other", "label": null, "task": "elsewhere",
            "depth": 1, "pid": pid, "status": "running", "started_ms": now, "finished_ms": null,
            "turns": 0, "tool_calls": 0, "result": null
        }));
    }
    std::fs::write(&file, serde_json::to_vec(&runs).unwrap()).unwrap();

    let second = family(
        dir.path(),
        Some(state.path()),
        &server,
        SubagentConfig::default(),
    )
    .await;
    let mut announcements = second.bus.subscribe(SYSTEM_CHANNEL);
    let interrupted = second.manager.recover().await;
    let ids: Vec<&str> = interrupted.iter().map(|run| run.id.as_str()).collect();
    assert_eq!(
        ids,
        ["sub-1", "sub-8"],
        "the live process's run is left alone"
    );
    let announcement = next_announcement(&mut announcements).await;
    assert_eq!(announcement.session_key, "main");
    assert!(
        announcement
            .content
            .starts_with("Sub-agent sub-1 (cut) was interrupted"),
        "{}",
        announcement.content
    );
    assert_eq!(
        next_announcement(&mut announcements).await.session_key,
        "other"
    );
    let records = second.manager.records();
    let states: Vec<(&str, SubagentStatus)> = records
        .iter()
        .map(|run| (run.id.as_str(), run.status))
        .collect();
    assert_eq!(
        states,
        [
            ("sub-1", SubagentStatus::Interrupted),
            ("sub-7", SubagentStatus::Running),
            ("sub-8", SubagentStatus::Interrupted)
        ],
        "the stale record was swept"
    );
    // New ids continue after the recorded ones, whoever wrote them.
    let next = second
        .manager
        .spawn("main", 1, "Report the content of b.txt", None)
        .unwrap();
    assert_eq!(next.id, "sub-9");
    drop(first);
}
