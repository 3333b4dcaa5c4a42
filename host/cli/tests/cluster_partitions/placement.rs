//! Where the partitions of a cluster whose hosts serve partitions are: a host of such a
//! cluster, the partition leases' holders as `clawcage cluster status` shows them, the wait
//! until they are placed as the rendezvous placement says, and a session a given host serves.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use clawcage_cluster::leases::{PARTITIONS, partition_of, partitions_won};
use clawcage_tests::llm_server::LlmServer;
use clawcage_tests::nats::NatsServer;
use serde_json::Value;

use super::host::Host;

/// A host of a cluster whose hosts serve partitions.
pub fn partitioned(nats: &NatsServer, model: &LlmServer, host_id: &str) -> Host {
    Host::with(
        &nats.url(),
        model.url(),
        host_id,
        "serve = \"partitions\"\n",
    )
}

/// The partition leases' holders as `clawcage cluster status --json` shows them, by partition.
pub fn partition_holders(host: &Host, workspace: &Path) -> Vec<(u32, String)> {
    let output = host
        .command(workspace, &["cluster", "status", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    status["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|lease| {
            let partition = lease[0].as_str()?.strip_prefix("part.")?.parse().ok()?;
            Some((partition, lease[1]["host"].as_str()?.to_string()))
        })
        .collect()
}

/// Waits until the partitions are held exactly as the placement among `hosts` says, each once.
pub async fn settled(host: &Host, workspace: &Path, hosts: &[&str]) -> Duration {
    let started = Instant::now();
    let live: Vec<String> = hosts.iter().map(|host| host.to_string()).collect();
    loop {
        let holders = partition_holders(host, workspace);
        let placed = holders.len() == PARTITIONS as usize
            && live.iter().all(|name| {
                let held: BTreeSet<u32> = holders
                    .iter()
                    .filter(|(_, holder)| holder == name)
                    .map(|(partition, _)| *partition)
                    .collect();
                held == partitions_won(name, &live, PARTITIONS)
                    .into_iter()
                    .collect()
            });
        if placed {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the partitions did not settle on {live:?}: {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A session whose partition `owner` wins among `hosts`.
pub fn session_of(owner: &str, hosts: &[&str], name: &str) -> String {
    let live: Vec<String> = hosts.iter().map(|host| host.to_string()).collect();
    let won = partitions_won(owner, &live, PARTITIONS);
    (0..10_000)
        .map(|n| format!("agent:main:test:{name}-{n}"))
        .find(|key| won.contains(&partition_of(key)))
        .unwrap()
}
