//! Helpers for the web tests: a real HTTP/1.1 server (hyper) on a loopback address that records
//! what it received and answers as the test scripts it, including answers that attack the client
//! (an endless body, no answer at all, redirects, a body written in parts); a server that echoes
//! a request header back as echo services do ([`echo_server`]); a name resolver that maps test
//! names to local addresses and counts lookups; and a capture of the process's tracing output.
//!
//! The server runs on its own thread with its own runtime, so it serves synchronous tests (the
//! CLI's), async tests and benchmarks alike, and stops when dropped.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use clawcage_core::BoxFuture;
use clawcage_sandbox::network::NameResolver;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Recorded {
    /// The request of `parts` with `body`, as a test reads it back.
    pub fn of(parts: &hyper::http::request::Parts, body: Vec<u8>) -> Recorded {
        Recorded {
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map(ToString::to_string)
                .unwrap_or_default(),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_string(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body,
        }
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this content type and body.
    Ok(&'static str, Vec<u8>),
    /// Any status, headers and body.
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// A redirect with this status to this location.
    Redirect(u16, String),
    /// 200 with a body of `total` bytes of `x`, produced as the client reads (counted in
    /// [`WebServer::body_bytes_sent`]).
    Endless(u64),
    /// 200 with this content type and a chunked body written in these parts, with a pause
    /// after each, so the client reads every part separately.
    Parts(&'static str, Vec<Vec<u8>>),
    /// Read the request and never answer.
    Hang,
}

impl Reply {
    /// 200 `text/html`.
    pub fn html(body: impl Into<String>) -> Reply {
        Reply::Ok("text/html; charset=utf-8", body.into().into_bytes())
    }

    /// 200 `application/json`.
    pub fn json(body: impl Into<String>) -> Reply {
        Reply::Ok("application/json", body.into().into_bytes())
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// A scripted HTTP/1.1 server on a loopback address.
pub struct WebServer {
    server: ServerThread,
    requests: Arc<Mutex<Vec<Recorded>>>,
    sent: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
}

/// A test server's thread, serving on a loopback listener until dropped (then told to stop and
/// joined).
pub(crate) struct ServerThread {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Binds `addr` (a loopback address; port 0 picks a free one) and runs `serve` with the
    /// listener and the stop signal on a thread named `{name}-{addr}`.
    pub(crate) fn start(
        addr: SocketAddr,
        name: &str,
        serve: impl FnOnce(StdListener, oneshot::Receiver<()>) + Send + 'static,
    ) -> io::Result<ServerThread> {
        assert!(
            addr.ip().is_loopback(),
            "test servers listen on loopback only"
        );
        let listener = StdListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (shutdown, stop) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-{addr}"))
            .spawn(move || serve(listener, stop))?;
        Ok(ServerThread {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for WebServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebServer")
            .field("addr", &self.server.addr())
            .finish()
    }
}

impl WebServer {
    /// Serve on 127.0.0.1 on a free port.
    pub fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> WebServer {
        Self::start_on(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), handler)
            .unwrap_or_else(|error| panic!("cannot start the test server: {error}"))
    }

    /// Serve on `addr` (a loopback address; port 0 picks a free one).
    pub fn start_on(
        addr: SocketAddr,
        handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> io::Result<WebServer> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let handler: Handler = Arc::new(handler);
        let state = (requests.clone(), sent.clone(), connections.clone());
        let server = ServerThread::start(addr, "test-web", move |listener, stop| {
            serve(listener, handler, state, stop)
        })?;
        Ok(WebServer {
            server,
            requests,
            sent,
            connections,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// `http://127.0.0.1:PORT{path}` (or the server's address).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr())
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Body bytes of [`Reply::Endless`] answers handed to the connection so far.
    pub fn body_bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

type ServerState = (Arc<Mutex<Vec<Recorded>>>, Arc<AtomicU64>, Arc<AtomicU64>);

fn serve(
    listener: StdListener,
    handler: Handler,
    (requests, sent, connections): ServerState,
    stop: oneshot::Receiver<()>,
) {
    serve_http(
        listener,
        stop,
        move || {
            connections.fetch_add(1, Ordering::Relaxed);
        },
        move |request| {
            let handler = handler.clone();
            let requests = requests.clone();
            let sent = sent.clone();
            async move {
                match answer(request, &handler, &requests, &sent).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        },
    );
}

/// Serves HTTP/1.1 on `listener` (on a runtime of its own, in the calling thread) until `stop`:
/// `accepted` is told of each connection, `answer` answers each request.
pub(crate) fn serve_http<A, F>(
    listener: StdListener,
    mut stop: oneshot::Receiver<()>,
    accepted: impl Fn() + Send + 'static,
    answer: A,
) where
    A: Fn(hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = hyper::Response<ReplyBody>> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        loop {
            let accepted_now = tokio::select! {
                _ = &mut stop => return,
                accepted_now = listener.accept() => accepted_now,
            };
            let Ok((stream, _)) = accepted_now else {
                continue;
            };
            accepted();
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<Incoming>| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// The body of every answer of the test servers.
pub(crate) type ReplyBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    request: hyper::Request<Incoming>,
    handler: &Handler,
    requests: &Mutex<Vec<Recorded>>,
    sent: &Arc<AtomicU64>,
) -> Result<hyper::Response<ReplyBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes().to_vec())
        .unwrap_or_default();
    let recorded = Recorded::of(&parts, body);
    requests
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(recorded.clone());
    let reply = handler(&recorded);
    let full = |status: u16, headers: Vec<(String, String)>, body: Vec<u8>| {
        let mut response = hyper::Response::new(Full::new(Bytes::from(body)).boxed());
        *response.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (
                hyper::header::HeaderName::from_bytes(name.as_bytes()),
                hyper::header::HeaderValue::from_str(&value),
            ) {
                response.headers_mut().append(name, value);
            }
        }
        response
    };
    Ok(match reply {
        Reply::Ok(content_type, body) => full(
            200,
            vec![("content-type".to_string(), content_type.to_string())],
            body,
        ),
        Reply::Full(status, headers, body) => full(status, headers, body),
        Reply::Redirect(status, location) => {
            full(status, vec![("location".to_string(), location)], Vec::new())
        }
        Reply::Endless(total) => {
            let mut response = hyper::Response::new(
                Endless {
                    remaining: total,
                    chunk: Bytes::from(vec![b'x'; 64 << 10]),
                    sent: sent.clone(),
                }
                .boxed(),
            );
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            response
        }
        Reply::Parts(content_type, parts) => {
            let mut response = hyper::Response::new(
                Parts {
                    parts: parts.into_iter().map(Bytes::from).collect(),
                    pause: None,
                }
                .boxed(),
            );
            if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, value);
            }
            response
        }
        Reply::Hang => std::future::pending::<hyper::Response<ReplyBody>>().await,
    })
}

/// A body of `remaining` bytes produced chunk by chunk as the connection takes them.
struct Endless {
    remaining: u64,
    chunk: Bytes,
    sent: Arc<AtomicU64>,
}

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let size = this.remaining.min(this.chunk.len() as u64);
        this.remaining -= size;
        this.sent.fetch_add(size, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(this.chunk.slice(..size as usize)))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// A body written part by part, pausing after each part so that each goes out in its own write.
struct Parts {
    parts: VecDeque<Bytes>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for Parts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(pause) = this.pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.pause = None;
        }
        match this.parts.pop_front() {
            None => Poll::Ready(None),
            Some(part) => {
                this.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(100))));
                Poll::Ready(Some(Ok(Frame::data(part))))
            }
        }
    }
}

/// A server that reflects the value of request header `header` (lower case), as echo services
/// such as httpbin do, by path:
///
/// - `/headers`: every request header as JSON, `{"headers": {"name": "value", ...}}`;
/// - `/content-type`: the value in the response's `content-type`, `text/x-VALUE`;
/// - `/redirect`: a 302 to `/landing?token=VALUE`; `/landing` answers `landed at PATH`;
/// - `/split`: `first part A` and `B second part` in two writes, where A and B are the value's
///   halves;
/// - `/pad?before=N&total=M`: `N` bytes of `x`, the value, then `x` up to `M` bytes in all.
pub fn echo_server(header: &'static str) -> WebServer {
    WebServer::start(move |request| {
        let value = request.header(header).unwrap_or("(none)").to_string();
        let (path, query) = request
            .path
            .split_once('?')
            .unwrap_or((request.path.as_str(), ""));
        let number = |key: &str| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| *name == key)
                .and_then(|(_, number)| number.parse::<usize>().ok())
                .unwrap_or(0)
        };
        match path {
            "/headers" => {
                let headers: serde_json::Map<String, serde_json::Value> = request
                    .headers
                    .iter()
                    .map(|(name, value)| (name.clone(), serde_json::Value::from(value.as_str())))
                    .collect();
                Reply::json(serde_json::json!({ "headers": headers }).to_string())
            }
            "/content-type" => Reply::Full(
                200,
                vec![("content-type".to_string(), format!("text/x-{value}"))],
                b"typed".to_vec(),
            ),
            "/redirect" => Reply::Redirect(302, format!("/landing?token={value}")),
            "/landing" => Reply::Ok(
                "text/plain",
                format!("landed at {}", request.path).into_bytes(),
            ),
            "/split" => {
                let (first, second) = value.split_at(value.len() / 2);
                Reply::Parts(
                    "text/plain",
                    vec![
                        format!("first part {first}").into_bytes(),
                        format!("{second} second part").into_bytes(),
                    ],
                )
            }
            "/pad" => {
                let before = number("before");
                let after = number("total").saturating_sub(before + value.len());
                let mut body = vec![b'x'; before];
                body.extend_from_slice(value.as_bytes());
                body.extend(std::iter::repeat_n(b'x', after));
                Reply::Ok("text/plain", body)
            }
            _ => Reply::Full(404, vec![], b"missing".to_vec()),
        }
    })
}

/// A resolver for tests: names map to scripted answers (a sequence per name, the last one
/// repeating), unknown names are "not found", and every lookup is counted.
#[derive(Debug, Default)]
pub struct TestResolver {
    answers: Mutex<HashMap<String, Vec<Vec<IpAddr>>>>,
    lookups: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
}

impl TestResolver {
    /// A resolver that knows no names.
    pub fn new() -> Arc<TestResolver> {
        Arc::new(TestResolver::default())
    }

    /// Answer `addresses` for `name`, every time.
    pub fn map(self: &Arc<Self>, name: &str, addresses: &[&str]) -> Arc<Self> {
        self.map_sequence(name, &[addresses])
    }

    /// Answer the first list on the first lookup, the second on the second, and so on; the
    /// last list repeats.
    pub fn map_sequence(self: &Arc<Self>, name: &str, answers: &[&[&str]]) -> Arc<Self> {
        let parsed = answers
            .iter()
            .map(|answer| {
                answer
                    .iter()
                    .map(|ip| {
                        ip.parse()
                            .unwrap_or_else(|_| panic!("bad test address {ip}"))
                    })
                    .collect()
            })
            .collect();
        self.answers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name.to_string(), parsed);
        self.clone()
    }

    /// How often `name` was looked up.
    pub fn lookups_of(&self, name: &str) -> usize {
        self.lookups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// How many lookups were made in all.
    pub fn total_lookups(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

impl NameResolver for TestResolver {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            self.total.fetch_add(1, Ordering::Relaxed);
            let count = {
                let mut lookups = self
                    .lookups
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let count = lookups.entry(name.to_string()).or_insert(0);
                *count += 1;
                *count
            };
            let answers = self
                .answers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match answers.get(name) {
                Some(sequence) => {
                    let index = (count - 1).min(sequence.len().saturating_sub(1));
                    Ok(sequence.get(index).cloned().unwrap_or_default())
                }
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("the test resolver does not know {name}"),
                )),
            }
        })
    }
}

/// Everything the host's own code and its HTTP stack (reqwest, hyper, wasmtime-wasi-http) write
/// to tracing, at every level, since [`capture_logs`] was first called; other crates at `info`.
/// The first call installs the global subscriber. (The WASI layer's per-call trace of every
/// stream read is left out: it would copy every body byte into the capture.)
pub fn capture_logs() -> &'static LogCapture {
    static CAPTURE: OnceLock<&'static LogCapture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture: &'static LogCapture = Box::leak(Box::new(LogCapture {
            buffer: Mutex::new(Vec::new()),
        }));
        let installed = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,clawcage=trace,reqwest=trace,hyper=trace,hyper_util=trace,wasmtime_wasi_http=trace",
            ))
            .with_ansi(false)
            .with_writer(move || CaptureWriter(capture))
            .try_init();
        assert!(
            installed.is_ok(),
            "another global tracing subscriber is already installed"
        );
        capture
    })
}

/// The captured log text.
#[derive(Debug)]
pub struct LogCapture {
    buffer: Mutex<Vec<u8>>,
}

impl LogCapture {
    /// All text captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .buffer
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
        .into_owned()
    }
}

struct CaptureWriter(&'static LogCapture);

impl Write for CaptureWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
