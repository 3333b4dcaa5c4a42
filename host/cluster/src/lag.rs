//! How far behind the lanes are, for `clawcage cluster status`: per lane partition, the inputs
//! its sessions' inboxes hold that are not done yet, how many sessions they are in and how long
//! the oldest has waited. Read from the inboxes as any host sees them (one read per session), so
//! it costs a moment on a cluster with many sessions and changes nothing.

use clawcage_agent::LaneInbox;
use serde::Serialize;

use crate::leases::partition_of;

/// The inputs waiting in one lane partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionLag {
    /// The partition.
    pub partition: u32,
    /// Sessions of it with inputs not done.
    pub sessions: usize,
    /// Inputs not done.
    pub pending: usize,
    /// When the oldest of them was taken, in milliseconds since the Unix epoch.
    pub oldest_ms: u64,
}

/// The partitions whose sessions have inputs not done, in partition order.
pub fn pending_by_partition(inbox: &dyn LaneInbox) -> std::io::Result<Vec<PartitionLag>> {
    let mut lag: std::collections::BTreeMap<u32, PartitionLag> = Default::default();
    for session in inbox.sessions()? {
        let pending = inbox.pending(&session)?;
        let Some(oldest_ms) = pending.iter().map(|input| input.at_ms).min() else {
            continue;
        };
        let partition = partition_of(&session);
        let entry = lag.entry(partition).or_insert(PartitionLag {
            partition,
            sessions: 0,
            pending: 0,
            oldest_ms,
        });
        entry.sessions += 1;
        entry.pending += pending.len();
        entry.oldest_ms = entry.oldest_ms.min(oldest_ms);
    }
    Ok(lag.into_values().collect())
}
