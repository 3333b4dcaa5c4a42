//! The OCI distribution client: manifests and blobs pulled and pushed over clawcage's own
//! policy-checked HTTP client ([`NetworkPolicy`]), so every hop of every request is judged before
//! it connects. The registry itself is reached as named (plain http only on loopback); a redirect
//! may lead to any public host over https (a registry's content delivery network), never to a
//! loopback, private or link-local address or plain http elsewhere. Credentials are a secret
//! bound to the registry's host and port: they are added to requests for it and to nothing else,
//! not to a redirect's target and not to a token service on another host. Every response is read
//! under a size cap (a manifest's, or exactly the size its descriptor declares) and a time limit,
//! and every manifest and blob is checked against its digest before it is returned.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_sandbox::network::{
    AllowList, NameResolver, NetworkLimits, NetworkPolicy, OutboundRequest, OutboundResponse,
    Secret, SecretValue,
};

use crate::artifact::{IMAGE_INDEX, IMAGE_MANIFEST};
use crate::credentials::Credentials;
use crate::digest::Digest;
use crate::reference::{Reference, is_loopback_registry};

/// Sizes and times of registry traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryLimits {
    /// Largest manifest read.
    pub manifest_bytes: u64,
    /// Largest blob (a component) read or sent.
    pub blob_bytes: u64,
    /// Time to resolve and connect, per hop.
    pub connect_timeout: Duration,
    /// Time for one whole request, its body included.
    pub request_timeout: Duration,
}

impl Default for RegistryLimits {
    fn default() -> Self {
        Self {
            manifest_bytes: 4 << 20,
            // The plugin loader's own limit on a component.
            blob_bytes: 256 << 20,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
        }
    }
}

/// Why a registry request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The registry has no such manifest or blob (404).
    #[error("{0}")]
    NotFound(String),
    /// Anything else: refused, malformed, too large, too slow, a digest that does not match.
    #[error("{0}")]
    Failed(String),
}

fn failed(message: impl Into<String>) -> RegistryError {
    RegistryError::Failed(message.into())
}

/// A manifest as the registry sent it, its digest checked.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// The bytes, exactly as received (the digest is over them).
    pub bytes: Vec<u8>,
    /// The `Content-Type` the registry gave.
    pub content_type: Option<String>,
    /// The digest of `bytes`.
    pub digest: Digest,
}

/// How the registry asked to be authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// A client of one registry.
pub struct RegistryClient {
    registry: String,
    base_url: String,
    credentials: Option<Credentials>,
    limits: RegistryLimits,
    /// `Authorization` values that worked, by scope (`repository:NAME:pull`).
    authorizations: Mutex<BTreeMap<String, String>>,
    resolver: Option<Arc<dyn NameResolver>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("registry", &self.registry)
            .field("credentials", &self.credentials)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl RegistryClient {
    /// A client of the registry `reference` names, sending `credentials` to it alone.
    pub fn new(
        reference: &Reference,
        credentials: Option<Credentials>,
        limits: RegistryLimits,
    ) -> Self {
        Self {
            registry: reference.api_host().to_string(),
            base_url: reference.base_url(),
            credentials,
            limits,
            authorizations: Mutex::new(BTreeMap::new()),
            resolver: None,
        }
    }

    /// This client resolving names with `resolver` (tests).
    pub fn with_resolver(mut self, resolver: Arc<dyn NameResolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// The limits.
    pub fn limits(&self) -> &RegistryLimits {
        &self.limits
    }

    /// The manifest `reference` (a tag or a digest) of `repository`, at most
    /// [`RegistryLimits::manifest_bytes`], its digest checked: against the digest asked for, and
    /// against the digest the registry says it sent.
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<FetchedManifest, RegistryError> {
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.base_url);
        let mut request = OutboundRequest::get(url);
        request.headers.push((
            "accept".to_string(),
            format!("{IMAGE_MANIFEST}, {IMAGE_INDEX}"),
        ));
        let what = format!("the manifest {repository}:{reference}");
        let response = self
            .send(
                request,
                &pull_scope(repository),
                self.limits.manifest_bytes,
                &what,
            )
            .await?;
        let response = expect_status(response, &[200], &what)?;
        if response.truncated {
            return Err(failed(format!(
                "{what} is larger than {} bytes; it is not a plugin's manifest",
                self.limits.manifest_bytes
            )));
        }
        let digest = Digest::of(&response.body);
        if let Ok(asked) = Digest::parse(reference)
            && asked != digest
        {
            return Err(failed(format!(
                "the registry answered {what} with bytes of digest {digest}; refused"
            )));
        }
        if let Some(said) = header(&response, "docker-content-digest")
            && said != digest.to_string()
        {
            return Err(failed(format!(
                "the registry says {what} has digest {said}, but its bytes have {digest}; refused"
            )));
        }
        Ok(FetchedManifest {
            content_type: header(&response, "content-type").map(str::to_string),
            bytes: response.body,
            digest,
        })
    }

    /// The blob `digest` of `repository`, which its descriptor says is `size` bytes: refused
    /// unread when `size` is over the limit, read up to `size` bytes, and checked against the
    /// digest.
    pub async fn blob(
        &self,
        repository: &str,
        digest: &Digest,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        if size > self.limits.blob_bytes {
            return Err(failed(format!(
                "{what} is {} bytes, over the limit of {} bytes; it is not downloaded",
                size, self.limits.blob_bytes
            )));
        }
        let url = format!("{}/v2/{repository}/blobs/{digest}", self.base_url);
        let response = self
            .send(
                OutboundRequest::get(url),
                &pull_scope(repository),
                size,
                what,
            )
            .await?;
        let response = expect_status(response, &[200], what)?;
        if response.truncated {
            return Err(failed(format!(
                "the registry sent more than the {size} bytes {what} is said to have; refused"
            )));
        }
        if response.body.len() as u64 != size {
            return Err(failed(format!(
                "the registry sent {} of the {size} bytes of {what}; refused",
                response.body.len()
            )));
        }
        if !digest.matches(&response.body) {
            return Err(failed(format!(
                "the bytes the registry sent for {what} do not have its digest {digest} (they have {}); refused",
                Digest::of(&response.body)
            )));
        }
        Ok(response.body)
    }

    /// Uploads `bytes` as a blob of `repository` (unless the registry has it already); returns
    /// its digest.
    pub async fn push_blob(
        &self,
        repository: &str,
        bytes: &[u8],
        what: &str,
    ) -> Result<Digest, RegistryError> {
        let digest = Digest::of(bytes);
        let scope = push_scope(repository);
        let head = OutboundRequest {
            method: "HEAD".to_string(),
            ..OutboundRequest::get(format!("{}/v2/{repository}/blobs/{digest}", self.base_url))
        };
        if self.send(head, &scope, 0, what).await?.status == 200 {
            return Ok(digest);
        }
        let start = OutboundRequest {
            method: "POST".to_string(),
            ..OutboundRequest::get(format!("{}/v2/{repository}/blobs/uploads/", self.base_url))
        };
        let started = expect_status(
            self.send(start, &scope, 64 << 10, what).await?,
            &[202],
            what,
        )?;
        let Some(location) = header(&started, "location") else {
            return Err(failed(format!(
                "the registry started the upload of {what} without saying where to send it (no Location)"
            )));
        };
        let mut upload = url::Url::parse(&format!("{}/", self.base_url))
            .and_then(|base| base.join(location))
            .map_err(|error| {
                failed(format!(
                    "the registry's upload location {location:?} is not a URL ({error})"
                ))
            })?;
        upload
            .query_pairs_mut()
            .append_pair("digest", &digest.to_string());
        let put = OutboundRequest {
            method: "PUT".to_string(),
            url: upload.to_string(),
            headers: vec![(
                "content-type".to_string(),
                "application/octet-stream".to_string(),
            )],
            body: Some(bytes.to_vec()),
        };
        expect_status(self.send(put, &scope, 64 << 10, what).await?, &[201], what)?;
        Ok(digest)
    }

    /// Puts `bytes` (of `media_type`) as the manifest `tag` of `repository`; returns its digest.
    pub async fn push_manifest(
        &self,
        repository: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<Digest, RegistryError> {
        let what = format!("the manifest {repository}:{tag}");
        let put = OutboundRequest {
            method: "PUT".to_string(),
            url: format!("{}/v2/{repository}/manifests/{tag}", self.base_url),
            headers: vec![("content-type".to_string(), media_type.to_string())],
            body: Some(bytes.to_vec()),
        };
        expect_status(
            self.send(put, &push_scope(repository), 64 << 10, &what)
                .await?,
            &[201],
            &what,
        )?;
        Ok(Digest::of(bytes))
    }

    /// Sends `request` with the authorization known for `scope`; on a 401, answers the
    /// registry's challenge once and sends it again.
    async fn send(
        &self,
        request: OutboundRequest,
        scope: &str,
        max_bytes: u64,
        what: &str,
    ) -> Result<OutboundResponse, RegistryError> {
        let known = self.known_authorization(scope);
        let response = self
            .send_as(request.clone(), known.clone(), max_bytes, what)
            .await?;
        if response.status != 401 {
            return Ok(response);
        }
        let challenge = header(&response, "www-authenticate")
            .and_then(parse_challenge)
            .ok_or_else(|| {
                failed(format!(
                    "the registry refused {what} (401) without a usable WWW-Authenticate challenge"
                ))
            })?;
        let authorization = match challenge {
            Challenge::Basic => match &self.credentials {
                Some(credentials) => credentials.basic_header(),
                None => return Err(self.needs_credentials(what)),
            },
            Challenge::Bearer {
                realm,
                service,
                scope: asked,
            } => {
                let scope = asked.unwrap_or_else(|| scope.to_string());
                format!(
                    "Bearer {}",
                    self.token(&realm, service.as_deref(), &scope).await?
                )
            }
        };
        if known.as_deref() == Some(authorization.as_str()) {
            return Err(self.refused_credentials(what));
        }
        let response = self
            .send_as(request, Some(authorization.clone()), max_bytes, what)
            .await?;
        if response.status == 401 || response.status == 403 {
            return Err(if self.credentials.is_some() {
                self.refused_credentials(what)
            } else {
                self.needs_credentials(what)
            });
        }
        if let Ok(mut known) = self.authorizations.lock() {
            known.insert(scope.to_string(), authorization);
        }
        Ok(response)
    }

    fn known_authorization(&self, scope: &str) -> Option<String> {
        self.authorizations.lock().ok()?.get(scope).cloned()
    }

    fn needs_credentials(&self, what: &str) -> RegistryError {
        failed(format!(
            "{} asks for credentials for {what}; log in (e.g. `skopeo login {}` or `docker login {}`) so the credentials file has an entry for it",
            self.registry, self.registry, self.registry
        ))
    }

    fn refused_credentials(&self, what: &str) -> RegistryError {
        let source = self
            .credentials
            .as_ref()
            .map(|credentials| format!(" from {}", credentials.source.display()))
            .unwrap_or_default();
        failed(format!(
            "{} refused the credentials{source} for {what}; log in again",
            self.registry
        ))
    }

    /// A bearer token from the registry's token service. The registry's credentials go with the
    /// request only when the service is on the registry's own host and port.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, RegistryError> {
        let mut url = url::Url::parse(realm).map_err(|error| {
            failed(format!(
                "the registry's token service {realm:?} is not a URL ({error})"
            ))
        })?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", scope);
        }
        let realm_host = match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => {
                let host = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]")
                } else {
                    host.to_string()
                };
                let default = if url.scheme() == "http" { 80 } else { 443 };
                if port == default && !self.registry.contains(':') {
                    host
                } else {
                    format!("{host}:{port}")
                }
            }
            _ => {
                return Err(failed(format!(
                    "the registry's token service {realm:?} names no host"
                )));
            }
        };
        let same_host = realm_host.eq_ignore_ascii_case(&self.registry);
        let authorization = self
            .credentials
            .as_ref()
            .filter(|_| same_host)
            .map(Credentials::basic_header);
        let what = format!("a token from {realm}");
        let response = self
            .send_to(
                &realm_host,
                OutboundRequest::get(url.to_string()),
                authorization,
                64 << 10,
                &what,
            )
            .await?;
        let response = expect_status(response, &[200], &what)?;
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            token: Option<String>,
            #[serde(default)]
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&response.body)
            .map_err(|error| failed(format!("{what} is not the expected JSON ({error})")))?;
        token
            .token
            .or(token.access_token)
            .filter(|token| !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| failed(format!("{what} holds no usable token")))
    }

    async fn send_as(
        &self,
        request: OutboundRequest,
        authorization: Option<String>,
        max_bytes: u64,
        what: &str,
    ) -> Result<OutboundResponse, RegistryError> {
        let registry = self.registry.clone();
        self.send_to(&registry, request, authorization, max_bytes, what)
            .await
    }

    /// One request under a policy that allows `host` as named, loopback when the registry is on
    /// loopback, and any public host over https; `authorization` goes to `host` alone.
    async fn send_to(
        &self,
        host: &str,
        request: OutboundRequest,
        authorization: Option<String>,
        max_bytes: u64,
        what: &str,
    ) -> Result<OutboundResponse, RegistryError> {
        // The registry as named; another host (a token service) only as any public host is.
        let mut entries = Vec::new();
        if host == self.registry {
            entries.push(if is_loopback_registry(host) {
                format!("http://{host}")
            } else {
                host.to_string()
            });
        }
        if is_loopback_registry(&self.registry) {
            entries.extend(
                ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"].map(str::to_string),
            );
        }
        let allow = AllowList::parse(&entries)
            .map_err(|error| failed(format!("the registry {host} cannot be reached: {error}")))?
            .with_any_public_host();
        let mut policy = NetworkPolicy::new(allow).with_limits(NetworkLimits {
            connect_timeout: self.limits.connect_timeout,
            total_timeout: self.limits.request_timeout,
            max_response_bytes: max_bytes,
            max_request_bytes: request.body.as_ref().map_or(0, |body| body.len() as u64),
            ..NetworkLimits::default()
        });
        if let Some(resolver) = &self.resolver {
            policy = policy.with_resolver(resolver.clone());
        }
        if let Some(value) = authorization {
            let secret = Secret::new(
                host,
                "authorization",
                SecretValue::new(value),
                "the registry credentials",
            )
            .map_err(|error| failed(error.to_string()))?;
            policy = policy.with_secrets(vec![secret]);
        }
        policy.send(request).await.map_err(|error| {
            // The policy's advice names the tools' allow-list, which does not govern installs.
            let message = error.message();
            let message = message
                .split(". To allow it, add")
                .next()
                .unwrap_or(message);
            failed(format!("{what}: {message}"))
        })
    }
}

fn pull_scope(repository: &str) -> String {
    format!("repository:{repository}:pull")
}

fn push_scope(repository: &str) -> String {
    format!("repository:{repository}:pull,push")
}

fn header<'a>(response: &'a OutboundResponse, name: &str) -> Option<&'a str> {
    response
        .headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// `response` when its status is one of `expected`; otherwise an error with the registry's own
/// message (the OCI error body's first `message`), 404 as [`RegistryError::NotFound`].
fn expect_status(
    response: OutboundResponse,
    expected: &[u16],
    what: &str,
) -> Result<OutboundResponse, RegistryError> {
    if expected.contains(&response.status) {
        return Ok(response);
    }
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorEntry>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorEntry {
        #[serde(default)]
        message: String,
    }
    let said = serde_json::from_slice::<Errors>(&response.body)
        .ok()
        .and_then(|errors| errors.errors.into_iter().next())
        .map(|entry| {
            // The registry's words, on one line and without control characters.
            entry
                .message
                .chars()
                .take(200)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
        })
        .filter(|message| !message.is_empty())
        .map(|message| format!(": {message}"))
        .unwrap_or_default();
    let message = format!("the registry answered {} for {what}{said}", response.status);
    Err(if response.status == 404 {
        RegistryError::NotFound(message)
    } else {
        failed(message)
    })
}

/// Parses a `WWW-Authenticate` value: `Basic ...` or `Bearer realm="...",service="...",scope="..."`.
fn parse_challenge(value: &str) -> Option<Challenge> {
    let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = BTreeMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        params.insert(key, value.to_string());
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: params.remove("realm")?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(parse_challenge("Basic realm=\"x\""), Some(Challenge::Basic));
        assert_eq!(
            parse_challenge(
                "Bearer realm=\"https://auth.example/token\",service=\"reg\",scope=\"repository:a/b:pull\""
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".to_string(),
                service: Some("reg".to_string()),
                scope: Some("repository:a/b:pull".to_string()),
            })
        );
        assert_eq!(parse_challenge("Bearer service=\"x\""), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge("Bearer realm=\"unterminated"), None);
    }
}
