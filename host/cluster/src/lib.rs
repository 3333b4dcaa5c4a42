//! Several gateway hosts sharing their sessions through NATS JetStream: [`Cluster::connect`]
//! connects to a NATS server (or cluster), refuses one older than 2.10 or without JetStream,
//! creates or updates the stream and buckets it uses (idempotently, so every host may do it at
//! its start), and hands out the JetStream implementations of the agent's store traits: the
//! [`EventLog`] ([`JetStreamEventLog`]: the `CLAW_EV` stream, one subject per session, appends
//! fenced by the owner's epoch and the expected last subject sequence, followers as ordered
//! consumers) and the [`RunRegistry`] ([`KvRuns`]: the `claw_runs` and `claw_idem` key-value
//! buckets), the [`TranscriptStore`](clawcage_agent::TranscriptStore) ([`JetStreamTranscripts`]:
//! the `CLAW_TX` stream, one subject per session, appends fenced by the expected last subject
//! sequence), the [`LaneInbox`](clawcage_agent::LaneInbox) ([`JetStreamInbox`]: the
//! `CLAW_INBOX` stream, a subject per session, claims as leases), and the [`Leases`] that say
//! which host owns what (`claw_leases`: revision-checked
//! create and renew, a time to live, the taking revision as the fencing epoch; `claw_hosts`: the
//! live hosts; rendezvous placement of the lane partitions) with the [`Ownership`] that keeps
//! one host's share of the partitions while several hosts serve at once, and the small records every host
//! shares ([`KvRecords`]: the cron jobs, the pairings and the Telegram journal in `claw_state`,
//! each written at the revision read). This crate depends only on
//! `clawcage-core` and `clawcage-agent`; the design is in the scale-out notes (§2.2, §2.3, §2.5,
//! §2.7, §2.10).

pub mod events;
pub mod fence;
pub mod inbox;
pub mod keys;
pub mod lag;
pub mod leases;
pub mod ownership;
pub mod records;
pub mod runs;
mod subject_log;
pub mod transcripts;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use clawcage_agent::events::EventLog;
use clawcage_agent::runs::RunRegistry;

pub use events::JetStreamEventLog;
pub use fence::{PartitionFences, SessionFences, WriteFence};
pub use inbox::{Claims, JetStreamInbox};
pub use leases::{Holder, HostRecord, Lease, LeaseError, Leases};
pub use ownership::{Ownership, OwnershipOptions, PartitionChange};
pub use records::{KvRecord, KvRecords};
pub use runs::KvRuns;
pub use transcripts::JetStreamTranscripts;

/// The bucket of what every host must agree on (the workspace's identity).
pub const META_BUCKET: &str = "claw_meta";

/// The oldest NATS server the backend accepts: 2.10 (stream subject transforms and consumers
/// with several filter subjects, which the lane inputs of a later stage use).
pub const MINIMUM_SERVER: (u64, u64) = (2, 10);

/// What a cluster holds, as [`Cluster::status`] reads it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The servers, without any password.
    pub url: String,
    /// The version of the server this connection reached.
    pub server_version: String,
    /// Lane partitions of the cluster.
    pub partitions: u32,
    /// The hosts that announced themselves recently.
    pub hosts: Vec<HostRecord>,
    /// Each lease held: its key, its holder and its current revision.
    pub leases: Vec<(String, Holder, u64)>,
    /// The backend's streams and key-value buckets (`KV_<bucket>`).
    pub streams: Vec<StreamStatus>,
    /// The partitions with inputs not done (filled in by [`ClusterStatus::with_lag`]).
    pub lag: Vec<lag::PartitionLag>,
}

impl ClusterStatus {
    /// This status with the inputs waiting in each partition, as `inbox` reads them.
    pub fn with_lag(mut self, inbox: &dyn clawcage_agent::LaneInbox) -> std::io::Result<Self> {
        self.lag = lag::pending_by_partition(inbox)?;
        Ok(self)
    }

    /// Who serves partition `partition`: the holder of its lease, or of the `gateway` lease
    /// (an active/standby cluster, whose active host serves every partition).
    pub fn owner_of(&self, partition: u32) -> Option<&str> {
        let own = leases::partition_lease(partition);
        self.leases
            .iter()
            .find(|(name, _, _)| *name == own)
            .or_else(|| {
                self.leases
                    .iter()
                    .find(|(name, _, _)| name == leases::GATEWAY_LEASE)
            })
            .map(|(_, holder, _)| holder.host.as_str())
    }
}

/// The size of one stream.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamStatus {
    /// Its name.
    pub name: String,
    /// Messages stored.
    pub messages: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// Distinct subjects (sessions, keys).
    pub subjects: u64,
    /// Consumers open on it now (each live follower and each read has one while it lasts; a
    /// number that only grows means readers are not ending).
    pub consumers: usize,
}

/// How to reach the NATS servers and how to lay out what the backend stores there.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// A NATS credentials file (`.creds`, a user JWT and its nkey seed, as `nsc` writes them).
    pub credentials_file: Option<PathBuf>,
    /// TLS to the servers.
    pub tls: TlsOptions,
    /// The name this connection shows in the server's monitoring (the host's id).
    pub connection_name: Option<String>,
    /// Replicas of each stream and bucket: 1 on a single server, 3 on a production cluster.
    pub replicas: usize,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
    /// How long a JetStream request (a publish's acknowledgement, a read) may take.
    pub request_timeout: Duration,
    /// Events kept per session (older ones are reported to readers as a gap).
    pub events_per_session: i64,
    /// Events older than this are dropped (`None`: kept until the per-session limit).
    pub events_max_age: Option<Duration>,
    /// How long a lease lasts without renewal (the leases bucket's `max_age`); every host of a
    /// cluster must use the same. A dead host's partitions move after at most this long.
    pub lease_ttl: Duration,
    /// The fences the stores connected with these options check before every write of a
    /// session: held open by the keeper of the lease they write under (the active gateway's, or
    /// each owned partition's), never closed by default.
    pub write_fences: SessionFences,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            credentials_file: None,
            tls: TlsOptions::default(),
            connection_name: None,
            replicas: 1,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            events_per_session: events::EVENTS_PER_SESSION,
            events_max_age: None,
            lease_ttl: Duration::from_secs(10),
            write_fences: SessionFences::default(),
        }
    }
}

/// TLS to the NATS servers (rustls; the system's roots unless `root_certificates` names others).
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// Refuse a server that does not offer TLS.
    pub required: bool,
    /// A PEM file of the certificate authorities to trust instead.
    pub root_certificates: Option<PathBuf>,
    /// A PEM client certificate and its key, for servers that verify clients.
    pub client_certificate: Option<(PathBuf, PathBuf)>,
}

/// Why the cluster backend could not start. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The credentials file could not be read.
    #[error(
        "cannot read the NATS credentials file {}: {source}; check the path (a .creds file with a user JWT and its nkey seed, as nsc or your NATS operator writes it)",
        path.display()
    )]
    Credentials {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A TLS file is missing or unreadable.
    #[error("cannot use the TLS file {}: {source}; check the path in the cluster's TLS settings", path.display())]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No connection could be made.
    #[error(
        "cannot connect to the NATS server at {url}: {reason}; check that nats-server runs there (with -js) and that the address, credentials and TLS settings match it"
    )]
    Connect {
        /// Where (without any password it held).
        url: String,
        /// Why.
        reason: String,
    },
    /// The server is older than [`MINIMUM_SERVER`].
    #[error(
        "the NATS server at {url} is version {version}; several gateway hosts need nats-server 2.10 or newer: upgrade it (tests/nats/setup.sh installs 2.15.1; Debian's package is older)"
    )]
    ServerTooOld {
        /// Where.
        url: String,
        /// The version it reported.
        version: String,
    },
    /// The server runs without JetStream.
    #[error(
        "the NATS server at {url} (version {version}) runs without JetStream; start it with -js and a store directory (-sd DIR), or add `jetstream {{ store_dir: DIR }}` to its configuration"
    )]
    NoJetStream {
        /// Where.
        url: String,
        /// The version it reported.
        version: String,
    },
    /// A stream or bucket could not be created or brought to the settings the backend needs.
    #[error(
        "cannot set up {what} on the NATS server at {url}: {reason}; check that JetStream is enabled for this account and has room, and that no other program uses that name with other settings"
    )]
    Setup {
        /// Which stream or bucket.
        what: String,
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
}

/// A connection to the NATS servers, with the stream and buckets set up.
#[derive(Debug, Clone)]
pub struct Cluster {
    client: async_nats::Client,
    context: jetstream::Context,
    options: ClusterOptions,
    /// Where it connected, without any password.
    url: String,
    version: String,
    events: JetStreamEventLog,
    runs: KvRuns,
}

impl Cluster {
    /// Connects to `url` (`nats://host:port`, several separated by commas), checks the server
    /// and sets up the stream and buckets.
    pub async fn connect(url: &str, options: &ClusterOptions) -> Result<Self, ClusterError> {
        let shown = redacted_url(url);
        // Counts the connections made (the first and every reconnection): followers follow
        // again at once when it moves, rather than when their consumer is found gone.
        let (connections, reconnected) = tokio::sync::watch::channel(0u64);
        let connect = connect_options(options)
            .await?
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Connected) {
                    connections.send_modify(|count| *count += 1);
                }
                std::future::ready(())
            });
        // Several servers, separated by commas: the client knows them all and moves to another
        // when one goes away.
        let servers = url
            .split(',')
            .map(str::trim)
            .filter(|server| !server.is_empty())
            .map(str::parse::<async_nats::ServerAddr>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ClusterError::Connect {
                url: shown.clone(),
                reason: format!(
                    "{error}; give each server as nats://HOST:PORT, separated by commas"
                ),
            })?;
        let client = connect
            .connect(servers.as_slice())
            .await
            .map_err(|error| ClusterError::Connect {
                url: shown.clone(),
                reason: if options.tls.required || options.tls.root_certificates.is_some() {
                    format!(
                        "{error} (TLS is required: does the server offer TLS, with a certificate from the authority given?)"
                    )
                } else {
                    error.to_string()
                },
            })?;
        let info = client.server_info();
        check_server(&info, &shown)?;
        let context = jetstream::ContextBuilder::new()
            .timeout(options.request_timeout)
            .build(client.clone());
        let events = JetStreamEventLog::open(context.clone(), options, reconnected)
            .await
            .map_err(|(what, reason)| ClusterError::Setup {
                what,
                url: shown.clone(),
                reason,
            })?;
        let runs = KvRuns::open(&context, options)
            .await
            .map_err(|(what, reason)| ClusterError::Setup {
                what,
                url: shown.clone(),
                reason,
            })?;
        Ok(Self {
            client,
            context,
            options: options.clone(),
            url: shown,
            version: info.version,
            events,
            runs,
        })
    }

    /// The event log on the `CLAW_EV` stream.
    pub fn event_log(&self) -> Arc<dyn EventLog> {
        Arc::new(self.events.clone())
    }

    /// The leases (`claw_leases`) and live hosts (`claw_hosts`) as holder `me` sees them; the
    /// buckets are created or updated here.
    pub async fn leases(&self, me: Holder) -> Result<Leases, ClusterError> {
        Leases::open(&self.context, &self.options, me)
            .await
            .map_err(|(what, reason)| ClusterError::Setup {
                what,
                url: self.url.clone(),
                reason,
            })
    }

    /// What the cluster holds now, for `clawcage cluster status`: the live hosts, the leases
    /// and their holders, and the size of each of the backend's streams and buckets. Reads
    /// only.
    pub async fn status(&self) -> Result<ClusterStatus, ClusterError> {
        let setup = |what: &str, reason: String| ClusterError::Setup {
            what: what.to_string(),
            url: self.url.clone(),
            reason,
        };
        let leases = self
            .leases(Holder {
                host: "status".to_string(),
                incarnation: std::process::id().to_string(),
            })
            .await?;
        let hosts = leases
            .live_hosts()
            .await
            .map_err(|error| setup(leases::HOSTS_BUCKET, error.to_string()))?;
        let mut held = leases
            .all()
            .await
            .map_err(|error| setup(leases::LEASES_BUCKET, error.to_string()))?;
        held.sort_by(|a, b| a.0.cmp(&b.0));
        let mut names = self.context.stream_names();
        let mut streams = Vec::new();
        while let Some(name) = futures_util::StreamExt::next(&mut names).await {
            let name = name.map_err(|error| setup("the stream list", error.to_string()))?;
            if !(name.starts_with("CLAW_") || name.starts_with("KV_claw_")) {
                continue;
            }
            let mut stream = self
                .context
                .get_stream(&name)
                .await
                .map_err(|error| setup(&name, error.to_string()))?;
            let info = stream
                .info()
                .await
                .map_err(|error| setup(&name, error.to_string()))?;
            streams.push(StreamStatus {
                name: name.clone(),
                messages: info.state.messages,
                bytes: info.state.bytes,
                subjects: info.state.subjects_count,
                consumers: info.state.consumer_count,
            });
        }
        streams.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ClusterStatus {
            url: self.url.clone(),
            server_version: self.version.clone(),
            partitions: leases::PARTITIONS,
            hosts,
            leases: held,
            streams,
            lag: Vec::new(),
        })
    }

    /// Records `identity` as the cluster's workspace (the first host to ask does), or says
    /// which identity was recorded before, in the `claw_meta` bucket.
    pub async fn workspace_identity(&self, identity: &str) -> Result<String, ClusterError> {
        let setup = |reason: String| ClusterError::Setup {
            what: format!("the key-value bucket {META_BUCKET}"),
            url: self.url.clone(),
            reason,
        };
        let meta = open_bucket(
            &self.context,
            &self.options,
            META_BUCKET,
            "clawcage: what every host of the cluster must agree on",
            Duration::ZERO,
        )
        .await
        .map_err(|(_, reason)| setup(reason))?;
        // Patiently: a fresh cluster's bucket may have no leader for a while ("no responders").
        subject_log::patiently(|| async {
            match meta.create("workspace", identity.to_string().into()).await {
                Ok(_) => return Ok(identity.to_string()),
                Err(error) if error.kind() == jetstream::kv::CreateErrorKind::AlreadyExists => {}
                Err(error) => return Err(error.to_string()),
            }
            let recorded = meta
                .get("workspace")
                .await
                .map_err(|error| error.to_string())?
                .ok_or_else(|| {
                    "the recorded workspace vanished; start the host again".to_string()
                })?;
            Ok(String::from_utf8_lossy(&recorded).into_owned())
        })
        .await
        .map_err(setup)
    }

    /// The run registry on the `claw_runs` and `claw_idem` buckets.
    pub fn run_registry(&self) -> Arc<dyn RunRegistry> {
        Arc::new(self.runs.clone())
    }

    /// How many consumers the event stream has now (each live follower and read has one; a
    /// number that only grows means followers are not ending).
    pub async fn open_event_consumers(&self) -> std::io::Result<usize> {
        self.events.open_consumers().await
    }

    /// Each stored event of `session_key` as its `seq` and its writer's epoch, in the stream's
    /// order ([`JetStreamEventLog::writers_of`]).
    pub async fn event_writers(&self, session_key: &str) -> std::io::Result<Vec<(u64, u64)>> {
        self.events.writers_of(session_key).await
    }

    /// The version the server reported when this connection was made.
    pub fn server_version(&self) -> &str {
        &self.version
    }

    /// The largest message the server takes (its `max_payload`), in bytes.
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }
}

/// Creates or updates key-value bucket `name` (one revision kept per key, entries forgotten
/// `max_age` after their last write, on file, with the options' replicas) and opens it. An error
/// names the bucket and says why.
pub(crate) async fn open_bucket(
    context: &jetstream::Context,
    options: &ClusterOptions,
    name: &str,
    description: &str,
    max_age: Duration,
) -> Result<jetstream::kv::Store, (String, String)> {
    let config = jetstream::kv::Config {
        bucket: name.to_string(),
        description: description.to_string(),
        history: 1,
        max_age,
        storage: jetstream::stream::StorageType::File,
        num_replicas: options.replicas.max(1),
        ..Default::default()
    };
    subject_log::patiently(|| async {
        context
            .create_or_update_key_value(config.clone())
            .await
            .map_err(|error| error.to_string())
    })
    .await
    .map_err(|error| (format!("the key-value bucket {name}"), error))
}

/// The connection's options: credentials, TLS, timeouts. Files are checked here, so a wrong
/// path is named before any connection is tried.
async fn connect_options(
    options: &ClusterOptions,
) -> Result<async_nats::ConnectOptions, ClusterError> {
    let mut connect = match &options.credentials_file {
        Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|source| ClusterError::Credentials {
                path: path.clone(),
                source,
            })?,
        None => async_nats::ConnectOptions::new(),
    };
    connect = connect
        .connection_timeout(options.connect_timeout)
        .request_timeout(Some(options.request_timeout));
    if let Some(name) = &options.connection_name {
        connect = connect.name(name);
    }
    let tls = &options.tls;
    if tls.required {
        connect = connect.require_tls(true);
    }
    if let Some(roots) = &tls.root_certificates {
        readable(roots)?;
        connect = connect.add_root_certificates(roots.clone());
    }
    if let Some((certificate, key)) = &tls.client_certificate {
        readable(certificate)?;
        readable(key)?;
        connect = connect.add_client_certificate(certificate.clone(), key.clone());
    }
    Ok(connect)
}

fn readable(path: &Path) -> Result<(), ClusterError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|source| ClusterError::TlsFile {
            path: path.to_path_buf(),
            source,
        })
}

/// Refuses a server older than [`MINIMUM_SERVER`] or without JetStream.
pub fn check_server(info: &async_nats::ServerInfo, url: &str) -> Result<(), ClusterError> {
    let too_old = || ClusterError::ServerTooOld {
        url: url.to_string(),
        version: if info.version.is_empty() {
            "unknown".to_string()
        } else {
            info.version.clone()
        },
    };
    let (major, minor) = parse_version(&info.version).ok_or_else(too_old)?;
    if (major, minor) < MINIMUM_SERVER {
        return Err(too_old());
    }
    if !info.jetstream {
        return Err(ClusterError::NoJetStream {
            url: url.to_string(),
            version: info.version.clone(),
        });
    }
    Ok(())
}

/// The major and minor numbers of a server version such as `2.10.4`, `v2.11.0-RC.1`.
fn parse_version(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// `url` without the password (or token) a `user:password@` part carries, for messages.
fn redacted_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let one = one.trim();
            let (scheme, rest) = one.split_once("://").unwrap_or(("", one));
            let shown = match rest.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => rest.to_string(),
            };
            if scheme.is_empty() {
                shown
            } else {
                format!("{scheme}://{shown}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version: &str, jetstream: bool) -> async_nats::ServerInfo {
        async_nats::ServerInfo {
            version: version.to_string(),
            jetstream,
            ..Default::default()
        }
    }

    #[test]
    fn servers_older_than_2_10_or_without_jetstream_are_refused_by_name() {
        for accepted in ["2.10.0", "2.15.1", "v2.11.0-RC.1", "3.0.0"] {
            assert!(
                check_server(&server(accepted, true), "nats://h:4222").is_ok(),
                "{accepted}"
            );
        }
        for refused in ["2.9.10", "1.4.1", "", "garbage", "2"] {
            let error = check_server(&server(refused, true), "nats://h:4222")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains("2.10 or newer"), "{refused}: {error}");
            assert!(error.contains("nats://h:4222"), "{error}");
        }
        let error = check_server(&server("2.9.10", true), "u")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("version 2.9.10"), "{error}");
        let error = check_server(&server("2.15.1", false), "nats://h:4222")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("without JetStream") && error.contains("-js"),
            "{error}"
        );
    }

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(
            redacted_url("nats://user:secret@h1:4222, tls://token@h2"),
            "nats://***@h1:4222,tls://***@h2"
        );
        assert_eq!(redacted_url("127.0.0.1:4222"), "127.0.0.1:4222");
    }

    #[tokio::test]
    async fn a_missing_credentials_file_is_named_before_connecting() {
        let options = ClusterOptions {
            credentials_file: Some(PathBuf::from("/nonexistent/clawcage.creds")),
            ..ClusterOptions::default()
        };
        let error = Cluster::connect("nats://127.0.0.1:1", &options)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("credentials file /nonexistent/clawcage.creds"),
            "{error}"
        );
        let options = ClusterOptions {
            tls: TlsOptions {
                root_certificates: Some(PathBuf::from("/nonexistent/ca.pem")),
                ..TlsOptions::default()
            },
            ..ClusterOptions::default()
        };
        let error = Cluster::connect("nats://127.0.0.1:1", &options)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("TLS file /nonexistent/ca.pem"), "{error}");
    }
}
