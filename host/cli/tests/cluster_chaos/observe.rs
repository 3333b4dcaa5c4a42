//! What the cluster's chaos suite watches and checks besides its sends: a client following one
//! session's events across every takeover, the cluster's inboxes read directly, the cron
//! session's firings and answers, and the wait for a fresh NATS cluster to take replicated
//! writes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use serde_json::json;

use super::workload::FIRING;
use super::{Addresses, CRON_SESSION, HOSTS, TOKEN, WATCHED, lock};

/// A client through host `turn` (modulo the hosts) when it takes one (a standby relays it to the
/// active host), else through the active host at `active`.
pub(super) async fn client_through(
    addresses: &Addresses,
    active: std::net::SocketAddr,
    turn: usize,
) -> GatewayClient {
    let host = turn % HOSTS.len();
    let through = lock(addresses)[host];
    if let Some(addr) = through
        && let Ok((client, _)) = GatewayClient::try_connect(addr, TOKEN).await
    {
        let how = if addr == active {
            "the active host"
        } else {
            "a standby, relayed"
        };
        eprintln!("cluster chaos: sending through {} ({how})", HOSTS[host]);
        return client;
    }
    GatewayClient::connect(active, TOKEN).await.0
}

/// Follows [`WATCHED`]'s events from its first, as a client whose host dies would: connected to
/// one host after another (`addresses`; a standby relays it to the active host `hosts` names),
/// and, each time its connection ends or another host becomes active, subscribing again
/// through the next one from the last event it saw. Every event seen is pushed to `seen`.
pub(super) async fn watch_events(
    mut hosts: tokio::sync::watch::Receiver<std::net::SocketAddr>,
    addresses: Addresses,
    seen: Arc<Mutex<Vec<serde_json::Value>>>,
) {
    let mut turn = 0;
    loop {
        let active = *hosts.borrow_and_update();
        turn += 1;
        let addr = lock(&addresses)[turn % HOSTS.len()].unwrap_or(active);
        let since = lock(&seen)
            .last()
            .and_then(|event| event["seq"].as_u64())
            .unwrap_or(0);
        let subscribed = async {
            let (mut client, _) = GatewayClient::try_connect(addr, TOKEN).await?;
            let id = client
                .try_send_request(
                    "sessions.subscribe",
                    json!({"sessionKey": WATCHED, "since": since}),
                )
                .await?;
            let answer = client.try_response(&id).await?;
            if answer["ok"] != true {
                return Err(format!("{answer}"));
            }
            Ok::<_, String>(client)
        };
        let Ok(mut client) = subscribed.await else {
            // That host is gone already: the next one is named soon.
            let _ = tokio::time::timeout(Duration::from_millis(200), hosts.changed()).await;
            continue;
        };
        let mut probed = Instant::now();
        while !hosts.has_changed().unwrap_or(true) {
            // The host it goes through may die (a standby killed): the connection's end is
            // found by a request that cannot be sent.
            if probed.elapsed() >= Duration::from_secs(1) {
                probed = Instant::now();
                if client.try_send_request("health", json!({})).await.is_err() {
                    break;
                }
            }
            let asked = Instant::now();
            match client.next_event(Duration::from_millis(200)).await {
                Some(event)
                    if event["event"] == "agent" && event["payload"]["sessionKey"] == WATCHED =>
                {
                    lock(&seen).push(event["payload"].clone());
                }
                Some(_) => {}
                // Closed (its host died): found by the next probe.
                None if asked.elapsed() < Duration::from_millis(100) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None => {}
            }
        }
    }
}

/// A reader of the cluster's inboxes (it never claims or appends).
fn inbox_of(nats: &str, replicas: usize) -> clawcage_cluster::JetStreamInbox {
    clawcage_cluster::JetStreamInbox::connect(
        nats,
        &clawcage_cluster::ClusterOptions {
            replicas,
            ..Default::default()
        },
        clawcage_cluster::Holder {
            host: "chaos-reader".to_string(),
            incarnation: "1".to_string(),
        },
        clawcage_cluster::Claims::CoveredByCaller,
    )
    .unwrap()
}

/// A reading connection to the cluster (it sets up nothing the hosts have not).
pub(super) async fn cluster_of(nats: &str, replicas: usize) -> clawcage_cluster::Cluster {
    clawcage_cluster::Cluster::connect(
        nats,
        &clawcage_cluster::ClusterOptions {
            replicas,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// The cron job fires on (two more firings answered), is removed with `remove` (a `clawcage`
/// of one of the hosts), its last firing let end; then every firing was answered once and each
/// slot's key taken once. How many times it fired.
pub(super) async fn cron_fired_once(
    client: &mut GatewayClient,
    mut remove: std::process::Command,
    nats: &str,
    replicas: usize,
    seed: u64,
) -> usize {
    let answered_now = cron_answers(client).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while cron_answers(client).await < answered_now + 2 {
        assert!(
            Instant::now() < deadline,
            "the cron job stopped firing (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let removed = remove.args(["cron", "remove", "job-1"]).output().unwrap();
    assert!(removed.status.success(), "{removed:?}");
    let (firings, answers) = cron_turns(client, &inbox_of(nats, replicas), seed).await;
    assert!(firings >= 3, "the job fired {firings} times (seed {seed})");
    assert_eq!(firings, answers, "every firing answered once (seed {seed})");
    firings
}

/// The cron session's history as JSON text.
pub(super) async fn cron_history(client: &mut GatewayClient) -> String {
    client
        .request(
            "chat.history",
            json!({"sessionKey": CRON_SESSION, "limit": 1000}),
        )
        .await
        .to_string()
}

/// The cron job's firings answered so far.
pub(super) async fn cron_answers(client: &mut GatewayClient) -> usize {
    cron_history(client)
        .await
        .matches(&format!("Answered: {FIRING}"))
        .count()
}

/// Once no firing of the cron session is pending: the firings it took as turns and the answers
/// to them in its history, after checking that the inbox took each slot's key once and that
/// every firing it took is in the history.
async fn cron_turns(
    client: &mut GatewayClient,
    inbox: &clawcage_cluster::JetStreamInbox,
    seed: u64,
) -> (usize, usize) {
    use clawcage_agent::LaneInbox as _;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !inbox.pending(CRON_SESSION).unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "cron firings still pending after 60 s (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let keys: Vec<String> = inbox
        .finished(CRON_SESSION)
        .unwrap()
        .into_iter()
        .filter_map(|input| input.idempotency)
        .collect();
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "each slot taken once: {keys:?} (seed {seed})"
    );
    assert!(
        keys.iter().all(|key| key.starts_with("cron:job-1:")),
        "{keys:?}"
    );
    let history = cron_history(client).await;
    let answers = history.matches(&format!("Answered: {FIRING}")).count();
    let firings = history.matches(FIRING).count() - answers;
    assert_eq!(
        firings,
        keys.len(),
        "every firing taken is a turn (seed {seed}): {keys:?}"
    );
    (firings, answers)
}

/// Waits until a fresh three-server cluster takes replicated writes (its JetStream layer elects
/// its leaders first; on a busy machine that takes up to a minute), so that the hosts start on a
/// formed cluster, as in production.
pub(super) async fn cluster_ready(nats: &str, replicas: usize, seed: u64) {
    let options = clawcage_cluster::ClusterOptions {
        replicas,
        ..Default::default()
    };
    let started = Instant::now();
    loop {
        let url = nats.to_string();
        let options = options.clone();
        let ready = tokio::task::spawn_blocking(move || {
            clawcage_cluster::KvRecords::connect(&url, &options)
                .map_err(|error| error.to_string())
                .and_then(|records| records.take_once(&format!("ready.{}", std::process::id())))
        })
        .await
        .unwrap();
        match ready {
            Ok(_) => return,
            Err(error) => {
                assert!(
                    started.elapsed() < Duration::from_secs(180),
                    "the NATS cluster took no replicated write within 180 s (seed {seed}): {error}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
