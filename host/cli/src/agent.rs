//! The agent commands' shared wiring: the registry plus the `message` tool, the provider chosen
//! by flags and config, the agent loop and its sessions with transcripts in the state directory
//! — and `clawcage run`, which sends one task and prints the final answer on stdout.

use std::path::Path;
use std::sync::Arc;

use clawcage_agent::transcript::now_ms;
use clawcage_agent::{
    AgentLoop, MessageBus, MessageTool, OutboundMessage, SendCallback, Sessions, ToolRegistry,
    TranscriptStore, TurnEnd,
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
}

/// Wire up an agent over `tools` (plus the `message` tool sending through `send`).
pub fn start(
    context: AgentContext<'_>,
    mut tools: ToolRegistry,
    send: SendCallback,
    stream: bool,
) -> Result<Runtime, Failure> {
    tools
        .register(Arc::new(MessageTool::new("user", send)))
        .map_err(|error| Failure::Tool(error.to_string()))?;
    let config = context.config;
    let chosen = choose_provider(
        context.provider,
        &config.provider,
        context.config_file.and_then(Path::parent),
        &tools,
    )?;
    let label = chosen.provider.label();
    let agent = AgentLoop::new(
        chosen.provider,
        tools.clone(),
        config.agent.agent_config(stream)?,
    );
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
        bus: MessageBus::new(),
    })
}

/// `clawcage run`: one task; the answer on stdout, progress on stderr.
pub async fn run_task(
    context: AgentContext<'_>,
    tools: ToolRegistry,
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
    let runtime = start(context, tools, print_messages(console.clone()), false)?;
    if runtime.scripted {
        console.line(&format!(
            "note: the answers come from a recorded script ({}), not from a model",
            runtime.label
        ));
    }
    let key = session.unwrap_or_else(|| format!("run-{}-{}", now_ms(), std::process::id()));
    let outcome = runtime
        .sessions
        .send_user(&key, task, console.clone())
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: the task failed: {error}")))?;
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
