//! Streamable HTTP: rmcp's tower service on a hyper HTTP/1.1 accept loop at [`HTTP_PATH`],
//! loopback only. Before rmcp sees a POST from a loopback `Host`, its body is read here, at most
//! [`MAX_MESSAGE_BYTES`] of it kept, and run through [`inbound::admit`]: rmcp would answer a body
//! it cannot parse (invalid, or nested past serde_json's 128 levels) with a plain-text HTTP error
//! that no MCP client ties to its request. A refused request whose id could be read is answered
//! with a JSON-RPC error for that id (`200`, `application/json`), so the client's call ends;
//! anything else with `400` or `413` and a JSON-RPC error without an id.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{Buf as _, Bytes};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::inbound::{self, MAX_MESSAGE_BYTES, Refusal, Scan};
use crate::{HTTP_PATH, McpServer, ServeError};

/// How much of an oversized body is still read (and discarded) to find its id and let the client
/// finish sending before the answer; past this the connection is answered and closed.
const MAX_DISCARDED_BYTES: usize = 16 * MAX_MESSAGE_BYTES;

/// The `Host` names rmcp's default configuration accepts (its DNS-rebinding protection).
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

type HttpService = StreamableHttpService<McpServer, LocalSessionManager>;
type Response = http::Response<BoxBody<Bytes, Infallible>>;

impl McpServer {
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
        let config = StreamableHttpServerConfig::default()
            .with_cancellation_token(shutdown.child_token())
            .with_max_request_body_bytes(MAX_MESSAGE_BYTES);
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
}

/// Sends requests for [`HTTP_PATH`] to rmcp, POST bodies from loopback hosts checked first, and
/// answers 404 elsewhere.
async fn route(service: &HttpService, request: http::Request<Incoming>) -> Response {
    if request.uri().path() != HTTP_PATH {
        return plain(
            http::StatusCode::NOT_FOUND,
            "not found: the MCP endpoint of clawcage is /mcp\n",
        );
    }
    if request.method() != http::Method::POST || !from_loopback_host(request.headers()) {
        // rmcp refuses a foreign Host without reading the body; a GET or DELETE has none.
        return service.handle(request).await;
    }
    let (parts, body) = request.into_parts();
    let (kept, scan) = match read_body(body).await {
        Ok(read) => read,
        Err(error) => {
            return plain(
                http::StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {error}\n"),
            );
        }
    };
    match (inbound::admit(kept.as_deref(), &scan), kept) {
        (Ok(_), Some(body)) => {
            let request = http::Request::from_parts(parts, Full::new(Bytes::from(body)));
            service.handle(request).await
        }
        (Ok(_), None) => refusal_response(&inbound::too_large(&scan)),
        (Err(refusal), _) => {
            refusal.log();
            refusal_response(&refusal)
        }
    }
}

/// Reads a body, keeping at most [`MAX_MESSAGE_BYTES`] (`None` past that) and scanning all of
/// it, up to [`MAX_DISCARDED_BYTES`].
async fn read_body(mut body: Incoming) -> Result<(Option<Vec<u8>>, Scan), hyper::Error> {
    let mut scan = Scan::default();
    let mut kept = Some(Vec::new());
    while let Some(frame) = body.frame().await {
        let Ok(mut data) = frame?.into_data() else {
            continue;
        };
        while data.has_remaining() {
            let chunk = data.chunk();
            scan.feed(chunk);
            if let Some(bytes) = kept.as_mut() {
                if scan.len() > MAX_MESSAGE_BYTES {
                    kept = None;
                } else {
                    bytes.extend_from_slice(chunk);
                }
            }
            let length = chunk.len();
            data.advance(length);
        }
        if scan.len() > MAX_DISCARDED_BYTES {
            break;
        }
    }
    Ok((kept, scan))
}

/// The HTTP answer to a refused message: the JSON-RPC error for a request whose id is known,
/// else `413` or `400` with an id-less JSON-RPC error (or none, for a notification).
fn refusal_response(refusal: &Refusal) -> Response {
    let status = match (&refusal.id, refusal.answer) {
        (Some(_), true) => http::StatusCode::OK,
        _ if refusal.too_large => http::StatusCode::PAYLOAD_TOO_LARGE,
        _ => http::StatusCode::BAD_REQUEST,
    };
    let Some(reply) = refusal.reply() else {
        return plain(status, format!("{}\n", refusal.message));
    };
    let mut response = http::Response::new(Full::new(Bytes::from(reply.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn plain(status: http::StatusCode, text: impl Into<Bytes>) -> Response {
    let mut response = http::Response::new(Full::new(text.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Whether the `Host` header names a loopback host, the way rmcp's default allow-list reads it.
fn from_loopback_host(headers: &http::HeaderMap) -> bool {
    let Some(host) = headers
        .get(http::header::HOST)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    LOOPBACK_HOSTS
        .iter()
        .any(|allowed| name.eq_ignore_ascii_case(allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_as_rmcp_does() {
        for host in ["localhost", "127.0.0.1:8080", "[::1]:9", "LOCALHOST:1"] {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::HOST, host.parse().unwrap());
            assert!(from_loopback_host(&headers), "{host}");
        }
        for host in ["attacker.example", "127.0.0.1.example:80", "[::2]"] {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::HOST, host.parse().unwrap());
            assert!(!from_loopback_host(&headers), "{host}");
        }
        assert!(!from_loopback_host(&http::HeaderMap::new()));
    }
}
