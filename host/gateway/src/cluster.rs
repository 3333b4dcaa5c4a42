//! The gateway in a cluster (`[cluster]`), active/standby: every gateway host keeps its
//! sessions' state on NATS JetStream (events, runs, transcripts with their turn journals,
//! inboxes), and the one that holds the `gateway` lease serves; the others wait as standbys,
//! announced in `claw_hosts` and relaying their clients to the active host ([`crate::relay`]),
//! and the first to take the lease after the active host is gone serves in its place, taking
//! every session up (a marker on each one's transcript and inbox, so that a late write of the
//! host it replaced is refused by the server) and then its pending inputs and open turns from
//! the stream. The lease's epoch is the new active host's epoch as the sessions' writer, so a late
//! write of the host it replaced is refused by the server. An active host that cannot renew its
//! lease in time stops serving at once (exit 1) rather than write beside its successor. A host
//! restarting under the same `host_id` takes its own earlier lease back without waiting. Every
//! host must see the same workspace: the first host writes an identity file into it
//! (`.clawcage-workspace-id`) and records that identity in the cluster; a host whose workspace
//! holds another (or none, and the cluster has one) refuses to join.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_cluster::{
    Claims, Cluster, ClusterOptions, Holder, JetStreamInbox, JetStreamTranscripts, KvRecords,
    Lease, LeaseError, Leases, SessionFences, TlsOptions, WriteFence, records,
};
use clawcage_core::redact::Redactor;
use clawcage_runtime::cluster_config::ClusterSettings;
use clawcage_runtime::{Error, SessionStores};
use tokio_util::sync::CancellationToken;

pub use clawcage_cluster::leases::GATEWAY_LEASE;

pub use crate::relay::ActiveGateway;

mod partitioned;
pub(crate) use partitioned::{Partitioned, join_partitions, serve_partitions};

/// The connection options `settings` describe, for a connection named `connection`.
pub fn cluster_options(settings: &ClusterSettings, connection: &str) -> ClusterOptions {
    ClusterOptions {
        credentials_file: settings.credentials.clone(),
        tls: TlsOptions {
            required: settings.tls_required,
            root_certificates: settings.tls_ca.clone(),
            client_certificate: settings.tls_client.clone(),
        },
        connection_name: Some(format!("clawcage {connection} {}", settings.host_id)),
        replicas: settings.replicas,
        lease_ttl: Duration::from_secs(settings.lease_secs),
        ..ClusterOptions::default()
    }
}

/// This host, active: the cluster's stores for its sessions and the lease it serves under.
pub(crate) struct Active {
    pub(crate) cluster: Cluster,
    pub(crate) stores: SessionStores,
    /// The records every host shares (the pairings, the Telegram journal; the cron jobs are
    /// in `stores`).
    pub(crate) records: KvRecords,
    /// The writer's epoch: the lease's.
    pub(crate) epoch: u64,
    /// Cancelled when the lease is lost (or could not be renewed in time).
    pub(crate) lost: CancellationToken,
    /// The fences the stores' writes of each session pass.
    pub(crate) fences: SessionFences,
    pub(crate) me: Holder,
}

fn failed(settings: &ClusterSettings, error: impl std::fmt::Display) -> Error {
    Error::Failed(format!(
        "the cluster at {}: {error}",
        settings.nats.split(',').next().unwrap_or_default()
    ))
}

/// The file in the workspace that names it among clusters' workspaces.
pub const WORKSPACE_IDENTITY_FILE: &str = ".clawcage-workspace-id";

/// This workspace's identity: the one its identity file holds, or a new one written there (the
/// first host of a cluster on a new workspace). Hosts starting at once on a new workspace agree:
/// the file is created only if absent, and whoever finds it made reads it.
fn workspace_identity(workspace: &Path) -> Result<String, Error> {
    let file = workspace.join(WORKSPACE_IDENTITY_FILE);
    let cannot = |what: &str, error: std::io::Error| {
        Error::Failed(format!(
            "cannot {what} the workspace's identity {}: {error}",
            file.display()
        ))
    };
    let read = |file: &Path| -> Result<Option<String>, std::io::Error> {
        match std::fs::read_to_string(file) {
            Ok(text) if !text.trim().is_empty() => Ok(Some(text.trim().to_string())),
            Ok(_) => Ok(None),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    };
    if let Some(identity) = read(&file).map_err(|error| cannot("read", error))? {
        return Ok(identity);
    }
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|error| Error::Failed(format!("cannot make the workspace's identity: {error}")))?;
    let identity = bytes
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<String>();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
    {
        Ok(mut created) => {
            use std::io::Write as _;
            created
                .write_all(format!("{identity}\n").as_bytes())
                .and_then(|()| created.sync_all())
                .map_err(|error| cannot("write", error))?;
            Ok(identity)
        }
        // Another host made it first: its identity is the workspace's (it may still be writing
        // it: read until it is there).
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            for _ in 0..50 {
                if let Some(identity) = read(&file).map_err(|error| cannot("read", error))? {
                    return Ok(identity);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(Error::Failed(format!(
                "the workspace's identity {} stays empty; remove it and start again",
                file.display()
            )))
        }
        Err(error) => Err(cannot("write", error)),
    }
}

/// Checks that `workspace` is the one the cluster recorded (recording it when the cluster has
/// none yet): every host runs every session's tools, so they must all see one workspace.
async fn check_workspace(cluster: &Cluster, workspace: &Path) -> Result<(), Error> {
    let identity = workspace_identity(workspace)?;
    let recorded = cluster
        .workspace_identity(&identity)
        .await
        .map_err(|error| Error::Failed(error.to_string()))?;
    if recorded != identity {
        return Err(Error::Usage(format!(
            "this host's workspace {} is not the cluster's: its {WORKSPACE_IDENTITY_FILE} says {identity}, the cluster recorded {recorded}. Every host must see the same workspace (a shared filesystem): mount the cluster's workspace here and pass it with --workspace",
            workspace.display()
        )));
    }
    Ok(())
}

/// This host as a holder of leases: its host id and this process's incarnation.
fn holder(settings: &ClusterSettings) -> Holder {
    Holder {
        host: settings.host_id.clone(),
        incarnation: format!(
            "{}-{}",
            std::process::id(),
            clawcage_agent::transcript::now_ms()
        ),
    }
}

/// Connects a gateway host's stores of the sessions on a runtime of their own (call on a
/// blocking thread): the transcripts, the inboxes (their claims covered by the caller's lease,
/// the gateway's or each partition's) and the shared records.
fn connect_stores(
    nats: &str,
    options: &ClusterOptions,
    owner: Holder,
    redactor: Redactor,
) -> Result<(JetStreamTranscripts, JetStreamInbox, KvRecords), String> {
    let transcripts = JetStreamTranscripts::connect(nats, options, redactor)
        .map_err(|error| error.to_string())?;
    let inbox = JetStreamInbox::connect(nats, options, owner, Claims::CoveredByCaller)
        .map_err(|error| error.to_string())?;
    let records = KvRecords::connect(nats, options).map_err(|error| error.to_string())?;
    Ok((transcripts, inbox, records))
}

/// The sessions' stores the agent runs on, from a host's connected stores.
fn session_stores(
    transcripts: JetStreamTranscripts,
    inbox: JetStreamInbox,
    records: &KvRecords,
) -> SessionStores {
    SessionStores {
        transcripts: Arc::new(transcripts),
        inbox: Arc::new(inbox),
        cron_jobs: Some(Arc::new(records.record(records::CRON_RECORD))),
        budget: Some(Arc::new(records.record(records::BUDGET_RECORD))),
    }
}

/// Connects this host to the cluster `settings` name with `options`: checks that `workspace`
/// is the cluster's, and opens the leases as this process's holder.
async fn connect_host(
    settings: &ClusterSettings,
    options: &ClusterOptions,
    workspace: &Path,
) -> Result<(Cluster, Holder, Leases), Error> {
    let cluster = Cluster::connect(&settings.nats, options)
        .await
        .map_err(|error| Error::Failed(error.to_string()))?;
    check_workspace(&cluster, workspace).await?;
    let me = holder(settings);
    let leases = cluster
        .leases(me.clone())
        .await
        .map_err(|error| Error::Failed(error.to_string()))?;
    Ok((cluster, me, leases))
}

/// Joins the cluster `settings` name: connects, announces this host (with `url`, where its
/// clients connect), waits as a standby until the `gateway` lease is free (saying who is
/// active, and telling `active_seen` who and where, for the relay of this standby's clients),
/// takes it, and opens the stores. The lease is renewed from here on; `Active::lost` says when
/// it is lost.
pub(crate) async fn join(
    settings: &ClusterSettings,
    workspace: &Path,
    redactor: Redactor,
    url: Arc<Mutex<Option<String>>>,
    active_seen: tokio::sync::watch::Sender<Option<ActiveGateway>>,
) -> Result<Active, Error> {
    let mut options = cluster_options(settings, "gateway");
    // Every store this host writes the sessions with is fenced by the gateway lease: shut until
    // the lease is taken, open while it is renewed in time, shut for good once it is lost.
    let fence = WriteFence::shut_until_held();
    options.write_fences = fence.clone().into();
    let (cluster, me, leases) = connect_host(settings, &options, workspace).await?;
    let started_ms = clawcage_agent::transcript::now_ms();
    tokio::spawn(announce(
        leases.clone(),
        url.clone(),
        started_ms,
        options.lease_ttl,
    ));
    let mut said = None;
    // Since when the cluster has failed to answer, while it does, and when that was last said.
    let mut failing: Option<(std::time::Instant, std::time::Instant)> = None;
    let lease = loop {
        // A standby waits through the cluster's failures (a server restarting, a fresh
        // cluster placing its streams, a stream's new leader being elected) for as long as they
        // last: it says so when they start and once a minute while they go on, and when the
        // cluster answers again. Only a standby can take over once the cluster is back.
        let looked = async {
            let taken = match leases.acquire(GATEWAY_LEASE).await? {
                Some(lease) => Some(lease),
                None => leases.take_over_from_earlier_self(GATEWAY_LEASE).await?,
            };
            if taken.is_some() {
                return Ok((taken, None));
            }
            let active = leases.holder(GATEWAY_LEASE).await?;
            let active = active.map(|(holder, _)| holder.host);
            // Where the active host listens, looked up when it changes or is not known yet.
            let known = active_seen.borrow().clone();
            let seen = match (&active, known) {
                (None, _) => None,
                (Some(host), Some(known)) if known.host == *host && known.url.is_some() => {
                    Some(known)
                }
                (Some(host), _) => Some(ActiveGateway {
                    host: host.clone(),
                    url: leases
                        .live_hosts()
                        .await?
                        .into_iter()
                        .find(|record| record.holder.host == *host)
                        .and_then(|record| record.url),
                }),
            };
            active_seen.send_if_modified(|now| {
                let changed = *now != seen;
                *now = seen;
                changed
            });
            Ok::<_, LeaseError>((None, active))
        };
        let active = match looked.await {
            Ok((Some(lease), _)) => break lease,
            Ok((None, active)) => {
                if let Some((since, _)) = failing.take() {
                    tracing::info!(
                        "the cluster answers again after {} s; this standby waits on",
                        since.elapsed().as_secs()
                    );
                }
                active
            }
            Err(error) => {
                let now = std::time::Instant::now();
                match &mut failing {
                    None => {
                        tracing::warn!("{}; this standby tries again", failed(settings, &error));
                        failing = Some((now, now));
                    }
                    Some((since, last_said)) if last_said.elapsed() >= Duration::from_secs(60) => {
                        tracing::warn!(
                            "{}; this standby has tried for {} s and goes on trying",
                            failed(settings, &error),
                            since.elapsed().as_secs()
                        );
                        *last_said = now;
                    }
                    Some(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if said != active {
            if let Some(host) = &active {
                println!(
                    "clawcage gateway: standby in the cluster; the active gateway is {host}, and this host ({}) takes over if it stops",
                    me.host
                );
            }
            said = active;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tracing::info!(
        epoch = lease.epoch(),
        host = me.host,
        "this host is the cluster's active gateway"
    );
    // The connections this host relayed are carried over to itself: it is the active gateway
    // now, at the address it announced.
    active_seen.send_replace(Some(ActiveGateway {
        host: me.host.clone(),
        url: clawcage_core::sync::lock(&url).clone(),
    }));
    let lost = CancellationToken::new();
    fence.open_until(lease.fresh_until());
    keep_apart(
        leases,
        lease.clone(),
        lost.clone(),
        fence.clone(),
        options.lease_ttl,
    );
    // The stores' connections run on runtimes of their own: made on a blocking thread. Every
    // session is taken up before anything of it is read: a write of the host this one
    // replaces that a stalled server stores only now is refused by the server.
    let (nats, store_options, owner) = (settings.nats.clone(), options.clone(), me.clone());
    let by = format!("{} (epoch {})", me.host, lease.epoch());
    let (stores, records) = tokio::task::spawn_blocking(move || {
        let (transcripts, inbox, records) = connect_stores(&nats, &store_options, owner, redactor)?;
        let started = std::time::Instant::now();
        let sessions = clawcage_agent::LaneInbox::sessions(&inbox)
            .and_then(|sessions| {
                transcripts.take_up(&sessions)?;
                inbox.take_up(&sessions, &by)?;
                Ok(sessions.len())
            })
            .map_err(|error| format!("cannot take the sessions up: {error}"))?;
        tracing::info!(
            sessions,
            ms = started.elapsed().as_millis() as u64,
            "took the cluster's sessions up"
        );
        Ok::<_, String>((session_stores(transcripts, inbox, &records), records))
    })
    .await
    .map_err(|error| failed(settings, error))?
    .map_err(|error| failed(settings, error))?;
    Ok(Active {
        cluster,
        stores,
        records,
        epoch: lease.epoch(),
        lost,
        fences: fence.into(),
        me,
    })
}

/// Joins the cluster `cluster_settings` name ([`join`]) while `listener` already serves, as a
/// standby's front relaying every client to the active gateway under `settings`; once this
/// host is active, gives the listener back to be served by the gateway itself. `url` is where
/// it listens, announced to the other hosts unless `[cluster] advertise_url` says otherwise.
pub(crate) async fn join_relaying(
    cluster_settings: &ClusterSettings,
    runtime: &clawcage_runtime::Runtime,
    listener: tokio::net::TcpListener,
    settings: crate::Settings,
    url: &str,
) -> Result<(Active, tokio::net::TcpListener), Error> {
    let bound = listener
        .local_addr()
        .map_err(|error| Error::Failed(format!("cannot read the listening address: {error}")))?;
    let announced = cluster_settings.advertise_url.clone().unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            clawcage_runtime::tell!(
                "clawcage gateway: warning: this host listens on {bound}, which the other hosts of the cluster cannot reach it at; set [cluster] advertise_url so that they can relay their clients to it"
            );
        }
        url.to_string()
    });
    let (tell_active, active_seen) = tokio::sync::watch::channel(None);
    let relaying = CancellationToken::new();
    let front = tokio::spawn(crate::relay_clients(
        listener,
        settings,
        active_seen,
        cluster_settings.host_id.clone(),
        relaying.clone(),
    ));
    println!(
        "cluster: clients may connect at ws://{bound}{} now; while this host is a standby they are relayed to the active gateway",
        crate::http::WS_PATH
    );
    let joined = join(
        cluster_settings,
        runtime.workspace().path(),
        runtime.redactor().clone(),
        Arc::new(Mutex::new(Some(announced))),
        tell_active,
    )
    .await;
    relaying.cancel();
    let listener = front
        .await
        .map_err(|error| Error::Failed(format!("the standby's listener stopped: {error}")))?;
    Ok((joined?, listener))
}

/// Says this host is alive, with its clients' address once known, for as long as it runs.
async fn announce(leases: Leases, url: Arc<Mutex<Option<String>>>, started_ms: u64, ttl: Duration) {
    let mut ticks = tokio::time::interval(ttl.max(Duration::from_secs(1)));
    loop {
        ticks.tick().await;
        let address = clawcage_core::sync::lock(&url).clone();
        if let Err(error) = leases.announce(address, started_ms).await {
            tracing::warn!("cannot announce this host to the cluster: {error}");
        }
    }
}

/// Runs [`keep`] on a thread and runtime of its own: a task of the gateway's runtime that blocks
/// a worker (a store call waiting on a stalled server) cannot delay the renewal, nor the
/// decision to stop when it fails. Without a thread, the lease is given up at once.
fn keep_apart(
    leases: Leases,
    lease: Lease,
    lost: CancellationToken,
    fence: WriteFence,
    ttl: Duration,
) {
    let (fence_kept, lost_kept) = (fence.clone(), lost.clone());
    let started = std::thread::Builder::new()
        .name("clawcage-lease".to_string())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(keep(leases, lease, lost_kept, fence_kept, ttl)),
                Err(error) => stop_serving(
                    &fence_kept,
                    &lost_kept,
                    &format!("cannot keep the gateway lease: {error}; this host stops serving"),
                ),
            }
        });
    if let Err(error) = started {
        stop_serving(
            &fence,
            &lost,
            &format!("cannot keep the gateway lease: {error}; this host stops serving"),
        );
    }
}

/// Shuts `fence` (no write goes out from now on), says `why`, and cancels `lost` (the host stops
/// serving).
fn stop_serving(fence: &WriteFence, lost: &CancellationToken, why: &str) {
    fence.close();
    tracing::error!("{why}");
    lost.cancel();
}

/// Renews `lease` a few times per time to live, moving `fence` on with each renewal; shuts the
/// fence and cancels `lost` when the lease is lost or has gone unrenewed too long to act on. A
/// renewal that has not come back by the time the lease stops being fresh is given up, so a
/// server that holds the request (an election, a stalled server) cannot hold this host past its
/// lease: its writes stop, and it stops serving, before another host may take over.
async fn keep(
    leases: Leases,
    mut lease: Lease,
    lost: CancellationToken,
    fence: WriteFence,
    ttl: Duration,
) {
    let mut ticks = tokio::time::interval((ttl / 4).max(Duration::from_millis(250)));
    loop {
        ticks.tick().await;
        let fresh_until = tokio::time::Instant::from_std(lease.fresh_until());
        match tokio::time::timeout_at(fresh_until, leases.renew(&mut lease)).await {
            Ok(Ok(())) if fence.open_until(lease.fresh_until()) => {}
            Ok(Ok(())) => {
                stop_serving(
                    &fence,
                    &lost,
                    "a renewal of the gateway lease came back after this host's writes had stopped: this host stops serving, and the next active gateway takes its sessions up",
                );
                return;
            }
            Ok(Err(LeaseError::Lost { holder, .. })) => {
                let now = holder.map(|holder| holder.host).unwrap_or_default();
                stop_serving(
                    &fence,
                    &lost,
                    &format!("this host lost the gateway lease (to {now}): it stops serving"),
                );
                return;
            }
            Ok(Err(error)) => tracing::warn!("cannot renew the gateway lease: {error}"),
            Err(_) => tracing::warn!("a renewal of the gateway lease did not come back in time"),
        }
        if !lease.is_fresh() {
            stop_serving(
                &fence,
                &lost,
                "the gateway lease could not be renewed in time: this host stops serving before another may take over",
            );
            return;
        }
    }
}
