//! `clawcage acp`: clawcage as an ACP agent on stdio, for editors. `initialize` states what it
//! can do; `session/new` opens a session whose workspace is its `cwd` — refused unless the
//! operator's `[acp] allowed_roots` contains it — on a runtime built for that directory (one
//! per distinct directory, all sharing the sandbox engine); `session/load` resumes a session key
//! from the state directory and replays its history; `session/prompt` submits a turn to the
//! session's lane and streams its events as `session/update` until the turn ends with its
//! `stopReason`; `session/cancel` stops the turn as Ctrl-C does (its messages are kept). The
//! tools still run in the sandbox: the editor's `fs/*` and `terminal/*` methods are never used
//! for tool I/O. Like the gateway, it is a front end: it asks the runtime for agents and renders
//! their events; it holds no agent logic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, Implementation, InitializeRequest,
    InitializeResponse, LoadSessionRequest, LoadSessionResponse, NewSessionRequest,
    NewSessionResponse, PromptCapabilities, PromptRequest, PromptResponse, StopReason,
};
use agent_client_protocol::{Client, UntypedMessage};
use clawcage_agent::approvals::{OperatorEvent, OperatorFilter};
use clawcage_agent::events::EventObserver;
use clawcage_agent::subagent::{PermissionAsker, SubagentOutput};
use clawcage_agent::{
    AgentError, JsonlTranscripts, LaneInput, NotificationFront, OutboundMessage, SendCallback,
    TranscriptStore, TurnEnd, current_session_key,
};
use clawcage_core::BoxFuture;
use clawcage_core::approval::ApprovalDecision;
use clawcage_core::sync::lock;
use clawcage_runtime::acp_config::AcpHost;
use clawcage_runtime::{AgentOptions, Error, Host, Lifetime, Options, Runtime};
use serde_json::{Value, json};

use crate::lines;
use crate::updates;

/// The longest session id accepted (a session key is data, never a path).
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// One workspace's runtime and agent, shared by the sessions opened on it.
struct Workspace {
    runtime: Runtime,
    /// The long-running host: sub-agent results and cron firings on its bus become turns
    /// streamed to the client; its route and cron runner stop with the workspace.
    agent: Host,
}

/// One open session.
struct SessionEntry {
    workspace: Arc<Workspace>,
    /// A `session/cancel` arrived for the running prompt.
    cancelled: AtomicBool,
    /// The task that asks the editor what the approvals broker asks for this session.
    approvals: tokio::task::AbortHandle,
}

impl Drop for SessionEntry {
    fn drop(&mut self) {
        self.approvals.abort();
    }
}

/// The ACP agent's state.
pub struct Server {
    host: AcpHost,
    workspaces: tokio::sync::Mutex<HashMap<PathBuf, Arc<Workspace>>>,
    sessions: Mutex<HashMap<String, Arc<SessionEntry>>>,
    connection: OnceLock<ConnectionTo<Client>>,
    next_run: AtomicU64,
    prompts_running: AtomicU64,
    this: Weak<Server>,
}

fn acp_error(error: &Error) -> agent_client_protocol::Error {
    match error {
        Error::Usage(message) => {
            agent_client_protocol::Error::invalid_params().data(json!({"message": message}))
        }
        Error::Failed(message) => {
            agent_client_protocol::Error::internal_error().data(json!({"message": message}))
        }
    }
}

fn invalid(message: impl Into<String>) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(json!({"message": message.into()}))
}

/// A fresh session key: `agent:main:acp:<random>`.
fn new_session_key() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // The clock and the process id still make it unique in this state directory.
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or_default();
        bytes = ((stamp as u64) ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    format!(
        "agent:main:acp:{}",
        bytes
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    )
}

/// Checks a session id given by a client (`session/load`): at most 256 printable characters.
fn check_session_id(id: &str) -> Result<(), agent_client_protocol::Error> {
    if id.is_empty()
        || id.len() > MAX_SESSION_ID_BYTES
        || id.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid(format!(
            "invalid sessionId: use the id `session/new` returned (at most {MAX_SESSION_ID_BYTES} printable characters, no spaces)"
        )));
    }
    Ok(())
}

/// The prompt's content as the text of one user message. Embedded resources are included with
/// their URI; links are named (the agent reads files with its own sandboxed tools).
fn prompt_text(prompt: &[ContentBlock]) -> String {
    let mut parts = Vec::new();
    for block in prompt {
        let value = serde_json::to_value(block).unwrap_or(Value::Null);
        match value.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(text) = value.get("text").and_then(Value::as_str) {
                    parts.push(text.to_string());
                }
            }
            Some("resource_link") => {
                let uri = value.get("uri").and_then(Value::as_str).unwrap_or_default();
                parts.push(format!("[the user points at {uri}]"));
            }
            Some("resource") => {
                let resource = &value["resource"];
                let uri = resource["uri"].as_str().unwrap_or_default();
                match resource["text"].as_str() {
                    Some(text) => parts.push(format!("[content of {uri}]\n{text}")),
                    None => parts.push(format!("[a binary resource {uri} was left out]")),
                }
            }
            Some(other) => parts.push(format!("[a {other} block was left out: not supported]")),
            None => {}
        }
    }
    parts.join("\n\n")
}

impl Server {
    /// A server over `host`.
    pub fn new(host: AcpHost) -> Arc<Server> {
        Arc::new_cyclic(|this| Server {
            host,
            workspaces: tokio::sync::Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            connection: OnceLock::new(),
            next_run: AtomicU64::new(1),
            prompts_running: AtomicU64::new(0),
            this: this.clone(),
        })
    }

    fn remember(&self, connection: &ConnectionTo<Client>) {
        let _ = self.connection.get_or_init(|| connection.clone());
    }

    /// Sends `update` for session `key` (dropped when no client is connected).
    fn send_update(&self, key: &str, update: Value) {
        let Some(connection) = self.connection.get() else {
            return;
        };
        let message = match UntypedMessage::new(
            "session/update",
            json!({"sessionId": key, "update": update}),
        ) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "cannot build a session update");
                return;
            }
        };
        if let Err(error) = connection.send_notification(message) {
            tracing::debug!(%error, "a session update was not sent");
        }
    }

    /// The runtime and agent for `cwd` (checked against the allowed roots), built on first use.
    async fn workspace(&self, cwd: &Path) -> Result<Arc<Workspace>, Error> {
        let canonical = self.host.check_cwd(cwd)?;
        let mut workspaces = self.workspaces.lock().await;
        if let Some(workspace) = workspaces.get(&canonical) {
            return Ok(workspace.clone());
        }
        let mut runtime = self.host.runtime_for(&canonical).await?;
        for refused in &runtime.plugins().refused {
            tracing::warn!("{refused}");
        }
        // Sub-agents belong to the first workspace's sessions only: the run records in the
        // state directory are kept per process, and a second manager in the same process would
        // hand out the same ids and take the first one's running children for interrupted.
        let this = self.this.clone();
        let output: SubagentOutput = Arc::new(move |parent: &str, child: &str, text: &str| {
            if let Some(server) = this.upgrade() {
                server.send_update(
                    parent,
                    json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": format!("[{child}] {text}")}}),
                );
            }
        });
        // The first workspace's host also fires the state directory's cron jobs (one process
        // at a time does); the others' `cron` tool changes them.
        let mut agent = runtime
            .host(
                Lifetime::LongRunning,
                AgentOptions {
                    subagents: workspaces.is_empty(),
                    subagent_output: Some(output),
                    permission_asker: Some(self.permission_asker()),
                    ..AgentOptions::new(self.message_sender())
                },
            )
            .await?;
        let front = Arc::new(AcpNotifications {
            server: self.this.clone(),
            sessions: agent.sessions.clone(),
        });
        agent.start(front, None);
        let workspace = Arc::new(Workspace { runtime, agent });
        workspaces.insert(canonical, workspace.clone());
        Ok(workspace)
    }

    /// An external sub-agent's permission request (`permission_mode = "ask"`) goes to the editor
    /// of its parent's session as a `session/request_permission` with the agent's own options;
    /// the option chosen there is the answer.
    fn permission_asker(&self) -> PermissionAsker {
        let this = self.this.clone();
        Arc::new(
            move |parent: &str, request: Value| -> BoxFuture<'static, Option<String>> {
                let connection = this
                    .upgrade()
                    .and_then(|server| server.connection.get().cloned());
                let mut tool_call = request["toolCall"].clone();
                let title = tool_call["title"]
                    .as_str()
                    .unwrap_or("a tool call")
                    .to_string();
                tool_call["title"] = json!(format!("external agent: {title}"));
                let params = json!({
                    "sessionId": parent,
                    "toolCall": tool_call,
                    "options": request["options"],
                });
                Box::pin(async move {
                    let message = UntypedMessage::new("session/request_permission", params).ok()?;
                    let answer = connection?.send_request(message).block_task().await.ok()?;
                    (answer["outcome"]["outcome"] == "selected")
                        .then(|| answer["outcome"]["optionId"].as_str().map(str::to_string))
                        .flatten()
                })
            },
        )
    }

    /// The `message` tool's callback: its text goes to the session whose turn sends it, as
    /// agent text.
    fn message_sender(&self) -> SendCallback {
        let this = self.this.clone();
        Arc::new(
            move |message: OutboundMessage| -> BoxFuture<'static, Result<(), String>> {
                let server = this.upgrade();
                Box::pin(async move {
                    let Some(server) = server else {
                        return Err("the ACP server has stopped".to_string());
                    };
                    let Some(key) = current_session_key() else {
                        return Err("no session is running a turn".to_string());
                    };
                    server.send_update(
                        &key,
                        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": message.content}}),
                    );
                    Ok(())
                })
            },
        )
    }

    fn initialize(&self, request: &InitializeRequest) -> InitializeResponse {
        let version = if request.protocol_version < ProtocolVersion::V1 {
            request.protocol_version
        } else {
            ProtocolVersion::V1
        };
        InitializeResponse::new(version)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .prompt_capabilities(PromptCapabilities::new().embedded_context(true)),
            )
            .agent_info(
                Implementation::new("clawcage", env!("CARGO_PKG_VERSION"))
                    .title("clawcage (every tool in a WebAssembly sandbox)".to_string()),
            )
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
    ) -> Result<NewSessionResponse, agent_client_protocol::Error> {
        let workspace = self
            .workspace(&request.cwd)
            .await
            .map_err(|error| acp_error(&error))?;
        let key = new_session_key();
        self.open_session(&key, workspace);
        tracing::info!(session = %key, cwd = %request.cwd.display(), "ACP session opened");
        Ok(NewSessionResponse::new(key))
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
    ) -> Result<LoadSessionResponse, agent_client_protocol::Error> {
        let key = request.session_id.0.to_string();
        check_session_id(&key)?;
        let workspace = self
            .workspace(&request.cwd)
            .await
            .map_err(|error| acp_error(&error))?;
        let store =
            JsonlTranscripts::new(clawcage_agent::StateDir::new(self.host.state_dir()).sessions());
        if !store.exists(&key).unwrap_or(false) {
            return Err(invalid(format!(
                "no session `{key}` in the state directory {}: open a new one with session/new",
                self.host.state_dir().display()
            )));
        }
        let limit = workspace.runtime.history_limit();
        let loaded = store.load(&key, limit).map_err(|error| {
            agent_client_protocol::Error::internal_error().data(json!({
                "message": format!("cannot read the session's transcript: {error}")
            }))
        })?;
        for update in updates::replay(&loaded.messages) {
            self.send_update(&key, update);
        }
        self.open_session(&key, workspace);
        tracing::info!(session = %key, "ACP session loaded");
        Ok(LoadSessionResponse::new())
    }

    /// Registers session `key` on `workspace`, with the editor as the operator the approvals
    /// broker asks for it.
    fn open_session(&self, key: &str, workspace: Arc<Workspace>) {
        let approvals = self.ask_editor(key, &workspace);
        let entry = Arc::new(SessionEntry {
            workspace,
            cancelled: AtomicBool::new(false),
            approvals,
        });
        lock(&self.sessions).insert(key.to_string(), entry);
    }

    /// What the approvals broker asks for session `key` (and its sub-agents) becomes a
    /// `session/request_permission` with allow-once, allow-always and reject; the editor's
    /// answer decides it (a cancelled or failed request is a denial).
    fn ask_editor(&self, key: &str, workspace: &Workspace) -> tokio::task::AbortHandle {
        let mut operator = workspace
            .runtime
            .approvals()
            .operator(OperatorFilter::Session(key.to_string()));
        let this = self.this.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            while let Some(event) = operator.next().await {
                let OperatorEvent::Requested(request) = event else {
                    continue;
                };
                let server = this.upgrade();
                let Some(connection) = server.and_then(|server| server.connection.get().cloned())
                else {
                    continue;
                };
                let params = json!({
                    "sessionId": key,
                    "toolCall": {
                        // The tool call the question gates, so the editor shows it on that
                        // call's card (the approval id when the call is not known).
                        "toolCallId": request.tool_call_id.as_deref().unwrap_or(&request.id),
                        "title": request.describe(),
                        "kind": updates::tool_kind(&request.tool),
                        "status": "pending",
                        "rawInput": {"command": request.plan.command, "reasons": request.reasons},
                    },
                    "options": [
                        {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
                        {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                    ],
                });
                let broker = operator.broker().clone();
                tokio::spawn(async move {
                    let answer = match UntypedMessage::new("session/request_permission", params) {
                        Ok(message) => connection.send_request(message).block_task().await.ok(),
                        Err(_) => None,
                    };
                    let chosen = answer.as_ref().and_then(|answer| {
                        (answer["outcome"]["outcome"] == "selected")
                            .then(|| answer["outcome"]["optionId"].as_str())
                            .flatten()
                    });
                    let decision = match chosen {
                        Some("allow-once") => ApprovalDecision::AllowOnce,
                        Some("allow-always") => ApprovalDecision::AllowAlways,
                        _ => ApprovalDecision::Deny,
                    };
                    if let Err(error) = broker.resolve(&request.id, decision, "acp") {
                        tracing::debug!(%error, "the approval was decided elsewhere");
                    }
                });
            }
        })
        .abort_handle()
    }

    fn session(&self, key: &str) -> Result<Arc<SessionEntry>, agent_client_protocol::Error> {
        lock(&self.sessions).get(key).cloned().ok_or_else(|| {
            invalid(format!(
                "unknown session `{}`: open one with session/new or session/load first",
                key.chars().take(80).collect::<String>()
            ))
        })
    }

    async fn prompt(
        &self,
        request: PromptRequest,
    ) -> Result<PromptResponse, agent_client_protocol::Error> {
        let key = request.session_id.0.to_string();
        let entry = self.session(&key)?;
        let text = prompt_text(&request.prompt);
        if text.trim().is_empty() {
            return Err(invalid("the prompt has no text"));
        }
        entry.cancelled.store(false, Ordering::SeqCst);
        self.prompts_running.fetch_add(1, Ordering::SeqCst);
        let run_id = format!("acp-{}", self.next_run.fetch_add(1, Ordering::Relaxed));
        let (observer, mut events) = EventObserver::channel(&key, &run_id);
        let sessions = &entry.workspace.agent.sessions;
        let pending = sessions.submit(&key, LaneInput::User(text), Arc::new(observer));
        let mut wait = Box::pin(pending.wait());
        let reply = loop {
            tokio::select! {
                Some(event) = events.recv() => {
                    if let Some(update) = updates::update_of(&event) {
                        self.send_update(&key, update);
                    }
                }
                reply = &mut wait => break reply,
            }
        };
        while let Ok(event) = events.try_recv() {
            if let Some(update) = updates::update_of(&event) {
                self.send_update(&key, update);
            }
        }
        self.prompts_running.fetch_sub(1, Ordering::SeqCst);
        let cancelled = entry.cancelled.swap(false, Ordering::SeqCst);
        match reply {
            Ok(Some(outcome)) => {
                let window = sessions
                    .agent()
                    .context_policy()
                    .map(|policy| policy.window)
                    .unwrap_or_else(|| {
                        clawcage_agent::context_window(&entry.workspace.agent.label, None)
                    });
                self.send_update(
                    &key,
                    updates::usage_update(
                        outcome.usage.input_tokens + outcome.usage.output_tokens,
                        window,
                    ),
                );
                let stop = match outcome.end {
                    _ if cancelled => StopReason::Cancelled,
                    TurnEnd::Answered => StopReason::EndTurn,
                    // Said, so the client does not take silence for an answer.
                    TurnEnd::NoAnswer => {
                        self.send_update(
                            &key,
                            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("\n[{}]", outcome.text)}}),
                        );
                        StopReason::EndTurn
                    }
                    TurnEnd::IterationLimit | TurnEnd::LoopDetected { .. } => {
                        StopReason::MaxTurnRequests
                    }
                };
                Ok(PromptResponse::new(stop))
            }
            Ok(None) => Ok(PromptResponse::new(StopReason::EndTurn)),
            Err(AgentError::Interrupted) => Ok(PromptResponse::new(StopReason::Cancelled)),
            Err(_) if cancelled => Ok(PromptResponse::new(StopReason::Cancelled)),
            Err(error) => {
                let message = error.to_string();
                self.send_update(
                    &key,
                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("\n[the turn failed: {message}]")}}),
                );
                Err(agent_client_protocol::Error::internal_error()
                    .data(json!({"message": message})))
            }
        }
    }

    fn cancel(&self, notification: &CancelNotification) {
        let key = notification.session_id.0.to_string();
        let Some(entry) = lock(&self.sessions).get(&key).cloned() else {
            return;
        };
        entry.cancelled.store(true, Ordering::SeqCst);
        entry.workspace.agent.sessions.interrupt(&key);
    }

    /// Stops every running turn (their messages are kept) and waits a little for them to end.
    async fn shut_down(&self) {
        let entries: Vec<(String, Arc<SessionEntry>)> = lock(&self.sessions)
            .iter()
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect();
        for (key, entry) in &entries {
            entry.workspace.agent.sessions.interrupt(key);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.prompts_running.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Answers `responder` with `result` (a closed connection is only logged).
fn answer<T: agent_client_protocol::JsonRpcResponse>(
    responder: agent_client_protocol::v1::Responder<T>,
    result: Result<T, agent_client_protocol::Error>,
) {
    if let Err(error) = responder.respond_with_result(result) {
        tracing::debug!(%error, "a response was not sent");
    }
}

/// `clawcage acp`: serves ACP on stdin and stdout until the client closes stdin.
pub async fn run(mut options: Options) -> Result<(), Error> {
    options
        .external_agents
        .get_or_insert_with(crate::external::external_agents);
    let host = AcpHost::open(options)?;
    if host.roots().is_empty() {
        tracing::warn!(
            "[acp] allowed_roots is empty: every session/new will be refused until the operator lists the project directories"
        );
    }
    let server = Server::new(host);
    let transport = lines::transport(
        tokio::io::stdin(),
        tokio::io::stdout(),
        lines::MAX_LINE_BYTES,
    );
    let result = agent_client_protocol::Agent
        .v1()
        .name("clawcage")
        .on_receive_request(
            {
                let server = server.clone();
                async move |request: InitializeRequest, responder, connection| {
                    server.remember(&connection);
                    answer(responder, Ok(server.initialize(&request)));
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let server = server.clone();
                async move |request: NewSessionRequest, responder, connection| {
                    server.remember(&connection);
                    let server = server.clone();
                    tokio::spawn(async move {
                        answer(responder, server.new_session(request).await);
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let server = server.clone();
                async move |request: LoadSessionRequest, responder, connection| {
                    server.remember(&connection);
                    let server = server.clone();
                    tokio::spawn(async move {
                        answer(responder, server.load_session(request).await);
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let server = server.clone();
                async move |request: PromptRequest, responder, connection| {
                    server.remember(&connection);
                    let server = server.clone();
                    tokio::spawn(async move {
                        answer(responder, server.prompt(request).await);
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            {
                let server = server.clone();
                async move |notification: CancelNotification, connection| {
                    server.remember(&connection);
                    server.cancel(&notification);
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    server.shut_down().await;
    match result {
        Ok(()) => Ok(()),
        Err(error) if agent_client_protocol::is_incoming_transport_closed(&error) => Ok(()),
        Err(error) => Err(Error::Failed(format!("the ACP connection failed: {error}"))),
    }
}

/// Sub-agent results (and other notifications on the bus) become turns of their sessions,
/// streamed to the client like any turn.
struct AcpNotifications {
    server: Weak<Server>,
    sessions: clawcage_agent::Sessions,
}

impl NotificationFront for AcpNotifications {
    fn admit(&self, message: clawcage_core::InboundMessage) -> BoxFuture<'_, ()> {
        let Some(server) = self.server.upgrade() else {
            return Box::pin(std::future::ready(()));
        };
        let key = message.session_key.clone();
        let run_id = format!("notify-{}", server.next_run.fetch_add(1, Ordering::Relaxed));
        let (observer, mut events) = EventObserver::channel(&key, &run_id);
        let pending =
            self.sessions
                .submit(&key, LaneInput::Notification(message), Arc::new(observer));
        tokio::spawn(async move {
            let mut wait = Box::pin(pending.wait());
            loop {
                tokio::select! {
                    Some(event) = events.recv() => {
                        if let Some(update) = updates::update_of(&event) {
                            server.send_update(&key, update);
                        }
                    }
                    _ = &mut wait => break,
                }
            }
            while let Ok(event) = events.try_recv() {
                if let Some(update) = updates::update_of(&event) {
                    server.send_update(&key, update);
                }
            }
        });
        Box::pin(std::future::ready(()))
    }
}
