//! The HTTP side: a hyper HTTP/1.1 accept loop that serves the web chat (`/`, `/app.js`,
//! `/style.css`, the vendored Markdown renderer and sanitiser, the icon; all embedded in the
//! binary), `/healthz`, the webhooks (`POST /hooks/<name>`,
//! authenticated by their signatures), and upgrades `GET /ws` to a WebSocket after checking the
//! `Host` and `Origin` headers. The upgraded connection is handed to
//! [`connection::serve`](crate::connection::serve). Every connection is counted and timed as
//! unauthenticated ([`crate::limits`]) until that WebSocket's `connect` proves the token. While
//! the host is a standby of a cluster the same front serves, the WebSocket and the webhooks
//! going to the active host through [`crate::relay`] ([`Front`]).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use crate::limits::{Admissions, PendingSlot};
use crate::relay::Standby;
use crate::{Gateway, Settings};

/// The WebSocket path.
pub const WS_PATH: &str = "/ws";

/// Where webhooks are received: `POST /hooks/<name>`.
pub const HOOKS_PREFIX: &str = "/hooks/";

const INDEX_HTML: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const STYLE_CSS: &str = include_str!("web/style.css");
/// markdown-it and DOMPurify, unmodified (see `web/THIRD-PARTY.md`).
const MARKDOWN_JS: &str = include_str!("web/markdown-it.min.js");
const PURIFY_JS: &str = include_str!("web/purify.min.js");
const FAVICON_SVG: &str = include_str!("web/favicon.svg");

pub(crate) type Response = http::Response<Full<Bytes>>;

/// What serves a listener: the gateway itself, or, while this host waits as a standby in a
/// cluster, the relay to the active gateway ([`crate::relay`]).
#[derive(Clone)]
pub(crate) enum Front {
    /// This host serves the sessions.
    Active(Arc<Gateway>),
    /// This host is a standby: it relays its clients to the active host.
    Standby(Arc<Standby>),
}

impl Front {
    fn settings(&self) -> &Settings {
        match self {
            Front::Active(gateway) => &gateway.settings,
            Front::Standby(standby) => standby.settings(),
        }
    }

    fn admissions(&self) -> &Arc<Admissions> {
        match self {
            Front::Active(gateway) => &gateway.admissions,
            Front::Standby(standby) => standby.admissions(),
        }
    }
}

/// Accepts connections on `listener` until `stop` is cancelled, then gives the listener back.
/// Each one is admitted as unauthenticated ([`Admissions::admit`], which may evict the oldest
/// such connection) and served by [`serve_http`].
pub(crate) async fn accept_loop(
    front: Front,
    listener: TcpListener,
    stop: CancellationToken,
) -> TcpListener {
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like (the caps leave room for the gateway's own
                    // files, but other things may take them): wait a little rather than spin,
                    // and say so once a minute.
                    if warned.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(60)) {
                        tracing::warn!(%error, "cannot accept a connection (logged once a minute)");
                        warned = Some(tokio::time::Instant::now());
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return listener,
        };
        let _ = stream.set_nodelay(true);
        let slot = front.admissions().admit(peer);
        tokio::spawn(serve_http(front.clone(), stream, slot));
    }
}

/// Serves one connection's HTTP requests until it ends, upgrades, is evicted (closed at once),
/// or has lived [`Limits::unauthenticated_lifetime`](crate::limits::Limits) (then shut down
/// gracefully: the request in flight is answered within one more timeout). hyper closes it when
/// a request's headers take longer than the timeout, counted from the connection's start or
/// from the previous response: a silent client, one that sends a byte now and then, and an
/// idle keep-alive connection alike; a webhook's body must arrive within it too. An upgrade to
/// a WebSocket takes the slot along.
async fn serve_http(front: Front, stream: TcpStream, slot: PendingSlot) {
    let timeout = front.settings().limits.unauthenticated_timeout;
    let lifetime_ends = slot.admitted() + front.settings().limits.unauthenticated_lifetime();
    let evicted = slot.evicted();
    let peer = slot.peer();
    let slot = Arc::new(Mutex::new(Some(slot)));
    let service = hyper::service::service_fn(move |request| {
        let front = front.clone();
        let slot = slot.clone();
        async move {
            // Webhooks are authenticated by their signature, not by Host or Origin. Their
            // body must arrive within the timeout too (the answer follows at once: the reply
            // is delivered later, by a POST of the gateway's own).
            if let Some(name) = request.uri().path().strip_prefix(HOOKS_PREFIX) {
                let name = name.to_string();
                let answered = tokio::time::timeout(timeout, async {
                    match front {
                        Front::Active(gateway) => hook(gateway, &name, request).await,
                        Front::Standby(standby) => standby.forward_hook(&name, request).await,
                    }
                })
                .await;
                return Ok::<_, Infallible>(answered.unwrap_or_else(|_| {
                    plain(
                        http::StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "the request body did not arrive within {} s; send it at once\n",
                            timeout.as_secs()
                        ),
                    )
                }));
            }
            Ok::<_, Infallible>(route(front, request, &slot))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(64 << 10)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = evicted.cancelled() => return,
        () = tokio::time::sleep_until(lifetime_ends) => {
            tracing::debug!(%peer, "an unauthenticated connection lived its time: shutting it down");
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                served = tokio::time::timeout(timeout, connection.as_mut()) => match served {
                    Ok(served) => served,
                    Err(_) => return,
                },
                () = evicted.cancelled() => return,
            }
        }
    };
    if let Err(error) = served {
        tracing::debug!(%peer, "HTTP connection ended: {error}");
    }
}

pub(crate) fn plain(status: http::StatusCode, text: impl Into<String>) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(text.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    headers.insert(
        "content-security-policy",
        http::HeaderValue::from_static(
            "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    headers.insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "referrer-policy",
        http::HeaderValue::from_static("no-referrer"),
    );
    response
}

pub(crate) fn header(request: &http::Request<Incoming>, name: http::HeaderName) -> Option<&str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

fn route(
    front: Front,
    mut request: http::Request<Incoming>,
    slot: &Mutex<Option<PendingSlot>>,
) -> Response {
    let path = request.uri().path();
    if path == WS_PATH {
        return upgrade(front, &mut request, slot);
    }
    if request.method() != http::Method::GET && request.method() != http::Method::HEAD {
        return plain(
            http::StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served here\n",
        );
    }
    if let Err(why) = crate::auth::check_request(
        header(&request, http::header::HOST),
        None,
        front.settings().loopback,
        &front.settings().allowed_origins,
    ) {
        return plain(http::StatusCode::FORBIDDEN, format!("{why}\n"));
    }
    match path {
        "/" | "/index.html" => asset("text/html; charset=utf-8", INDEX_HTML),
        "/app.js" => asset("text/javascript; charset=utf-8", APP_JS),
        "/style.css" => asset("text/css; charset=utf-8", STYLE_CSS),
        "/markdown-it.min.js" => asset("text/javascript; charset=utf-8", MARKDOWN_JS),
        "/purify.min.js" => asset("text/javascript; charset=utf-8", PURIFY_JS),
        // Browsers ask for /favicon.ico on their own; an SVG answers both.
        "/favicon.svg" | "/favicon.ico" => asset("image/svg+xml", FAVICON_SVG),
        "/healthz" => match &front {
            Front::Active(_) => plain(http::StatusCode::OK, "ok\n"),
            Front::Standby(standby) => standby.health(),
        },
        _ => plain(
            http::StatusCode::NOT_FOUND,
            "not found: the web chat is at /, the WebSocket at /ws\n",
        ),
    }
}

/// `POST /hooks/<name>`: handed to the configured webhooks.
async fn hook(gateway: Arc<Gateway>, name: &str, request: http::Request<Incoming>) -> Response {
    match gateway
        .channels
        .get()
        .and_then(|channels| channels.webhooks().cloned())
    {
        Some(hooks) => hooks.receive(name, request).await,
        None => plain(
            http::StatusCode::NOT_FOUND,
            "no webhooks are configured: the operator adds [channels.webhooks.<name>]\n",
        ),
    }
}

/// How a WebSocket is framed: frames and messages of at most `max_frame_bytes`, written at once.
pub(crate) fn websocket_config(max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 << 10)
        .write_buffer_size(0)
        .max_write_buffer_size(max_frame_bytes.max(1 << 20) * 4)
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

fn upgrade(
    front: Front,
    request: &mut http::Request<Incoming>,
    slot: &Mutex<Option<PendingSlot>>,
) -> Response {
    let upgrade_requested = header(request, http::header::UPGRADE)
        .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
    let version_ok = header(request, http::header::SEC_WEBSOCKET_VERSION) == Some("13");
    let key = header(request, http::header::SEC_WEBSOCKET_KEY).map(str::to_string);
    let (Some(key), true, true, true) = (
        key,
        upgrade_requested,
        version_ok,
        request.method() == http::Method::GET,
    ) else {
        return plain(
            http::StatusCode::BAD_REQUEST,
            "this is the WebSocket endpoint: connect with a WebSocket client (GET, Upgrade: websocket, Sec-WebSocket-Version: 13)\n",
        );
    };
    if let Err(why) = crate::auth::check_request(
        header(request, http::header::HOST),
        header(request, http::header::ORIGIN),
        front.settings().loopback,
        &front.settings().allowed_origins,
    ) {
        tracing::info!("refused a WebSocket upgrade: {why}");
        return plain(http::StatusCode::FORBIDDEN, format!("{why}\n"));
    }
    if let Front::Standby(standby) = &front
        && let Some(refused) = standby.refuse_relayed(request)
    {
        return refused;
    }
    // The WebSocket keeps the connection's place among the unauthenticated ones until its
    // `connect` proves the token.
    let Some(slot) = slot
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
    else {
        return plain(
            http::StatusCode::BAD_REQUEST,
            "this connection has already been upgraded\n",
        );
    };
    let forwarded = request
        .headers()
        .contains_key(crate::relay::RELAYED_BY_HEADER);
    let on_upgrade = hyper::upgrade::on(request);
    let config = websocket_config(front.settings().max_frame_bytes);
    tokio::spawn(async move {
        let evicted = slot.evicted();
        let upgraded = tokio::select! {
            upgraded = on_upgrade => upgraded,
            () = evicted.cancelled() => return,
        };
        match upgraded {
            Ok(upgraded) => {
                let socket = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                match front {
                    Front::Active(gateway) => {
                        crate::connection::serve(gateway, socket, slot, forwarded).await
                    }
                    Front::Standby(standby) => crate::relay::serve(standby, socket, slot).await,
                }
            }
            Err(error) => tracing::debug!("the WebSocket upgrade failed: {error}"),
        }
    });
    let mut response = http::Response::new(Full::new(Bytes::new()));
    *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(accept) = http::HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(http::header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}
