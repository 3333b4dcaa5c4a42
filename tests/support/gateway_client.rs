//! A WebSocket client of the gateway protocol for the tests and benchmarks: it opens a socket
//! (with an `Origin` when asked), reads the challenge, sends `connect`, and then makes requests
//! and collects events. Events that arrive while a response is awaited are kept in order, so a
//! test sees every frame exactly once. Every wait has a deadline: a missing frame fails the
//! test instead of hanging it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error, Message};

/// How long a test waits for one frame by default.
pub const WAIT: Duration = Duration::from_secs(20);

/// A connected (or connecting) client.
pub struct GatewayClient {
    socket: WebSocketStream<TcpStream>,
    next_id: u64,
    events: VecDeque<Value>,
    /// Responses that arrived while another one was awaited.
    responses: VecDeque<Value>,
}

/// How a socket ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The close code (1005 when the frame had none; 1006 when the socket just ended).
    pub code: u16,
    /// The reason.
    pub reason: String,
}

impl GatewayClient {
    /// Opens a socket to `addr` (with `Origin: origin` if given) and reads the challenge.
    pub async fn open(addr: SocketAddr, origin: Option<&str>) -> Result<(Self, Value), String> {
        let origin: Vec<(&str, &str)> = origin
            .map(|origin| ("origin", origin))
            .into_iter()
            .collect();
        Self::open_with(addr, &origin).await
    }

    /// Opens a socket to `addr` with the request headers `headers` and reads the challenge.
    pub async fn open_with(
        addr: SocketAddr,
        headers: &[(&str, &str)],
    ) -> Result<(Self, Value), String> {
        let mut request = format!("ws://{addr}/ws")
            .into_client_request()
            .map_err(|error| error.to_string())?;
        for (name, value) in headers {
            let name: tokio_tungstenite::tungstenite::http::HeaderName = name
                .parse()
                .map_err(|_| format!("a bad header name {name}"))?;
            request.headers_mut().insert(
                name,
                value
                    .parse()
                    .map_err(|_| format!("a bad header value {value}"))?,
            );
        }
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|error| error.to_string())?;
        let _ = stream.set_nodelay(true);
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let (socket, _) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(config))
                .await
                .map_err(|error| match error {
                    Error::Http(response) => format!("HTTP {}", response.status().as_u16()),
                    other => other.to_string(),
                })?;
        let mut client = GatewayClient {
            socket,
            next_id: 1,
            events: VecDeque::new(),
            responses: VecDeque::new(),
        };
        let challenge = client
            .read_frame(WAIT)
            .await
            .map_err(|closed| format!("closed before the challenge: {closed:?}"))?;
        Ok((client, challenge))
    }

    /// Opens a socket and completes the handshake with `token`; panics unless `hello-ok`.
    pub async fn connect(addr: SocketAddr, token: &str) -> (Self, Value) {
        Self::try_connect(addr, token)
            .await
            .unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`GatewayClient::connect`], or why it could not (the gateway gone, or it refused)
    /// instead of panicking: for a test whose gateway may die.
    pub async fn try_connect(addr: SocketAddr, token: &str) -> Result<(Self, Value), String> {
        let (mut client, challenge) = Self::open(addr, None).await?;
        if challenge["event"] != "connect.challenge" {
            return Err(format!("no challenge first: {challenge}"));
        }
        let id = client
            .try_send_request("connect", connect_params(token))
            .await?;
        let hello = client.try_response(&id).await?;
        if hello["ok"] == true && hello["payload"]["type"] == "hello-ok" {
            Ok((client, hello))
        } else {
            Err(format!("the gateway refused the connection: {hello}"))
        }
    }

    /// Sends `text` as one text frame.
    pub async fn send_text(&mut self, text: impl Into<String>) {
        self.socket
            .send(Message::text(text.into()))
            .await
            .expect("the frame is sent");
    }

    /// Sends `text` as one text frame, reporting a failure (the gateway may close the socket
    /// while a large frame is still being written).
    pub async fn try_send_text(&mut self, text: impl Into<String>) -> Result<(), String> {
        self.socket
            .send(Message::text(text.into()))
            .await
            .map_err(|error| error.to_string())
    }

    /// The next response frame, whatever its id.
    pub async fn next_response(&mut self) -> Value {
        if let Some(response) = self.responses.pop_front() {
            return response;
        }
        loop {
            match self.read_frame(WAIT).await {
                Ok(frame) if frame["type"] == "res" => return frame,
                Ok(frame) => self.events.push_back(frame),
                Err(closed) => panic!("the socket closed while waiting for a response: {closed:?}"),
            }
        }
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        self.socket
            .send(Message::binary(bytes))
            .await
            .expect("the frame is sent");
    }

    /// Sends a request and returns its id.
    pub async fn send_request(&mut self, method: &str, params: Value) -> String {
        let id = format!("r{}", self.next_id);
        self.next_id += 1;
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.send_text(frame.to_string()).await;
        id
    }

    /// Sends a request and waits for its (first) response frame.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params).await;
        self.response(&id).await
    }

    /// Waits for the next response to request `id`.
    pub async fn response(&mut self, id: &str) -> Value {
        self.try_response(id)
            .await
            .unwrap_or_else(|closed| panic!("{closed}"))
    }

    /// [`GatewayClient::response`], or why none can come (the socket closed, or nothing came
    /// for a long while) instead of panicking: for a test whose gateway may die.
    pub async fn try_response(&mut self, id: &str) -> Result<Value, String> {
        if let Some(position) = self.responses.iter().position(|r| r["id"] == id) {
            return Ok(self.responses.remove(position).unwrap_or_default());
        }
        loop {
            match self.read_frame(WAIT).await {
                Ok(frame) if frame["type"] == "res" && frame["id"] == id => return Ok(frame),
                Ok(frame) if frame["type"] == "res" => self.responses.push_back(frame),
                Ok(frame) => self.events.push_back(frame),
                Err(closed) => {
                    return Err(format!(
                        "the socket closed while waiting for {id}: {closed:?}"
                    ));
                }
            }
        }
    }

    /// [`GatewayClient::send_request`], or why the frame could not be sent.
    pub async fn try_send_request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<String, String> {
        let id = format!("r{}", self.next_id);
        self.next_id += 1;
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .map_err(|error| format!("the request {id} could not be sent: {error}"))?;
        Ok(id)
    }

    /// The next event frame (buffered first), or `None` after `wait`.
    pub async fn next_event(&mut self, wait: Duration) -> Option<Value> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.read_frame(left).await {
                Ok(frame) if frame["type"] == "event" => return Some(frame),
                Ok(frame) => self.responses.push_back(frame),
                Err(_) => return None,
            }
        }
    }

    /// The payload of the next event named `name`, skipping others; panics after 60 s.
    pub async fn event_named(&mut self, name: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(event) = self.next_event(left).await else {
                panic!("no {name} event within 60 s");
            };
            if event["event"] == name {
                return event["payload"].clone();
            }
        }
    }

    /// The `agent` events' payloads until one satisfies `done` (included), ignoring `tick`s;
    /// panics after `wait`.
    pub async fn agent_events_until(
        &mut self,
        wait: Duration,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(event) = self.next_event(left).await else {
                panic!("no matching agent event within {wait:?}; saw {seen:#?}");
            };
            if event["event"] != "agent" {
                continue;
            }
            let payload = event["payload"].clone();
            let finished = done(&payload);
            seen.push(payload);
            if finished {
                return seen;
            }
        }
    }

    /// Every frame until the socket closes, and how it closed.
    pub async fn until_closed(&mut self) -> (Vec<Value>, Closed) {
        let mut frames = Vec::new();
        loop {
            match self.read_frame(WAIT).await {
                Ok(frame) => frames.push(frame),
                Err(closed) => return (frames, closed),
            }
        }
    }

    /// Closes the socket.
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }

    async fn read_frame(&mut self, wait: Duration) -> Result<Value, Closed> {
        loop {
            let next = tokio::time::timeout(wait, self.socket.next()).await;
            let message = match next {
                Err(_) => {
                    return Err(Closed {
                        code: 0,
                        reason: format!("no frame within {wait:?}"),
                    });
                }
                Ok(None) => {
                    return Err(Closed {
                        code: 1006,
                        reason: "the socket ended".into(),
                    });
                }
                Ok(Some(Err(error))) => {
                    return Err(Closed {
                        code: 1006,
                        reason: error.to_string(),
                    });
                }
                Ok(Some(Ok(message))) => message,
            };
            match message {
                Message::Text(text) => {
                    return Ok(serde_json::from_str(text.as_str()).expect("the gateway sends JSON"));
                }
                Message::Close(frame) => {
                    return Err(frame.map_or(
                        Closed {
                            code: 1005,
                            reason: String::new(),
                        },
                        |frame| Closed {
                            code: frame.code.into(),
                            reason: frame.reason.to_string(),
                        },
                    ));
                }
                _ => continue,
            }
        }
    }
}

/// The `connect` parameters with `token`.
pub fn connect_params(token: &str) -> Value {
    json!({
        "minProtocol": 1,
        "maxProtocol": 1,
        "client": {"id": "test", "version": "1", "mode": "test"},
        "auth": {"token": token},
    })
}
