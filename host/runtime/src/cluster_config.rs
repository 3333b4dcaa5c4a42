//! `[cluster]` in the config: the NATS servers several gateway hosts share their sessions
//! through, this host's id, the credentials and TLS to reach them, and how many replicas the
//! streams and buckets keep. Checked here, so a bad value is a configuration error at start-up
//! that names the key. Without the section nothing changes and no server is needed; with it,
//! `clawcage gateway` keeps its sessions on JetStream and the commands that change shared
//! records (cron, pairing, approvals) change the cluster's.

use std::path::{Path, PathBuf};

use anyhow::bail;
use serde::Deserialize;

/// `[cluster]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// The NATS servers: `nats://host:4222`, several separated by commas.
    pub nats: Option<String>,
    /// This host's id among the cluster's (default: the machine's host name).
    pub host_id: Option<String>,
    /// A NATS credentials file (a user JWT and its nkey seed); relative to this file.
    pub credentials: Option<PathBuf>,
    /// Refuse servers that do not offer TLS (default false; `tls://` URLs require it too).
    pub tls_required: Option<bool>,
    /// PEM file of the certificate authorities to trust instead of the system's.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's PEM key.
    pub tls_key: Option<PathBuf>,
    /// Replicas of every stream and bucket (default 1; 3 on a production cluster of 3 servers).
    pub replicas: Option<usize>,
    /// Seconds a lease lasts without renewal (default 10): how long a dead host's sessions
    /// wait for another host. Every host of a cluster must say the same.
    pub lease_secs: Option<u64>,
    /// Where the other hosts reach this host's gateway (`http://HOST:PORT/`), to relay their
    /// clients to it while it is active (default: the address it listens on).
    pub advertise_url: Option<String>,
    /// How the hosts share the sessions: `"active-standby"` (the default: one host serves
    /// every session, the others relay to it and take over when it dies) or `"partitions"`
    /// (every host serves its share of the sessions' 64 partitions at once; early: a client
    /// sends to the host serving its session).
    pub serve: Option<String>,
}

/// How the hosts of a cluster share the sessions (`[cluster] serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServeMode {
    /// One host serves every session; the others wait as standbys, relaying their clients.
    #[default]
    ActiveStandby,
    /// Every host serves the sessions of the partitions it owns, at once.
    Partitions,
}

/// `[cluster]` checked, with its paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The NATS servers.
    pub nats: String,
    /// This host's id.
    pub host_id: String,
    /// The credentials file.
    pub credentials: Option<PathBuf>,
    /// Refuse servers without TLS.
    pub tls_required: bool,
    /// The authorities to trust.
    pub tls_ca: Option<PathBuf>,
    /// The client certificate and its key.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// Replicas of every stream and bucket.
    pub replicas: usize,
    /// Seconds a lease lasts without renewal.
    pub lease_secs: u64,
    /// Where the other hosts reach this host's gateway (`http://HOST:PORT/`), when set.
    pub advertise_url: Option<String>,
    /// How the hosts share the sessions.
    pub serve: ServeMode,
}

/// The longest host id.
const MAX_HOST_ID: usize = 64;

impl ClusterSection {
    /// The settings, `None` without `nats` (no cluster); paths relative to `config_dir`.
    pub fn settings(&self, config_dir: Option<&Path>) -> anyhow::Result<Option<ClusterSettings>> {
        let Some(nats) = self.nats.as_deref() else {
            let stray = self.host_id.is_some()
                || self.credentials.is_some()
                || self.tls_ca.is_some()
                || self.tls_cert.is_some()
                || self.tls_key.is_some()
                || self.replicas.is_some()
                || self.lease_secs.is_some()
                || self.tls_required.is_some()
                || self.advertise_url.is_some()
                || self.serve.is_some();
            if stray {
                bail!(
                    "[cluster] has settings but no `nats` servers; add nats = \"nats://HOST:4222\", or remove the section"
                );
            }
            return Ok(None);
        };
        let servers: Vec<&str> = nats.split(',').map(str::trim).collect();
        if servers.iter().any(|server| {
            server.is_empty()
                || !["nats://", "tls://", "ws://", "wss://"]
                    .iter()
                    .any(|scheme| server.starts_with(scheme))
        }) {
            bail!(
                "[cluster] nats = {nats:?} is not a list of server URLs; use nats://HOST:PORT (or tls://), several separated by commas"
            );
        }
        let host_id = match &self.host_id {
            Some(id) => id.clone(),
            None => default_host_id(),
        };
        if host_id.is_empty()
            || host_id.len() > MAX_HOST_ID
            || !host_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!(
                "[cluster] host_id = {host_id:?} is not valid; use 1 to {MAX_HOST_ID} letters, digits, `-` or `_`, unique in the cluster"
            );
        }
        let resolve = |path: &PathBuf| match config_dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.clone(),
        };
        let tls_client = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((resolve(cert), resolve(key))),
            (None, None) => None,
            _ => bail!("[cluster] tls_cert and tls_key go together: give both, or neither"),
        };
        let replicas = match self.replicas {
            None => 1,
            Some(n) if (1..=5).contains(&n) => n,
            Some(n) => bail!(
                "[cluster] replicas = {n} is out of range; use 1 to 5 (3 on a cluster of 3 servers)"
            ),
        };
        let lease_secs = match self.lease_secs {
            None => 10,
            Some(n) if (2..=300).contains(&n) => n,
            Some(n) => bail!("[cluster] lease_secs = {n} is out of range; use 2 to 300"),
        };
        let advertise_url = self
            .advertise_url
            .as_deref()
            .map(|url| {
                let authority = url
                    .strip_prefix("http://")
                    .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
                    .filter(|authority| {
                        authority.rsplit_once(':').is_some_and(|(host, port)| {
                            !host.is_empty()
                                && !host.contains(['/', '@', '?', '#'])
                                && port.parse::<u16>().is_ok_and(|port| port > 0)
                        })
                    });
                match authority {
                    Some(authority) => Ok(format!("http://{authority}/")),
                    None => bail!(
                        "[cluster] advertise_url = {url:?} is not valid; use http://HOST:PORT/, the address the other hosts reach this gateway at"
                    ),
                }
            })
            .transpose()?;
        let serve = match self.serve.as_deref() {
            None | Some("active-standby") => ServeMode::ActiveStandby,
            Some("partitions") => ServeMode::Partitions,
            Some(other) => bail!(
                "[cluster] serve = {other:?} is not known; use \"active-standby\" (one host serves, the others take over) or \"partitions\" (every host serves its share)"
            ),
        };
        Ok(Some(ClusterSettings {
            nats: nats.to_string(),
            host_id,
            credentials: self.credentials.as_ref().map(resolve),
            tls_required: self.tls_required.unwrap_or(false)
                || servers.iter().any(|server| server.starts_with("tls://")),
            tls_ca: self.tls_ca.as_ref().map(resolve),
            tls_client,
            replicas,
            lease_secs,
            advertise_url,
            serve,
        }))
    }
}

/// The machine's host name, made a valid host id (`host` when there is none).
fn default_host_id() -> String {
    let name = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_string());
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_HOST_ID)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> ClusterSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn no_servers_no_cluster_and_stray_settings_are_named() {
        assert_eq!(section("").settings(None).unwrap(), None);
        let error = section("host_id = \"a\"")
            .settings(None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("no `nats` servers"), "{error}");
    }

    #[test]
    fn settings_are_checked_and_paths_resolved() {
        let settings = section(
            "nats = \"nats://127.0.0.1:4222, tls://n2:4222\"\nhost_id = \"gw-1\"\ncredentials = \"c.creds\"\ntls_cert = \"/abs/cert.pem\"\ntls_key = \"k.pem\"\nreplicas = 3\n",
        )
        .settings(Some(Path::new("/etc/clawcage")))
        .unwrap()
        .unwrap();
        assert_eq!(settings.host_id, "gw-1");
        assert_eq!(
            settings.credentials,
            Some(PathBuf::from("/etc/clawcage/c.creds"))
        );
        assert_eq!(
            settings.tls_client,
            Some((
                PathBuf::from("/abs/cert.pem"),
                PathBuf::from("/etc/clawcage/k.pem")
            ))
        );
        assert!(settings.tls_required, "a tls:// server requires TLS");
        assert_eq!((settings.replicas, settings.lease_secs), (3, 10));
        for (bad, named) in [
            ("nats = \"127.0.0.1:4222\"", "not a list of server URLs"),
            ("nats = \"nats://a,\"", "not a list of server URLs"),
            ("nats = \"nats://a\"\nhost_id = \"a b\"", "host_id"),
            ("nats = \"nats://a\"\ntls_key = \"k\"", "go together"),
            ("nats = \"nats://a\"\nreplicas = 0", "replicas = 0"),
            ("nats = \"nats://a\"\nlease_secs = 1", "lease_secs = 1"),
            (
                "nats = \"nats://a\"\nadvertise_url = \"https://gw:1\"",
                "advertise_url",
            ),
            (
                "nats = \"nats://a\"\nadvertise_url = \"http://gw/chat\"",
                "advertise_url",
            ),
            (
                "nats = \"nats://a\"\nadvertise_url = \"http://u@gw:80\"",
                "advertise_url",
            ),
            (
                "nats = \"nats://a\"\nadvertise_url = \"http://gw:0\"",
                "advertise_url",
            ),
            ("nats = \"nats://a\"\nserve = \"all\"", "serve = \"all\""),
        ] {
            let error = section(bad).settings(None).unwrap_err().to_string();
            assert!(error.contains(named), "{bad}: {error}");
        }
        let advertised = section("nats = \"nats://a\"\nadvertise_url = \"http://10.0.0.5:18789\"")
            .settings(None)
            .unwrap()
            .unwrap();
        assert_eq!(
            advertised.advertise_url.as_deref(),
            Some("http://10.0.0.5:18789/")
        );
        assert_eq!(advertised.serve, ServeMode::ActiveStandby);
        let partitioned = section("nats = \"nats://a\"\nserve = \"partitions\"")
            .settings(None)
            .unwrap()
            .unwrap();
        assert_eq!(partitioned.serve, ServeMode::Partitions);
        assert!(
            toml::from_str::<ClusterSection>("natz = \"x\"").is_err(),
            "unknown keys are refused"
        );
    }
}
