//! The `[network]` and `[web]` sections of the configuration and their translation into the web
//! component's grants: the allow-list, the secrets (read from the environment here, on the host,
//! and never handed to a component), the timeouts and body cap, and the search endpoint, which is
//! not secret and reaches the component as the setting `CLAWCAGE_SEARCH_ENDPOINT`.
//!
//! ```toml
//! [network]
//! allow = ["example.com", "*.example.org", "api.search.brave.com"]
//! connect_timeout_secs = 10
//! timeout_secs = 20
//! max_response_bytes = 5242880
//!
//! [[network.secrets]]
//! host = "api.search.brave.com"
//! header = "X-Subscription-Token"
//! env = "BRAVE_API_KEY"
//!
//! [web]
//! search_endpoint = "https://api.search.brave.com/res/v1/web/search"
//! ```

use std::time::Duration;

use anyhow::{Context as _, bail};
use clawcage_sandbox::network::{AllowList, NetworkLimits, NetworkPolicy, Secret, SecretValue};
use serde::Deserialize;

/// The Brave Search API host, whose key is read from `BRAVE_API_KEY` unless the config names
/// another source.
const BRAVE_HOST: &str = "api.search.brave.com";
const BRAVE_HEADER: &str = "X-Subscription-Token";
const BRAVE_ENV: &str = clawcage_core::BRAVE_API_KEY_ENV;

/// `[network]`: where outbound HTTP may go.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// Hosts that may be reached: `host`, `host:port`, `*.domain`, IP literals, optionally
    /// after `http://` to allow plain HTTP. Empty: nothing.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Headers the host adds for one host each, with values from the environment.
    #[serde(default)]
    pub secrets: Vec<SecretSection>,
    /// Seconds to resolve and connect (default 10).
    pub connect_timeout_secs: Option<f64>,
    /// Seconds for a whole request, redirects and body included (default 20).
    pub timeout_secs: Option<f64>,
    /// Bytes of a response body read; the rest is cut (default 5 MiB).
    pub max_response_bytes: Option<u64>,
}

/// `[[network.secrets]]`: one header added to requests for one host.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSection {
    /// The host (name or address, optionally `:PORT`) the secret belongs to.
    pub host: String,
    /// The header to add, e.g. `X-Subscription-Token` or `Authorization`.
    pub header: String,
    /// The environment variable holding the value.
    pub env: String,
}

/// `[web]`: settings of the web tools.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSection {
    /// The Brave-compatible search API endpoint (default the Brave Search web endpoint).
    pub search_endpoint: Option<String>,
}

impl NetworkSection {
    /// The network policy these settings describe. Secret values are read with `env`; a secret
    /// whose variable is unset is left out with a warning (requests then go without it).
    pub fn policy(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<NetworkPolicy> {
        let allow = AllowList::parse(&self.allow).map_err(anyhow::Error::new)?;
        for warning in broad_entries(&self.allow) {
            tracing::warn!("{warning}");
        }
        let mut secrets = Vec::new();
        let mut configured = self.secrets.iter().collect::<Vec<_>>();
        let default_brave = SecretSection {
            host: BRAVE_HOST.to_string(),
            header: BRAVE_HEADER.to_string(),
            env: BRAVE_ENV.to_string(),
        };
        if !configured
            .iter()
            .any(|secret| secret.host.trim().eq_ignore_ascii_case(BRAVE_HOST))
        {
            configured.push(&default_brave);
        }
        for secret in configured {
            let is_default = std::ptr::eq(secret, &default_brave);
            let Some(value) = env(&secret.env).filter(|value| !value.is_empty()) else {
                if !is_default {
                    tracing::warn!(
                        "[[network.secrets]] for {}: the environment variable {} is not set; requests to {} go without {}",
                        secret.host,
                        secret.env,
                        secret.host,
                        secret.header
                    );
                }
                continue;
            };
            let parsed = Secret::new(
                &secret.host,
                &secret.header,
                SecretValue::new(value),
                &secret.env,
            )
            .map_err(anyhow::Error::new)?;
            secrets.push(parsed);
        }
        Ok(NetworkPolicy::new(allow)
            .with_secrets(secrets)
            .with_limits(self.limits()?))
    }

    /// The limits, checked.
    pub fn limits(&self) -> anyhow::Result<NetworkLimits> {
        let defaults = NetworkLimits::default();
        let seconds = |value: Option<f64>, key: &str, default: Duration| match value {
            None => Ok(default),
            Some(seconds) if seconds > 0.0 && seconds <= 600.0 => {
                Ok(Duration::from_secs_f64(seconds))
            }
            Some(seconds) => bail!(
                "[network] {key} = {seconds} is out of range; use more than 0 and at most 600"
            ),
        };
        let max_response_bytes = match self.max_response_bytes {
            None => defaults.max_response_bytes,
            Some(bytes) if (1024..=1 << 30).contains(&bytes) => bytes,
            Some(bytes) => bail!(
                "[network] max_response_bytes = {bytes} is out of range; use 1024 to 1073741824"
            ),
        };
        Ok(NetworkLimits {
            connect_timeout: seconds(
                self.connect_timeout_secs,
                "connect_timeout_secs",
                defaults.connect_timeout,
            )?,
            total_timeout: seconds(self.timeout_secs, "timeout_secs", defaults.total_timeout)?,
            max_response_bytes,
            ..defaults
        })
    }
}

/// A warning for each allow entry that covers a whole top-level domain (`*.com`, `*.io`): legal,
/// but almost never what the operator means.
pub fn broad_entries(allow: &[String]) -> Vec<String> {
    allow
        .iter()
        .filter_map(|entry| {
            let host = entry
                .trim()
                .trim_start_matches("http://")
                .trim_start_matches("https://");
            let suffix = host.strip_prefix("*.")?;
            let name = suffix.split(':').next().unwrap_or(suffix);
            (!name.contains('.')).then(|| {
                format!(
                    "[network] allow entry {entry:?} allows every host under the top-level domain .{name}; list the domains you mean instead, e.g. \"*.example.{name}\""
                )
            })
        })
        .collect()
}

impl WebSection {
    /// The search endpoint to hand to the web component, checked to be an http(s) URL.
    pub fn search_endpoint(&self) -> anyhow::Result<Option<String>> {
        let Some(endpoint) = &self.search_endpoint else {
            return Ok(None);
        };
        let url = clawcage_sandbox::network::parse_url(endpoint)
            .map_err(|error| anyhow::anyhow!("{error}"))
            .with_context(|| format!("[web] search_endpoint = {endpoint:?} is not usable"))?;
        Ok(Some(url.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_section_is_parsed_and_checked() {
        let config: NetworkSection = toml::from_str(
            r#"
            allow = ["example.com", "*.example.org", "127.0.0.1:8080"]
            timeout_secs = 5
            [[secrets]]
            host = "api.example.com"
            header = "X-Key"
            env = "EXAMPLE_KEY"
            "#,
        )
        .unwrap();
        let policy = config
            .policy(|name| (name == "EXAMPLE_KEY").then(|| "v4lue".to_string()))
            .unwrap();
        assert_eq!(policy.limits().total_timeout, Duration::from_secs(5));
        assert_eq!(policy.secrets().len(), 1);
        let shown = policy.describe();
        assert!(
            shown.contains("example.com, *.example.org, 127.0.0.1:8080"),
            "{shown}"
        );
        assert!(
            shown.contains("x-key for api.example.com (from EXAMPLE_KEY)"),
            "{shown}"
        );
        assert!(!shown.contains("v4lue"), "{shown}");

        // No value in the environment: the secret is left out.
        assert!(config.policy(|_| None).unwrap().secrets().is_empty());
    }

    #[test]
    fn a_whole_top_level_domain_is_warned_about() {
        let warnings = broad_entries(&[
            "*.com".to_string(),
            "http://*.io:8080".to_string(),
            "*.example.org".to_string(),
            "example.com".to_string(),
        ]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains(".com"), "{warnings:?}");
        assert!(warnings[1].contains(".io"), "{warnings:?}");
    }

    #[test]
    fn brave_search_gets_its_key_from_brave_api_key_by_default() {
        let config = NetworkSection::default();
        let policy = config
            .policy(|name| (name == "BRAVE_API_KEY").then(|| "k".to_string()))
            .unwrap();
        assert_eq!(policy.secrets().len(), 1);
        assert!(
            policy.secrets()[0]
                .describe()
                .contains("api.search.brave.com")
        );
        assert!(config.policy(|_| None).unwrap().secrets().is_empty());
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        let bad: NetworkSection = toml::from_str("allow = [\"example.com/path\"]").unwrap();
        let error = bad.policy(|_| None).unwrap_err().to_string();
        assert!(error.contains("[network] allow entry"), "{error}");
        let bad: NetworkSection = toml::from_str("timeout_secs = 0").unwrap();
        assert!(
            bad.limits()
                .unwrap_err()
                .to_string()
                .contains("timeout_secs")
        );
        assert!(toml::from_str::<NetworkSection>("alow = []").is_err());
        assert!(
            toml::from_str::<NetworkSection>(
                "[[secrets]]\nhost = \"a\"\nheader = \"b\"\nenv = \"c\"\nvalue = \"d\""
            )
            .is_err()
        );
        let web = WebSection {
            search_endpoint: Some("ftp://x/".to_string()),
        };
        assert!(web.search_endpoint().is_err());
    }
}
