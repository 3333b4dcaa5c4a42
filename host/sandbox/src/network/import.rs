//! The host side of the `clawcage:tool/http` import: a component's request goes through the
//! call's [`NetworkPolicy`](super::NetworkPolicy) (redirects followed, body capped) and comes back
//! as a response or an `http-error` whose case says whether the policy refused it, the request was
//! malformed, or the network failed. Both are scrubbed of the policy's secrets by the policy
//! before they get here (headers, body, final URL, message). Refusals are logged with the
//! component's name.

use super::client::OutboundRequest;
use super::error::{NetworkError, NetworkErrorFamily, NetworkErrorKind};
use crate::bindings::http;
use crate::host::CallState;

impl http::Host for CallState {
    async fn send(&mut self, request: http::Request) -> Result<http::Response, http::HttpError> {
        let Some(policy) = self.network.clone() else {
            let error = NetworkError::new(
                NetworkErrorKind::NotGranted,
                "this tool has no network access; the operator grants it with [network] allow in clawcage.toml",
            );
            return Err(to_guest_error(&self.component, error));
        };
        let outbound = OutboundRequest {
            method: request.method,
            url: request.url,
            headers: request.headers,
            body: request.body,
        };
        match policy.send(outbound).await {
            Ok(response) => Ok(http::Response {
                status: response.status,
                headers: response.headers,
                body: response.body,
                truncated: response.truncated,
                final_url: response.final_url,
            }),
            Err(error) => Err(to_guest_error(&self.component, error)),
        }
    }
}

fn to_guest_error(component: &str, error: NetworkError) -> http::HttpError {
    match error.family() {
        NetworkErrorFamily::Denied => {
            tracing::info!(target: "clawcage::network", %component, "request refused: {error}");
            http::HttpError::Denied(error.message().to_string())
        }
        NetworkErrorFamily::InvalidRequest => {
            tracing::debug!(target: "clawcage::network", %component, "invalid request: {error}");
            http::HttpError::InvalidRequest(error.message().to_string())
        }
        NetworkErrorFamily::Network => {
            tracing::info!(target: "clawcage::network", %component, "request failed: {error}");
            http::HttpError::Network(error.message().to_string())
        }
    }
}
