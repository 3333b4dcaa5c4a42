//! The leases of the JetStream backend against a real `nats-server`: one holder at a time, of
//! racing hosts exactly one, an epoch that only grows, a holder that stopped renewing refused by
//! the server and told who holds the lease now, and live hosts that drop out when they stop
//! announcing themselves, the partitions shared among those left.

use std::time::Duration;

use clawcage_cluster::leases::{Leases, PARTITIONS, partition_lease, partitions_won};
use clawcage_cluster::{ClusterOptions, Holder, LeaseError};
use clawcage_tests::nats::NatsServer;

use crate::cluster::connect_with;

/// Options whose leases last `seconds`.
pub(crate) fn short_leases(seconds: u64) -> ClusterOptions {
    ClusterOptions {
        lease_ttl: Duration::from_secs(seconds),
        ..ClusterOptions::default()
    }
}

fn holder(host: &str) -> Holder {
    Holder {
        host: host.to_string(),
        incarnation: format!("{host}-1"),
    }
}

/// The leases of two hosts, `a` and `b`, each on a connection of its own to `server`.
async fn hosts_a_and_b(server: &NatsServer, options: &ClusterOptions) -> (Leases, Leases) {
    let mut both = Vec::new();
    for name in ["a", "b"] {
        both.push(
            connect_with(server, options)
                .await
                .leases(holder(name))
                .await
                .unwrap(),
        );
    }
    let b = both.pop().unwrap();
    let a = both.pop().unwrap();
    (a, b)
}

#[tokio::test]
async fn a_lease_has_one_holder_a_growing_epoch_and_a_stale_holder_is_refused() {
    let Some(server) = NatsServer::start("a_lease_has_one_holder") else {
        return;
    };
    let options = short_leases(2);
    let (a, b) = hosts_a_and_b(&server, &options).await;
    let name = partition_lease(7);

    let mut first = a
        .acquire(&name)
        .await
        .unwrap()
        .expect("a free lease is taken");
    assert!(
        b.acquire(&name).await.unwrap().is_none(),
        "a held lease is not taken"
    );
    assert!(
        a.acquire(&name).await.unwrap().is_none(),
        "not twice by its holder either"
    );
    let (held_by, _) = b.holder(&name).await.unwrap().unwrap();
    assert_eq!(held_by, holder("a"));
    // Renewing keeps it past its time to live.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        a.renew(&mut first).await.unwrap();
        assert!(first.is_fresh());
    }
    assert!(
        b.acquire(&name).await.unwrap().is_none(),
        "renewed, so still held"
    );

    // `a` stops renewing (a pause, a lost network): it fences itself, then the lease expires.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !first.is_fresh(),
        "past 70% of the time to live a holder stops on its own"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let second = loop {
        if let Some(lease) = b.acquire(&name).await.unwrap() {
            break lease;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the expired lease was never free"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        second.epoch() > first.epoch(),
        "{} then {}",
        first.epoch(),
        second.epoch()
    );
    // The stale holder's renewal is refused by the server, naming the new holder.
    let error = a
        .renew(&mut first)
        .await
        .expect_err("a stale holder cannot renew");
    match &error {
        LeaseError::Lost { holder: now, .. } => assert_eq!(now.as_ref(), Some(&holder("b"))),
        other => panic!("not a lost lease: {other}"),
    }
    assert!(error.to_string().contains("held by b (b-1)"), "{error}");
    // Its release changes nothing: the lease stays `b`'s.
    a.release(first).await.unwrap();
    assert_eq!(a.holder(&name).await.unwrap().unwrap().0, holder("b"));
    // A release frees it at once, and the next holder's epoch is larger again.
    let second_epoch = second.epoch();
    b.release(second).await.unwrap();
    let third = a
        .acquire(&name)
        .await
        .unwrap()
        .expect("a released lease is free");
    assert!(third.epoch() > second_epoch);
    let all = a.all().await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        (all[0].0.as_str(), &all[0].1),
        (name.as_str(), &holder("a"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_racing_for_a_free_lease_get_it_exactly_once() {
    let Some(server) = NatsServer::start("hosts_racing_for_a_free_lease") else {
        return;
    };
    let options = ClusterOptions::default();
    let mut racers = Vec::new();
    for host in ["a", "b", "c", "d"] {
        let leases = connect_with(&server, &options)
            .await
            .leases(holder(host))
            .await
            .unwrap();
        for _ in 0..4 {
            let leases = leases.clone();
            racers.push(tokio::spawn(async move {
                leases.acquire("cron").await.unwrap()
            }));
        }
    }
    let mut won = Vec::new();
    for racer in racers {
        if let Some(lease) = racer.await.unwrap() {
            won.push(lease);
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
}

#[tokio::test]
async fn live_hosts_are_listed_until_they_stop_announcing_and_share_the_partitions() {
    let Some(server) = NatsServer::start("live_hosts_are_listed") else {
        return;
    };
    // Hosts are forgotten after three times the lease's time to live: 3 s here.
    let options = short_leases(1);
    let (a, b) = hosts_a_and_b(&server, &options).await;
    a.announce(Some("http://a:18789/".to_string()), 1)
        .await
        .unwrap();
    b.announce(None, 2).await.unwrap();
    let live = a.live_hosts().await.unwrap();
    let ids: Vec<String> = live.iter().map(|host| host.holder.host.clone()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(live[0].url.as_deref(), Some("http://a:18789/"));
    let shares: usize = ids
        .iter()
        .map(|host| partitions_won(host, &ids, PARTITIONS).len())
        .sum();
    assert_eq!(shares, PARTITIONS as usize);
    // `b` stops announcing; `a` goes on.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        a.announce(Some("http://a:18789/".to_string()), 1)
            .await
            .unwrap();
        let live = a.live_hosts().await.unwrap();
        if live.iter().all(|host| host.holder.host != "b") {
            assert_eq!(live.len(), 1, "{live:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never dropped out: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
