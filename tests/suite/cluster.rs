//! The JetStream backend (`clawcage-cluster`) against a real `nats-server`, beyond the store
//! contracts every backend passes: servers it must refuse (Debian's 2.9, no JetStream,
//! unreadable credentials, nobody listening, a certificate from an authority it was not given,
//! no TLS where TLS is required), TLS through a given authority, a stale owner's appends refused
//! by the server itself, an event larger than the server takes, a server that goes away and
//! comes back under a follower, session keys full of subject syntax, the binary search that
//! finds where a reader starts among many sessions' events, the bounded window, a removal that
//! neither lets an older owner back in nor leaves followers waiting, and reads and followers
//! that leave no consumer on the server once they are done. Leases: one holder at a time, of
//! racing hosts exactly one, an epoch that only grows, a holder that stopped renewing refused by
//! the server and told who holds the lease now, and live hosts that drop out when they stop
//! announcing themselves. Transcripts: a host that lost a session to another host is refused by
//! the server when it writes again, entries are scrubbed before they leave the process, the
//! synchronous store works from inside a single-threaded runtime, and an entry larger than the
//! server takes is an error that leaves the transcript usable. Inboxes: hosts appending to one
//! session at once keep one order and one input per idempotency key, a restarted host takes its
//! claims back at once while another host waits for the dead one's lease to lapse, and a long
//! session is rolled up without losing what is pending or remembered. Three servers: the stores
//! (R3) ride through the death of one server, a write waiting for new stream leaders and then
//! going through once.

use std::time::Duration;

use clawcage_agent::events::{AgentEvent, EventLogError, Stream};
use clawcage_agent::inbox::{Appended, InputRecord, InputStatus};
use clawcage_agent::session::queue::{Origin, QueuedJob};
use clawcage_agent::transcript::{Entry, now_ms};
use clawcage_agent::{LaneInbox, TranscriptStore};
use clawcage_cluster::leases::{PARTITIONS, partition_lease, partitions_won};
use clawcage_cluster::{
    Claims, Cluster, ClusterOptions, Holder, JetStreamInbox, JetStreamTranscripts, LeaseError,
    TlsOptions,
};
use clawcage_core::ChatMessage;
use clawcage_core::redact::Redactor;
use clawcage_tests::nats::NatsServer;
use serde_json::json;

async fn connect(server: &NatsServer) -> Cluster {
    connect_with(server, &ClusterOptions::default()).await
}

async fn connect_with(server: &NatsServer, options: &ClusterOptions) -> Cluster {
    Cluster::connect(&server.url(), options)
        .await
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()))
}

/// Event `seq` of `key` with `text`, numbered as its owner numbers it.
fn event(key: &str, seq: u64, text: &str) -> AgentEvent {
    let mut event = AgentEvent::new(key, "run", Stream::Assistant, json!({"delta": text}));
    event.seq = seq;
    event
}

/// The next event of a follower, within 60 s (`None` when it ended).
async fn next(events: &mut tokio::sync::mpsc::Receiver<AgentEvent>) -> Option<AgentEvent> {
    tokio::time::timeout(Duration::from_secs(60), events.recv())
        .await
        .expect("the follower neither delivered nor ended within 60 s")
}

#[tokio::test]
async fn a_server_without_jetstream_is_refused_saying_how_to_start_it() {
    let Some(server) = NatsServer::start_with("a_server_without_jetstream", false) else {
        return;
    };
    let error = Cluster::connect(&server.url(), &ClusterOptions::default())
        .await
        .err()
        .map(|error| error.to_string())
        .expect("a server without JetStream is refused");
    assert!(
        error.contains("without JetStream") && error.contains("-js") && error.contains("2.15.1"),
        "{error}"
    );
    assert!(error.contains(&server.url()), "names the server: {error}");
}

#[tokio::test]
async fn a_server_older_than_2_10_is_refused_naming_its_version() {
    let Some(server) = NatsServer::start_old("a_server_older_than_2_10") else {
        return;
    };
    let error = Cluster::connect(&server.url(), &ClusterOptions::default())
        .await
        .err()
        .map(|error| error.to_string())
        .expect("nats-server 2.9 is refused");
    assert!(
        error.contains("version 2.9.10") && error.contains("2.10 or newer"),
        "{error}"
    );
}

#[tokio::test]
async fn tls_reaches_a_server_only_through_the_authority_it_was_given() {
    let Some((server, authority)) = NatsServer::start_tls("tls_reaches_a_server") else {
        return;
    };
    let trusting = ClusterOptions {
        tls: TlsOptions {
            required: true,
            root_certificates: Some(authority),
            client_certificate: None,
        },
        ..ClusterOptions::default()
    };
    let log = connect_with(&server, &trusting).await.event_log();
    log.append(event("agent:main:webchat:tls", 1, "over TLS"), 1)
        .await
        .unwrap();
    assert_eq!(log.last_seq("agent:main:webchat:tls").await.unwrap(), 1);
    // The system's roots do not know the test authority: refused, and said where.
    let options = ClusterOptions {
        connect_timeout: Duration::from_secs(3),
        ..ClusterOptions::default()
    };
    let error = Cluster::connect(&server.url(), &options)
        .await
        .err()
        .map(|error| error.to_string())
        .expect("an unknown certificate authority is refused");
    assert!(
        error.contains(&server.url()) && error.contains("certificate"),
        "{error}"
    );
    // TLS required of a server that does not offer it.
    let Some(plain) = NatsServer::start("tls_reaches_a_server (plain)") else {
        return;
    };
    let error = Cluster::connect(&plain.url(), &trusting)
        .await
        .err()
        .map(|error| error.to_string())
        .expect("a server without TLS is refused when TLS is required");
    assert!(
        error.contains(&plain.url()) && error.contains("does the server offer TLS"),
        "{error}"
    );
}

#[tokio::test]
async fn unreadable_credentials_and_an_absent_server_are_clear_errors() {
    let Some(server) = NatsServer::start("unreadable_credentials") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.creds");
    let options = ClusterOptions {
        credentials_file: Some(missing.clone()),
        ..ClusterOptions::default()
    };
    let error = Cluster::connect(&server.url(), &options)
        .await
        .err()
        .map(|error| error.to_string())
        .expect("a missing credentials file is refused");
    assert!(
        error.contains("credentials file") && error.contains(&missing.display().to_string()),
        "{error}"
    );
    // A file that is not credentials at all.
    let garbage = dir.path().join("garbage.creds");
    std::fs::write(&garbage, "not a credentials file\n").unwrap();
    let options = ClusterOptions {
        credentials_file: Some(garbage),
        ..ClusterOptions::default()
    };
    let refused = Cluster::connect(&server.url(), &options).await;
    assert!(refused.is_err(), "garbage credentials are refused");
    // Nobody listens: named, with what to check.
    let mut gone = server;
    let url = gone.url();
    gone.kill();
    let options = ClusterOptions {
        connect_timeout: Duration::from_secs(2),
        ..ClusterOptions::default()
    };
    let error = Cluster::connect(&url, &options)
        .await
        .err()
        .map(|error| error.to_string())
        .expect("an absent server is an error");
    assert!(
        error.contains(&url) && error.contains("check that nats-server runs"),
        "{error}"
    );
}

#[tokio::test]
async fn a_stale_owners_append_is_refused_by_the_server_after_a_newer_owner_wrote() {
    let Some(server) = NatsServer::start("a_stale_owners_append") else {
        return;
    };
    let key = "agent:main:webchat:fenced";
    // Two processes: the old owner (epoch 1) and the one that took the session over (epoch 2).
    let old = connect(&server).await.event_log();
    let new = connect(&server).await.event_log();
    for seq in 1..=3 {
        old.append(event(key, seq, "old"), 1).await.unwrap();
    }
    assert_eq!(new.last_seq(key).await.unwrap(), 3);
    new.append(event(key, 4, "new"), 2).await.unwrap();
    // The old owner still believes it is at the end of the log: only the server can refuse it.
    let refused = old.append(event(key, 4, "zombie"), 1).await;
    assert!(
        matches!(
            refused,
            Err(EventLogError::Fenced {
                epoch: 1,
                current: 2,
                ..
            })
        ),
        "{refused:?}"
    );
    let refused = old.append(event(key, 9, "zombie"), 1).await;
    assert!(
        matches!(refused, Err(EventLogError::Fenced { .. })),
        "{refused:?}"
    );
    // Two writers of the same epoch numbering the same place: the second is out of order.
    let twin = connect(&server).await.event_log();
    assert_eq!(twin.last_seq(key).await.unwrap(), 4);
    new.append(event(key, 5, "new"), 2).await.unwrap();
    let twice = twin.append(event(key, 5, "twin"), 2).await;
    assert!(
        matches!(
            twice,
            Err(EventLogError::OutOfOrder {
                seq: 5,
                last: 5,
                ..
            })
        ),
        "{twice:?}"
    );
    // The one that is behind but not wrong goes on after one retry.
    twin.append(event(key, 6, "twin"), 2).await.unwrap();
    let texts: Vec<String> = new
        .read(key, 0, 100)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| format!("{}:{}", e.seq, e.data["delta"].as_str().unwrap()))
        .collect();
    assert_eq!(
        texts,
        ["1:old", "2:old", "3:old", "4:new", "5:new", "6:twin"]
    );
}

#[tokio::test]
async fn an_event_larger_than_the_server_takes_is_an_error_and_the_log_goes_on() {
    let Some(server) = NatsServer::start("an_event_larger_than_the_server_takes") else {
        return;
    };
    let cluster = connect(&server).await;
    let log = cluster.event_log();
    let key = "agent:main:webchat:huge";
    log.append(event(key, 1, "small"), 1).await.unwrap();
    let huge = "x".repeat(cluster.max_payload() + 1);
    let refused = log.append(event(key, 2, &huge), 1).await;
    let message = match refused {
        Err(EventLogError::Io(error)) => {
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
            error.to_string()
        }
        other => panic!("a huge event: {other:?}"),
    };
    assert!(
        message.contains("max_payload") && message.contains("event 2"),
        "{message}"
    );
    log.append(event(key, 2, "small again"), 1).await.unwrap();
    assert_eq!(log.last_seq(key).await.unwrap(), 2);
}

#[tokio::test]
async fn a_follower_outlives_a_server_restart_without_repeating_an_event() {
    let Some(mut server) = NatsServer::start("a_follower_outlives_a_server_restart") else {
        return;
    };
    let log = connect(&server).await.event_log();
    let key = "agent:main:webchat:restart";
    for seq in 1..=50 {
        log.append(event(key, seq, "before"), 1).await.unwrap();
    }
    let mut follow = log.follow(key, 0).await.unwrap();
    for seq in 1..=20 {
        assert_eq!(next(&mut follow.events).await.map(|e| e.seq), Some(seq));
    }
    // The server goes away with events unread, and comes back on the same store.
    server.restart();
    let mut seq = 51;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seq <= 100 {
        match log.append(event(key, seq, "after"), 1).await {
            Ok(_) => seq += 1,
            Err(error) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no append within 60 s of the restart: {error}\n{}",
                    server.log()
                );
                // As an owner does: the event may have been stored; number on from the log.
                if let Ok(last) = log.last_seq(key).await {
                    seq = seq.max(last + 1);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut seen = Vec::new();
    while seen.len() < 80 {
        match next(&mut follow.events).await {
            Some(event) => seen.push(event.seq),
            None => panic!("the follower ended after {seen:?}"),
        }
    }
    assert_eq!(
        seen,
        (21..=100).collect::<Vec<_>>(),
        "each event once, in order"
    );
    assert_eq!(log.last_seq(key).await.unwrap(), 100);
}

#[tokio::test]
async fn session_keys_with_subject_syntax_stay_apart() {
    let Some(server) = NatsServer::start("session_keys_with_subject_syntax") else {
        return;
    };
    let log = connect(&server).await.event_log();
    let keys = [
        "agent:main:webchat:a",
        "agent.main.webchat.a",
        "agent*main",
        "agent>main",
        "agent main",
        ">",
        "*",
        "a.>",
        "agent=3Amain=3Awebchat=3Aa",
        "",
        "ключ",
    ];
    for (n, key) in keys.iter().enumerate() {
        for seq in 1..=2 {
            log.append(event(key, seq, &format!("{n}")), 1)
                .await
                .unwrap_or_else(|error| panic!("{key:?}: {error}"));
        }
    }
    for (n, key) in keys.iter().enumerate() {
        let replay = log.read(key, 0, 100).await.unwrap();
        let own: Vec<(u64, String)> = replay
            .events
            .iter()
            .map(|e| (e.seq, e.data["delta"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(own, [(1, n.to_string()), (2, n.to_string())], "{key:?}");
        assert!(replay.events.iter().all(|e| e.session_key == *key));
    }
    // A follower of one sees none of the others' events.
    let mut follow = log.follow(">", 2).await.unwrap();
    log.append(event("*", 3, "star"), 1).await.unwrap();
    log.append(event(">", 3, "greater"), 1).await.unwrap();
    let got = next(&mut follow.events).await.unwrap();
    assert_eq!((got.session_key.as_str(), got.seq), (">", 3));
}

#[tokio::test]
async fn readers_start_right_after_since_among_many_sessions_events() {
    let Some(server) = NatsServer::start("readers_start_right_after_since") else {
        return;
    };
    let log = connect(&server).await.event_log();
    let keys = ["s:a", "s:b", "s:c"];
    // Interleaved, with an uneven share per session, so stream and session positions differ.
    for round in 1..=120u64 {
        for (n, key) in keys.iter().enumerate() {
            if round % (n as u64 + 1) == 0 {
                log.append(event(key, round / (n as u64 + 1), "x"), 1)
                    .await
                    .unwrap();
            }
        }
    }
    for (key, total) in [("s:a", 120u64), ("s:b", 60), ("s:c", 40)] {
        for since in [0, 1, total / 3, total / 2, total - 1, total, total + 5] {
            let replay = log.read(key, since, 7).await.unwrap();
            let seqs: Vec<u64> = replay.events.iter().map(|e| e.seq).collect();
            let expected: Vec<u64> = (since + 1..=total).take(7).collect();
            assert_eq!(seqs, expected, "{key} since {since}");
            assert_eq!((replay.first_retained, replay.last_seq), (1, total));
        }
        let mut follow = log.follow(key, total / 2).await.unwrap();
        assert_eq!(
            next(&mut follow.events).await.map(|e| e.seq),
            Some(total / 2 + 1),
            "{key}"
        );
    }
}

#[tokio::test]
async fn the_window_keeps_the_newest_events_and_reports_the_gap() {
    let Some(server) = NatsServer::start("the_window_keeps_the_newest_events") else {
        return;
    };
    let options = ClusterOptions {
        events_per_session: 10,
        ..ClusterOptions::default()
    };
    let log = connect_with(&server, &options).await.event_log();
    let key = "agent:main:webchat:window";
    for seq in 1..=35 {
        log.append(event(key, seq, "x"), 1).await.unwrap();
    }
    let replay = log.read(key, 0, 1000).await.unwrap();
    assert_eq!((replay.first_retained, replay.last_seq), (26, 35));
    let seqs: Vec<u64> = replay.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (26..=35).collect::<Vec<_>>());
    let follow = log.follow(key, 3).await.unwrap();
    assert_eq!(
        (follow.first_retained, follow.last_seq),
        (26, 35),
        "a follower from before the window learns of its gap"
    );
}

#[tokio::test]
async fn a_removed_session_keeps_its_fence_and_ends_every_follower() {
    let Some(server) = NatsServer::start("a_removed_session_keeps_its_fence") else {
        return;
    };
    let log = connect(&server).await.event_log();
    let other = connect(&server).await.event_log();
    let key = "agent:main:webchat:removed";
    let mut empty = other.follow("agent:main:webchat:never", 0).await.unwrap();
    for seq in 1..=3 {
        log.append(event(key, seq, "x"), 5).await.unwrap();
    }
    let mut follow = other.follow(key, 0).await.unwrap();
    // What was kept is delivered first (a removal before the follower read them would take
    // them away: the follower then ends with nothing, as a removed session has nothing).
    let mut seen = Vec::new();
    for _ in 1..=3 {
        seen.push(next(&mut follow.events).await.map(|event| event.seq));
    }
    assert_eq!(seen, [Some(1), Some(2), Some(3)]);
    log.remove(key).await.unwrap();
    assert!(
        next(&mut follow.events).await.is_none(),
        "the follower ends after the removal"
    );
    other.remove("agent:main:webchat:never").await.unwrap();
    assert!(
        next(&mut empty.events).await.is_none(),
        "a follower of a session without events ends too"
    );
    assert_eq!(other.last_seq(key).await.unwrap(), 0);
    let replay = other.read(key, 0, 100).await.unwrap();
    assert!(replay.events.is_empty(), "{replay:?}");
    assert_eq!((replay.first_retained, replay.last_seq), (1, 0));
    let stale = other.append(event(key, 1, "stale"), 4).await;
    assert!(
        matches!(stale, Err(EventLogError::Fenced { current: 5, .. })),
        "an older owner stays fenced after the removal: {stale:?}"
    );
    other.append(event(key, 1, "again"), 5).await.unwrap();
    let mut fresh = log.follow(key, 0).await.unwrap();
    assert_eq!(
        (fresh.first_retained, fresh.last_seq),
        (1, 1),
        "numbered from 1 again"
    );
    assert_eq!(next(&mut fresh.events).await.map(|e| e.seq), Some(1));
}

#[tokio::test]
async fn reads_and_ended_followers_leave_no_consumer_behind() {
    let Some(server) = NatsServer::start("reads_and_ended_followers_leave_no_consumer") else {
        return;
    };
    let cluster = connect(&server).await;
    let log = cluster.event_log();
    let key = "agent:main:webchat:consumers";
    for seq in 1..=5 {
        log.append(event(key, seq, "x"), 1).await.unwrap();
    }
    for since in 0..20 {
        log.read(key, since % 5, 100).await.unwrap();
    }
    let mut follows = Vec::new();
    for since in 0..5 {
        follows.push(log.follow(key, since).await.unwrap());
    }
    assert!(
        cluster.open_event_consumers().await.unwrap() >= 5,
        "the followers' consumers"
    );
    drop(follows);
    // The server would otherwise keep each for its 30 s inactivity threshold.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = cluster.open_event_consumers().await.unwrap();
        if open == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} consumers still open 10 s after the reads and followers ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Options whose leases last `seconds`.
fn short_leases(seconds: u64) -> ClusterOptions {
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

#[tokio::test]
async fn a_lease_has_one_holder_a_growing_epoch_and_a_stale_holder_is_refused() {
    let Some(server) = NatsServer::start("a_lease_has_one_holder") else {
        return;
    };
    let options = short_leases(2);
    let a = connect_with(&server, &options)
        .await
        .leases(holder("a"))
        .await
        .unwrap();
    let b = connect_with(&server, &options)
        .await
        .leases(holder("b"))
        .await
        .unwrap();
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
    let a = connect_with(&server, &options)
        .await
        .leases(holder("a"))
        .await
        .unwrap();
    let b = connect_with(&server, &options)
        .await
        .leases(holder("b"))
        .await
        .unwrap();
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

/// A message of the conversation: the user's at odd times, the assistant's at even ones (two
/// messages of one role in a row would be read as one).
fn message(at_ms: u64, text: &str) -> Entry {
    Entry::Message {
        at_ms,
        message: if at_ms % 2 == 1 {
            ChatMessage::user(text)
        } else {
            ChatMessage::assistant(text)
        },
    }
}

fn transcripts(server: &NatsServer, redactor: Redactor) -> JetStreamTranscripts {
    JetStreamTranscripts::connect(&server.url(), &ClusterOptions::default(), redactor)
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()))
}

#[test]
fn a_host_that_lost_a_session_is_refused_when_it_writes_again() {
    let Some(server) = NatsServer::start("a_host_that_lost_a_session") else {
        return;
    };
    let key = "agent:main:webchat:alice";
    let first = transcripts(&server, Redactor::default());
    first.append_steps(key, &[message(1, "one")]).unwrap();
    first.append_steps(key, &[message(2, "two")]).unwrap();
    // Another host takes the session over: it reads what is there, then writes.
    let second = transcripts(&server, Redactor::default());
    assert_eq!(second.load(key, 100).unwrap().messages.len(), 2);
    second.append_steps(key, &[message(3, "three")]).unwrap();
    // The first host's next write is refused by the server, and nothing of it is stored.
    let error = first
        .append_steps(key, &[message(4, "stale")])
        .expect_err("a stale writer is refused");
    assert!(
        error.to_string().contains("written by another host"),
        "{error}"
    );
    let texts: Vec<String> = second
        .load(key, 100)
        .unwrap()
        .messages
        .iter()
        .map(ChatMessage::text)
        .collect();
    assert_eq!(texts, ["one", "two", "three"]);
    // Having read again, it may write again (it owns the session once more).
    first.load(key, 100).unwrap();
    first.append_steps(key, &[message(4, "back")]).unwrap();
    assert_eq!(second.load(key, 100).unwrap().messages.len(), 4);
}

#[tokio::test]
async fn entries_are_scrubbed_and_the_store_works_inside_a_single_threaded_runtime() {
    let Some(server) = NatsServer::start("entries_are_scrubbed") else {
        return;
    };
    const SECRET: &str = "sk-transcript-secret-0123456789";
    // Built and called on this test's single-threaded runtime: the store's own runtime answers.
    let store = transcripts(&server, Redactor::new([("PROVIDER_KEY", SECRET)]));
    let key = "agent:main:test:secret";
    store
        .append_steps(key, &[message(1, &format!("the key is {SECRET}"))])
        .unwrap();
    let loaded = store.load(key, 10).unwrap();
    let text = loaded.messages[0].text();
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.contains("[redacted: PROVIDER_KEY]"), "{text}");
    // What the server holds is scrubbed too.
    let cluster = connect(&server).await;
    let status = cluster.status().await.unwrap();
    let transcripts_stream = status
        .streams
        .iter()
        .find(|stream| stream.name == "CLAW_TX")
        .expect("the transcript stream is listed");
    assert_eq!(transcripts_stream.messages, 1);
    let listed = store.sessions().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].key, key,
        "the key comes back whole from its header"
    );
}

#[test]
fn an_entry_larger_than_the_server_takes_is_an_error_and_the_transcript_goes_on() {
    let Some(server) = NatsServer::start("an_entry_larger_than_the_server_takes") else {
        return;
    };
    let store = transcripts(&server, Redactor::default());
    let key = "agent:main:test:large";
    store.append_steps(key, &[message(1, "small")]).unwrap();
    let huge = "x".repeat(2 << 20);
    let error = store
        .append_steps(key, &[message(4, &huge)])
        .expect_err("an entry over max_payload is refused");
    assert!(
        error.to_string().contains("transcript of session"),
        "{error}"
    );
    store.append_steps(key, &[message(2, "after")]).unwrap();
    let texts: Vec<String> = store
        .load(key, 10)
        .unwrap()
        .messages
        .iter()
        .map(ChatMessage::text)
        .collect();
    assert_eq!(texts, ["small", "after"]);
}

fn input(id: &str, key: Option<&str>) -> InputRecord {
    InputRecord {
        id: id.to_string(),
        at_ms: now_ms(),
        idempotency: key.map(str::to_string),
        job: QueuedJob::User {
            text: format!("text of {id}"),
            origin: Origin::of_key("agent:main:test:inbox"),
        },
        stop_requested: false,
    }
}

fn inbox(
    server: &NatsServer,
    options: &ClusterOptions,
    host: &str,
    incarnation: &str,
) -> JetStreamInbox {
    let me = Holder {
        host: host.to_string(),
        incarnation: incarnation.to_string(),
    };
    JetStreamInbox::connect(&server.url(), options, me, Claims::PerSession)
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()))
}

#[test]
fn hosts_appending_to_one_session_at_once_keep_one_order_and_one_input_per_key() {
    let Some(server) = NatsServer::start("hosts_appending_to_one_session") else {
        return;
    };
    let options = ClusterOptions::default();
    let hosts = [
        inbox(&server, &options, "a", "1"),
        inbox(&server, &options, "b", "1"),
    ];
    let key = "agent:main:test:inbox";
    // Four senders on each host; every idempotency key is sent by two of them.
    let new = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (number, host) in hosts.iter().cycle().take(8).enumerate() {
            let new = &new;
            scope.spawn(move || {
                for round in 0..5 {
                    let id = format!("r{number}-{round}");
                    let idempotency = format!("k{}-{round}", number % 4);
                    if host.append(key, &input(&id, Some(&idempotency))).unwrap() == Appended::New {
                        new.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            });
        }
    });
    // 4 keys × 5 rounds, each taken once.
    assert_eq!(new.load(std::sync::atomic::Ordering::SeqCst), 20);
    let seen_by_a: Vec<String> = hosts[0]
        .pending(key)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    let fresh = inbox(&server, &options, "c", "1");
    let seen_by_c: Vec<String> = fresh
        .pending(key)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(seen_by_c.len(), 20, "{seen_by_c:?}");
    let mut keys: Vec<String> = fresh
        .pending(key)
        .unwrap()
        .into_iter()
        .filter_map(|record| record.idempotency)
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 20, "one input per key");
    // One order, whichever host reads.
    let seen_by_b: Vec<String> = hosts[1]
        .pending(key)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(seen_by_a, seen_by_c);
    assert_eq!(seen_by_b, seen_by_c);
}

#[test]
fn a_restarted_host_takes_its_claims_back_at_once_and_another_host_waits_for_the_lease() {
    let Some(server) = NatsServer::start("a_restarted_host_takes_its_claims_back") else {
        return;
    };
    let options = short_leases(2);
    let key = "agent:main:test:claims";
    // Host a's first start claimed the session, then died without giving it back: its lease
    // is there, renewed by nobody.
    let dead = lease_left_by_a_dead_process(&server, &options, "a", "1");
    let stranger = inbox(&server, &options, "b", "1");
    assert!(
        !stranger.claim(key).unwrap(),
        "a lease not yet lapsed is respected"
    );
    // Host a starts again: the lease of its earlier self is a dead process's, taken at once.
    let restarted = inbox(&server, &options, "a", "2");
    assert!(
        restarted.claim(key).unwrap(),
        "its own earlier lease is taken back at once"
    );
    drop(dead);
    // Held and renewed by the restarted host: the other host still cannot take it, even after
    // several times the lease's time to live.
    std::thread::sleep(Duration::from_secs(5));
    assert!(!stranger.claim(key).unwrap(), "a renewed claim holds");
    // Given back at the end (the last handle's drop), it is free for the other host at once.
    drop(restarted);
    assert!(stranger.claim(key).unwrap());
}

/// A claim left by a process of `host` (`incarnation`) that died holding it: a lease taken on
/// a connection of its own and never renewed.
fn lease_left_by_a_dead_process(
    server: &NatsServer,
    options: &ClusterOptions,
    host: &str,
    incarnation: &str,
) -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let holder = Holder {
        host: host.to_string(),
        incarnation: incarnation.to_string(),
    };
    runtime.block_on(async {
        let cluster = Cluster::connect(&server.url(), options).await.unwrap();
        let leases = cluster.leases(holder).await.unwrap();
        leases
            .acquire("inbox.agent:main:test:claims")
            .await
            .unwrap()
            .expect("the session's claim was free");
    });
    runtime
}

#[test]
fn a_long_session_is_rolled_up_keeping_what_is_pending_and_remembered() {
    let Some(server) = NatsServer::start("a_long_session_is_rolled_up") else {
        return;
    };
    let options = ClusterOptions::default();
    let writer = inbox(&server, &options, "a", "1");
    let key = "agent:main:test:long";
    for number in 0..150 {
        let id = format!("i{number}");
        writer
            .append(key, &input(&id, Some(&format!("key{number}"))))
            .unwrap();
        if number % 10 != 9 {
            writer.done(key, &[id], InputStatus::Ok).unwrap();
        }
    }
    let reader = inbox(&server, &options, "b", "1");
    let pending: Vec<String> = reader
        .pending(key)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(pending.len(), 15, "{pending:?}");
    assert_eq!(pending[0], "i9");
    assert_eq!(reader.finished(key).unwrap().len(), 135);
    assert_eq!(
        reader.append(key, &input("again", Some("key3"))).unwrap(),
        Appended::Duplicate("i3".to_string()),
        "a key done long ago in this session is still remembered"
    );
    // Fewer records than the 285 written: dead ones were rolled up.
    let stored = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let status = connect(&server).await.status().await.unwrap();
        status
            .streams
            .iter()
            .find(|stream| stream.name == "CLAW_INBOX")
            .map(|stream| stream.messages)
            .unwrap_or_default()
    });
    assert!(stored < 200, "{stored} records kept");
}

/// Connects to `url` with `options`, waiting (at most 60 s) for a fresh cluster's JetStream to
/// elect its leader.
async fn connect_when_ready(url: &str, options: &ClusterOptions) -> Cluster {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match Cluster::connect(url, options).await {
            Ok(cluster) => return cluster,
            Err(error) if std::time::Instant::now() < deadline => {
                eprintln!("waiting for the cluster: {error}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_keep_every_store_when_one_of_them_dies() {
    let Some(mut nodes) = NatsServer::start_cluster("three_servers_keep_every_store") else {
        return;
    };
    let url = NatsServer::urls(&nodes);
    let options = ClusterOptions {
        replicas: 3,
        ..ClusterOptions::default()
    };
    let cluster = connect_when_ready(&url, &options).await;
    let me = Holder {
        host: "a".to_string(),
        incarnation: "1".to_string(),
    };
    let (transcripts, inbox) = tokio::task::spawn_blocking({
        let (url, options, me) = (url.clone(), options.clone(), me.clone());
        move || {
            (
                JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap(),
                JetStreamInbox::connect(&url, &options, me, Claims::PerSession).unwrap(),
            )
        }
    })
    .await
    .unwrap();
    let key = "agent:main:test:r3";
    let events = cluster.event_log();
    let mut seq = 0;
    let write = |round: u64| {
        let (transcripts, inbox) = (transcripts.clone(), inbox.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                transcripts.append_steps(key, &[message(round * 2 + 1, &format!("q{round}"))])?;
                transcripts.commit(key, &[message(round * 2 + 2, &format!("a{round}"))])?;
                inbox
                    .append(
                        key,
                        &input(&format!("i{round}"), Some(&format!("k{round}"))),
                    )
                    .map(drop)
            })
            .await
            .unwrap()
        }
    };
    for round in 0..5 {
        write(round).await.unwrap();
        seq += 1;
        events.append(event(key, seq, "before"), 1).await.unwrap();
    }
    // One server dies; the other two keep a majority of every stream's replicas.
    nodes[0].kill();
    let killed = std::time::Instant::now();
    let mut first_write = None;
    for round in 5..10 {
        // The stores ride through the election of new stream leaders: the write waits, then
        // goes through, once.
        write(round)
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        first_write.get_or_insert_with(|| killed.elapsed());
        seq += 1;
        events.append(event(key, seq, "after"), 1).await.unwrap();
    }
    eprintln!(
        "three servers: the first write after a server died went through {:?} after it",
        first_write.unwrap_or_default()
    );
    // A fresh reader (another host) finds everything, through the surviving servers.
    let (loaded, pending) = tokio::task::spawn_blocking({
        let (url, options) = (url.clone(), options.clone());
        move || {
            let fresh = JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap();
            let fresh_inbox = JetStreamInbox::connect(
                &url,
                &options,
                Holder {
                    host: "b".to_string(),
                    incarnation: "1".to_string(),
                },
                Claims::PerSession,
            )
            .unwrap();
            (
                fresh.load(key, 100).unwrap(),
                fresh_inbox.pending(key).unwrap(),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(loaded.messages.len(), 20, "{:?}", loaded.messages);
    assert_eq!(pending.len(), 10);
    let replay = events.read(key, 0, 100).await.unwrap();
    assert_eq!(replay.events.len(), 10);
}
