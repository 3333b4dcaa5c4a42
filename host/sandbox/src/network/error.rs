//! [`NetworkError`]: why an outbound request got no response. The kind says whether the policy
//! refused it, the request was malformed, or the network failed; the message says what happened
//! and, for a refusal, which configuration key would allow it. Messages never contain a secret:
//! they are built from URLs, names, addresses and error texts, never from header values, and
//! what a server's answer put into one is scrubbed of the policy's secrets (`redacted`).

use std::fmt;

/// What went wrong, finely enough to map onto `wasi:http` error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkErrorKind {
    /// The host (or host and port) is not on the allow-list.
    HostNotAllowed,
    /// The name resolved to, or the URL named, an address the policy refuses.
    AddressRefused,
    /// Plain `http://` to a host that is only allowed over https.
    PlainHttpRefused,
    /// More redirects than the policy allows.
    TooManyRedirects,
    /// A redirect to a scheme other than http or https.
    RedirectRefused,
    /// The component has no network grant at all.
    NotGranted,
    /// The URL, method, a header or the body is not acceptable.
    InvalidRequest,
    /// The name does not resolve.
    NameNotFound,
    /// The connection could not be made.
    ConnectFailed,
    /// The connect or total timeout passed.
    TimedOut,
    /// The server's answer was not valid HTTP, or the connection broke.
    Protocol,
}

/// The three families a component sees (the WIT `http-error` cases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkErrorFamily {
    /// Refused by the operator's policy.
    Denied,
    /// The request itself is malformed.
    InvalidRequest,
    /// Allowed, but the network failed.
    Network,
}

/// Why an outbound request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkError {
    kind: NetworkErrorKind,
    message: String,
}

impl NetworkError {
    /// An error of `kind` with `message`.
    pub fn new(kind: NetworkErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A malformed request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(NetworkErrorKind::InvalidRequest, message)
    }

    /// The fine-grained kind.
    pub fn kind(&self) -> NetworkErrorKind {
        self.kind
    }

    /// The family a component sees.
    pub fn family(&self) -> NetworkErrorFamily {
        use NetworkErrorKind::*;
        match self.kind {
            HostNotAllowed | AddressRefused | PlainHttpRefused | TooManyRedirects
            | RedirectRefused | NotGranted => NetworkErrorFamily::Denied,
            InvalidRequest => NetworkErrorFamily::InvalidRequest,
            NameNotFound | ConnectFailed | TimedOut | Protocol => NetworkErrorFamily::Network,
        }
    }

    /// This error with every secret value `redactor` knows replaced in its message (a redirect
    /// target or a server's text may carry what the server was sent).
    pub(crate) fn redacted(self, redactor: &clawcage_core::redact::Redactor) -> Self {
        if redactor.is_empty() {
            return self;
        }
        Self {
            message: redactor.redact(&self.message),
            kind: self.kind,
        }
    }

    /// This error naming `key` wherever it named `default_key` as the setting to change.
    pub(crate) fn with_key(self, default_key: &str, key: &str) -> Self {
        Self {
            message: self.message.replace(default_key, key),
            kind: self.kind,
        }
    }

    /// The message, written for the model and the operator.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for NetworkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NetworkError {}
