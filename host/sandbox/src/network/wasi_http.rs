//! Standard `wasi:http` for third-party components, through the same policy and client as the
//! `clawcage:tool/http` import. wasmtime-wasi-http provides the `wasi:http/types` and
//! `wasi:http/outgoing-handler` bindings; [`PolicyHooks`] replaces its sender, so every request a
//! guest's own HTTP client makes is checked, resolved, pinned and capped here. As `wasi:http`
//! prescribes, redirects are not followed: the guest sees the 3xx and its next request is checked
//! again like any other. Refusals become the standard error codes (`HTTP-request-denied`,
//! `destination-IP-prohibited`, ...); the full message, with the configuration key that would allow
//! the request, goes to the host's log. What comes back is scrubbed of the policy's secrets before
//! the guest reads it: header values (the 3xx `location` included), trailers, and the body as it
//! streams (the cap counts the bytes on the wire, and `content-length` is dropped when the policy
//! has secrets, since scrubbing may change the length).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use clawcage_core::redact::{Redactor, StreamRedactor};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as WasiHttpError, ForbiddenHeaderFilter, RequestOptions,
    WasiBody, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use super::client::{CheckedRequest, NetworkPolicy, check_header_name};
use super::error::{NetworkError, NetworkErrorKind};
use super::policy::parse_url;
use super::secrets::scrub_headers;
use crate::host::CallState;

/// The `wasi:http` hooks of one call: the call's network policy, if any.
pub(crate) struct PolicyHooks {
    network: Option<Arc<NetworkPolicy>>,
    component: String,
}

impl PolicyHooks {
    pub(crate) fn new(network: Option<Arc<NetworkPolicy>>, component: &str) -> Self {
        Self {
            network,
            component: component.to_string(),
        }
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), WasiHttpError>> + Send>,
                ),
                WasiHttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for PolicyHooks {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        Arc::new(|name| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name) || check_header_name(name).is_err()
        })
    }

    fn set_host_header(&mut self) -> bool {
        // The client sets `host` from the checked URL.
        false
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), WasiHttpError>> + Send>,
    ) -> SendFuture {
        let network = self.network.clone();
        let component = self.component.clone();
        Box::new(async move {
            let Some(policy) = network else {
                tracing::warn!(target: "clawcage::network", %component, "wasi:http request refused: this component has no network grant");
                return Err(WasiHttpError::HttpRequestDenied);
            };
            let sent = send(&policy, request, options)
                .await
                .map_err(|error| policy.explained(error));
            match sent {
                Ok(response) => Ok((
                    response,
                    Box::new(async { Ok(()) }) as Box<dyn Future<Output = _> + Send>,
                )),
                Err(error) => {
                    log_refusal(&component, &error);
                    Err(to_wasi_error(&error))
                }
            }
        })
    }
}

/// Check and send one `wasi:http` request through `policy`, without following redirects.
async fn send(
    policy: &NetworkPolicy,
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<http::Response<WasiBody>, NetworkError> {
    let limits = *policy.limits();
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let url = parse_url(&parts.uri.to_string())?;
    let mut headers = http::HeaderMap::new();
    for (name, value) in &parts.headers {
        if check_header_name(name).is_ok() {
            headers.append(name.clone(), value.clone());
        }
    }
    let cap = usize::try_from(limits.max_request_bytes).unwrap_or(usize::MAX);
    let body = http_body_util::Limited::new(body, cap)
        .collect()
        .await
        .map_err(|_| {
            NetworkError::invalid(format!(
                "the request body is larger than {cap} bytes or could not be read"
            ))
        })?
        .to_bytes();
    let checked = CheckedRequest {
        method: parts.method,
        url,
        headers,
        body: (!body.is_empty()).then_some(body),
    };
    let mut deadline = started + limits.total_timeout;
    if let Some(first_byte) = options.and_then(|options| options.first_byte_timeout) {
        deadline = deadline.min(Instant::now() + first_byte);
    }
    let narrowed;
    let policy = match options.and_then(|options| options.connect_timeout) {
        Some(connect) if connect < limits.connect_timeout => {
            narrowed = policy.clone().with_limits(super::client::NetworkLimits {
                connect_timeout: connect,
                ..limits
            });
            &narrowed
        }
        _ => policy,
    };
    let response = policy.hop(&checked, &mut deadline).await?;
    let redactor = policy.redactor().clone();
    let url = redactor.redact(checked.url.as_str());
    let (mut parts, body) = http::Response::from(response).into_parts();
    parts.headers = scrub_headers(&redactor, &parts.headers);
    if !redactor.is_empty() {
        parts.headers.remove(http::header::CONTENT_LENGTH);
    }
    let between_bytes = options.and_then(|options| options.between_bytes_timeout);
    let body = PolicedBody {
        inner: Box::pin(body),
        remaining: limits.max_response_bytes,
        cap: limits.max_response_bytes,
        deadline: Box::pin(tokio::time::sleep_until(started + limits.total_timeout)),
        between_bytes,
        idle: between_bytes.map(|timeout| Box::pin(tokio::time::sleep(timeout))),
        url,
        scrub: redactor.stream(),
        redactor,
        queued: None,
        done: false,
    };
    Ok(http::Response::from_parts(parts, body.boxed_unsync()))
}

/// A response body that ends with an error past the byte cap or the deadline, instead of being
/// read further, and that is scrubbed of the policy's secrets on the way.
struct PolicedBody {
    inner: Pin<Box<reqwest::Body>>,
    /// Wire bytes still allowed.
    remaining: u64,
    cap: u64,
    deadline: Pin<Box<Sleep>>,
    between_bytes: Option<Duration>,
    idle: Option<Pin<Box<Sleep>>>,
    url: String,
    /// Scrubs the data frames; holds back the start of what may be a secret.
    scrub: StreamRedactor,
    /// Scrubs the trailers.
    redactor: Redactor,
    /// What the body ends with, once the scrubber's held-back bytes went out.
    queued: Option<Ending>,
    done: bool,
}

/// How a [`PolicedBody`] ends.
enum Ending {
    /// The stream ended.
    End,
    /// The trailers, then the end.
    Trailers(http::HeaderMap),
    /// An error instead of more body.
    Error(WasiHttpError),
}

type FramePoll = Poll<Option<Result<Frame<Bytes>, WasiHttpError>>>;

impl PolicedBody {
    /// End the body with `ending`, after the bytes the scrubber still holds (scrubbed as a cut
    /// body when `cut`: a secret cut short there is replaced too).
    fn end_with(&mut self, ending: Ending, cut: bool) -> FramePoll {
        let tail = if cut {
            self.scrub.finish_cut()
        } else {
            self.scrub.finish()
        };
        self.queued = Some(ending);
        if tail.is_empty() {
            self.next_ending()
        } else {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(tail)))))
        }
    }

    fn next_ending(&mut self) -> FramePoll {
        match self.queued.take() {
            None | Some(Ending::End) => {
                self.done = true;
                Poll::Ready(None)
            }
            Some(Ending::Trailers(trailers)) => {
                self.queued = Some(Ending::End);
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Some(Ending::Error(error)) => {
                self.done = true;
                Poll::Ready(Some(Err(error)))
            }
        }
    }
}

impl Body for PolicedBody {
    type Data = Bytes;
    type Error = WasiHttpError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = self.get_mut();
        if this.queued.is_some() {
            return this.next_ending();
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if this.deadline.as_mut().poll(cx).is_ready()
                || this
                    .idle
                    .as_mut()
                    .is_some_and(|idle| idle.as_mut().poll(cx).is_ready())
            {
                tracing::warn!(target: "clawcage::network", url = %this.url, "wasi:http response body timed out");
                return this.end_with(Ending::Error(WasiHttpError::ConnectionReadTimeout), true);
            }
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return this.end_with(Ending::End, false),
                Poll::Ready(Some(Err(error))) => {
                    let code = if error.is_timeout() {
                        WasiHttpError::ConnectionReadTimeout
                    } else {
                        WasiHttpError::HttpProtocolError
                    };
                    return this.end_with(Ending::Error(code), true);
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => {
                        let trailers = scrub_headers(&this.redactor, &trailers);
                        return this.end_with(Ending::Trailers(trailers), false);
                    }
                    Err(_) => continue,
                },
            };
            let size = data.len() as u64;
            if size > this.remaining {
                tracing::warn!(
                    target: "clawcage::network",
                    url = %this.url,
                    cap = this.cap,
                    "wasi:http response body exceeds the cap ([network] max_response_bytes); stopped reading"
                );
                let error = WasiHttpError::HttpResponseBodySize(Some(this.cap));
                return this.end_with(Ending::Error(error), true);
            }
            this.remaining -= size;
            if let (Some(timeout), Some(idle)) = (this.between_bytes, this.idle.as_mut()) {
                idle.as_mut().reset(Instant::now() + timeout);
            }
            if this.redactor.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let scrubbed = this.scrub.push(&data);
            if !scrubbed.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(scrubbed)))));
            }
            // Everything was held back (the start of a possible secret): read on.
        }
    }
}

fn log_refusal(component: &str, error: &NetworkError) {
    match error.family() {
        super::error::NetworkErrorFamily::Denied => {
            tracing::warn!(target: "clawcage::network", %component, "wasi:http request refused: {error}");
        }
        _ => {
            tracing::info!(target: "clawcage::network", %component, "wasi:http request failed: {error}");
        }
    }
}

/// The standard error code for a policy error.
fn to_wasi_error(error: &NetworkError) -> WasiHttpError {
    use NetworkErrorKind::*;
    match error.kind() {
        HostNotAllowed | PlainHttpRefused | TooManyRedirects | RedirectRefused | NotGranted => {
            WasiHttpError::HttpRequestDenied
        }
        AddressRefused => WasiHttpError::DestinationIpProhibited,
        InvalidRequest => WasiHttpError::HttpRequestUriInvalid,
        NameNotFound => WasiHttpError::DnsError {
            rcode: Some("name not found".to_string()),
            info_code: None,
        },
        ConnectFailed => WasiHttpError::ConnectionRefused,
        TimedOut => WasiHttpError::ConnectionTimeout,
        Protocol => WasiHttpError::HttpProtocolError,
    }
}
