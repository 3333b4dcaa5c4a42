//! [`NetworkPolicy`]: the operator's network grant for one component, and the client that sends
//! requests under it. For every hop the URL is checked against the allow-list, the name is
//! resolved once by the policy's [`NameResolver`], every address is judged, and a reqwest client
//! built for that hop connects to exactly the addresses that were judged (its own resolver refuses
//! every lookup, so there is no second one). Redirects are followed here, each hop checked again;
//! timeouts bound the whole exchange; the response body is read in chunks and never buffered past
//! the cap. Secret headers are added for the host they belong to, on every hop that goes there,
//! and scrubbed from everything that comes back — header values, redirect targets (before they
//! are followed), the final URL, the body (while streaming, the cap still counting the bytes on
//! the wire) and error messages — so a host that echoes its request shows `[redacted: SOURCE]`. It
//! is one file (over 700 lines) because it is one request path (check, resolve, connect, redirect,
//! read, scrub) taken hop by hop under one [`NetworkPolicy`]; the parts that stand alone
//! (addresses, resolving, secrets, errors) are its sibling modules.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use clawcage_core::redact::Redactor;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use tokio::time::Instant;
use url::Url;

use super::error::{NetworkError, NetworkErrorKind};
use super::policy::{AllowList, Target, check_addresses, check_target, exact_entry, parse_url};
use super::resolve::{NameResolver, SystemResolver};
use super::secrets::{Secret, redactor_for, scrub_headers};

/// The most redirects any policy follows.
pub const MAX_REDIRECTS: u32 = 5;

/// Header names a component may not set: the host sets them, or they steer the connection
/// itself rather than the request.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "http2-settings",
    "expect",
];

/// Headers dropped when a redirect leads to another origin, as browsers do.
const ORIGIN_BOUND_HEADERS: &[HeaderName] = &[header::AUTHORIZATION, header::COOKIE];

/// Sizes and times of outbound HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkLimits {
    /// Time to resolve and connect, per hop.
    pub connect_timeout: Duration,
    /// Time for the whole exchange, redirects and body included.
    pub total_timeout: Duration,
    /// Bytes of response body kept; the rest is not read.
    pub max_response_bytes: u64,
    /// Bytes of request body accepted from a component.
    pub max_request_bytes: u64,
    /// Redirects followed (at most [`MAX_REDIRECTS`]).
    pub max_redirects: u32,
}

impl Default for NetworkLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(20),
            max_response_bytes: 5 << 20,
            max_request_bytes: 1 << 20,
            max_redirects: MAX_REDIRECTS,
        }
    }
}

impl NetworkLimits {
    /// The tighter of two limit sets, field by field.
    pub fn narrowed_by(&self, other: &NetworkLimits) -> NetworkLimits {
        NetworkLimits {
            connect_timeout: self.connect_timeout.min(other.connect_timeout),
            total_timeout: self.total_timeout.min(other.total_timeout),
            max_response_bytes: self.max_response_bytes.min(other.max_response_bytes),
            max_request_bytes: self.max_request_bytes.min(other.max_request_bytes),
            max_redirects: self.max_redirects.min(other.max_redirects),
        }
    }
}

/// One request from a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundRequest {
    /// The method, e.g. `GET`.
    pub method: String,
    /// An absolute http or https URL.
    pub url: String,
    /// Headers as (name, value) pairs.
    pub headers: Vec<(String, String)>,
    /// The body, if any.
    pub body: Option<Vec<u8>>,
}

impl OutboundRequest {
    /// A `GET` of `url` without headers.
    pub fn get(url: impl Into<String>) -> Self {
        Self {
            method: "GET".to_string(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
        }
    }
}

/// The final response, redirects followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundResponse {
    /// The status code.
    pub status: u16,
    /// Headers as (name, value) pairs, values decoded lossily.
    pub headers: Vec<(String, String)>,
    /// The body: at most `max_response_bytes` read from the wire, scrubbed of the policy's
    /// secrets.
    pub body: Vec<u8>,
    /// Whether the body was cut at the cap.
    pub truncated: bool,
    /// The URL that answered.
    pub final_url: String,
}

/// A request after its method, headers and body were checked.
#[derive(Debug, Clone)]
pub(crate) struct CheckedRequest {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Bytes>,
}

/// What the operator allows one component to reach over the network.
#[derive(Debug, Clone)]
pub struct NetworkPolicy {
    lists: Vec<AllowList>,
    secrets: Vec<Secret>,
    /// Scrubs the secrets' values from responses; built from `secrets`.
    redactor: Redactor,
    limits: NetworkLimits,
    resolver: Arc<dyn NameResolver>,
    /// The configuration key a refusal tells the operator to change, when it is not
    /// `[network] allow` (a plugin's policy names its own grant).
    grant_key: Option<Arc<str>>,
    /// Asked about a host off the allow-list (`[approvals] network = "ask"`) instead of refusing.
    approvals: Option<Arc<dyn clawcage_core::approval::ApprovalGate>>,
}

impl PartialEq for NetworkPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.lists == other.lists
            && self.secrets == other.secrets
            && self.limits == other.limits
            && std::ptr::addr_eq(Arc::as_ptr(&self.resolver), Arc::as_ptr(&other.resolver))
    }
}

impl Eq for NetworkPolicy {}

impl NetworkPolicy {
    /// Requests to the hosts of `allow`, default limits, no secrets, the system resolver.
    pub fn new(allow: AllowList) -> Self {
        Self {
            lists: vec![allow],
            secrets: Vec::new(),
            redactor: Redactor::default(),
            limits: NetworkLimits::default(),
            resolver: Arc::new(SystemResolver),
            grant_key: None,
            approvals: None,
        }
    }

    /// This policy asking `gate` about a host off the allow-list instead of refusing the
    /// request, when the gate asks about the network. An approval adds exactly that host (its
    /// port and scheme) for the one request, or for good when the gate keeps it.
    pub fn with_approvals(mut self, gate: Arc<dyn clawcage_core::approval::ApprovalGate>) -> Self {
        self.approvals = gate.asks_network().then_some(gate);
        self
    }

    /// This policy with refusals naming `key` (e.g. `[plugins.grants.NAME] network in
    /// clawcage.toml`) as the setting to change instead of `[network] allow`.
    pub fn with_grant_key(mut self, key: &str) -> Self {
        self.grant_key = Some(Arc::from(key));
        self
    }

    /// `error` as the component and the operator see it: scrubbed of the secrets, naming the
    /// key that would allow the request.
    pub(crate) fn explained(&self, error: NetworkError) -> NetworkError {
        let error = error.redacted(&self.redactor);
        match &self.grant_key {
            Some(key) => error.with_key(super::policy::ALLOW_KEY, key),
            None => error,
        }
    }

    /// This policy with `secrets` added to requests for their hosts and scrubbed from every
    /// response (a value shorter than 8 bytes is sent but cannot be scrubbed; the log says so).
    pub fn with_secrets(mut self, secrets: Vec<Secret>) -> Self {
        self.redactor = redactor_for(&secrets, true);
        self.secrets = secrets;
        self
    }

    /// This policy with `limits` (redirects capped at [`MAX_REDIRECTS`]).
    pub fn with_limits(mut self, mut limits: NetworkLimits) -> Self {
        limits.max_redirects = limits.max_redirects.min(MAX_REDIRECTS);
        self.limits = limits;
        self
    }

    /// This policy resolving names with `resolver` (tests inject their own).
    pub fn with_resolver(mut self, resolver: Arc<dyn NameResolver>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The limits.
    pub fn limits(&self) -> &NetworkLimits {
        &self.limits
    }

    /// The allow-lists; a request must pass every one.
    pub fn allow_lists(&self) -> &[AllowList] {
        &self.lists
    }

    /// The secrets, for display (values are never shown).
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// What scrubs the secrets' values from responses before a component sees them.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// What both policies allow: both allow-lists must pass, only secrets both hold are kept,
    /// limits are the tighter ones. The resolver is `self`'s.
    pub fn narrowed_by(&self, other: &NetworkPolicy) -> NetworkPolicy {
        let mut lists = self.lists.clone();
        for list in &other.lists {
            if !lists.contains(list) {
                lists.push(list.clone());
            }
        }
        let secrets: Vec<Secret> = self
            .secrets
            .iter()
            .filter(|secret| other.secrets.contains(secret))
            .cloned()
            .collect();
        NetworkPolicy {
            lists,
            redactor: redactor_for(&secrets, false),
            secrets,
            limits: self.limits.narrowed_by(&other.limits),
            resolver: self.resolver.clone(),
            grant_key: self.grant_key.clone().or_else(|| other.grant_key.clone()),
            // Asking instead of refusing survives only when both sides ask.
            approvals: match (&self.approvals, &other.approvals) {
                (Some(mine), Some(_)) => Some(mine.clone()),
                _ => None,
            },
        }
    }

    /// One line for `clawcage tools`: the allowed hosts and the secrets' hosts.
    pub fn describe(&self) -> String {
        let allowed = if self.lists.iter().any(AllowList::is_empty) {
            "network: nothing allowed (add hosts to [network] allow)".to_string()
        } else {
            let lists: Vec<String> = self.lists.iter().map(ToString::to_string).collect();
            format!("network: {}", lists.join(" and within "))
        };
        if self.secrets.is_empty() {
            allowed
        } else {
            let secrets: Vec<String> = self.secrets.iter().map(Secret::describe).collect();
            format!(
                "{allowed}; secrets added by the host: {}",
                secrets.join(", ")
            )
        }
    }

    /// Send `request`, following redirects (each hop checked again), and read the body up to
    /// the cap. The response and any error are scrubbed of the policy's secrets.
    pub async fn send(&self, request: OutboundRequest) -> Result<OutboundResponse, NetworkError> {
        self.follow(request)
            .await
            .map_err(|error| self.explained(error))
    }

    async fn follow(&self, request: OutboundRequest) -> Result<OutboundResponse, NetworkError> {
        let mut deadline = Instant::now() + self.limits.total_timeout;
        let mut request = self.check_request(request)?;
        let mut redirected_from: Option<Url> = None;
        let mut redirects = 0;
        loop {
            let response = self
                .hop(&request, &mut deadline)
                .await
                .map_err(|error| after_redirect(error, redirected_from.as_ref()))?;
            let status = response.status();
            let location = response
                .headers()
                .get(header::LOCATION)
                .and_then(|value| value.to_str().ok())
                // A location echoing a secret is scrubbed before it is followed: the value then
                // appears in no later URL, log line, error or final URL.
                .map(|location| self.redactor.redact(location));
            let Some(location) = location.filter(|_| is_followed_redirect(status)) else {
                return self.read_response(response, &request.url, deadline).await;
            };
            if redirects >= self.limits.max_redirects {
                return Err(NetworkError::new(
                    NetworkErrorKind::TooManyRedirects,
                    format!(
                        "{} redirected more than {} times; stopped at {} (the limit is fixed)",
                        redirected_from.as_ref().unwrap_or(&request.url),
                        self.limits.max_redirects,
                        request.url
                    ),
                ));
            }
            redirects += 1;
            let next = request.url.join(&location).map_err(|error| {
                NetworkError::new(
                    NetworkErrorKind::Protocol,
                    format!(
                        "{} redirected to {location:?}, which is not a valid URL ({error})",
                        request.url
                    ),
                )
            })?;
            if !matches!(next.scheme(), "http" | "https") {
                return Err(NetworkError::new(
                    NetworkErrorKind::RedirectRefused,
                    format!(
                        "{} redirected to {next}; only http:// and https:// redirects are followed",
                        request.url
                    ),
                ));
            }
            if next.origin() != request.url.origin() {
                for name in ORIGIN_BOUND_HEADERS {
                    request.headers.remove(name);
                }
            }
            let keeps_method = matches!(
                status,
                StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
            );
            if !keeps_method && request.method != Method::HEAD {
                request.method = Method::GET;
                request.body = None;
                request.headers.remove(header::CONTENT_TYPE);
            }
            tracing::debug!(target: "clawcage::network", from = %request.url, to = %next, "following a redirect");
            redirected_from = Some(request.url.clone());
            request.url = next;
        }
    }

    /// Check a component's method, URL, headers and body.
    pub(crate) fn check_request(
        &self,
        request: OutboundRequest,
    ) -> Result<CheckedRequest, NetworkError> {
        let method = Method::from_bytes(request.method.trim().as_bytes()).map_err(|_| {
            NetworkError::invalid(format!("{:?} is not an HTTP method", request.method))
        })?;
        if method == Method::CONNECT || method == Method::TRACE {
            return Err(NetworkError::invalid(format!(
                "the {method} method is not allowed"
            )));
        }
        let url = parse_url(&request.url)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &request.headers {
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                NetworkError::invalid(format!("{name:?} is not a valid header name"))
            })?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                NetworkError::invalid(format!("the value of header {name} is not valid"))
            })?;
            check_header_name(&name)?;
            headers.append(name, value);
        }
        let body = match request.body {
            Some(body) if body.len() as u64 > self.limits.max_request_bytes => {
                return Err(NetworkError::invalid(format!(
                    "the request body has {} bytes; at most {} are sent",
                    body.len(),
                    self.limits.max_request_bytes
                )));
            }
            other => other.map(Bytes::from),
        };
        Ok(CheckedRequest {
            method,
            url,
            headers,
            body,
        })
    }

    /// One exchange without following redirects: check the URL, resolve once, check the
    /// addresses, connect to them and send. Returns the response with its body unread. Time an
    /// operator took to approve the host moves `deadline` on.
    pub(crate) async fn hop(
        &self,
        request: &CheckedRequest,
        deadline: &mut Instant,
    ) -> Result<reqwest::Response, NetworkError> {
        let approved;
        let (target, lists) = match check_target(&self.lists, request.url.clone()) {
            Ok(target) => (target, &self.lists),
            Err(refused) if refused.kind() == NetworkErrorKind::HostNotAllowed => {
                let (Some(gate), Some(entry)) = (&self.approvals, exact_entry(&request.url)) else {
                    return Err(refused);
                };
                // While a person decides, neither the call's time limit nor this request's
                // deadline runs.
                let asked = Instant::now();
                {
                    let _paused = crate::clock::pause_current_call();
                    gate.review_network(&entry).await
                }
                .map_err(|why| NetworkError::new(NetworkErrorKind::HostNotAllowed, why))?;
                *deadline += asked.elapsed();
                // Exactly the approved host, added to every list for this request.
                approved = self
                    .lists
                    .iter()
                    .map(|list| {
                        AllowList::parse(
                            list.entries()
                                .iter()
                                .map(ToString::to_string)
                                .chain(std::iter::once(entry.clone())),
                        )
                    })
                    .collect::<Result<Vec<AllowList>, _>>()
                    .map_err(|error| {
                        NetworkError::invalid(format!(
                            "the approved host {entry} cannot be added to the allow-list: {error}"
                        ))
                    })?;
                (check_target(&approved, request.url.clone())?, &approved)
            }
            Err(refused) => return Err(refused),
        };
        let deadline = *deadline;
        let addresses = self.addresses_of(&target, deadline).await?;
        check_addresses(lists, &target, &addresses)?;

        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut builder = reqwest::Client::builder()
            .use_preconfigured_tls(tls_config()?)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .http1_only()
            .pool_max_idle_per_host(0)
            .connect_timeout(self.limits.connect_timeout.min(remaining))
            .timeout(remaining)
            .user_agent(concat!("clawcage/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(NoSecondLookup));
        if target.name().is_some() {
            let pinned: Vec<SocketAddr> = addresses
                .iter()
                .map(|ip| SocketAddr::new(*ip, target.port))
                .collect();
            builder = builder.resolve_to_addrs(target.url_host(), &pinned);
        }
        let client = builder.build().map_err(|error| {
            NetworkError::new(
                NetworkErrorKind::Protocol,
                format!(
                    "the HTTP client could not be set up: {}",
                    error_chain(&error)
                ),
            )
        })?;

        let mut headers = request.headers.clone();
        let all_loopback = addresses
            .iter()
            .all(|ip| super::address::is_loopback(super::address::canonical(*ip)));
        for secret in self
            .secrets
            .iter()
            .filter(|secret| secret.applies_to(&target))
        {
            // A component's own value for a secret header never reaches the host it is for.
            headers.remove(secret.header());
            if target.url.scheme() == "https" || all_loopback {
                headers.insert(secret.header().clone(), secret.value().clone());
            } else {
                tracing::warn!(
                    target: "clawcage::network",
                    header = %secret.header(),
                    host = %target.host,
                    "not sending a secret header over plain http"
                );
            }
        }
        let mut outgoing = client
            .request(request.method.clone(), target.url.clone())
            .headers(headers);
        if let Some(body) = &request.body {
            outgoing = outgoing.body(body.clone());
        }
        tracing::debug!(
            target: "clawcage::network",
            method = %request.method,
            url = %target.url,
            addresses = ?addresses,
            "sending an allowed request"
        );
        let sent = tokio::time::timeout_at(deadline, outgoing.send()).await;
        match sent {
            Err(_) => Err(timed_out(&target, self.limits.total_timeout)),
            Ok(Err(error)) => Err(describe_send_error(&error, &target, &self.limits)),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// The addresses to connect to: the literal, or the one answer of the resolver.
    async fn addresses_of(
        &self,
        target: &Target,
        deadline: Instant,
    ) -> Result<Vec<IpAddr>, NetworkError> {
        let Some(name) = target.name() else {
            return match target.host {
                super::policy::TargetHost::Ip(ip) => Ok(vec![ip]),
                super::policy::TargetHost::Name(_) => Ok(Vec::new()),
            };
        };
        let lookup_deadline = deadline.min(Instant::now() + self.limits.connect_timeout);
        let answer = tokio::time::timeout_at(lookup_deadline, self.resolver.lookup(name)).await;
        match answer {
            Err(_) => Err(NetworkError::new(
                NetworkErrorKind::TimedOut,
                format!("looking up {name} timed out"),
            )),
            Ok(Err(error)) => Err(NetworkError::new(
                NetworkErrorKind::NameNotFound,
                format!("{name} could not be resolved: {error}"),
            )),
            Ok(Ok(addresses)) if addresses.is_empty() => Err(NetworkError::new(
                NetworkErrorKind::NameNotFound,
                format!("{name} has no address"),
            )),
            Ok(Ok(addresses)) => Ok(addresses),
        }
    }

    /// Read the body in chunks, keeping at most the cap of wire bytes; past it, stop reading
    /// (the connection is dropped with the response). Headers, body and URL are scrubbed.
    async fn read_response(
        &self,
        mut response: reqwest::Response,
        url: &Url,
        deadline: Instant,
    ) -> Result<OutboundResponse, NetworkError> {
        let status = response.status().as_u16();
        let headers = scrub_headers(&self.redactor, response.headers())
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let cap = usize::try_from(self.limits.max_response_bytes).unwrap_or(usize::MAX);
        let mut scrub = self.redactor.stream();
        let mut body = Vec::new();
        let mut wire = 0;
        let mut truncated = false;
        loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_) => {
                    return Err(NetworkError::new(
                        NetworkErrorKind::TimedOut,
                        format!(
                            "reading the response from {url} timed out after {} s ([network] timeout_secs)",
                            self.limits.total_timeout.as_secs_f64()
                        ),
                    ));
                }
                Ok(Err(error)) => {
                    let kind = if error.is_timeout() {
                        NetworkErrorKind::TimedOut
                    } else {
                        NetworkErrorKind::Protocol
                    };
                    return Err(NetworkError::new(
                        kind,
                        format!(
                            "reading the response from {url} failed: {}",
                            error_chain(&error)
                        ),
                    ));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => chunk,
            };
            let room = cap - wire;
            if chunk.len() > room {
                body.extend(scrub.push(&chunk[..room]));
                truncated = true;
                break;
            }
            wire += chunk.len();
            body.extend(scrub.push(&chunk));
        }
        body.extend(if truncated {
            scrub.finish_cut()
        } else {
            scrub.finish()
        });
        if truncated {
            tracing::debug!(target: "clawcage::network", %url, cap, "response body cut at the cap");
        }
        Ok(OutboundResponse {
            status,
            headers,
            body,
            truncated,
            final_url: self.redactor.redact(url.as_str()),
        })
    }
}

/// Refuse headers a component may not set.
pub(crate) fn check_header_name(name: &HeaderName) -> Result<(), NetworkError> {
    if FORBIDDEN_HEADERS.contains(&name.as_str()) || name.as_str().starts_with("proxy-") {
        return Err(NetworkError::invalid(format!(
            "the header {name} is set by the host and cannot be given"
        )));
    }
    Ok(())
}

fn is_followed_redirect(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    )
}

/// Say that a refusal happened on a redirect hop, keeping its kind.
fn after_redirect(error: NetworkError, from: Option<&Url>) -> NetworkError {
    match from {
        Some(from) => NetworkError::new(
            error.kind(),
            format!("after a redirect from {from}: {}", error.message()),
        ),
        None => error,
    }
}

fn timed_out(target: &Target, total: Duration) -> NetworkError {
    NetworkError::new(
        NetworkErrorKind::TimedOut,
        format!(
            "{} did not answer within {} s ([network] timeout_secs)",
            target.url,
            total.as_secs_f64()
        ),
    )
}

fn describe_send_error(
    error: &reqwest::Error,
    target: &Target,
    limits: &NetworkLimits,
) -> NetworkError {
    if error.is_timeout() {
        if error.is_connect() {
            return NetworkError::new(
                NetworkErrorKind::TimedOut,
                format!(
                    "connecting to {}:{} timed out after {} s ([network] connect_timeout_secs)",
                    target.host,
                    target.port,
                    limits.connect_timeout.as_secs_f64()
                ),
            );
        }
        return timed_out(target, limits.total_timeout);
    }
    if error.is_connect() {
        return NetworkError::new(
            NetworkErrorKind::ConnectFailed,
            format!(
                "could not connect to {}:{}: {}",
                target.host,
                target.port,
                root_cause(error)
            ),
        );
    }
    NetworkError::new(
        NetworkErrorKind::Protocol,
        format!(
            "the request to {} failed: {}",
            target.url,
            root_cause(error)
        ),
    )
}

/// The innermost error's text.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// Every error in the chain, joined.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error;
    while let Some(source) = current.source() {
        text.push_str(": ");
        text.push_str(&source.to_string());
        current = source;
    }
    text
}

/// The resolver installed in every per-hop client: names were resolved and checked before the
/// client was built and are pinned with `resolve_to_addrs`, so any lookup reaching this resolver
/// would be a second one, and is refused.
struct NoSecondLookup;

impl reqwest::dns::Resolve for NoSecondLookup {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_string();
        Box::pin(async move {
            Err(format!(
                "internal error: {name} was not resolved by the network policy; refusing a second lookup"
            )
            .into())
        })
    }
}

/// The TLS configuration every hop uses: rustls with the ring provider and the Mozilla roots
/// compiled in (`webpki-roots`, the set reqwest itself uses), HTTP/1.1 only. Built once per
/// process and cloned per hop (cheap: its parts are shared).
fn tls_config() -> Result<rustls::ClientConfig, NetworkError> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("TLS could not be set up: {error}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(config)
        })
        .clone()
        .map_err(|message| NetworkError::new(NetworkErrorKind::Protocol, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> NetworkPolicy {
        NetworkPolicy::new(AllowList::parse(["example.com"]).unwrap())
    }

    #[test]
    fn components_cannot_set_connection_headers() {
        for name in [
            "Host",
            "content-length",
            "Transfer-Encoding",
            "proxy-authorization",
            "Connection",
        ] {
            let mut request = OutboundRequest::get("https://example.com/");
            request.headers.push((name.to_string(), "x".to_string()));
            let error = policy().check_request(request).unwrap_err();
            assert_eq!(error.kind(), NetworkErrorKind::InvalidRequest, "{name}");
        }
        let mut request = OutboundRequest::get("https://example.com/");
        request
            .headers
            .push(("Accept".to_string(), "text/html".to_string()));
        assert!(policy().check_request(request).is_ok());
    }

    #[test]
    fn methods_and_bodies_are_checked() {
        let mut request = OutboundRequest::get("https://example.com/");
        request.method = "CONNECT".to_string();
        assert!(policy().check_request(request).is_err());
        let mut request = OutboundRequest::get("https://example.com/");
        request.method = "BAD METHOD".to_string();
        assert!(policy().check_request(request).is_err());
        let mut request = OutboundRequest::get("https://example.com/");
        request.body = Some(vec![0; (1 << 20) + 1]);
        let error = policy().check_request(request).unwrap_err();
        assert!(error.message().contains("at most 1048576"), "{error}");
    }

    #[test]
    fn narrowing_stacks_lists_and_keeps_shared_secrets() {
        let parent = NetworkPolicy::new(AllowList::parse(["*.example.org"]).unwrap());
        let child = NetworkPolicy::new(AllowList::parse(["a.example.org"]).unwrap()).with_limits(
            NetworkLimits {
                total_timeout: Duration::from_secs(1),
                ..NetworkLimits::default()
            },
        );
        let narrowed = parent.narrowed_by(&child);
        assert_eq!(narrowed.allow_lists().len(), 2);
        assert_eq!(narrowed.limits().total_timeout, Duration::from_secs(1));
        assert!(narrowed.secrets().is_empty());
        assert!(
            narrowed
                .describe()
                .contains("*.example.org and within a.example.org")
        );
    }

    #[test]
    fn the_scrubber_follows_the_secrets() {
        let secret = Secret::new(
            "example.com",
            "X-Token",
            super::super::secrets::SecretValue::new("token-value-1234"),
            "EXAMPLE_KEY",
        )
        .unwrap();
        let with_secret = policy().with_secrets(vec![secret.clone()]);
        assert_eq!(with_secret.redactor().labels(), ["EXAMPLE_KEY"]);
        assert!(policy().redactor().is_empty());
        // Narrowing keeps only the secrets both sides hold, and scrubs exactly those.
        assert!(with_secret.narrowed_by(&policy()).redactor().is_empty());
        let both = with_secret.narrowed_by(&policy().with_secrets(vec![secret]));
        assert_eq!(both.redactor().labels(), ["EXAMPLE_KEY"]);
        let error = NetworkError::invalid("echo: token-value-1234").redacted(both.redactor());
        assert_eq!(error.message(), "echo: [redacted: EXAMPLE_KEY]");
    }

    #[test]
    fn the_tls_configuration_builds() {
        let config = tls_config().unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }
}
