//! Outbound HTTP through the host's `clawcage:tool/http` import (feature
//! `http`). The host decides where a request may go (the operator's
//! allow-list), resolves names itself, refuses private and loopback
//! addresses, follows redirects, caps the body and adds any API keys the
//! operator configured for the destination; a tool only builds the request.
//!
//! Outside WebAssembly (native unit tests) there is no host: every request
//! fails with [`HttpError::Network`].

use crate::ToolError;

/// One outbound request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method in upper case, e.g. `GET`.
    pub method: String,
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    /// Headers as (name, value) pairs.
    pub headers: Vec<(String, String)>,
    /// The body, if any.
    pub body: Option<Vec<u8>>,
}

impl Request {
    /// A `GET` of `url`.
    pub fn get(url: impl Into<String>) -> Self {
        Self {
            method: "GET".to_string(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// This request with one more header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// The final response, after the host followed any redirects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers as (name, value) pairs; names are lower case.
    pub headers: Vec<(String, String)>,
    /// The body, at most the operator's cap.
    pub body: Vec<u8>,
    /// Whether the body was cut at the cap.
    pub truncated: bool,
    /// The URL that answered.
    pub final_url: String,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The host's network policy refused it; the text names the config key
    /// that would allow it.
    Denied(String),
    /// The request is malformed (bad URL, unsupported scheme, bad header).
    InvalidRequest(String),
    /// Allowed, but the network failed (not found, refused, timeout).
    Network(String),
}

impl From<HttpError> for ToolError {
    fn from(error: HttpError) -> Self {
        match error {
            HttpError::Denied(message) => ToolError::Denied(message),
            HttpError::InvalidRequest(message) => ToolError::InvalidArgs(message),
            HttpError::Network(message) => ToolError::Failed(message),
        }
    }
}

/// Send `request` through the host and wait for the response.
pub fn send(request: Request) -> Result<Response, HttpError> {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::clawcage::tool::http as wit;
        let response = wit::send(&wit::Request {
            method: request.method,
            url: request.url,
            headers: request.headers,
            body: request.body,
        })
        .map_err(|error| match error {
            wit::HttpError::Denied(message) => HttpError::Denied(message),
            wit::HttpError::InvalidRequest(message) => HttpError::InvalidRequest(message),
            wit::HttpError::Network(message) => HttpError::Network(message),
        })?;
        Ok(Response {
            status: response.status,
            headers: response.headers,
            body: response.body,
            truncated: response.truncated,
            final_url: response.final_url,
        })
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        Err(HttpError::Network(format!(
            "no host to send {} {} through outside WebAssembly",
            request.method, request.url
        )))
    }
}
