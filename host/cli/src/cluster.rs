//! `clawcage cluster status`: what the NATS JetStream cluster of `[cluster]` holds — the live
//! gateway hosts, the lane partitions and other leases with their holders and epochs, and the
//! size of each of the backend's streams and key-value buckets — read without changing anything
//! a host relies on (the streams and buckets are created if missing, as every host does at its
//! start).

use clap::Subcommand;
use std::sync::Arc;

use clawcage_cluster::{Claims, Cluster, ClusterStatus, Holder, JetStreamInbox, KvRecords};
use clawcage_core::records::RecordStore;
use clawcage_gateway::cluster::cluster_options;
use clawcage_runtime::Options;
use clawcage_runtime::cluster_config::ClusterSettings;

use crate::Failure;

/// `clawcage cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Show the cluster: live hosts, partitions and their owners, lag, stream sizes.
    ///
    /// Reads `[cluster]` of the configuration (nats, host_id, credentials, TLS), connects to
    /// the NATS servers and lists what the gateway hosts share there. Exit 2 without `[cluster]`,
    /// 1 when the servers cannot be reached or refuse.
    Status {
        /// Print JSON: {url, serverVersion, partitions, hosts, leases, streams, lag}.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `command`.
pub async fn run(options: Options, command: ClusterCommand) -> Result<(), Failure> {
    let ClusterCommand::Status { json } = command;
    let settings = settings_of(&options)?.ok_or_else(|| {
            Failure::Usage(
                "the configuration has no [cluster]: add nats = \"nats://HOST:4222\" under [cluster] (docs/cluster.md)"
                    .to_string(),
            )
        })?;
    let cluster = Cluster::connect(&settings.nats, &cluster_options(&settings, "status"))
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
    let status = cluster
        .status()
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
    // The inputs waiting per partition, read from the inboxes (a store on a runtime of its own,
    // made on a blocking thread).
    let (nats, options) = (settings.nats.clone(), cluster_options(&settings, "status"));
    let status = tokio::task::spawn_blocking(move || {
        let inbox = JetStreamInbox::connect(
            &nats,
            &options,
            Holder {
                host: "status".to_string(),
                incarnation: std::process::id().to_string(),
            },
            Claims::CoveredByCaller,
        )
        .map_err(|error| format!("clawcage: {error}"))?;
        status
            .with_lag(&inbox)
            .map_err(|error| format!("clawcage: cannot read the inboxes: {error}"))
    })
    .await
    .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?
    .map_err(Failure::Tool)?;
    if json {
        let text = serde_json::to_string_pretty(&status)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        outln!("{text}");
    } else {
        for line in describe(&status) {
            outln!("{line}");
        }
    }
    Ok(())
}

/// The `[cluster]` of the configuration `options` name (its trust checked), if it has one.
pub fn settings_of(options: &Options) -> Result<Option<ClusterSettings>, Failure> {
    let located = clawcage_runtime::locate(options)?;
    located.check_trust()?;
    let config_dir = located
        .source
        .as_ref()
        .and_then(|source| source.path.parent())
        .map(std::path::Path::to_path_buf);
    located
        .config
        .cluster
        .settings(config_dir.as_deref())
        .map_err(|error| Failure::Usage(format!("{error:#}")))
}

/// The record `key` (`records::CRON_RECORD`, `records::PAIRING_RECORD`) of the cluster
/// `runtime`'s `[cluster]` names, if it names one.
pub async fn shared_record(
    runtime: &clawcage_runtime::Runtime,
    key: &'static str,
) -> Result<Option<Arc<dyn RecordStore>>, Failure> {
    let config_dir = runtime
        .config_source()
        .and_then(|source| source.path.parent())
        .map(std::path::Path::to_path_buf);
    let settings = runtime
        .config()
        .cluster
        .settings(config_dir.as_deref())
        .map_err(|error| Failure::Usage(format!("{error:#}")))?;
    shared_record_of(settings, key).await
}

/// The record `key` of the cluster `settings` describe, if any.
pub async fn shared_record_of(
    settings: Option<ClusterSettings>,
    key: &'static str,
) -> Result<Option<Arc<dyn RecordStore>>, Failure> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    let options = cluster_options(&settings, key);
    let records = tokio::task::spawn_blocking(move || KvRecords::connect(&settings.nats, &options))
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?
        .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
    Ok(Some(Arc::new(records.record(key))))
}

/// `status` as the lines `clawcage cluster status` prints.
fn describe(status: &ClusterStatus) -> Vec<String> {
    let mut lines = vec![format!(
        "cluster at {} (nats-server {})",
        status.url, status.server_version
    )];
    lines.push(format!("hosts: {} live", status.hosts.len()));
    for host in &status.hosts {
        lines.push(format!(
            "  {}  incarnation {}  {}",
            host.holder.host,
            host.holder.incarnation,
            host.url.as_deref().unwrap_or("(no address)")
        ));
    }
    let partitions = status
        .leases
        .iter()
        .filter(|(name, _, _)| name.starts_with("part."))
        .count();
    lines.push(format!(
        "partitions: {partitions} of {} held",
        status.partitions
    ));
    lines.push(format!("leases: {}", status.leases.len()));
    for (name, holder, revision) in &status.leases {
        lines.push(format!("  {name}  {holder}  revision {revision}"));
    }
    let waiting: usize = status.lag.iter().map(|lag| lag.pending).sum();
    lines.push(format!(
        "lag: {waiting} inputs not done, in {} partitions",
        status.lag.len()
    ));
    let now_ms = clawcage_agent::transcript::now_ms();
    for lag in &status.lag {
        lines.push(format!(
            "  part.{}  {} pending in {} sessions  oldest {} s  served by {}",
            lag.partition,
            lag.pending,
            lag.sessions,
            now_ms.saturating_sub(lag.oldest_ms) / 1000,
            status.owner_of(lag.partition).unwrap_or("nobody")
        ));
    }
    lines.push("streams:".to_string());
    for stream in &status.streams {
        lines.push(format!(
            "  {}  {} messages  {} bytes  {} subjects  {} consumers",
            stream.name, stream.messages, stream.bytes, stream.subjects, stream.consumers
        ));
    }
    lines
}
