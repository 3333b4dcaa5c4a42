//! A standby's front in a cluster: while a host waits as a standby it listens all the same, so
//! that a client may connect to any host of the cluster. It serves the web chat's page itself,
//! answers `/healthz` with 503 naming the active host (a load balancer that checks it sends new
//! clients to the active host directly), and holds every connection to the same checks and
//! limits as the active gateway: `Host` and `Origin`, the unauthenticated connections' caps and
//! timeouts, the `connect` and its token. Only then does it open a connection of its own to the
//! active gateway (the holder of the `gateway` lease, at the address it announced), hand it the
//! client's `connect`, and relay the two connections frame by frame, unchanged, in both
//! directions: the active gateway does everything the client asks, so `chat.send`,
//! `sessions.subscribe`, `agent.wait`, approvals and the rest answer the same through any
//! host. A webhook is forwarded whole to the active host, which checks its signature. When the
//! active host goes away the relayed connection is carried over, not closed: the requests it
//! had in flight are answered `UNAVAILABLE` (they may or may not have been done), those the
//! client sends meanwhile are held, and once another host serves (this one, if it took over)
//! the relay connects to it with the client's `connect`, follows each session the client
//! followed again from the last event it passed on ([`carry`] keeps track, [`carry_over`]
//! waits for the next host), and sends the held requests on:
//! the client sees its events go on, none missed and none twice, and its turn resume and end.
//! If no host serves within [`CARRY_OVER_PATIENCE`], the connection is closed with 1012 and
//! the client connects again. A connection that another standby relays here is refused, so two standbys with
//! stale views of the cluster cannot relay a client round in a loop. The relay keeps little in
//! flight (a small receive buffer towards the active gateway), so a relayed client that does not
//! read is cut off by the active gateway's own send queue, as a direct client is.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

use crate::Settings;
use crate::channels::webhook::MAX_BODY_BYTES;
use crate::connection::{
    Connected, WRITE_TIMEOUT, capacity_reason, close, close_oversized, handshake, refuse,
};
use crate::http::{Response, WS_PATH, plain};
use crate::limits::{Admissions, PendingSlot};
use crate::protocol::{Code, GatewayError};

mod carry;
mod carry_over;
use carry::{Carried, FromGateway};
use carry_over::{answer_unanswered, carry_over};

/// The header a standby puts on what it relays, naming itself.
pub const RELAYED_BY_HEADER: &str = "x-clawcage-relayed-by";

/// How long reaching the active gateway and its handshake may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// The receive buffer of a relay's connection to the active gateway.
const UPSTREAM_RECEIVE_BUFFER: u32 = 128 << 10;

/// How long a relayed connection whose active gateway went away waits for another host to
/// serve (the lease's time to live and the next host's start) before it is closed.
pub const CARRY_OVER_PATIENCE: Duration = Duration::from_secs(60);

/// The largest answer of the active host to a forwarded webhook passed on.
const MAX_HOOK_ANSWER_BYTES: usize = 64 << 10;

/// The active gateway as this standby last saw the cluster: its host and where it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveGateway {
    /// Its `host_id`.
    pub host: String,
    /// The URL it announced (`http://host:port/`), once it did.
    pub url: Option<String>,
}

/// Where to reach the active gateway (or the host serving a session).
pub(crate) struct Target {
    pub(crate) host: String,
    /// `host:port`.
    pub(crate) authority: String,
}

/// A standby's front: the settings and limits it serves its clients under, and the active
/// gateway it relays them to.
pub(crate) struct Standby {
    settings: Settings,
    admissions: Arc<Admissions>,
    active: watch::Receiver<Option<ActiveGateway>>,
    /// This host's id, named on what it relays.
    me: String,
    /// Forwards webhooks; `None` when it could not be made (a webhook is then refused).
    forwarder: Option<reqwest::Client>,
    /// How long a relayed connection waits for the next active gateway.
    carry_over_patience: Duration,
}

impl Standby {
    /// A front under `settings` for the host `me`, relaying to the active gateway `active` says.
    pub(crate) fn new(
        settings: Settings,
        active: watch::Receiver<Option<ActiveGateway>>,
        me: String,
    ) -> Arc<Self> {
        let forwarder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(UPSTREAM_TIMEOUT)
            .timeout(UPSTREAM_TIMEOUT)
            .build()
            .inspect_err(|error| tracing::warn!("cannot make the webhook forwarder: {error}"))
            .ok();
        Arc::new(Self {
            admissions: Admissions::new(settings.limits.clone(), settings.loopback),
            settings,
            active,
            me,
            forwarder,
            carry_over_patience: CARRY_OVER_PATIENCE,
        })
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn admissions(&self) -> &Arc<Admissions> {
        &self.admissions
    }

    /// `/healthz` on a standby: 503, naming the active host.
    pub(crate) fn health(&self) -> Response {
        let active = match self.active.borrow().as_ref() {
            Some(active) => format!("the active gateway is {}", active.host),
            None => "no host of the cluster is active right now".to_string(),
        };
        plain(
            http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "standby ({}): {active}; clients connecting here are relayed to it\n",
                self.me
            ),
        )
    }

    /// Refuses what another standby relays (`None`: it comes from a client).
    pub(crate) fn refuse_relayed(&self, request: &http::Request<Incoming>) -> Option<Response> {
        let by = request.headers().get(RELAYED_BY_HEADER)?;
        let by: String = String::from_utf8_lossy(by.as_bytes())
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        Some(plain(
            http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "this host ({}) is a standby too, not the active gateway {by} took it for: connect again in a few seconds\n",
                self.me
            ),
        ))
    }

    /// Where the active gateway is, or why it cannot be reached now.
    fn target(&self) -> Result<Target, String> {
        let Some(active) = self.active.borrow().clone() else {
            return Err("no host of the cluster is active right now (a standby takes over within the lease's time to live): connect again in a few seconds".to_string());
        };
        let Some(url) = active.url else {
            return Err(format!(
                "the active gateway {} has not said where it listens yet: connect again in a moment",
                active.host
            ));
        };
        let authority = url
            .strip_prefix("http://")
            .map(|rest| rest.split('/').next().unwrap_or_default().to_string())
            .filter(|authority| !authority.is_empty())
            .ok_or_else(|| {
                format!(
                    "the active gateway {} announced {url}, which is not an http:// address: set its [cluster] advertise_url",
                    active.host
                )
            })?;
        let unspecified = authority
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|address| address.ip().is_unspecified());
        if unspecified {
            return Err(format!(
                "the active gateway {} listens on {authority}, an address other hosts cannot reach: set its [cluster] advertise_url to the address they reach it at",
                active.host
            ));
        }
        Ok(Target {
            host: active.host,
            authority,
        })
    }

    /// `POST /hooks/<name>` on a standby: forwarded whole to the active gateway, whose answer
    /// is passed on.
    pub(crate) async fn forward_hook(
        &self,
        name: &str,
        request: http::Request<Incoming>,
    ) -> Response {
        let unavailable =
            |why: String| plain(http::StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
        if let Some(refused) = self.refuse_relayed(&request) {
            return refused;
        }
        let target = match self.target() {
            Ok(target) => target,
            Err(why) => return unavailable(why),
        };
        let Some(forwarder) = &self.forwarder else {
            return unavailable("this standby cannot forward webhooks: see its log".to_string());
        };
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                return plain(
                    http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is over {MAX_BODY_BYTES} bytes, or did not arrive whole\n"),
                );
            }
        };
        let mut forwarded = forwarder
            .post(format!("http://{}/hooks/{name}", target.authority))
            .header(RELAYED_BY_HEADER, self.me.as_str())
            .body(body);
        for (header, value) in &parts.headers {
            let hop = matches!(
                header.as_str(),
                "host"
                    | "connection"
                    | "content-length"
                    | "transfer-encoding"
                    | "keep-alive"
                    | "upgrade"
                    | "te"
                    | "trailer"
            );
            if !hop && header.as_str() != RELAYED_BY_HEADER {
                forwarded = forwarded.header(header.as_str(), value.as_bytes());
            }
        }
        let answer = match forwarded.send().await {
            Ok(answer) => answer,
            Err(error) => {
                return unavailable(format!(
                    "the active gateway {} at {} cannot be reached ({error}); send it again in a few seconds",
                    target.host, target.authority
                ));
            }
        };
        let status = answer.status();
        let content_type = answer.headers().get(http::header::CONTENT_TYPE).cloned();
        let mut body = Vec::new();
        let mut answer = answer;
        while let Ok(Some(chunk)) = answer.chunk().await {
            let room = MAX_HOOK_ANSWER_BYTES.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= MAX_HOOK_ANSWER_BYTES {
                break;
            }
        }
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, content_type);
        }
        response
    }
}

/// Serves `listener` as a standby of a cluster until `stop` is cancelled, then gives it back:
/// every client is held to `settings` and relayed to the active gateway `active` names, `me`
/// naming this host on what it relays.
pub async fn relay_clients(
    listener: tokio::net::TcpListener,
    settings: Settings,
    active: watch::Receiver<Option<ActiveGateway>>,
    me: String,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::net::TcpListener {
    let standby = Standby::new(settings, active, me);
    crate::http::accept_loop(crate::http::Front::Standby(standby), listener, stop).await
}

/// Serves one upgraded connection of a standby, unauthenticated in `slot`: the handshake as
/// the active gateway would hold it, then the relay to the active gateway until either side
/// ends.
pub(crate) async fn serve<S>(
    standby: Arc<Standby>,
    mut socket: WebSocketStream<S>,
    slot: PendingSlot,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(Connected {
        request,
        frame,
        client,
        admitted: _admitted,
    }) = handshake(&standby.settings, &mut socket, slot).await
    else {
        return;
    };
    let target = match standby.target() {
        Ok(target) => target,
        Err(why) => {
            refuse(
                &mut socket,
                &request.id,
                GatewayError::new(Code::Unavailable, why),
            )
            .await;
            return;
        }
    };
    let connect = frame.clone();
    let (mut upstream, answer) = match open_upstream(&standby.me, &target, frame).await {
        Ok(opened) => opened,
        Err(why) => {
            let error = GatewayError::new(
                Code::Unavailable,
                format!(
                    "the active gateway {} at {} cannot be reached ({why}); connect again in a few seconds",
                    target.host, target.authority
                ),
            );
            refuse(&mut socket, &request.id, error).await;
            return;
        }
    };
    let accepted = serde_json::from_str::<serde_json::Value>(answer.as_str())
        .is_ok_and(|answer| answer["ok"] == true);
    if tokio::time::timeout(WRITE_TIMEOUT, socket.send(Message::Text(answer)))
        .await
        .is_err()
        || !accepted
    {
        // The active gateway refused the client (and closes its side): so does this one.
        close(
            &mut socket,
            CloseCode::Policy,
            "refused by the active gateway",
        )
        .await;
        return;
    }
    tracing::info!(client = %client.id, mode = %client.mode, active = %target.host, "client relayed to the active gateway");
    let max_frame = standby.settings.max_frame_bytes;
    let mut carried = Carried::default();
    loop {
        let ended = pipe(&mut socket, &mut upstream, max_frame, &mut carried).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), upstream.close(None)).await;
        let ended = match ended {
            Ended::Upstream(CloseCode::Restart | CloseCode::Away, reason) => {
                tracing::info!(client = %client.id, "the active gateway went away ({reason}): carrying the relayed client over");
                if !answer_unanswered(&mut socket, &mut carried).await {
                    Ended::Client
                } else {
                    match carry_over(&standby, &connect, &mut socket, &mut carried, max_frame).await
                    {
                        Ok((next, host)) => {
                            tracing::info!(client = %client.id, active = %host, "relayed client carried over to the next active gateway");
                            upstream = next;
                            continue;
                        }
                        Err(ended) => ended,
                    }
                }
            }
            other => other,
        };
        match ended {
            Ended::Client => {}
            Ended::Oversized(reason) => close_oversized(&mut socket, &reason).await,
            Ended::Upstream(code, reason) => close(&mut socket, code, &reason).await,
        }
        break;
    }
    tracing::info!(client = %client.id, "relayed client disconnected");
}

/// Connects to the active gateway as the client: its challenge is read, the client's `connect`
/// frame sent, and its answer returned.
pub(crate) async fn open_upstream(
    me: &str,
    target: &Target,
    connect: Utf8Bytes,
) -> Result<(WebSocketStream<TcpStream>, Utf8Bytes), String> {
    let steps = async {
        let stream = connect_buffering_little(&target.authority).await?;
        let mut request = format!("ws://{}{WS_PATH}", target.authority)
            .into_client_request()
            .map_err(|error| error.to_string())?;
        let me = http::HeaderValue::from_str(me).map_err(|error| error.to_string())?;
        request.headers_mut().insert(RELAYED_BY_HEADER, me);
        // What the active gateway sends may be larger than what a client may send.
        let config = WebSocketConfig::default().write_buffer_size(0);
        let (mut upstream, _) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(config))
                .await
                .map_err(|error| format!("its WebSocket handshake failed: {error}"))?;
        match upstream.next().await {
            Some(Ok(Message::Text(challenge))) if challenge.contains("connect.challenge") => {}
            other => return Err(format!("it did not send its challenge (got {other:?})")),
        }
        upstream
            .send(Message::Text(connect))
            .await
            .map_err(|error| error.to_string())?;
        match upstream.next().await {
            Some(Ok(Message::Text(answer))) => Ok((upstream, answer)),
            other => Err(format!("it did not answer the connect (got {other:?})")),
        }
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, steps)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", UPSTREAM_TIMEOUT.as_secs())))
}

/// A TCP connection to `authority` whose receive buffer stays small (the kernel would grow a
/// loopback one to 32 MB): what the active gateway sends waits on its side, in its connection's
/// queue, while the client does not read, so the active gateway cuts a slow relayed client off
/// as it would a direct one, and the relay holds little of what it passes on.
async fn connect_buffering_little(authority: &str) -> Result<TcpStream, String> {
    let mut last_error = format!("{authority} names no address");
    for address in tokio::net::lookup_host(authority)
        .await
        .map_err(|error| format!("cannot resolve {authority}: {error}"))?
    {
        let socket = match address {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .map_err(|error| error.to_string())?;
        socket
            .set_recv_buffer_size(UPSTREAM_RECEIVE_BUFFER)
            .map_err(|error| error.to_string())?;
        match socket.connect(address).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(error) => last_error = format!("{address}: {error}"),
        }
    }
    Err(last_error)
}

/// How a relay ended.
enum Ended {
    /// The client went away (or its socket failed).
    Client,
    /// The client sent a frame over the limit.
    Oversized(String),
    /// The active gateway closed (with its code and reason) or went away.
    Upstream(CloseCode, String),
}

/// Relays frames between the client and the active gateway until one of them ends. A client
/// that does not read stops this relay's reading of the active gateway, whose own send queue
/// then cuts the relayed connection off, as it would a direct client.
async fn pipe<S>(
    socket: &mut WebSocketStream<S>,
    upstream: &mut WebSocketStream<TcpStream>,
    max_frame: usize,
    carried: &mut Carried,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let gone = || {
        Ended::Upstream(
            CloseCode::Restart,
            "the active gateway went away: connect again (another host takes over)".to_string(),
        )
    };
    loop {
        tokio::select! {
            message = socket.next() => match message {
                Some(Ok(message @ (Message::Text(_) | Message::Binary(_)))) => {
                    if let Message::Text(text) = &message {
                        carried.sent(text.as_str());
                    }
                    let sent = tokio::time::timeout(WRITE_TIMEOUT, upstream.send(message)).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        return gone();
                    }
                }
                Some(Ok(Message::Close(_))) | None => return Ended::Client,
                Some(Ok(_)) => {}
                Some(Err(WsError::Capacity(error))) => {
                    return Ended::Oversized(capacity_reason(&error, max_frame));
                }
                Some(Err(_)) => return Ended::Client,
            },
            message = upstream.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    match carried.received(text.as_str()) {
                        FromGateway::Pass => {}
                        FromGateway::Keep => continue,
                        FromGateway::Send(frame) => {
                            let sent = tokio::time::timeout(WRITE_TIMEOUT, upstream.send(Message::Text(frame))).await;
                            if !matches!(sent, Ok(Ok(()))) {
                                return gone();
                            }
                            continue;
                        }
                    }
                    match tokio::time::timeout(WRITE_TIMEOUT, socket.send(Message::Text(text))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return Ended::Client,
                        Err(_) => {
                            return Ended::Upstream(
                                CloseCode::Again,
                                "the client did not read for 10 s".to_string(),
                            );
                        }
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame
                        .map(|CloseFrame { code, reason }| (code, reason.to_string()))
                        .unwrap_or((CloseCode::Restart, "the active gateway closed the connection".to_string()));
                    return Ended::Upstream(code, reason);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return gone(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
