//! The agent commands' shared wiring: the registry plus the `message` tool, the provider chosen
//! by flags and config, the agent loop and its sessions with transcripts in the state directory
//! — and `clawcage run`, which sends one task and prints the final answer on stdout.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::subagent::SYSTEM_CHANNEL;
use clawcage_agent::transcript::now_ms;
use clawcage_agent::{
    AgentError, AgentLoop, AuditLog, LaneInput, MessageBus, MessageTool, OutboundMessage,
    SendCallback, Sessions, SubagentManager, ToolRegistry, TranscriptStore, TurnEnd,
};
use clawcage_core::BoxFuture;

use crate::Failure;
use crate::agent_config::{ProviderArgs, choose_provider};
use crate::config::Config;
use crate::render::{Console, Sink};

/// A running agent.
pub struct Runtime {
    /// The sessions (one lane each).
    pub sessions: Sessions,
    /// The tools the agent may call, the `message` tool included.
    pub tools: ToolRegistry,
    /// Whether the scripted provider answers.
    pub scripted: bool,
    /// `provider/model`, or the chain.
    pub label: String,
    /// The inbound bus: subsystems (sub-agents, cron) publish here; front ends subscribe to the
    /// `system` channel and route notifications into the sessions' lanes.
    pub bus: MessageBus,
    /// The sub-agents, when `[subagents]` is enabled and the host prepared tools for children.
    pub subagents: Option<Arc<SubagentManager>>,
}

/// A `message` tool callback that prints through `console`.
pub fn print_messages(console: Arc<Console>) -> SendCallback {
    Arc::new(
        move |message: OutboundMessage| -> BoxFuture<'static, Result<(), String>> {
            let console = console.clone();
            Box::pin(async move {
                console.line(&format!(
                    "  [message to {}] {}",
                    message.channel, message.content
                ));
                Ok(())
            })
        },
    )
}

/// What the agent commands share: the configuration, the flags and where state lives.
#[derive(Clone, Copy)]
pub struct AgentContext<'a> {
    /// The configuration.
    pub config: &'a Config,
    /// The file it came from, if any (relative paths in it are relative to this file).
    pub config_file: Option<&'a Path>,
    /// `--provider`, `--model`, `--base-url`, `--script`.
    pub provider: &'a ProviderArgs,
    /// Where transcripts (`sessions/`) and other state go.
    pub state_dir: &'a Path,
    /// The audit log every tool call is recorded in (`None`: auditing is off).
    pub audit_path: Option<&'a Path>,
    /// The inbound bus the runtime uses (shared with the subsystems built before it, e.g. cron).
    pub bus: &'a MessageBus,
}

/// Wire up an agent over `tools` (plus the `message` tool sending through `send`, and `spawn`
/// and `subagents` when `child_tools`, the tools prepared for sub-agents, are given).
pub fn start(
    context: AgentContext<'_>,
    mut tools: ToolRegistry,
    child_tools: Option<ToolRegistry>,
    send: SendCallback,
    stream: bool,
) -> Result<Runtime, Failure> {
    tools
        .register(Arc::new(MessageTool::new("user", send)))
        .map_err(|error| Failure::Tool(error.to_string()))?;
    let config = context.config;
    let audit = open_audit_log(context.audit_path)?;
    let bus = context.bus.clone();
    let mut agent_config = config.agent.agent_config(stream)?;
    let subagents = match child_tools {
        Some(child_tools) if config.subagents.enabled() => {
            let manager = SubagentManager::new(
                &tools,
                child_tools,
                config.subagents.config()?,
                bus.clone(),
                Some(context.state_dir),
            )
            .map_err(|error| Failure::Usage(error.to_string()))?;
            for tool in [manager.spawn_tool(), manager.subagents_tool()] {
                tools
                    .register(tool)
                    .map_err(|error| Failure::Tool(error.to_string()))?;
            }
            agent_config.system_prompt.push_str("\n\n");
            agent_config.system_prompt.push_str(&manager.prompt_note());
            Some(manager)
        }
        _ => None,
    };
    let chosen = choose_provider(
        context.provider,
        &config.provider,
        context.config_file.and_then(Path::parent),
        &tools,
    )?;
    let label = chosen.provider.label();
    if let Some(manager) = &subagents {
        manager.set_provider(chosen.provider.clone());
        if let Some(log) = &audit {
            manager.set_audit(log.clone());
        }
    }
    let agent = AgentLoop::new(chosen.provider, tools.clone(), agent_config).with_audit(audit);
    let sessions = Sessions::new(
        agent,
        Some(TranscriptStore::new(context.state_dir.join("sessions"))),
        config.agent.history_limit()?,
    );
    Ok(Runtime {
        sessions,
        tools,
        scripted: chosen.scripted,
        label,
        bus,
        subagents,
    })
}

/// `clawcage run`: one task; the answer on stdout, progress on stderr.
pub async fn run_task(
    context: AgentContext<'_>,
    tools: ToolRegistry,
    child_tools: Option<ToolRegistry>,
    task: &str,
    session: Option<String>,
) -> Result<(), Failure> {
    if task.trim().is_empty() {
        return Err(Failure::Usage(
            "the task is empty; pass what to do, e.g. clawcage run \"summarise README.md\""
                .to_string(),
        ));
    }
    let console = Arc::new(Console::new(Sink::Stderr, false));
    let runtime = start(
        context,
        tools,
        child_tools,
        print_messages(console.clone()),
        false,
    )?;
    if runtime.scripted {
        console.line(&format!(
            "note: the answers come from a recorded script ({}), not from a model",
            runtime.label
        ));
    }
    let key = session.unwrap_or_else(|| format!("run-{}-{}", now_ms(), std::process::id()));
    // Subscribed before the turn, so no sub-agent's announcement can be missed.
    let mut announcements = runtime.bus.subscribe(SYSTEM_CHANNEL);
    let mut outcome = runtime
        .sessions
        .send_user(&key, task, console.clone())
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: the task failed: {error}")))?;
    // The answer waits for the sub-agents this task started: each announcement is a turn in
    // which the agent takes the result in, and the last turn's text is the answer.
    if let Some(manager) = &runtime.subagents {
        let children = manager.running_for(&key);
        if children > 0 {
            console.line(&format!(
                "waiting for {children} sub-agent(s) to report (each has at most {} s)",
                manager.config().timeout.as_secs()
            ));
        }
        loop {
            let waiting = manager.running_for(&key) > 0;
            let wait = if waiting {
                Duration::from_millis(200)
            } else {
                Duration::ZERO
            };
            let message = match tokio::time::timeout(wait, announcements.recv()).await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(_) if waiting => continue,
                Err(_) => break,
            };
            console.line(&format!(
                "[{}] {}",
                message.sender,
                first_line(&message.content)
            ));
            outcome = runtime
                .sessions
                .submit(&key, LaneInput::Notification(message), console.clone())
                .wait()
                .await
                .and_then(|outcome| {
                    outcome.ok_or_else(|| AgentError::History("no outcome".to_string()))
                })
                .map_err(|error| Failure::Tool(format!("clawcage: the task failed: {error}")))?;
        }
    }
    console.end_turn(
        &outcome.answered_by,
        outcome.usage,
        runtime.sessions.usage(&key),
    );
    match outcome.end {
        TurnEnd::Answered => {
            println!("{}", outcome.text);
            Ok(())
        }
        TurnEnd::IterationLimit | TurnEnd::LoopDetected { .. } => {
            Err(Failure::Tool(format!("clawcage: {}", outcome.text)))
        }
    }
}

/// The first line of `text`, for one-line progress notes.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The audit log at `path` opened for appending (`None`: auditing is off).
pub fn open_audit_log(path: Option<&Path>) -> Result<Option<Arc<AuditLog>>, Failure> {
    let Some(path) = path else {
        return Ok(None);
    };
    AuditLog::open(path).map(|log| Some(Arc::new(log))).map_err(|error| {
        Failure::Usage(format!(
            "cannot open the audit log {} ({error}); fix [audit] path, pass --state-dir, or set [audit] enabled = false",
            path.display()
        ))
    })
}
