//! External ACP agents as sub-agents: `spawn` with `runtime: "acp"` and `agent: NAME` starts the
//! program configured under `[acp.agents.NAME]` (only when `[acp] allowed_agents` lists it) and
//! drives it as an ACP client. The process itself is native — it is not inside the WebAssembly
//! sandbox — so clawcage gives it only what the operator configured: its environment is
//! `PATH`, `HOME`, `LANG` and the configured variables (no credential of clawcage's), its
//! working directory is the workspace, and what it asks clawcage to do is sandboxed: its
//! `fs/write_text_file` requests run through the bundled `write_file` tool under the child's
//! grants (read-only unless configured), its `fs/read_text_file` requests read the exact text
//! beneath the workspace on the host when those grants include `read_file` (the tool's answer
//! is cut and noted for a model; a file written back from it would be cut), its `terminal/*` requests through
//! the sandboxed `exec` tool, and its `session/request_permission` requests are answered by the
//! configured policy (`deny-all` by default, `approve-reads`, or `ask`: the person at the
//! parent's front end chooses, and where nobody can be asked it is rejected). Its streamed text goes to the parent's front end; its final text is
//! the sub-agent's result, announced like any child's. Its own time limit (`timeout_secs`)
//! counts from its start, so `initialize` and `session/new` must be answered within it too; one
//! that is not ends the run naming the unanswered method. Stopping it (the `subagents` tool, a
//! time limit) sends `session/cancel`; an agent that no longer answers is killed at once, one
//! that does gets a grace period to exit, and the process is always waited for before its
//! result is reported, so no zombie and no hung agent is left. This file runs an agent (start,
//! deadlines, stop, usage charged to the parent's budget); `requests` answers what it asks.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, UntypedMessage};
use clawcage_agent::AuditedRegistry;
use clawcage_agent::provider::redacting::TextScrubber;
use clawcage_agent::subagent::{ExternalRun, ExternalRuntime, PermissionAsker};
use clawcage_core::redact::Redactor;
use clawcage_core::sync::lock;
use clawcage_core::{BoxFuture, ToolError, ToolOutput};
use clawcage_runtime::acp_config::{ExternalAgent, PermissionMode};
use clawcage_runtime::{
    AttachExternalAgents, Error, ExternalAgents as ExternalAgentsHook, LineRange, Runtime,
    WorkspaceGrant, WorkspaceTextError,
};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::lines;

mod requests;

/// How long a stopped agent gets to end on its own before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// The most bytes of a file `fs/read_text_file` returns in one answer: JSON-escaped, it stays
/// well inside a message line a reader bounds at 8 MiB, as clawcage's own reader does.
const READ_TEXT_LIMIT: usize = 4 << 20;

/// The most bytes of a terminal's output kept (the exec tool cuts its own output too).
const TERMINAL_OUTPUT_LIMIT: usize = 1 << 20;

/// The runtime's hook that makes external ACP agents available ([`external_runtime`]), for
/// `Options::external_agents`: with it every front end's sub-agents can `spawn` them.
pub fn external_agents() -> ExternalAgentsHook {
    ExternalAgentsHook(Arc::new(AcpAttach))
}

/// [`external_runtime`] as the runtime's [`AttachExternalAgents`].
struct AcpAttach;

impl AttachExternalAgents for AcpAttach {
    fn external_runtime<'a>(
        &'a self,
        runtime: &'a Runtime,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn ExternalRuntime>>, Error>> {
        Box::pin(external_runtime(runtime))
    }
}

/// The external agents `runtime`'s configuration allows, for its sub-agent manager (`None`
/// when it allows none).
pub async fn external_runtime(
    runtime: &Runtime,
) -> Result<Option<Arc<dyn ExternalRuntime>>, Error> {
    let agents = runtime.external_agents()?;
    if agents.is_empty() {
        return Ok(None);
    }
    // The agent's directory is the runtime's workspace, already clear of the state, plugins and
    // configuration directories; checked again here, where a native process is given it.
    runtime.check_workspace(runtime.workspace().path())?;
    let read_only = runtime.external_agent_tools(false).await?;
    let read_write = if agents.values().any(|agent| agent.write) {
        Some(runtime.external_agent_tools(true).await?)
    } else {
        None
    };
    Ok(Some(Arc::new(ExternalAgents {
        agents,
        workspace: runtime.workspace().clone(),
        read_only,
        read_write,
        redactor: runtime.redactor().clone(),
    })))
}

/// The external agents of one runtime.
struct ExternalAgents {
    agents: BTreeMap<String, ExternalAgent>,
    workspace: WorkspaceGrant,
    read_only: AuditedRegistry,
    read_write: Option<AuditedRegistry>,
    /// Scrubs the agents' streamed text of the host's secrets before a front end shows it.
    redactor: Redactor,
}

impl ExternalRuntime for ExternalAgents {
    fn agents(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    fn run(&self, run: ExternalRun) -> BoxFuture<'static, Result<String, String>> {
        let Some(agent) = self.agents.get(&run.agent).cloned() else {
            let name = run.agent.clone();
            return Box::pin(async move { Err(format!("unknown external agent `{name}`")) });
        };
        let tools = match (&self.read_write, agent.write) {
            (Some(read_write), true) => read_write.clone(),
            _ => self.read_only.clone(),
        };
        let workspace = self.workspace.clone();
        let scrubber = Arc::new(TextScrubber::new(&self.redactor));
        Box::pin(async move {
            let (done_tx, done_rx) = oneshot::channel();
            // Dropping `stop` (this future dropped: stopped or timed out) tells the supervisor.
            let (stop, stopped) = watch::channel(false);
            tokio::spawn(supervise(
                agent, run, tools, workspace, scrubber, stopped, done_tx,
            ));
            let result = done_rx
                .await
                .unwrap_or_else(|_| Err("the external agent's supervisor ended".to_string()));
            drop(stop);
            result
        })
    }
}

/// A terminal: one exec call running in its own task.
struct TerminalState {
    result: watch::Receiver<Option<(String, Option<i64>)>>,
    task: tokio::task::AbortHandle,
}

/// What one run shares with its request handlers.
struct RunState {
    agent: ExternalAgent,
    tools: AuditedRegistry,
    /// The session the calls are audited under (`parent/sub-N`).
    session: String,
    /// The parent's session, where permission requests are asked.
    parent_session: String,
    /// Asks the person at the parent's front end (`permission_mode = "ask"`).
    ask: Option<PermissionAsker>,
    output: Arc<dyn Fn(&str) + Send + Sync>,
    /// Scrubs what `output` is given: an agent's streamed text can hold a secret it was told.
    scrubber: Arc<TextScrubber>,
    text: Mutex<String>,
    terminals: Mutex<HashMap<String, TerminalState>>,
    next_terminal: AtomicU64,
    /// The workspace `fs/read_text_file` reads from, when the child's grants read files.
    workspace: WorkspaceGrant,
}

/// Starts the agent, drives one prompt, and always reaps the process.
async fn supervise(
    agent: ExternalAgent,
    run: ExternalRun,
    tools: AuditedRegistry,
    workspace: WorkspaceGrant,
    scrubber: Arc<TextScrubber>,
    mut stopped: watch::Receiver<bool>,
    done: oneshot::Sender<Result<String, String>>,
) {
    let mut command = tokio::process::Command::new(&agent.command);
    command
        .args(&agent.args)
        .env_clear()
        .envs(agent.env.iter().map(|(name, value)| (name, value)))
        .current_dir(workspace.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let _ = done.send(Err(format!(
                "cannot start the external agent `{}` ({}): {error}; check [acp.agents.{}] command",
                agent.name, agent.command, agent.name
            )));
            return;
        }
    };
    let pid = child.id().unwrap_or_default();
    tracing::info!(agent = %agent.name, pid, subagent = %run.id, "external agent started");
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = done.send(Err(
            "the external agent's pipes could not be opened".to_string()
        ));
        return;
    };
    if let Some(stderr) = child.stderr.take() {
        let name = agent.name.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt as _;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(agent = %name, "stderr: {line}");
            }
        });
    }
    let state = Arc::new(RunState {
        agent: agent.clone(),
        tools,
        session: format!("{}/{}", run.parent_session, run.id),
        parent_session: run.parent_session.clone(),
        ask: run.ask.clone(),
        output: run.output.clone(),
        scrubber,
        text: Mutex::new(String::new()),
        terminals: Mutex::new(HashMap::new()),
        next_terminal: AtomicU64::new(1),
        workspace: workspace.clone(),
    });
    let transport = lines::transport(stdout, stdin, lines::MAX_LINE_BYTES);
    let workspace_text = workspace.path().display().to_string();
    // Its own time limit counts from its start: `initialize` and `session/new` spend it too.
    let deadline = agent.timeout.map(|limit| Instant::now() + limit);
    let backstop = backstop(deadline, stopped.clone());
    let connection = Client
        .v1()
        .name("clawcage")
        .on_receive_request(
            {
                let state = state.clone();
                async move |request: UntypedMessage, responder: Responder<Value>, _connection| {
                    let state = state.clone();
                    tokio::spawn(async move {
                        let (method, params) = request.into_parts();
                        let result = state.serve(&method, params).await;
                        if let Err(error) = responder.respond_with_result(result) {
                            tracing::debug!(%error, "a response to the external agent was not sent");
                        }
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            {
                let state = state.clone();
                async move |notification: UntypedMessage, _connection| {
                    let (method, params) = notification.into_parts();
                    if method == "session/update" {
                        state.update(&params);
                    }
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async |connection: ConnectionTo<Agent>| {
            drive(
                &connection,
                &state,
                &run,
                &workspace_text,
                &mut stopped,
                deadline,
            )
            .await
        });
    // Whatever the protocol layer still waits for once the run is over (a write the agent never
    // reads), the connection is given up a grace period after the deadline or the stop.
    let ended = tokio::select! {
        ended = connection => ended,
        () = backstop => Ok(Ended {
            result: Err(format!(
                "the external agent `{}` stopped answering and was killed",
                agent.name
            )),
            answering: false,
        }),
    };
    for terminal in lock(&state.terminals).drain() {
        terminal.1.task.abort();
    }
    let (outcome, answering) = match ended {
        Ok(Ended { result, answering }) => (result, answering),
        Err(error) => (
            Err(format!(
                "the external agent `{}` broke the protocol or ended early: {error}",
                agent.name
            )),
            true,
        ),
    };
    // An agent that still answers gets a moment to exit on its own (its stdin is closed); one
    // that stopped answering is killed at once. Either way it is reaped before the result is
    // reported, so no process outlives its run.
    let exited = answering && tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok();
    if !exited {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    tracing::info!(agent = %agent.name, pid, "external agent ended");
    let _ = done.send(outcome);
}

/// How a run ended: its result, and whether the agent was still answering (else it is killed
/// without a grace period).
struct Ended {
    result: Result<String, String>,
    answering: bool,
}

/// Resolves a grace period after `deadline` or after the run is stopped (its stop handle
/// dropped), whichever comes first; never without either.
async fn backstop(deadline: Option<Instant>, mut stopped: watch::Receiver<bool>) {
    let grace = STOP_GRACE * 2;
    let at_deadline = async {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline + grace).await,
            None => std::future::pending().await,
        }
    };
    let after_stop = async {
        let _ = stopped.changed().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = at_deadline => {}
        () = after_stop => {}
    }
}

/// `future`'s output, or `None` once `deadline` has passed.
async fn before<T>(deadline: Option<Instant>, future: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

/// Sends `method` with `params` and waits for the answer.
async fn request(
    connection: &ConnectionTo<Agent>,
    method: &str,
    params: Value,
) -> Result<Value, String> {
    let message = UntypedMessage::new(method, params).map_err(|error| error.to_string())?;
    connection
        .send_request(message)
        .block_task()
        .await
        .map_err(|error| format!("{method} failed: {error}"))
}

/// Sends `session/cancel` and gives `prompt` the grace period to end: whether it did.
async fn cancel<F: Future>(
    connection: &ConnectionTo<Agent>,
    session_id: &str,
    prompt: std::pin::Pin<&mut F>,
) -> bool {
    if let Ok(cancel) = UntypedMessage::new("session/cancel", json!({"sessionId": session_id})) {
        let _ = connection.send_notification(cancel);
    }
    tokio::time::timeout(STOP_GRACE, prompt).await.is_ok()
}

/// Why the session could not be started.
enum SetupError {
    /// The agent answered with an error, or with no session.
    Failed(String),
    /// The time limit ran out waiting for the answer to this method.
    Unanswered(&'static str),
}

/// initialize, session/new in the workspace, one prompt, each within the agent's time limit
/// (`deadline`); a stop or the limit cancels the prompt.
async fn drive(
    connection: &ConnectionTo<Agent>,
    state: &Arc<RunState>,
    run: &ExternalRun,
    workspace: &str,
    stopped: &mut watch::Receiver<bool>,
    deadline: Option<Instant>,
) -> Result<Ended, agent_client_protocol::Error> {
    let name = &state.agent.name;
    let limit = state.agent.timeout.unwrap_or_default().as_secs();
    let ended = |result, answering| Ok(Ended { result, answering });
    let setup = async {
        let ask = async |method: &'static str, params: Value| match before(
            deadline,
            request(connection, method, params),
        )
        .await
        {
            Some(answer) => answer.map_err(SetupError::Failed),
            None => Err(SetupError::Unanswered(method)),
        };
        ask(
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": {
                    "fs": {"readTextFile": true, "writeTextFile": true},
                    "terminal": state.agent.terminal,
                },
                "clientInfo": {"name": "clawcage", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
        let session = ask("session/new", json!({"cwd": workspace, "mcpServers": []})).await?;
        session
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| SetupError::Failed("session/new returned no sessionId".to_string()))
    };
    let session_id = tokio::select! {
        session = setup => match session {
            Ok(id) => id,
            Err(SetupError::Failed(error)) => return ended(Err(format!("the external agent `{name}` did not start a session: {error}")), true),
            Err(SetupError::Unanswered(method)) => return ended(Err(format!("the external agent `{name}` did not answer `{method}` within its time limit of {limit} s ([acp.agents.{name}] timeout_secs); it was killed")), false),
        },
        _ = stopped.changed() => return ended(Err("stopped before it started".to_string()), true),
    };
    let prompt = request(
        connection,
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": run.task}]}),
    );
    tokio::pin!(prompt);
    let answer = tokio::select! {
        answer = &mut prompt => answer,
        () = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        } => {
            let answering = cancel(connection, &session_id, prompt.as_mut()).await;
            let after = if answering {
                "session/cancel was sent and it ended its turn".to_string()
            } else {
                format!("it did not answer session/cancel within {} s and was killed", STOP_GRACE.as_secs())
            };
            return ended(Err(format!("stopped after its time limit of {limit} s ([acp.agents.{name}] timeout_secs); {after}")), answering);
        }
        _ = stopped.changed() => {
            let answering = cancel(connection, &session_id, prompt.as_mut()).await;
            return ended(Err("stopped; session/cancel was sent".to_string()), answering);
        }
    };
    state.show_held();
    let text = lock(&state.text).trim().to_string();
    let result = match answer {
        Ok(response) => {
            // What the agent reports using counts against its parent session's budget.
            if let Some(tokens) = reported_tokens(&response) {
                run.charge(tokens);
            }
            let stop = response
                .get("stopReason")
                .and_then(Value::as_str)
                .unwrap_or("end_turn")
                .to_string();
            match stop.as_str() {
                "end_turn" if !text.is_empty() => Ok(text),
                "end_turn" => Ok(format!("`{name}` ended its turn without text")),
                other => Err(format!("`{name}` stopped ({other}): {text}")),
            }
        }
        Err(error) => Err(format!("`{name}` failed: {error}. Its text so far: {text}")),
    };
    ended(result, true)
}

/// The tokens an agent's `session/prompt` answer reports (ACP's `usage`: `totalTokens`, or its
/// input and output), if it reports any.
fn reported_tokens(response: &Value) -> Option<u64> {
    let usage = response.get("usage")?;
    usage
        .get("totalTokens")
        .and_then(Value::as_u64)
        .or_else(|| {
            let input = usage.get("inputTokens").and_then(Value::as_u64);
            let output = usage.get("outputTokens").and_then(Value::as_u64);
            (input.is_some() || output.is_some())
                .then(|| input.unwrap_or(0).saturating_add(output.unwrap_or(0)))
        })
}
