//! The JetStream backend (`clawcage-cluster`) against a real `nats-server`, beyond the store
//! contracts every backend passes: servers it must refuse (Debian's 2.9, no JetStream,
//! unreadable credentials, nobody listening, a certificate from an authority it was not given,
//! no TLS where TLS is required), TLS through a given authority, and the event log: a stale
//! owner's appends refused by the server itself, an event larger than the server takes, a
//! server that goes away and comes back under a follower, session keys full of subject syntax,
//! the binary search that finds where a reader starts among many sessions' events, the bounded
//! window, a removal that neither lets an older owner back in nor leaves followers waiting, and
//! reads and followers that leave no consumer on the server once they are done. The leases are
//! in `cluster_leases.rs`, the transcripts and inboxes in `cluster_stores.rs`.

use std::time::Duration;

use clawcage_agent::events::{AgentEvent, EventLogError, Stream};
use clawcage_cluster::{Cluster, ClusterOptions, TlsOptions};
use clawcage_tests::nats::NatsServer;
use serde_json::json;

pub(crate) async fn connect(server: &NatsServer) -> Cluster {
    connect_with(server, &ClusterOptions::default()).await
}

pub(crate) async fn connect_with(server: &NatsServer, options: &ClusterOptions) -> Cluster {
    Cluster::connect(&server.url(), options)
        .await
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()))
}

/// Event `seq` of `key` with `text`, numbered as its owner numbers it.
pub(crate) fn event(key: &str, seq: u64, text: &str) -> AgentEvent {
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
