//! The gateway in a cluster whose hosts serve at once (`[cluster] serve = "partitions"`): each
//! host keeps its share of the sessions' partitions with a partition keeper
//! ([`clawcage_cluster::Ownership`]), writes a session only while it owns the session's
//! partition (the stores check that partition's fence, and its events carry the partition's
//! epoch), takes a partition's sessions up when it gains it and lets them go when it hands it
//! over or loses it ([`crate::hub::Hub::take_up_partition`], [`crate::hub::Hub::let_go_partition`]).
//! A host that stops gives its partitions back at once; one that dies leaves them to expire.

use std::path::Path;
use std::sync::{Arc, Mutex};

use clawcage_cluster::leases::PARTITIONS;
use clawcage_cluster::{Leases, Ownership, OwnershipOptions, PartitionChange, PartitionFences};
use clawcage_core::redact::Redactor;
use clawcage_runtime::Error;
use clawcage_runtime::cluster_config::ClusterSettings;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Active, announce, cluster_options, connect_host, connect_stores, failed, session_stores,
};
use crate::hub::{Hub, Partitions, TakeUp};

/// What a host serving its share of the partitions keeps beside its stores.
pub(crate) struct Partitioned {
    /// The keeper of this host's partitions.
    pub(crate) ownership: Ownership,
    /// What the keeper reports.
    pub(crate) changes: mpsc::UnboundedReceiver<PartitionChange>,
    /// The partitions held, and how their sessions are taken up.
    pub(crate) partitions: Partitions,
    /// The cluster's leases (who serves each partition), and this host's id among them.
    pub(crate) leases: Leases,
    pub(crate) me: String,
}

/// Joins the cluster `settings` name as a host serving its share of the partitions: connects,
/// checks the workspace, announces this host (with `url`, where its clients connect), opens
/// the stores (fenced by partition) and starts keeping its partitions. The hub takes them up as
/// they come ([`serve_partitions`]).
pub(crate) async fn join_partitions(
    settings: &ClusterSettings,
    workspace: &Path,
    redactor: Redactor,
    url: String,
) -> Result<(Active, Partitioned), Error> {
    let mut options = cluster_options(settings, "gateway");
    let fences = PartitionFences::new();
    options.write_fences = fences.clone().into();
    let (cluster, me, leases) = connect_host(settings, &options, workspace).await?;
    tokio::spawn(announce(
        leases.clone(),
        Arc::new(Mutex::new(Some(url))),
        clawcage_agent::transcript::now_ms(),
        options.lease_ttl,
    ));
    let (nats, store_options, owner) = (settings.nats.clone(), options.clone(), me.clone());
    let by = format!("{} (partitions)", me.host);
    let (stores, records, take_up) = tokio::task::spawn_blocking(move || {
        // The partition's fence covers the claim on each of its sessions.
        let (transcripts, inbox, records) = connect_stores(&nats, &store_options, owner, redactor)?;
        let (marked_transcripts, marked_inbox) = (transcripts.clone(), inbox.clone());
        let take_up: TakeUp = Arc::new(move |sessions: &[String]| {
            marked_transcripts.take_up(sessions)?;
            marked_inbox.take_up(sessions, &by)
        });
        Ok::<_, String>((
            session_stores(transcripts, inbox, &records),
            records,
            take_up,
        ))
    })
    .await
    .map_err(|error| failed(settings, error))?
    .map_err(|error| failed(settings, error))?;
    let (ownership, changes) = Ownership::start(
        leases.clone(),
        OwnershipOptions::for_ttl(PARTITIONS, options.lease_ttl),
    )
    .map_err(|error| {
        failed(
            settings,
            format!("cannot keep this host's partitions: {error}"),
        )
    })?;
    let host = me.host.clone();
    Ok((
        Active {
            cluster,
            stores,
            records,
            epoch: 0,
            lost: CancellationToken::new(),
            fences: fences.clone().into(),
            me,
        },
        Partitioned {
            ownership,
            changes,
            partitions: Partitions {
                fences,
                take_up,
                // Within the keeper's grace (half a lease), before its fence shuts.
                hand_over_patience: options.lease_ttl * 2 / 5,
            },
            leases,
            me: host,
        },
    ))
}

/// Carries out what the partition keeper reports, in order, for as long as it reports: a
/// partition gained is held (its fence and epoch) and its sessions taken up; one to hand over
/// lets its running turns end (a while), is let go, its events stored, and only then given up;
/// one lost is given up and let go.
pub(crate) async fn serve_partitions(
    hub: Arc<Hub>,
    mut changes: mpsc::UnboundedReceiver<PartitionChange>,
    partitions: Partitions,
) {
    let (fences, patience) = (partitions.fences, partitions.hand_over_patience);
    while let Some(change) = changes.recv().await {
        match change {
            PartitionChange::Gained {
                partition,
                epoch,
                fence,
            } => {
                fences.hold(partition, fence, epoch);
                hub.take_up_partition(partition).await;
            }
            PartitionChange::Release { partition, done } => {
                hub.hand_over_partition(partition, patience).await;
                fences.let_go(partition);
                let _ = done.send(());
            }
            PartitionChange::Lost { partition, why } => {
                tracing::warn!(partition, "this host lost a partition: {why}");
                fences.let_go(partition);
                hub.let_go_partition(partition).await;
            }
        }
    }
}
