//! The MCP server of clawcage: it serves the tools of an [`AuditedRegistry`] to Model Context
//! Protocol clients (Claude Code, Claude Desktop, Cursor, …) over stdio or streamable HTTP,
//! through the official Rust SDK (rmcp). Each tool is listed with its JSON Schema; a call runs
//! through the registry (schema check, sandbox, audit log) and a [`ToolError`] becomes a tool
//! result with `isError: true` and the error's text, so the model reads it. The crate knows
//! nothing of wasm: it depends on the agent crate's registry only and is tested with plain tools.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use clawcage_agent::AuditedRegistry;
use clawcage_agent::audit::new_session_id;
use clawcage_core::ToolError;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The path the streamable-HTTP endpoint is served at.
pub const HTTP_PATH: &str = "/mcp";

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
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("tools", &self.registry.registry().names())
            .field("session", &self.session)
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
        }
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
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|error| ServeError::Handshake(error.to_string()))?;
        running
            .waiting()
            .await
            .map(|_reason| ())
            .map_err(|error| ServeError::Session(error.to_string()))
    }

    /// Serves streamable HTTP at [`HTTP_PATH`] on `listener` until `shutdown` is cancelled. Only
    /// loopback listeners are accepted; requests whose `Host` is not a loopback name are refused
    /// (DNS-rebinding protection of rmcp's default configuration).
    pub async fn serve_http(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let address = listener.local_addr()?;
        if !address.ip().is_loopback() {
            return Err(ServeError::NotLoopback(address));
        }
        let config =
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
        let template = self;
        let service = StreamableHttpService::new(
            move || Ok(template.new_session("mcp-http")),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => accepted?,
                () = shutdown.cancelled() => return Ok(()),
            };
            let service = service.clone();
            let connection_shutdown = shutdown.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(route(&service, request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler);
                tokio::select! {
                    result = connection => {
                        if let Err(error) = result {
                            tracing::debug!(%peer, "MCP HTTP connection ended: {error}");
                        }
                    }
                    () = connection_shutdown.cancelled() => {}
                }
            });
        }
    }

    async fn call(&self, session: &str, request: CallToolRequestParams) -> CallToolResult {
        let args = Value::Object(request.arguments.unwrap_or_default());
        match self
            .registry
            .execute_value(session, &request.name, &args)
            .await
        {
            Ok(output) => CallToolResult::success(vec![ContentBlock::text(output.text)]),
            Err(error) => error_result(&error),
        }
    }
}

/// A tool error as an MCP tool result the model reads: `isError: true`, the error's text.
pub fn error_result(error: &ToolError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error.to_string())])
}

type HttpService = StreamableHttpService<McpServer, LocalSessionManager>;

/// Sends requests for [`HTTP_PATH`] to rmcp and answers 404 elsewhere.
async fn route(
    service: &HttpService,
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    if request.uri().path() == HTTP_PATH {
        return service.handle(request).await;
    }
    let mut response = http::Response::new(
        Full::new(Bytes::from_static(
            b"not found: the MCP endpoint of clawcage is /mcp\n",
        ))
        .boxed(),
    );
    *response.status_mut() = http::StatusCode::NOT_FOUND;
    response
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
        // A cancelled request drops the call: the instance is dropped with it and the audit log
        // records the call as cancelled.
        tokio::select! {
            result = self.call(&session, request) => Ok(result.into()),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("the request was cancelled", None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_agent::ToolRegistry;
    use clawcage_core::{BoxFuture, ToolOutput, ToolSpec};
    use serde_json::json;

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
        let mut ok = CallToolRequestParams::new("upper");
        ok.arguments = json!({"text": "abc"}).as_object().cloned();
        let result = server.call("s", ok).await;
        assert_eq!(result.is_error, Some(false));
        assert_eq!(
            result.content[0].as_text().map(|t| t.text.as_str()),
            Some("ABC")
        );

        let mut denied = CallToolRequestParams::new("upper");
        denied.arguments = json!({"text": ""}).as_object().cloned();
        let result = server.call("s", denied).await;
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.content[0].as_text().map(|t| t.text.as_str()),
            Some("denied: empty text is not allowed")
        );

        let schema_fail = server.call("s", CallToolRequestParams::new("upper")).await;
        assert_eq!(schema_fail.is_error, Some(true));
        let text = schema_fail.content[0].as_text().unwrap().text.clone();
        assert!(text.starts_with("invalid arguments:"), "{text}");

        let unknown = server.call("s", CallToolRequestParams::new("nope")).await;
        assert_eq!(unknown.is_error, Some(true));
        assert!(
            unknown.content[0]
                .as_text()
                .unwrap()
                .text
                .contains("unknown tool `nope`")
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
