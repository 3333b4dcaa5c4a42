//! `oci://REGISTRY/REPOSITORY:TAG` and `oci://REGISTRY/REPOSITORY@sha256:DIGEST`: what an operator
//! names to install a plugin, parsed strictly (the OCI distribution grammar for repositories and
//! tags, a registry host with an optional port) so nothing odd reaches a URL. Plain http is used
//! only for a registry on the loopback interface. Docker Hub is named as Docker names it
//! (`docker.io`, a one-part repository meaning `library/NAME`) and reached at its API host.

use std::fmt;

use crate::digest::Digest;

/// The names of Docker Hub, whose API is at [`DOCKER_HUB_API`].
const DOCKER_HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
/// Docker Hub's registry API host.
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// The key Docker's credentials files keep Docker Hub's credentials under (normalised).
const DOCKER_HUB_CREDENTIALS: &str = "index.docker.io";

/// A parsed `oci://` reference. It names a tag, a digest or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host` or `host:port`, lower case.
    pub registry: String,
    /// `path/to/repo`, lower case.
    pub repository: String,
    /// The tag, when one is named.
    pub tag: Option<String>,
    /// The digest, when one is named: it is what is pulled, whatever the tag says.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
    pub fn parse(text: &str) -> Result<Reference, String> {
        let usage = "write oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST, e.g. oci://ghcr.io/acme/weather:1.0.0";
        let Some(rest) = text.trim().strip_prefix("oci://") else {
            return Err(format!("{text:?} is not an oci:// reference; {usage}"));
        };
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => (
                rest,
                Some(Digest::parse(digest).map_err(|error| format!("{text:?}: {error}"))?),
            ),
            None => (rest, None),
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(format!("{text:?} names no repository; {usage}"));
        };
        let registry = check_registry(registry).map_err(|error| format!("{text:?}: {error}"))?;
        // A colon after the last slash starts the tag.
        let last_slash = path.rfind('/').map_or(0, |index| index + 1);
        let (repository, tag) = match path[last_slash..].find(':') {
            Some(colon) => {
                let colon = last_slash + colon;
                (&path[..colon], Some(path[colon + 1..].to_string()))
            }
            None => (path, None),
        };
        check_repository(repository).map_err(|error| format!("{text:?}: {error}"))?;
        // Docker Hub's official images live under `library/`.
        let repository = if DOCKER_HUB.contains(&registry.as_str()) && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository.to_string()
        };
        if let Some(tag) = &tag {
            check_tag(tag).map_err(|error| format!("{text:?}: {error}"))?;
        }
        if tag.is_none() && digest.is_none() {
            return Err(format!(
                "{text:?} names neither a tag nor a digest; name the version to install, e.g. {text}:1.0.0"
            ));
        }
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What a manifest request names: the digest when there is one, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// This reference pinned to `digest` (the tag kept, for people to read).
    pub fn pinned(&self, digest: &Digest) -> Reference {
        Reference {
            digest: Some(digest.clone()),
            ..self.clone()
        }
    }

    /// This reference without its digest: what `plugins update` resolves again.
    pub fn unpinned(&self) -> Reference {
        Reference {
            digest: None,
            ..self.clone()
        }
    }

    /// Whether the registry is on the loopback interface (where plain http is used).
    pub fn is_loopback(&self) -> bool {
        is_loopback_registry(&self.registry)
    }

    /// The host (and port) the registry's API answers at: the registry as named, Docker Hub's
    /// API host for Docker Hub.
    pub fn api_host(&self) -> &str {
        if DOCKER_HUB.contains(&self.registry.as_str()) {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// The registry as credentials files name it (Docker Hub's own key for Docker Hub).
    pub fn credentials_key(&self) -> &str {
        if DOCKER_HUB.contains(&self.registry.as_str()) {
            DOCKER_HUB_CREDENTIALS
        } else {
            &self.registry
        }
    }

    /// `http://API-HOST` on loopback, else `https://API-HOST`.
    pub fn base_url(&self) -> String {
        let scheme = if self.is_loopback() { "http" } else { "https" };
        format!("{scheme}://{}", self.api_host())
    }

    /// `REGISTRY/REPOSITORY`, as a signature's claims name the image.
    pub fn docker_reference(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Whether `registry` (`host[:port]`) is on the loopback interface.
pub fn is_loopback_registry(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => registry.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn check_registry(registry: &str) -> Result<String, String> {
    let lower = registry.to_ascii_lowercase();
    let parsed = url::Url::parse(&format!("https://{lower}/"))
        .map_err(|error| format!("the registry {registry:?} is not a host[:port] ({error})"))?;
    let clean = parsed.username().is_empty()
        && parsed.password().is_none()
        && parsed.path() == "/"
        && parsed.query().is_none()
        && parsed.host_str().is_some();
    if !clean || lower.contains(['@', '?', '#', '\\']) || lower.is_empty() {
        return Err(format!(
            "the registry {registry:?} must be a host with an optional port"
        ));
    }
    Ok(lower)
}

/// The OCI distribution grammar: path components of `[a-z0-9]+` joined by `.`, `_`, `__` or
/// runs of `-`, separated by `/`, at most 255 characters.
fn check_repository(repository: &str) -> Result<(), String> {
    let fail = || {
        Err(format!(
            "the repository {repository:?} must be lower-case path components of a-z, 0-9 joined by `.`, `_` or `-`, separated by `/`"
        ))
    };
    if repository.is_empty() || repository.len() > 255 {
        return fail();
    }
    for component in repository.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
            return fail();
        }
        let mut index = 0;
        while index < bytes.len() {
            let b = bytes[index];
            if alnum(b) {
                index += 1;
                continue;
            }
            // A separator: `.`, `_`, `__` or `-`+, always followed by an alphanumeric.
            let run_end = match b {
                b'.' => index + 1,
                b'_' if bytes.get(index + 1) == Some(&b'_') => index + 2,
                b'_' => index + 1,
                b'-' => bytes[index..]
                    .iter()
                    .position(|&c| c != b'-')
                    .map_or(bytes.len(), |run| index + run),
                _ => return fail(),
            };
            if !bytes.get(run_end).copied().is_some_and(alnum) {
                return fail();
            }
            index = run_end;
        }
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the tag {tag:?} must be 1-128 characters of letters, digits, `.`, `_` and `-`, not starting with `.` or `-`"
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    #[test]
    fn references_with_a_tag_a_digest_or_both_parse() {
        let tagged = Reference::parse("oci://127.0.0.1:5000/acme/tools/weather:1.0.0").unwrap();
        assert_eq!(tagged.registry, "127.0.0.1:5000");
        assert_eq!(tagged.repository, "acme/tools/weather");
        assert_eq!(tagged.tag.as_deref(), Some("1.0.0"));
        assert!(tagged.is_loopback());
        assert_eq!(tagged.base_url(), "http://127.0.0.1:5000");
        assert_eq!(tagged.manifest_reference(), "1.0.0");
        let digest = format!("sha256:{}", "ab".repeat(32));
        let both = Reference::parse(&format!("oci://ghcr.io/acme/weather:1.0@{digest}")).unwrap();
        assert_eq!(both.manifest_reference(), digest);
        assert_eq!(both.base_url(), "https://ghcr.io");
        assert!(!both.is_loopback());
        assert_eq!(
            both.to_string(),
            format!("oci://ghcr.io/acme/weather:1.0@{digest}")
        );
        assert_eq!(
            both.unpinned().to_string(),
            "oci://ghcr.io/acme/weather:1.0"
        );
        assert!(
            Reference::parse("oci://localhost/a__b-c.d/e---f:v1")
                .unwrap()
                .is_loopback()
        );
        assert!(
            Reference::parse("oci://[::1]:5000/a:v")
                .unwrap()
                .is_loopback()
        );
    }

    #[test]
    fn docker_hub_is_named_as_docker_names_it() {
        let official = Reference::parse("oci://docker.io/weather:1").unwrap();
        assert_eq!(official.repository, "library/weather");
        assert_eq!(official.base_url(), "https://registry-1.docker.io");
        assert_eq!(official.credentials_key(), "index.docker.io");
        assert_eq!(official.to_string(), "oci://docker.io/library/weather:1");
        let user = Reference::parse("oci://docker.io/acme/weather:1").unwrap();
        assert_eq!(user.repository, "acme/weather");
        assert_eq!(user.api_host(), "registry-1.docker.io");
        let other = Reference::parse("oci://ghcr.io/weather:1").unwrap();
        assert_eq!(other.repository, "weather");
        assert_eq!(other.api_host(), "ghcr.io");
        assert_eq!(other.credentials_key(), "ghcr.io");
    }

    #[test]
    fn malformed_references_are_refused_with_the_expected_form() {
        for bad in [
            "ghcr.io/acme/weather:1.0",
            "oci://ghcr.io/acme/weather",
            "oci://ghcr.io",
            "oci://user:pw@ghcr.io/acme/weather:1",
            "oci://ghcr.io/Acme/weather:1",
            "oci://ghcr.io/acme/../weather:1",
            "oci://ghcr.io/acme//weather:1",
            "oci://ghcr.io/acme/weather:-1",
            "oci://ghcr.io/acme/weather:1@sha256:short",
            "oci://ghcr.io/acme/weather@md5:00",
            "oci://ghcr.io/acme/weather:a b",
            "oci://ghcr.io/acme_/weather:1",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad} was accepted");
        }
        let error = Reference::parse("oci://ghcr.io/acme/weather").unwrap_err();
        assert!(error.contains("neither a tag nor a digest"), "{error}");
    }
}
