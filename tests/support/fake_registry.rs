//! A misbehaving OCI distribution registry for the attack tests of plugin installation: a real
//! HTTP/1.1 server (hyper) on 127.0.0.1 on a free port that speaks the distribution wire format
//! (`GET /v2/`, `GET|HEAD /v2/<name>/manifests/<reference>`, `GET|HEAD /v2/<name>/blobs/<digest>`,
//! with `Content-Type`, `Docker-Content-Digest` and OCI error bodies) over content the test puts
//! in, and can lie or attack: a blob served under a digest its bytes do not have, a manifest
//! under a digest header it does not have, a blob redirected elsewhere, a blob whose body stops
//! after some bytes while the connection stays open, and Bearer or Basic authentication
//! challenges. It records every request with its headers. [`FakeTokenServer`] is the token
//! endpoint a Bearer challenge names, recording what was sent to it (so a test sees whether
//! credentials went there). [`component_manifest`] builds a manifest in the form `wkg oci push`
//! writes. Both servers run on their own thread with their own runtime and stop when dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use sha2::{Digest as _, Sha256};
use tokio::sync::oneshot;

pub use crate::web::Recorded;
use crate::web::{Reply, ReplyBody, ServerThread, WebServer};

/// The media type of an OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The media type of a WebAssembly component layer, as `wkg oci push` writes it.
pub const WASM_LAYER: &str = "application/wasm";

/// The media type of the config of a WebAssembly artifact, as `wkg oci push` writes it.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";

/// `sha256:HEX` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A manifest stored under a reference.
#[derive(Debug, Clone)]
struct StoredManifest {
    bytes: Bytes,
    media_type: String,
    /// What `Docker-Content-Digest` says (the bytes' digest unless the test made it lie).
    digest: String,
}

/// The authentication the registry demands.
#[derive(Debug, Clone, Default)]
enum Auth {
    #[default]
    None,
    /// `Authorization: Bearer TOKEN`, else a challenge naming `realm`.
    Bearer { realm: String, token: String },
    /// `Authorization: Basic base64(user:password)`, exactly this header value.
    Basic { expected: String },
}

#[derive(Debug, Default)]
struct State {
    /// Blobs by repository and digest.
    blobs: HashMap<(String, String), Bytes>,
    /// Manifests by repository and reference (tag or digest).
    manifests: HashMap<(String, String), StoredManifest>,
    /// Blob digest → where a request for it is redirected (307).
    redirects: HashMap<String, String>,
    /// Blob digest → how many bytes of it are sent before the body stalls.
    stalls: HashMap<String, usize>,
    auth: Auth,
    requests: Vec<Recorded>,
}

/// A fake OCI registry on 127.0.0.1; see the module documentation.
pub struct FakeRegistry {
    server: ServerThread,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for FakeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRegistry")
            .field("addr", &self.server.addr())
            .finish()
    }
}

impl FakeRegistry {
    /// An empty registry, without authentication, on a free port.
    pub fn start() -> FakeRegistry {
        let state = Arc::new(Mutex::new(State::default()));
        let served = state.clone();
        let server = ServerThread::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            "test-oci",
            move |listener, stop| serve(listener, served, stop),
        )
        .unwrap_or_else(|error| panic!("cannot start the fake registry: {error}"));
        FakeRegistry { server, state }
    }

    /// `127.0.0.1:PORT`, the registry part of a reference (`127.0.0.1:PORT/REPO:TAG`).
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores `bytes` as a blob of `repo` and returns its digest (`sha256:HEX`).
    pub fn put_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = sha256_digest(bytes);
        self.put_blob_as(repo, &digest, bytes);
        digest
    }

    /// Stores `bytes` as the blob `digest` of `repo`, whatever their real digest: a blob whose
    /// bytes do not match its digest when they differ.
    pub fn put_blob_as(&self, repo: &str, digest: &str, bytes: &[u8]) {
        self.state().blobs.insert(
            (repo.to_string(), digest.to_string()),
            Bytes::copy_from_slice(bytes),
        );
    }

    /// Stores manifest `json` of `media_type` in `repo` under `tag` and under its digest, and
    /// returns the digest (`sha256:HEX`).
    pub fn put_manifest(&self, repo: &str, tag: &str, json: &[u8], media_type: &str) -> String {
        let digest = sha256_digest(json);
        self.put_manifest_as(repo, tag, &digest, json, media_type);
        self.put_manifest_as(repo, &digest, &digest, json, media_type);
        digest
    }

    /// Stores manifest `json` of `media_type` in `repo` under `reference` (a tag or a digest)
    /// only, answered with `Docker-Content-Digest: {digest}` whatever the bytes' real digest: a
    /// manifest that lies about its digest when they differ.
    pub fn put_manifest_as(
        &self,
        repo: &str,
        reference: &str,
        digest: &str,
        json: &[u8],
        media_type: &str,
    ) {
        self.state().manifests.insert(
            (repo.to_string(), reference.to_string()),
            StoredManifest {
                bytes: Bytes::copy_from_slice(json),
                media_type: media_type.to_string(),
                digest: digest.to_string(),
            },
        );
    }

    /// Stores `wasm` as a component in `repo` under `tag`, in the form `wkg oci push` writes
    /// (see [`component_config`] and [`component_manifest`]; the layer titled `component.wasm`),
    /// with `annotations` on the manifest. Returns the manifest's, the config's and the layer's
    /// digests.
    pub fn put_component(
        &self,
        repo: &str,
        tag: &str,
        wasm: &[u8],
        annotations: &[(&str, &str)],
    ) -> PushedComponent {
        let config = component_config(wasm);
        let config_digest = self.put_blob(repo, &config);
        let layer_digest = self.put_blob(repo, wasm);
        let manifest = component_manifest(
            (&config_digest, config.len()),
            (&layer_digest, wasm.len()),
            "component.wasm",
            annotations,
        );
        let manifest_digest = self.put_manifest(repo, tag, &manifest, OCI_MANIFEST);
        PushedComponent {
            manifest: manifest_digest,
            config: config_digest,
            layer: layer_digest,
        }
    }

    /// Answers every request for blob `digest` (any repository) with a 307 to `location`.
    pub fn redirect_blob(&self, digest: &str, location: &str) {
        self.state()
            .redirects
            .insert(digest.to_string(), location.to_string());
    }

    /// Answers `GET` of blob `digest` with its headers (the full `Content-Length`) and its first
    /// `after_bytes` bytes, then sends nothing more and keeps the connection open.
    pub fn stall_blob(&self, digest: &str, after_bytes: usize) {
        self.state().stalls.insert(digest.to_string(), after_bytes);
    }

    /// From now on every `/v2` request without `Authorization: Bearer {token}` is answered 401
    /// with `WWW-Authenticate: Bearer realm="{realm_url}",service="fake"` and, when the path
    /// names a repository, `,scope="repository:REPO:pull"`.
    pub fn require_bearer(&self, realm_url: &str, token: &str) {
        self.state().auth = Auth::Bearer {
            realm: realm_url.to_string(),
            token: token.to_string(),
        };
    }

    /// From now on every `/v2` request without `Authorization: Basic base64(user:password)` is
    /// answered 401 with `WWW-Authenticate: Basic realm="fake"`.
    pub fn require_basic(&self, user: &str, password: &str) {
        self.state().auth = Auth::Basic {
            expected: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ),
        };
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }
}

/// The digests of a component stored by [`FakeRegistry::put_component`].
#[derive(Debug, Clone)]
pub struct PushedComponent {
    /// The manifest's digest.
    pub manifest: String,
    /// The config blob's digest.
    pub config: String,
    /// The component layer's digest.
    pub layer: String,
}

/// The config blob `wkg oci push` writes for a component: `{"created":…,"author":null,
/// "architecture":"wasm","os":"wasip2","layerDigests":["sha256:…"],"component":{"exports":[…],
/// "imports":[…],"target":null}}`, here with empty import and export lists (wkg reads them from
/// the component) and a fixed creation time.
pub fn component_config(wasm: &[u8]) -> Vec<u8> {
    serde_json::json!({
        "created": "2026-01-01T00:00:00Z",
        "author": null,
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [sha256_digest(wasm)],
        "component": { "exports": [], "imports": [], "target": null },
    })
    .to_string()
    .into_bytes()
}

/// An OCI image manifest in the form `wkg oci push` writes (keys in its order): `annotations`
/// (left out when there are none), a config of [`WASM_CONFIG`] and one layer of [`WASM_LAYER`],
/// each given as (digest, size), the layer annotated `org.opencontainers.image.title:
/// {layer_title}` (wkg writes the pushed file's name), the OCI manifest media type and schema
/// version 2.
pub fn component_manifest(
    config: (&str, usize),
    layer: (&str, usize),
    layer_title: &str,
    annotations: &[(&str, &str)],
) -> Vec<u8> {
    let mut manifest = serde_json::Map::new();
    if !annotations.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(key, value)| ((*key).to_string(), serde_json::Value::from(*value)))
            .collect();
        manifest.insert("annotations".into(), serde_json::Value::Object(map));
    }
    manifest.insert(
        "config".into(),
        serde_json::json!({ "digest": config.0, "mediaType": WASM_CONFIG, "size": config.1 }),
    );
    manifest.insert(
        "layers".into(),
        serde_json::json!([{
            "annotations": { "org.opencontainers.image.title": layer_title },
            "digest": layer.0,
            "mediaType": WASM_LAYER,
            "size": layer.1,
        }]),
    );
    manifest.insert("mediaType".into(), OCI_MANIFEST.into());
    manifest.insert("schemaVersion".into(), 2.into());
    serde_json::Value::Object(manifest).to_string().into_bytes()
}

fn serve(listener: StdListener, state: Arc<Mutex<State>>, stop: oneshot::Receiver<()>) {
    crate::web::serve_http(
        listener,
        stop,
        || {},
        move |request| {
            let state = state.clone();
            async move { answer(request, &state).await }
        },
    );
}

/// What a `/v2` path asks for.
enum Route<'a> {
    /// `/v2/`.
    Base,
    /// `/v2/<name>/manifests/<reference>`.
    Manifest(&'a str, &'a str),
    /// `/v2/<name>/blobs/<digest>`.
    Blob(&'a str, &'a str),
    /// Anything else.
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    if path == "/v2/" || path == "/v2" {
        return Route::Base;
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Route::Unknown;
    };
    if let Some(at) = rest.rfind("/manifests/") {
        return Route::Manifest(&rest[..at], &rest[at + "/manifests/".len()..]);
    }
    if let Some(at) = rest.rfind("/blobs/") {
        return Route::Blob(&rest[..at], &rest[at + "/blobs/".len()..]);
    }
    Route::Unknown
}

async fn answer(
    request: hyper::Request<Incoming>,
    state: &Mutex<State>,
) -> hyper::Response<ReplyBody> {
    let (parts, body) = request.into_parts();
    // Drain whatever body came, so the connection stays usable.
    let _ = body.collect().await;
    let recorded = Recorded::of(&parts, Vec::new());
    let mut state = state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    state.requests.push(recorded.clone());
    let path = parts.uri.path();
    let route = route(path);
    let head = parts.method == hyper::Method::HEAD;
    if parts.method != hyper::Method::GET && !head {
        return error(
            405,
            "UNSUPPORTED",
            "the fake registry serves GET and HEAD only",
        );
    }
    if path.starts_with("/v2")
        && let Some(challenge) = challenge(&state.auth, &recorded, &route)
    {
        let mut response = error(401, "UNAUTHORIZED", "authentication required");
        set_header(&mut response, "www-authenticate", &challenge);
        return response;
    }
    match route {
        Route::Base => {
            let mut response = full(200, Bytes::from_static(b"{}"), false);
            set_header(&mut response, "content-type", "application/json");
            response
        }
        Route::Manifest(name, reference) => {
            let key = (name.to_string(), reference.to_string());
            let Some(manifest) = state.manifests.get(&key) else {
                return error(404, "MANIFEST_UNKNOWN", "manifest unknown");
            };
            let mut response = full(200, manifest.bytes.clone(), head);
            set_header(&mut response, "content-type", &manifest.media_type);
            set_header(&mut response, "docker-content-digest", &manifest.digest);
            response
        }
        Route::Blob(name, digest) => {
            if let Some(location) = state.redirects.get(digest) {
                let mut response = full(307, Bytes::new(), false);
                set_header(&mut response, "location", location);
                return response;
            }
            let key = (name.to_string(), digest.to_string());
            let Some(bytes) = state.blobs.get(&key).cloned() else {
                return error(404, "BLOB_UNKNOWN", "blob unknown to registry");
            };
            let mut response = match state.stalls.get(digest) {
                Some(&after) if !head => {
                    let total = bytes.len() as u64;
                    let first = bytes.slice(..after.min(bytes.len()));
                    let mut response = hyper::Response::new(
                        Stalled {
                            first: Some(first),
                            total,
                        }
                        .boxed(),
                    );
                    set_header(&mut response, "content-length", &total.to_string());
                    response
                }
                _ => full(200, bytes, head),
            };
            set_header(&mut response, "content-type", "application/octet-stream");
            set_header(&mut response, "docker-content-digest", digest);
            response
        }
        Route::Unknown => error(404, "NAME_UNKNOWN", "repository name not known to registry"),
    }
}

/// The `WWW-Authenticate` challenge for a request that lacks the credentials `auth` demands.
fn challenge(auth: &Auth, request: &Recorded, route: &Route<'_>) -> Option<String> {
    let given = request.header("authorization");
    match auth {
        Auth::None => None,
        Auth::Bearer { realm, token } => {
            if given == Some(format!("Bearer {token}").as_str()) {
                return None;
            }
            let scope = match route {
                Route::Manifest(name, _) | Route::Blob(name, _) => {
                    format!(",scope=\"repository:{name}:pull\"")
                }
                Route::Base | Route::Unknown => String::new(),
            };
            Some(format!("Bearer realm=\"{realm}\",service=\"fake\"{scope}"))
        }
        Auth::Basic { expected } => {
            (given != Some(expected.as_str())).then(|| "Basic realm=\"fake\"".to_string())
        }
    }
}

/// A response of `status` with `body`, or for a `HEAD` (`head`) with the body's length in
/// `Content-Length` and no body.
fn full(status: u16, body: Bytes, head: bool) -> hyper::Response<ReplyBody> {
    let length = body.len();
    let body = if head { Bytes::new() } else { body };
    let mut response = hyper::Response::new(Full::new(body).boxed());
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    set_header(&mut response, "content-length", &length.to_string());
    set_header(
        &mut response,
        "docker-distribution-api-version",
        "registry/2.0",
    );
    response
}

/// An OCI error answer: `{"errors":[{"code":CODE,"message":MESSAGE}]}`.
fn error(status: u16, code: &str, message: &str) -> hyper::Response<ReplyBody> {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message }] }).to_string();
    let mut response = full(status, Bytes::from(body), false);
    set_header(&mut response, "content-type", "application/json");
    response
}

fn set_header(response: &mut hyper::Response<ReplyBody>, name: &str, value: &str) {
    if let (Ok(name), Ok(value)) = (
        hyper::header::HeaderName::from_bytes(name.as_bytes()),
        hyper::header::HeaderValue::from_str(value),
    ) {
        response.headers_mut().insert(name, value);
    }
}

/// A body that announces `total` bytes, sends `first`, then never anything more.
struct Stalled {
    first: Option<Bytes>,
    total: u64,
}

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut().first.take() {
            Some(first) if !first.is_empty() => Poll::Ready(Some(Ok(Frame::data(first)))),
            // Never woken again: the connection stays open until the server stops.
            _ => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.total)
    }
}

/// The token endpoint a Bearer challenge names: answers every request with
/// `{"token": TOKEN, "access_token": TOKEN}` and records it, headers included.
pub struct FakeTokenServer {
    server: WebServer,
}

impl std::fmt::Debug for FakeTokenServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeTokenServer")
            .field("addr", &self.server.addr())
            .finish()
    }
}

impl FakeTokenServer {
    /// A token server handing out `token`, on a free port.
    pub fn start(token: &str) -> FakeTokenServer {
        let body = serde_json::json!({ "token": token, "access_token": token }).to_string();
        FakeTokenServer {
            server: WebServer::start(move |_| Reply::json(body.clone())),
        }
    }

    /// `http://127.0.0.1:PORT/token`, the realm to name in a challenge.
    pub fn realm(&self) -> String {
        self.server.url("/token")
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.server.requests()
    }
}
