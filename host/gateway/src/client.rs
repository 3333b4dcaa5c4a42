//! A client of the gateway protocol, for front ends that attach to a running gateway
//! (`clawcage chat --gateway`): it opens the WebSocket (`ws://` only; a remote gateway is
//! reached through a tunnel), answers the challenge with `connect`, and then sends requests and
//! hands out the events. One task owns the socket: a response is handed to the request that
//! waits for it ([`Client::request`]); events, and the responses of requests sent without
//! waiting ([`Client::send`]), go to one queue in the order they arrived, so a `chat.send`'s
//! acknowledgement is read before the events of its run. When the socket closes every waiting
//! request fails with the close reason.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use clawcage_core::sync::lock;

use crate::protocol::PROTOCOL_VERSION;

/// How long connecting, the handshake and one request may take.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a connection or a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The address is not a `ws://host:port` URL.
    Url(String),
    /// Nothing answers there, or it is not a gateway.
    Unreachable(String),
    /// The gateway refused the handshake (a wrong or missing token, another protocol).
    Refused {
        /// The error code (`UNAUTHORIZED`, `INVALID_REQUEST`).
        code: String,
        /// The gateway's message.
        message: String,
    },
    /// The request failed: the gateway's error response.
    Failed {
        /// The error code.
        code: String,
        /// The gateway's message.
        message: String,
    },
    /// The connection ended.
    Closed(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Url(why) | ClientError::Unreachable(why) | ClientError::Closed(why) => {
                f.write_str(why)
            }
            ClientError::Refused { message, .. } | ClientError::Failed { message, .. } => {
                f.write_str(message)
            }
        }
    }
}

impl std::error::Error for ClientError {}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>;

/// A connected client. Dropping it closes the socket.
pub struct Client {
    outgoing: mpsc::UnboundedSender<String>,
    pending: Pending,
    events: Option<mpsc::UnboundedReceiver<Value>>,
    closed: Arc<Mutex<Option<String>>>,
    next_id: AtomicU64,
}

/// `ws://host:port[/path]` as the address to dial and the URL to request (`/ws` by default).
fn parse_url(url: &str) -> Result<(String, String), ClientError> {
    let bad = |why: &str| {
        ClientError::Url(format!(
            "{why}: give the gateway's WebSocket address, e.g. --gateway ws://127.0.0.1:18789"
        ))
    };
    if url.starts_with("wss://") {
        return Err(ClientError::Url(
            "wss:// is not supported: reach a remote gateway through a tunnel (ssh -L 18789:127.0.0.1:18789 HOST) and use ws://127.0.0.1:18789".to_string(),
        ));
    }
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad(&format!("`{url}` does not start with ws://")))?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(bad(&format!("`{url}` names no host")));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
    {
        authority.to_string()
    } else {
        format!(
            "{authority}:{}",
            crate::DEFAULT_BIND.rsplit(':').next().unwrap_or("18789")
        )
    };
    let path = match path {
        "" | "/" => crate::http::WS_PATH,
        path => path,
    };
    Ok((authority.clone(), format!("ws://{authority}{path}")))
}

impl Client {
    /// Connects to `url` with `token`, as a client named `id` in `mode` (e.g. `cli`); returns
    /// the client and the `hello-ok` payload. A `cli` client is an approver of `session`'s
    /// requests (and its sub-agents'), the terminal being where that session's operator is.
    pub async fn connect(
        url: &str,
        token: &str,
        id: &str,
        mode: &str,
        session: Option<&str>,
    ) -> Result<(Client, Value), ClientError> {
        tokio::time::timeout(CLIENT_TIMEOUT, Self::open(url, token, id, mode, session))
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Unreachable(format!(
                    "{url} did not complete the handshake within {} s; is it a clawcage gateway?",
                    CLIENT_TIMEOUT.as_secs()
                )))
            })
    }

    async fn open(
        url: &str,
        token: &str,
        id: &str,
        mode: &str,
        session: Option<&str>,
    ) -> Result<(Client, Value), ClientError> {
        let (address, url) = parse_url(url)?;
        let stream = TcpStream::connect(&address).await.map_err(|error| {
            ClientError::Unreachable(format!(
                "no gateway answers at {url} ({error}); start one with `clawcage gateway`, or check --gateway"
            ))
        })?;
        let _ = stream.set_nodelay(true);
        let request = url
            .as_str()
            .into_client_request()
            .map_err(|error| ClientError::Url(format!("`{url}`: {error}")))?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let (mut socket, _) = tokio_tungstenite::client_async_with_config(
            request,
            stream,
            Some(config),
        )
        .await
        .map_err(|error| {
            ClientError::Unreachable(match error {
                WsError::Http(response) => format!(
                    "{url} answered HTTP {} instead of a WebSocket; is it a clawcage gateway?",
                    response.status().as_u16()
                ),
                other => format!("cannot open the WebSocket {url}: {other}"),
            })
        })?;
        // The challenge, then connect.
        let first = read_json(&mut socket).await?;
        if first["event"] != "connect.challenge" {
            return Err(ClientError::Unreachable(format!(
                "{url} did not send the gateway's challenge; is it a clawcage gateway?"
            )));
        }
        let mut connect = json!({
            "type": "req",
            "id": "connect",
            "method": "connect",
            "params": {
                "minProtocol": PROTOCOL_VERSION,
                "maxProtocol": PROTOCOL_VERSION,
                "client": {"id": id, "version": env!("CARGO_PKG_VERSION"), "mode": mode},
                "auth": {"token": token},
            },
        });
        // A terminal is where its operator is: it answers its session's approvals, and only
        // those, so another session's request is not held for a terminal that ignores it.
        if mode == "cli"
            && let Some(session) = session
        {
            connect["params"]["scopes"] = json!(["operator.approvals"]);
            connect["params"]["approvalSession"] = json!(session);
        }
        socket
            .send(Message::Text(connect.to_string().into()))
            .await
            .map_err(|error| ClientError::Closed(format!("the gateway closed: {error}")))?;
        let hello = loop {
            let frame = read_json(&mut socket).await?;
            if frame["type"] == "res" && frame["id"] == "connect" {
                break frame;
            }
        };
        if hello["ok"] != true {
            return Err(ClientError::Refused {
                code: text(&hello["error"]["code"]),
                message: text(&hello["error"]["message"]),
            });
        }
        let (outgoing, mut to_send) = mpsc::unbounded_channel::<String>();
        let (events_in, events) = mpsc::unbounded_channel();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(Mutex::new(None));
        {
            let pending = pending.clone();
            let closed = closed.clone();
            tokio::spawn(async move {
                let why = loop {
                    tokio::select! {
                        frame = to_send.recv() => {
                            let Some(frame) = frame else {
                                let _ = socket.close(None).await;
                                break "the client closed the connection".to_string();
                            };
                            if let Err(error) = socket.send(Message::Text(frame.into())).await {
                                break format!("the connection to the gateway failed: {error}");
                            }
                        }
                        message = socket.next() => match message {
                            Some(Ok(Message::Text(text))) => {
                                let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                                    continue;
                                };
                                let waiter = if frame["type"] == "res" {
                                    let id = frame["id"].as_str().unwrap_or_default().to_string();
                                    lock(&pending).remove(&id)
                                } else {
                                    None
                                };
                                match waiter {
                                    Some(waiter) => {
                                        let _ = waiter.send(frame);
                                    }
                                    // Nobody may read the events; responses still matter.
                                    None => {
                                        let _ = events_in.send(frame);
                                    }
                                }
                            }
                            Some(Ok(Message::Close(frame))) => {
                                break match frame {
                                    Some(frame) if !frame.reason.is_empty() => {
                                        format!("the gateway closed the connection: {}", frame.reason)
                                    }
                                    _ => "the gateway closed the connection".to_string(),
                                };
                            }
                            Some(Ok(_)) => {}
                            Some(Err(error)) => break format!("the connection to the gateway failed: {error}"),
                            None => break "the gateway closed the connection".to_string(),
                        },
                    }
                };
                *lock(&closed) = Some(why);
                lock(&pending).clear();
            });
        }
        Ok((
            Client {
                outgoing,
                pending,
                events: Some(events),
                closed,
                next_id: AtomicU64::new(1),
            },
            hello["payload"].clone(),
        ))
    }

    /// Why the connection ended, once it has.
    pub fn closed_reason(&self) -> Option<String> {
        lock(&self.closed).clone()
    }

    /// Sends `method` with `params` and waits for its response: the payload, or the error.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = format!("c{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let (answer, response) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), answer);
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        let gone = || {
            ClientError::Closed(
                self.closed_reason()
                    .unwrap_or_else(|| "the gateway closed the connection".to_string()),
            )
        };
        if self.outgoing.send(frame.to_string()).is_err() {
            return Err(gone());
        }
        let frame = match tokio::time::timeout(CLIENT_TIMEOUT, response).await {
            Ok(Ok(frame)) => frame,
            Ok(Err(_)) => return Err(gone()),
            Err(_) => {
                lock(&self.pending).remove(&id);
                return Err(ClientError::Closed(format!(
                    "the gateway did not answer {method} within {} s",
                    CLIENT_TIMEOUT.as_secs()
                )));
            }
        };
        if frame["ok"] == true {
            Ok(frame["payload"].clone())
        } else {
            Err(ClientError::Failed {
                code: text(&frame["error"]["code"]),
                message: text(&frame["error"]["message"]),
            })
        }
    }

    /// Sends `method` with `params` without waiting: its response arrives among the events.
    /// Returns the request's id.
    pub fn send(&self, method: &str, params: Value) -> Result<String, ClientError> {
        let id = format!("c{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.outgoing.send(frame.to_string()).map_err(|_| {
            ClientError::Closed(
                self.closed_reason()
                    .unwrap_or_else(|| "the gateway closed the connection".to_string()),
            )
        })?;
        Ok(id)
    }

    /// The frames that are not answers to [`Client::request`] — events (`{type: "event",
    /// event, payload, seq?}`) and the responses to [`Client::send`] — in the order they
    /// arrived; the channel ends with the connection. Given out once.
    pub fn take_events(&mut self) -> Option<mpsc::UnboundedReceiver<Value>> {
        self.events.take()
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

async fn read_json<S>(socket: &mut S) -> Result<Value, ClientError>
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str(text.as_str()).map_err(|_| {
                    ClientError::Unreachable(
                        "the server sent something other than JSON; is it a clawcage gateway?"
                            .to_string(),
                    )
                });
            }
            Some(Ok(Message::Close(frame))) => {
                return Err(ClientError::Closed(match frame {
                    Some(frame) => format!("the gateway closed the connection: {}", frame.reason),
                    None => "the gateway closed the connection".to_string(),
                }));
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                return Err(ClientError::Closed(format!(
                    "the connection to the gateway failed: {error}"
                )));
            }
            None => {
                return Err(ClientError::Closed(
                    "the gateway closed the connection".to_string(),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_port_and_the_socket_path() {
        assert_eq!(
            parse_url("ws://127.0.0.1:18789").expect("ok"),
            (
                "127.0.0.1:18789".to_string(),
                "ws://127.0.0.1:18789/ws".to_string()
            )
        );
        assert_eq!(
            parse_url("ws://localhost/ws").expect("ok").0,
            "localhost:18789"
        );
        assert!(matches!(
            parse_url("wss://example.org"),
            Err(ClientError::Url(_))
        ));
        assert!(matches!(
            parse_url("127.0.0.1:18789"),
            Err(ClientError::Url(_))
        ));
        assert!(matches!(parse_url("ws:///ws"), Err(ClientError::Url(_))));
    }
}
