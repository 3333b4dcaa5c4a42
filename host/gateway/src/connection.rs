//! One WebSocket connection. The gateway speaks first (`connect.challenge` with a nonce); the
//! client's first frame must be a `connect` request with a protocol range that includes ours
//! and the token, within the unauthenticated timeout, or the socket is closed with a reason;
//! until then the connection holds its place among the unauthenticated ones and is closed at
//! once when it is evicted from there ([`crate::limits`]). The token moves it to the
//! authenticated ones, where no timeout of the handshake applies any more. After
//! `hello-ok`, one task serves the socket: it reads requests (each handled in a task of its
//! own, at most [`MAX_REQUESTS_IN_FLIGHT`] at once) and writes what the connection's
//! [`Outbox`] holds — responses and the events of the sessions it subscribed to — in order. A
//! client that does not read is cut off when its outbox fills, a frame over the size limit closes
//! the socket with code 1009, and a write that takes longer than [`WRITE_TIMEOUT`] ends the
//! connection: nothing one client does stalls another. A standby of a cluster holds its clients
//! to the same [`handshake`] before it relays them ([`crate::relay`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

use crate::hub::Outbox;
use crate::limits::{AuthenticatedSlot, PendingSlot};
use crate::protocol::{self, Code, GatewayError, PROTOCOL_VERSION, Request};
use crate::{Gateway, Settings};

/// How long one frame may take to write before the client counts as gone.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests of one connection handled at once at most.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 64;

/// Who the client said it is.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// `client.id`.
    pub id: String,
    /// `client.version`.
    pub version: String,
    /// `client.mode` (e.g. `webchat`, `cli`).
    pub mode: String,
    /// Whether `scopes` names `operator.approvals` (or `operator.admin`): the connection hears
    /// and may answer approval requests.
    pub approver: bool,
    /// `approvalSession`: an approver that hears, lists and answers only this session's
    /// requests (and its sub-agents'), as a terminal attached to one session does. Requests of
    /// other sessions are then not held for it: where nobody else can answer, their fallback
    /// decides at once.
    pub approval_session: Option<String>,
}

/// A token bucket: `capacity` sends at once, refilled at `capacity` per minute.
#[derive(Debug)]
pub struct RateLimit {
    capacity: f64,
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// A bucket of `per_minute` sends.
    pub fn per_minute(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute.max(1));
        Self {
            capacity,
            tokens: capacity,
            at: Instant::now(),
        }
    }

    /// Takes one token; false when none is left.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.capacity / 60.0;
        self.tokens = (self.tokens + refill).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What the request handlers of one connection share.
pub struct Conn {
    /// Where responses and events go.
    pub outbox: Outbox,
    /// Who the client is.
    pub client: ClientInfo,
    /// The sessions it follows.
    pub subscriptions: Mutex<HashSet<String>>,
    /// `chat.send` and `agent` per minute.
    pub sends: Mutex<RateLimit>,
    requests: Arc<Semaphore>,
    /// Its `connect` frame as it sent it (presented again to the host serving a session it
    /// asks about, when that is another host).
    pub(crate) connect_frame: Utf8Bytes,
    /// Whether another host of the cluster forwards this connection here (it is then never
    /// forwarded again).
    pub(crate) forwarded: bool,
    /// Its requests forwarded to the hosts serving their sessions.
    pub(crate) forwarder: crate::forward::Forwarder,
}

impl Conn {
    /// The gateway's own connection, behind `outbox`, for what reaches this host other than
    /// through a client (a channel's message for a session another host serves): it presents
    /// `connect_frame` to the hosts it asks.
    pub(crate) fn internal(outbox: Outbox, connect_frame: Utf8Bytes) -> Self {
        Self {
            outbox,
            client: ClientInfo {
                id: "clawcage-gateway".to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                mode: "internal".to_string(),
                approver: false,
                approval_session: None,
            },
            subscriptions: Mutex::new(HashSet::new()),
            sends: Mutex::new(RateLimit::per_minute(u32::MAX)),
            requests: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            connect_frame,
            forwarded: false,
            forwarder: crate::forward::Forwarder::default(),
        }
    }

    /// Queues the response to `id`.
    pub fn respond(&self, id: &Value, result: Result<Value, GatewayError>) {
        let frame = match result {
            Ok(payload) => protocol::ok(id, payload),
            Err(error) => protocol::err(id, &error),
        };
        self.outbox.push(frame);
    }

    /// The subscriptions, locked.
    pub fn subscriptions(&self) -> MutexGuard<'_, HashSet<String>> {
        self.subscriptions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) async fn close<S>(socket: &mut WebSocketStream<S>, code: CloseCode, reason: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // A close reason has at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(reason[..end].to_string()),
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.close(Some(frame))).await;
}

/// Refuses the handshake: the error as a response when the request had an id, then a close.
pub(crate) async fn refuse<S>(socket: &mut WebSocketStream<S>, id: &Value, error: GatewayError)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tracing::debug!(message = %error.message, "refusing a connection");
    let _ = tokio::time::timeout(
        WRITE_TIMEOUT,
        socket.send(Message::Text(protocol::err(id, &error))),
    )
    .await;
    close(socket, CloseCode::Policy, &error.message).await;
}

pub(crate) fn capacity_reason(error: &CapacityError, max: usize) -> String {
    let size = match error {
        CapacityError::MessageTooLong { size, .. } => format!(" (this one: {size})"),
        _ => String::new(),
    };
    format!("frame too large: at most {max} bytes per message{size}")
}

/// Closes after an oversized frame: the rest of it is read and dropped first (for at most two
/// seconds), so the client receives the close frame instead of a reset.
pub(crate) async fn close_oversized<S>(socket: &mut WebSocketStream<S>, reason: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    close(socket, CloseCode::Size, reason).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut buffer = [0u8; 16 << 10];
    while let Ok(Ok(read)) =
        tokio::time::timeout_at(deadline, socket.get_mut().read(&mut buffer)).await
    {
        if read == 0 {
            break;
        }
    }
}

/// Reads the `connect` request and checks it; returns the client or why not.
fn check_connect(settings: &Settings, request: &Request) -> Result<ClientInfo, GatewayError> {
    if request.method != "connect" {
        return Err(GatewayError::new(
            Code::InvalidRequest,
            format!(
                "the first request must be `connect` (got `{}`)",
                request.method.chars().take(40).collect::<String>()
            ),
        ));
    }
    let params = &request.params;
    let number = |name: &str| params.get(name).and_then(Value::as_u64);
    let (Some(min), Some(max)) = (number("minProtocol"), number("maxProtocol")) else {
        return Err(GatewayError::params(
            "connect",
            "minProtocol and maxProtocol must be numbers",
        ));
    };
    if !(min..=max).contains(&PROTOCOL_VERSION) {
        return Err(GatewayError::new(
            Code::InvalidRequest,
            format!(
                "protocol mismatch: this gateway speaks protocol {PROTOCOL_VERSION}, the client {min} to {max}"
            ),
        ));
    }
    let token = params
        .pointer("/auth/token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if token.is_empty() {
        return Err(GatewayError::new(
            Code::Unauthorized,
            "unauthorized: connect needs auth.token (open the URL the gateway printed, or read <state-dir>/gateway/token)",
        ));
    }
    if !settings.token.matches(token) {
        return Err(GatewayError::new(
            Code::Unauthorized,
            "unauthorized: wrong token",
        ));
    }
    let text = |pointer: &str| {
        params
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(64)
            .collect::<String>()
    };
    let approval_session = match params.get("approvalSession") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) => {
            crate::check_key(key)?;
            Some(key.clone())
        }
        Some(_) => {
            return Err(GatewayError::params(
                "connect",
                "approvalSession must be a session key",
            ));
        }
    };
    Ok(ClientInfo {
        approval_session,
        id: text("/client/id"),
        version: text("/client/version"),
        mode: text("/client/mode"),
        approver: params
            .get("scopes")
            .and_then(Value::as_array)
            .is_some_and(|scopes| {
                scopes.iter().any(|scope| {
                    scope
                        .as_str()
                        .is_some_and(|scope| crate::approvals::APPROVER_SCOPES.contains(&scope))
                })
            }),
    })
}

/// A connection whose `connect` proved the token.
pub(crate) struct Connected {
    /// The `connect` request.
    pub(crate) request: Request,
    /// Its frame as the client sent it.
    pub(crate) frame: Utf8Bytes,
    /// Who the client said it is.
    pub(crate) client: ClientInfo,
    /// Its place among the authenticated connections, held while it lives.
    pub(crate) admitted: AuthenticatedSlot,
}

/// The handshake of an upgraded connection, unauthenticated in `slot`: the challenge, then the
/// client's `connect`, checked against `settings` (protocol, token) within the unauthenticated
/// timeout, and the connection's promotion to the authenticated ones. Refuses (and closes) the
/// socket and returns `None` when any of it fails.
pub(crate) async fn handshake<S>(
    settings: &Settings,
    socket: &mut WebSocketStream<S>,
    slot: PendingSlot,
) -> Option<Connected>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let max_frame = settings.max_frame_bytes;
    let timeout = settings.limits.unauthenticated_timeout;
    let evicted = slot.evicted();
    let Ok(nonce) = crate::auth::random_hex(16) else {
        close(socket, CloseCode::Error, "no randomness for the challenge").await;
        return None;
    };
    let challenge = protocol::event(
        "connect.challenge",
        json!({"nonce": nonce, "ts": clawcage_agent::transcript::now_ms()}),
        None,
    );
    // An evicted connection is dropped at once, without a close handshake: its place has been
    // given to a newer one, and its descriptor must not linger.
    let deadline = tokio::time::Instant::now() + timeout;
    let sent = tokio::select! {
        sent = tokio::time::timeout_at(deadline, socket.send(Message::Text(challenge))) => sent,
        () = evicted.cancelled() => return None,
    };
    if !matches!(sent, Ok(Ok(()))) {
        return None;
    }
    let first = tokio::select! {
        first = tokio::time::timeout_at(deadline, socket.next()) => first,
        () = evicted.cancelled() => return None,
    };
    let text = match first {
        Err(_) => {
            close(
                socket,
                CloseCode::Policy,
                &format!(
                    "handshake timeout: send connect within {} s",
                    timeout.as_secs()
                ),
            )
            .await;
            return None;
        }
        Ok(None) | Ok(Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed))) => {
            return None;
        }
        Ok(Some(Err(WsError::Capacity(error)))) => {
            close_oversized(socket, &capacity_reason(&error, max_frame)).await;
            return None;
        }
        Ok(Some(Err(_))) => return None,
        Ok(Some(Ok(Message::Text(text)))) => text,
        Ok(Some(Ok(_))) => {
            close(
                socket,
                CloseCode::Unsupported,
                "the first frame must be a JSON text frame with the connect request",
            )
            .await;
            return None;
        }
    };
    let request = match protocol::parse_request(text.as_str()) {
        Ok(request) => request,
        Err((id, error)) => {
            let error = GatewayError::new(
                error.code,
                format!(
                    "the first frame must be the connect request: {}",
                    error.message
                ),
            );
            refuse(socket, &id, error).await;
            return None;
        }
    };
    let client = match check_connect(settings, &request) {
        Ok(client) => client,
        Err(error) => {
            refuse(socket, &request.id, error).await;
            return None;
        }
    };
    // The token is proven: the connection leaves the unauthenticated ones (and their timeouts)
    // for the authenticated ones, which have a cap of their own.
    let admitted = match slot.promote() {
        Ok(admitted) => admitted,
        Err(full) => {
            if evicted.is_cancelled() {
                return None;
            }
            let error = GatewayError::new(
                Code::Unavailable,
                format!(
                    "too many connections: this gateway serves {} authenticated connections at once (--max-connections less --max-unauthenticated); close one and reconnect",
                    full.cap
                ),
            );
            refuse(socket, &request.id, error).await;
            return None;
        }
    };

    Some(Connected {
        request,
        frame: text,
        client,
        admitted,
    })
}

/// Serves one upgraded connection, unauthenticated in `slot`, until it ends; `forwarded`: another
/// host of the cluster forwards it here.
pub async fn serve<S>(
    gateway: Arc<Gateway>,
    mut socket: WebSocketStream<S>,
    slot: PendingSlot,
    forwarded: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max_frame = gateway.settings.max_frame_bytes;
    let Some(Connected {
        request,
        frame: connect_frame,
        client,
        admitted: _admitted,
    }) = handshake(&gateway.settings, &mut socket, slot).await
    else {
        return;
    };

    let id = gateway.hub.next_id();
    let (outbox, mut frames) = Outbox::new(id, gateway.settings.send_queue);
    let conn = Arc::new(Conn {
        outbox: outbox.clone(),
        client,
        subscriptions: Mutex::new(HashSet::new()),
        sends: Mutex::new(RateLimit::per_minute(gateway.settings.sends_per_minute)),
        requests: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
        connect_frame,
        forwarded,
        forwarder: crate::forward::Forwarder::default(),
    });
    gateway.hub.connect(outbox.clone());
    tracing::info!(connection = id, client = %conn.client.id, version = %conn.client.version, mode = %conn.client.mode, "client connected");
    conn.respond(&request.id, Ok(gateway.hello(id)));
    if conn.client.approver
        && let Some(approvals) = gateway.approvals.get()
    {
        approvals.connect(outbox.clone(), conn.client.approval_session.clone());
        // With the hosts serving partitions, it hears every host's approvals.
        if gateway.owners.get().is_some() && !conn.forwarded {
            tokio::spawn(crate::forward::link_approver(gateway.clone(), conn.clone()));
        }
    }

    let mut tick = tokio::time::interval(gateway.settings.tick_interval);
    tick.tick().await;
    let ended: Option<(CloseCode, String)> = loop {
        tokio::select! {
            () = outbox.closed() => break outbox.close_reason(),
            frame = frames.recv() => {
                let Some(frame) = frame else { break None };
                match tokio::time::timeout(WRITE_TIMEOUT, socket.send(Message::Text(frame))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break None,
                    Err(_) => break Some((CloseCode::Again, "the client did not read for 10 s".to_string())),
                }
            }
            message = socket.next() => match message {
                None => break None,
                Some(Ok(Message::Text(text))) => handle(&gateway, &conn, text),
                Some(Ok(Message::Binary(_))) => conn.respond(
                    &Value::Null,
                    Err(GatewayError::new(Code::InvalidRequest, "binary frames are not accepted: send JSON text frames")),
                ),
                Some(Ok(Message::Close(_))) => break None,
                Some(Ok(_)) => {}
                Some(Err(WsError::Capacity(error))) => {
                    break Some((CloseCode::Size, capacity_reason(&error, max_frame)));
                }
                Some(Err(_)) => break None,
            },
            _ = tick.tick() => {
                outbox.push(protocol::event("tick", json!({"ts": clawcage_agent::transcript::now_ms()}), None));
            }
        }
    };
    let subscriptions = conn.subscriptions().clone();
    gateway.hub.disconnect(id, &subscriptions);
    if let Some(approvals) = gateway.approvals.get() {
        approvals.disconnect(id);
    }
    if let Some((CloseCode::Size, reason)) = &ended {
        close_oversized(&mut socket, reason).await;
    } else if let Some((code, reason)) = ended {
        // What was queued before the close (a shutdown notice) goes out first.
        while let Ok(frame) = frames.try_recv() {
            let sent =
                tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Text(frame)))
                    .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
        }
        close(&mut socket, code, &reason).await;
    }
    tracing::info!(connection = id, "client disconnected");
}

/// Parses one request frame and hands it to its method in a task of its own.
fn handle(gateway: &Arc<Gateway>, conn: &Arc<Conn>, text: Utf8Bytes) {
    let request = match protocol::parse_request(text.as_str()) {
        Ok(request) => request,
        Err((id, error)) => {
            conn.respond(&id, Err(error));
            return;
        }
    };
    let Ok(permit) = conn.requests.clone().try_acquire_owned() else {
        conn.respond(
            &request.id,
            Err(GatewayError::new(
                Code::RateLimited,
                format!("{MAX_REQUESTS_IN_FLIGHT} requests of this connection are still running; wait for their answers"),
            )),
        );
        return;
    };
    let gateway = gateway.clone();
    let conn = conn.clone();
    tokio::spawn(async move {
        crate::methods::dispatch(&gateway, &conn, request).await;
        drop(permit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_allows_a_burst_then_refuses() {
        let mut limit = RateLimit::per_minute(3);
        assert!(limit.take() && limit.take() && limit.take());
        assert!(!limit.take());
    }
}
