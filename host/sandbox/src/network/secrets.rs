//! Secrets the host adds to requests on a component's behalf: a header (such as
//! `X-Subscription-Token`) whose value comes from the operator's environment, sent only to the
//! one host it belongs to. The value lives in a [`SecretValue`], whose `Debug` and `Display` print
//! `[redacted]`; it is handed to the HTTP client as a header marked sensitive and is never
//! written to a log, an error or anything a component can read. A host that reflects the request
//! (an echo service, a debugging endpoint) would hand the value back, so every response is
//! scrubbed of the policy's secrets before a component sees it: `redactor_for` builds the
//! scrubber and `scrub_headers` applies it to header fields.

use std::fmt;

use clawcage_core::redact::{MIN_SECRET_BYTES, Redactor};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::policy::{Target, TargetHost, parse_exact_host};

/// A secret's value. Printing it shows `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wrap `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that uses it (a header, a request's URL, a signature).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a secret could not be configured. Never contains the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[[network.secrets]] entry for host {host:?}: {reason}")]
pub struct SecretError {
    /// The host as written.
    pub host: String,
    /// What is wrong.
    pub reason: String,
}

/// One header the host adds to requests for one host.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    host: TargetHost,
    port: Option<u16>,
    header: HeaderName,
    value: HeaderValue,
    source: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("header", &self.header)
            .field("value", &"[redacted]")
            .field("source", &self.source)
            .finish()
    }
}

impl Secret {
    /// A secret header `header: value` for requests to `host` (a name or address, optionally
    /// `:PORT`; without a port, every port). `source` names where the value came from (an
    /// environment variable), for messages.
    pub fn new(
        host: &str,
        header: &str,
        value: SecretValue,
        source: &str,
    ) -> Result<Secret, SecretError> {
        let fail = |reason: String| SecretError {
            host: host.to_string(),
            reason,
        };
        let (target_host, port) =
            parse_exact_host(host).map_err(|reason| fail(format!("host: {reason}")))?;
        let header = HeaderName::from_bytes(header.trim().as_bytes())
            .map_err(|_| fail(format!("header {header:?} is not a valid header name")))?;
        let mut value = HeaderValue::from_str(&value.0).map_err(|_| {
            fail(format!(
                "the value of {source} is not a valid header value (control characters or non-ASCII?)"
            ))
        })?;
        value.set_sensitive(true);
        Ok(Secret {
            host: target_host,
            port,
            header,
            value,
            source: source.to_string(),
        })
    }

    /// Whether this secret belongs to the destination of `target`.
    pub(crate) fn applies_to(&self, target: &Target) -> bool {
        self.host == target.host && self.port.is_none_or(|port| port == target.port)
    }

    /// The header's name.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The header's value, marked sensitive.
    pub(crate) fn value(&self) -> &HeaderValue {
        &self.value
    }

    /// Where the value came from (an environment variable): the label its scrubbed
    /// occurrences show, e.g. `[redacted: BRAVE_API_KEY]`.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The host (and port, if one was named) the secret is sent to, e.g. `api.search.brave.com`.
    pub fn host(&self) -> String {
        let port = self.port.map(|port| format!(":{port}")).unwrap_or_default();
        format!("{}{port}", self.host)
    }

    /// One line without the value, e.g. `X-Subscription-Token for api.search.brave.com (from
    /// BRAVE_API_KEY)`.
    pub fn describe(&self) -> String {
        let port = self.port.map(|port| format!(":{port}")).unwrap_or_default();
        format!(
            "{} for {}{port} (from {})",
            self.header, self.host, self.source
        )
    }
}

/// The scrubber for `secrets`: each value, labelled with where it came from. With `warn`, a
/// value too short to scrub is reported in the log (never the value itself).
pub(crate) fn redactor_for(secrets: &[Secret], warn: bool) -> Redactor {
    let redactor = Redactor::new(
        secrets
            .iter()
            .map(|secret| (secret.source.clone(), secret.value.as_bytes())),
    );
    if warn {
        for source in redactor.skipped() {
            tracing::warn!(
                target: "clawcage::network",
                "the value of {source} is shorter than {MIN_SECRET_BYTES} bytes: it is sent, but it cannot be scrubbed from responses without mangling them, so a host that echoes it back shows it to the model; use the full key"
            );
        }
    }
    redactor
}

/// Response header fields as a component may see them: every value scrubbed, and fields whose
/// name contains a secret (names are lower-cased, so they cannot be rewritten) left out.
pub(crate) fn scrub_headers(redactor: &Redactor, headers: &HeaderMap) -> HeaderMap {
    if redactor.is_empty() {
        return headers.clone();
    }
    let mut scrubbed = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let Some(label) = redactor.mentioned_ignoring_case(name.as_str().as_bytes()) {
            tracing::warn!(
                target: "clawcage::network",
                "a response header named after the value of {label} was left out"
            );
            continue;
        }
        if !redactor.contains(value.as_bytes()) {
            scrubbed.append(name.clone(), value.clone());
            continue;
        }
        match HeaderValue::from_bytes(&redactor.redact_bytes(value.as_bytes())) {
            Ok(value) => {
                scrubbed.append(name.clone(), value);
            }
            Err(_) => {
                tracing::warn!(
                    target: "clawcage::network",
                    header = %name,
                    "a response header holding a secret could not be rewritten and was left out"
                );
            }
        }
    }
    scrubbed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_never_print() {
        let value = SecretValue::new("s3cr3t-value");
        assert_eq!(format!("{value:?} {value}"), "[redacted] [redacted]");
        let secret = Secret::new("api.example.com", "X-Token", value, "EXAMPLE_KEY").unwrap();
        let shown = format!("{secret:?} {}", secret.describe());
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(
            shown.contains("x-token for api.example.com (from EXAMPLE_KEY)"),
            "{shown}"
        );
        assert!(secret.value().is_sensitive());
    }

    #[test]
    fn bad_secrets_are_explained_without_the_value() {
        let error = Secret::new(
            "api.example.com",
            "X-Token",
            SecretValue::new("line\nbreak-s3cr3t"),
            "EXAMPLE_KEY",
        )
        .unwrap_err();
        assert!(!error.to_string().contains("s3cr3t"), "{error}");
        assert!(error.to_string().contains("EXAMPLE_KEY"), "{error}");
        assert!(Secret::new("*.example.com", "X", SecretValue::new("v"), "K").is_err());
        assert!(Secret::new("example.com", "bad header", SecretValue::new("v"), "K").is_err());
    }

    #[test]
    fn response_headers_are_scrubbed_of_secret_values() {
        let value = "s3cr3t-value-42";
        let secret = Secret::new(
            "api.example.com",
            "X-Token",
            SecretValue::new(value),
            "EXAMPLE_KEY",
        )
        .unwrap();
        let redactor = redactor_for(&[secret], false);
        let mut headers = HeaderMap::new();
        headers.append(
            "x-echo",
            HeaderValue::from_str(&format!("token={value}")).unwrap(),
        );
        headers.append(
            "location",
            HeaderValue::from_str(&format!("/next?k={value}")).unwrap(),
        );
        headers.append("content-type", HeaderValue::from_static("text/plain"));
        headers.append(
            HeaderName::from_bytes(format!("x-{value}").as_bytes()).unwrap(),
            HeaderValue::from_static("1"),
        );
        let scrubbed = scrub_headers(&redactor, &headers);
        assert_eq!(scrubbed.len(), 3);
        assert_eq!(scrubbed["x-echo"], "token=[redacted: EXAMPLE_KEY]");
        assert_eq!(scrubbed["location"], "/next?k=[redacted: EXAMPLE_KEY]");
        assert_eq!(scrubbed["content-type"], "text/plain");
        // Without secrets nothing changes.
        assert_eq!(scrub_headers(&Redactor::default(), &headers), headers);
    }
}
