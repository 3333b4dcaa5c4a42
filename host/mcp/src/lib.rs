//! The MCP server of clawcage: it serves the tools of an [`AuditedRegistry`] to Model Context
//! Protocol clients (Claude Code, Claude Desktop, Cursor, …) over stdio or streamable HTTP,
//! through the official Rust SDK (rmcp). Each tool is listed with its JSON Schema; a call runs
//! through the registry (schema check, sandbox, audit log) and a [`ToolError`] becomes a tool
//! result with `isError: true` and the error's text, so the model reads it. Every request is
//! answered: what rmcp would drop unanswered (invalid JSON, messages too large or nested too
//! deeply) is refused with a JSON-RPC error first (`inbound`), and each call runs on a thread of
//! its own under a deadline, so a tool that holds its thread delays neither the other requests
//! nor its own answer. The crate knows nothing of wasm: it depends on the agent crate's registry
//! only and is tested with plain tools.

mod http_endpoint;
mod inbound;
mod lines;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use clawcage_agent::AuditedRegistry;
use clawcage_agent::approvals::{ApprovalBroker, OperatorEvent, OperatorFilter, OperatorHandle};
use clawcage_agent::audit::new_session_id;
use clawcage_agent::session::with_session_key;
use clawcage_core::approval::ApprovalDecision;
use clawcage_core::{ToolError, ToolOutput};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

pub use inbound::{MAX_ARGUMENT_DEPTH, MAX_MESSAGE_BYTES, MAX_MESSAGE_DEPTH, nesting_depth};

/// The path the streamable-HTTP endpoint is served at.
pub const HTTP_PATH: &str = "/mcp";

/// The time limit assumed for a call when none is set: the most `[limits] timeout_secs` allows.
pub const DEFAULT_CALL_TIME_LIMIT: Duration = Duration::from_secs(3600);

/// How long past its time limit the server waits for a call before answering without it (the
/// limit covers the tool's run; loading its component on the first call comes on top).
pub const CALL_TIME_MARGIN: Duration = Duration::from_secs(30);

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP handshake over stdio failed.
    #[error("the MCP client did not complete the handshake: {0}")]
    Handshake(String),
    /// The stdio session ended abnormally.
    #[error("the MCP session ended with an error: {0}")]
    Session(String),
    /// The HTTP listener failed.
    #[error("the HTTP listener failed: {0}")]
    Listener(#[from] std::io::Error),
    /// The address is not a loopback address.
    #[error(
        "refusing to serve MCP over HTTP on {0}: the endpoint has no authentication, so it listens on loopback only; use 127.0.0.1:PORT (or [::1]:PORT) and put an authenticating proxy in front for remote clients"
    )]
    NotLoopback(SocketAddr),
}

/// One MCP server session over a registry. Cheap to clone; HTTP creates one per MCP session.
#[derive(Clone)]
pub struct McpServer {
    registry: AuditedRegistry,
    tools: Arc<Vec<Tool>>,
    instructions: Arc<str>,
    /// The session id recorded in the audit log when the transport names none.
    session: String,
    /// The tools' time limit; a call is answered at the latest `margin` after it.
    time_limit: Duration,
    /// [`CALL_TIME_MARGIN`] (shorter in tests).
    margin: Duration,
    /// The approvals broker: a call's approval requests are asked through MCP elicitation when
    /// the client supports it (else `ask_fallback` decides).
    approvals: Option<ApprovalBroker>,
    /// Each MCP session's elicitation asker, shared by its calls in flight and stopped with the
    /// last of them: one operator per session, so a request is asked once however many of the
    /// session's calls are running.
    askers: Arc<Mutex<HashMap<String, Weak<AbortOnDropHandle<()>>>>>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("tools", &self.registry.registry().names())
            .field("session", &self.session)
            .field("time_limit", &self.time_limit)
            .finish()
    }
}

impl McpServer {
    /// A server for the tools of `registry`. `instructions` is shown to clients that display
    /// server instructions (e.g. which workspace the tools can reach). `session_prefix` names the
    /// transport in audit-log session ids (`mcp-stdio`, `mcp-http`).
    pub fn new(registry: AuditedRegistry, instructions: &str, session_prefix: &str) -> Self {
        let tools = registry
            .registry()
            .specs()
            .into_iter()
            .map(|spec| {
                let schema = match &spec.input_schema {
                    Value::Object(map) => map.clone(),
                    // The registry accepts any schema; MCP requires an object schema.
                    other => {
                        let mut wrapped = serde_json::Map::new();
                        wrapped.insert("type".into(), Value::String("object".into()));
                        wrapped.insert("description".into(), Value::String(other.to_string()));
                        wrapped
                    }
                };
                Tool::new(
                    spec.name.clone(),
                    spec.description.clone(),
                    Arc::new(schema),
                )
            })
            .collect();
        Self {
            registry,
            tools: Arc::new(tools),
            instructions: instructions.into(),
            session: new_session_id(session_prefix),
            time_limit: DEFAULT_CALL_TIME_LIMIT,
            margin: CALL_TIME_MARGIN,
            approvals: None,
            askers: Arc::default(),
        }
    }

    /// The same server asking the client's user, through MCP elicitation, about the approval
    /// requests of its calls (clients without elicitation get `ask_fallback`).
    pub fn with_approvals(mut self, approvals: ApprovalBroker) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// The same server for tools that stop themselves after `limit` (the run's `[limits]
    /// timeout`): a call still running [`CALL_TIME_MARGIN`] later is answered with an error and
    /// abandoned, even if the tool never gives its thread back.
    pub fn with_call_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// The same server with a fresh session id (one per HTTP session).
    pub fn new_session(&self, session_prefix: &str) -> Self {
        let mut next = self.clone();
        next.session = new_session_id(session_prefix);
        next
    }

    /// The session id used in the audit log when the transport gives none.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Serves one client over this process's stdin and stdout until the client closes them.
    pub async fn serve_stdio(self) -> Result<(), ServeError> {
        let (read, write) = rmcp::transport::stdio_pipes();
        self.serve_io(read, write).await
    }

    /// Serves one client speaking newline-delimited JSON-RPC over `read` and `write` until it
    /// closes `read`.
    pub async fn serve_io<R, W>(self, read: R, write: W) -> Result<(), ServeError>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let running = self
            .serve(lines::LineTransport::new(read, write))
            .await
            .map_err(|error| ServeError::Handshake(error.to_string()))?;
        running
            .waiting()
            .await
            .map(|_reason| ())
            .map_err(|error| ServeError::Session(error.to_string()))
    }

    /// Runs one call and says how it ended, in every case. The call runs on a blocking-pool
    /// thread of its own (driven by this runtime's handle), never on the threads that serve the
    /// protocol: a tool whose future holds its thread (a guest that never yields, blocking I/O)
    /// cannot stall other requests, and the deadline below still fires. When the deadline
    /// passes or this future is dropped (the client cancelled), the call is dropped at its next
    /// yield and the audit log records it as cancelled.
    async fn call(
        &self,
        session: &str,
        request: CallToolRequestParams,
        elicit: Option<Peer<RoleServer>>,
    ) -> CallToolResult {
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.unwrap_or_default());
        // The transports refuse deeper messages before parsing them; this bound holds for any
        // caller, before the schema validator, the audit digest and the tool recurse on them.
        let depth = nesting_depth(&args);
        if depth > MAX_ARGUMENT_DEPTH {
            return error_result(&ToolError::InvalidArgs(format!(
                "arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels ({depth}) for `{name}`; flatten them"
            )));
        }
        let registry = self.registry.clone();
        let session = session.to_string();
        // The call runs as the MCP session's work, so its approval requests name that session
        // and only this client's user is asked.
        let asker = match (&self.approvals, elicit) {
            (Some(approvals), Some(peer)) => Some(self.session_asker(&session, approvals, peer)),
            _ => None,
        };
        let waits_for_people = asker.is_some();
        let stop = CancellationToken::new();
        let _stop_when_done = stop.clone().drop_guard();
        let runtime = tokio::runtime::Handle::current();
        let span = tracing::Span::current();
        let tool = name.clone();
        let running = tokio::task::spawn_blocking(move || {
            runtime.block_on(
                async move {
                    let key = session.clone();
                    tokio::select! {
                        result = with_session_key(key, registry.execute_value(&session, &tool, &args)) => Some(result),
                        () = stop.cancelled() => None,
                    }
                }
                .instrument(span),
            )
        });
        let mut deadline = self.time_limit.saturating_add(self.margin);
        if waits_for_people && let Some(approvals) = &self.approvals {
            // A person may take up to the approvals timeout to answer before the call starts.
            deadline = deadline.saturating_add(approvals.settings().timeout);
        }
        match tokio::time::timeout(deadline, running).await {
            Ok(Ok(Some(result))) => tool_result(result),
            Ok(Ok(None)) => error_result(&ToolError::Failed(format!(
                "the call of `{name}` was cancelled"
            ))),
            Ok(Err(error)) => {
                tracing::error!(tool = %name, "a tool call ended abnormally: {error}");
                error_result(&ToolError::Failed(format!(
                    "the tool `{name}` stopped unexpectedly (a bug in the tool or in clawcage: {error}); the call had no result, try it again or report the bug"
                )))
            }
            Err(_elapsed) => {
                tracing::error!(tool = %name, ?deadline, "a tool call overran its time limit");
                error_result(&ToolError::Failed(format!(
                    "the tool `{name}` did not finish within its time limit of {} s and a margin of {} s, so the server stopped waiting for it; it may be stuck, or the task is too large for one call",
                    self.time_limit.as_secs_f64(),
                    self.margin.as_secs_f64()
                )))
            }
        }
    }
}

impl McpServer {
    /// The elicitation asker of `session`: the one its running calls share, or a new one.
    fn session_asker(
        &self,
        session: &str,
        approvals: &ApprovalBroker,
        peer: Peer<RoleServer>,
    ) -> Arc<AbortOnDropHandle<()>> {
        let mut askers = self
            .askers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(asker) = askers.get(session).and_then(Weak::upgrade) {
            return asker;
        }
        askers.retain(|_, asker| asker.strong_count() > 0);
        let operator = approvals.operator(OperatorFilter::Session(session.to_string()));
        let asker = Arc::new(AbortOnDropHandle::new(tokio::spawn(
            ask_through_elicitation(operator, peer),
        )));
        askers.insert(session.to_string(), Arc::downgrade(&asker));
        asker
    }
}

/// Asks the client's user about each approval request of the call, through MCP elicitation: a
/// form with one choice, `allow-once`, `allow-always` or `deny`. Declined, cancelled, an invalid
/// answer or a failed elicitation deny.
async fn ask_through_elicitation(mut operator: OperatorHandle, peer: Peer<RoleServer>) {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Decision",
                "enum": ["allow-once", "allow-always", "deny"],
            }
        },
        "required": ["decision"],
    });
    let Ok(schema) = serde_json::from_value::<ElicitationSchema>(schema) else {
        tracing::error!("the approval form cannot be built; approvals fall back to deny");
        return;
    };
    while let Some(event) = operator.next().await {
        let OperatorEvent::Requested(request) = event else {
            continue;
        };
        let message = format!(
            "{}\nAllow it? allow-once runs it this time, allow-always keeps allowing it, deny refuses it.",
            request.describe()
        );
        let answer = peer
            .create_elicitation(ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: schema.clone(),
            })
            .await;
        let decision = match answer {
            Ok(result) if result.action == ElicitationAction::Accept => result
                .content
                .as_ref()
                .and_then(|content| content.get("decision"))
                .and_then(Value::as_str)
                .and_then(ApprovalDecision::parse)
                .unwrap_or(ApprovalDecision::Deny),
            Ok(_) => ApprovalDecision::Deny,
            Err(error) => {
                tracing::warn!("the approval could not be asked through elicitation: {error}");
                ApprovalDecision::Deny
            }
        };
        let _ = operator.resolve(&request.id, decision, "mcp-elicitation");
    }
}

fn tool_result(result: Result<ToolOutput, ToolError>) -> CallToolResult {
    match result {
        Ok(output) => CallToolResult::success(vec![ContentBlock::text(output.text)]),
        Err(error) => error_result(&error),
    }
}

/// A tool error as an MCP tool result the model reads: `isError: true`, the error's text.
pub fn error_result(error: &ToolError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error.to_string())])
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("clawcage", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(self.instructions.to_string());
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Over HTTP the transport's session id ties the audit lines of one client together.
        let session = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|value| value.to_str().ok())
            .map(|id| format!("mcp-http-{id}"))
            .unwrap_or_else(|| self.session.clone());
        let elicit = context
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.elicitation.is_some())
            .then(|| context.peer.clone());
        // A cancelled request drops the call: the instance is dropped with it and the audit log
        // records the call as cancelled.
        tokio::select! {
            result = self.call(&session, request, elicit) => Ok(result.into()),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("the request was cancelled", None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_agent::ToolRegistry;
    use clawcage_core::{BoxFuture, ToolSpec};
    use serde_json::json;
    use tokio::net::TcpListener;

    /// Upper-cases `text`; `"hang"` never answers and `"panic"` panics.
    #[derive(Debug)]
    struct Upper(ToolSpec);

    impl clawcage_core::Tool for Upper {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
            Box::pin(async move {
                match args["text"].as_str() {
                    Some("") => Err(ToolError::Denied("empty text is not allowed".into())),
                    Some("hang") => std::future::pending().await,
                    Some("panic") => panic!("the tool panicked on purpose"),
                    Some(text) => Ok(ToolOutput::text(text.to_uppercase())),
                    None => Err(ToolError::InvalidArgs("no text".into())),
                }
            })
        }
    }

    fn server() -> McpServer {
        let mut registry = ToolRegistry::new();
        registry
            .register(Arc::new(Upper(ToolSpec {
                name: "upper".into(),
                description: "Upper-case a text.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                }),
            })))
            .unwrap();
        McpServer::new(AuditedRegistry::new(registry, None), "test", "test")
    }

    fn upper(arguments: Value) -> CallToolRequestParams {
        let mut request = CallToolRequestParams::new("upper");
        request.arguments = arguments.as_object().cloned();
        request
    }

    fn text(result: &CallToolResult) -> &str {
        result.content[0]
            .as_text()
            .map(|text| text.text.as_str())
            .unwrap()
    }

    #[test]
    fn tools_are_listed_with_their_schemas() {
        let server = server();
        let tool = server.get_tool("upper").unwrap();
        assert_eq!(tool.description.as_deref(), Some("Upper-case a text."));
        assert_eq!(tool.input_schema["required"], json!(["text"]));
        assert!(server.get_tool("nope").is_none());
        assert_eq!(server.get_info().server_info.name, "clawcage");
    }

    #[tokio::test]
    async fn a_tool_error_is_a_tool_result_with_is_error_and_its_text() {
        let server = server();
        let result = server.call("s", upper(json!({"text": "abc"})), None).await;
        assert_eq!(result.is_error, Some(false));
        assert_eq!(text(&result), "ABC");

        let result = server.call("s", upper(json!({"text": ""})), None).await;
        assert_eq!(result.is_error, Some(true));
        assert_eq!(text(&result), "denied: empty text is not allowed");

        let schema_fail = server
            .call("s", CallToolRequestParams::new("upper"), None)
            .await;
        assert_eq!(schema_fail.is_error, Some(true));
        assert!(
            text(&schema_fail).starts_with("invalid arguments:"),
            "{}",
            text(&schema_fail)
        );

        let unknown = server
            .call("s", CallToolRequestParams::new("nope"), None)
            .await;
        assert_eq!(unknown.is_error, Some(true));
        assert!(text(&unknown).contains("unknown tool `nope`"));
    }

    #[tokio::test]
    async fn arguments_nested_too_deeply_are_refused_before_the_registry() {
        let mut deep = json!("bottom");
        for _ in 0..MAX_ARGUMENT_DEPTH {
            deep = json!([deep]);
        }
        let result = server()
            .call("s", upper(json!({"text": "x", "deep": deep})), None)
            .await;
        assert_eq!(result.is_error, Some(true));
        assert!(
            text(&result).starts_with(&format!(
                "invalid arguments: arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
            )),
            "{}",
            text(&result)
        );
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_answered_and_abandoned() {
        let mut server = server().with_call_time_limit(Duration::from_millis(50));
        server.margin = Duration::from_millis(50);
        let result = server.call("s", upper(json!({"text": "hang"})), None).await;
        assert_eq!(result.is_error, Some(true));
        assert!(
            text(&result).contains("did not finish within its time limit of 0.05 s"),
            "{}",
            text(&result)
        );
        // The server still serves.
        let result = server.call("s", upper(json!({"text": "ok"})), None).await;
        assert_eq!(text(&result), "OK");
    }

    #[tokio::test]
    async fn a_tool_that_panics_is_answered_with_an_error() {
        let result = server()
            .call("s", upper(json!({"text": "panic"})), None)
            .await;
        assert_eq!(result.is_error, Some(true));
        assert!(
            text(&result).contains("stopped unexpectedly"),
            "{}",
            text(&result)
        );
    }

    #[tokio::test]
    async fn http_refuses_non_loopback_addresses() {
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let error = server()
            .serve_http(listener, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(error, ServeError::NotLoopback(_)), "{error}");
        assert!(error.to_string().contains("loopback only"));
    }
}
