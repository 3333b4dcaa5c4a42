//! The transcripts and inboxes of the JetStream backend against a real `nats-server`, beyond
//! the contracts: a host that lost a session to another host is refused by the server when it
//! writes again, entries are scrubbed before they leave the process, the synchronous stores work
//! from inside a single-threaded runtime, an entry larger than the server takes is an error that
//! leaves the transcript usable; hosts appending to one session at once keep one order and one
//! input per idempotency key, a restarted host takes its claims back at once while another host
//! waits for the dead one's lease to lapse, and a long session is rolled up without losing what
//! is pending or remembered. Three servers: the stores (R3) ride through the death of one server,
//! a write waiting for new stream leaders and then going through once. A host whose lease
//! lapsed (its write fence shut) sends nothing more to any store, and a host taking a session
//! up is not written behind by the one it replaced.

use std::time::Duration;

use clawcage_agent::inbox::{Appended, InputRecord, InputStatus};
use clawcage_agent::transcript::Entry;
use clawcage_agent::{LaneInbox, TranscriptStore};
use clawcage_cluster::{
    Claims, Cluster, ClusterOptions, Holder, JetStreamInbox, JetStreamTranscripts,
};
use clawcage_core::ChatMessage;
use clawcage_core::redact::Redactor;
use clawcage_tests::nats::NatsServer;

use crate::cluster::{connect, connect_with, event};
use crate::cluster_leases::short_leases;

/// A message of the conversation: the user's at odd times, the assistant's at even ones (two
/// messages of one role in a row would be read as one).
pub(crate) fn message(at_ms: u64, text: &str) -> Entry {
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

/// A host that becomes a session's writer takes it up before it reads it: a marker appended to
/// its transcript and its inbox. The host it replaced is then refused by the server at its next
/// transcript write, although the new host wrote nothing of its own yet: a write the old host
/// sent before the takeover and a stalled server stores only after meets the same refusal.
/// What was stored before is read, and the markers change nothing a reader sees.
#[test]
fn taking_a_session_up_refuses_what_its_last_writer_sends_after() {
    let Some(server) = NatsServer::start("taking_a_session_up") else {
        return;
    };
    let key = "agent:main:test:inbox";
    let old = transcripts(&server, Redactor::default());
    old.append_steps(key, &[message(1, "one")]).unwrap();
    let old_inbox = inbox(&server, &ClusterOptions::default(), "old", "1");
    assert_eq!(
        old_inbox.append(key, &input("i1", Some("k1"))).unwrap(),
        Appended::New
    );
    // The new writer takes the session up, twice (a host taking over again): nothing else.
    let new = transcripts(&server, Redactor::default());
    let new_inbox = inbox(&server, &ClusterOptions::default(), "new", "1");
    for _ in 0..2 {
        new.take_up(&[key.to_string()]).unwrap();
        new_inbox
            .take_up(&[key.to_string()], "new (epoch 2)")
            .unwrap();
    }
    let error = old
        .append_steps(key, &[message(2, "stale")])
        .expect_err("the replaced writer is refused");
    assert!(
        error.to_string().contains("written by another host"),
        "{error}"
    );
    // Readers see what was stored, and nothing of the markers.
    let texts = |store: &JetStreamTranscripts| -> Vec<String> {
        store
            .load(key, 100)
            .unwrap()
            .messages
            .iter()
            .map(ChatMessage::text)
            .collect()
    };
    assert_eq!(texts(&new), ["one"]);
    let pending: Vec<String> = new_inbox
        .pending(key)
        .unwrap()
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_eq!(pending, ["i1"]);
    assert_eq!(
        new_inbox
            .append(key, &input("i1-again", Some("k1")))
            .unwrap(),
        Appended::Duplicate("i1".to_string()),
        "the input's key is still known"
    );
    // The new writer writes on; the session's whole story is one.
    new.append_steps(key, &[message(2, "two")]).unwrap();
    new_inbox
        .done(key, &["i1".to_string()], InputStatus::Ok)
        .unwrap();
    assert_eq!(
        texts(&transcripts(&server, Redactor::default())),
        ["one", "two"]
    );
    let reader = inbox(&server, &ClusterOptions::default(), "reader", "1");
    assert!(reader.pending(key).unwrap().is_empty());
    assert_eq!(reader.finished(key).unwrap().len(), 1);
    // Taking up a session with nothing stored yet is no error, and leaves it empty.
    new.take_up(&["agent:main:test:new".to_string()]).unwrap();
    let loaded = new.load("agent:main:test:new", 100).unwrap();
    assert!(loaded.messages.is_empty());
}

/// A takeover reads every session's inbox and transcript: each read's consumer is deleted when
/// the read ends, so none is left on the server (they lingered for its inactivity threshold,
/// and a takeover of many sessions met the server's limit of consumers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_many_sessions_leaves_no_consumers_behind() {
    let Some(server) = NatsServer::start("reading_many_sessions") else {
        return;
    };
    const SESSIONS: usize = 60;
    // A host's stores, as a gateway's: the transcripts and the inboxes it covers.
    let stores_of = |host: &str| {
        let (url, host) = (server.url(), host.to_string());
        move || {
            let me = Holder {
                host,
                incarnation: "1".to_string(),
            };
            let options = ClusterOptions::default();
            (
                JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap(),
                JetStreamInbox::connect(&url, &options, me, Claims::CoveredByCaller).unwrap(),
            )
        }
    };
    let keys: Vec<String> = (0..SESSIONS)
        .map(|n| format!("agent:main:test:read-{n}"))
        .collect();
    let (written, writer) = (keys.clone(), stores_of("writer"));
    tokio::task::spawn_blocking(move || {
        let (transcripts, inbox) = writer();
        for key in &written {
            transcripts
                .append_steps(key, &[message(1, "hello")])
                .unwrap();
            inbox
                .append(key, &crate::store_contracts::input_of(key, "i1", None))
                .unwrap();
        }
    })
    .await
    .unwrap();
    // Another host reads them all, as a takeover does.
    let (read, reader) = (keys.clone(), stores_of("reader"));
    tokio::task::spawn_blocking(move || {
        let (transcripts, inbox) = reader();
        for key in &read {
            assert_eq!(transcripts.load(key, 10).unwrap().messages.len(), 1);
            assert_eq!(inbox.pending(key).unwrap().len(), 1);
        }
    })
    .await
    .unwrap();
    let cluster = connect(&server).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status().await.unwrap();
        let open: Vec<(String, usize)> = status
            .streams
            .iter()
            .filter(|stream| stream.name == "CLAW_TX" || stream.name == "CLAW_INBOX")
            .map(|stream| (stream.name.clone(), stream.consumers))
            .collect();
        if open.iter().all(|(_, consumers)| *consumers == 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "consumers left behind after {SESSIONS} sessions were read: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
fn an_entry_larger_than_the_server_takes_is_stored_in_parts_and_read_whole() {
    let Some(server) = NatsServer::start("an_entry_larger_than_the_server_takes") else {
        return;
    };
    let store = transcripts(&server, Redactor::default());
    let key = "agent:main:test:large";
    store.append_steps(key, &[message(1, "small")]).unwrap();
    // 2.5 MiB of one answer: more than twice the server's 1 MiB max_payload.
    let huge: String = (0..(5 << 19))
        .map(|index: u32| char::from(b'a' + (index % 26) as u8))
        .collect();
    store.append_steps(key, &[message(4, &huge)]).unwrap();
    store.append_steps(key, &[message(2, "after")]).unwrap();
    let expected = ["small".to_string(), huge.clone(), "after".to_string()];
    let texts = |store: &JetStreamTranscripts| -> Vec<String> {
        store
            .load(key, 10)
            .unwrap()
            .messages
            .iter()
            .map(ChatMessage::text)
            .collect()
    };
    assert_eq!(texts(&store), expected);
    // Another host reads it whole too, and writes after it.
    let other = transcripts(&server, Redactor::default());
    assert_eq!(texts(&other), expected);
    other
        .append_steps(key, &[message(2, "from the other host")])
        .unwrap();
    assert_eq!(texts(&other).len(), 4);
    // The stream holds the big record as several messages.
    let messages = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let status = connect(&server).await.status().await.unwrap();
        status
            .streams
            .iter()
            .find(|stream| stream.name == "CLAW_TX")
            .map(|stream| stream.messages)
            .unwrap()
    });
    assert!(
        messages >= 6,
        "{messages} messages for 4 records, one of 2.5 MiB"
    );
}

fn input(id: &str, key: Option<&str>) -> InputRecord {
    crate::store_contracts::input_of("agent:main:test:inbox", id, key)
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

/// A host whose lease lapsed sends nothing more: with the write fence its stores were connected
/// with shut, a transcript append, an inbox append and an event are each refused before they
/// leave the process, saying why, and nothing of them is stored; once the fence is open again
/// (the lease renewed) they go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_lease_lapsed_sends_nothing_more() {
    let Some(server) = NatsServer::start("a_host_whose_lease_lapsed") else {
        return;
    };
    let fence = clawcage_cluster::WriteFence::shut_until_held();
    let options = ClusterOptions {
        write_fences: fence.clone().into(),
        ..ClusterOptions::default()
    };
    let key = "agent:main:test:fenced";
    let url = server.url();
    let (fenced_transcripts, fenced_inbox) = {
        let options = options.clone();
        tokio::task::spawn_blocking(move || {
            let me = Holder {
                host: "a".to_string(),
                incarnation: "1".to_string(),
            };
            (
                JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap(),
                JetStreamInbox::connect(&url, &options, me, Claims::CoveredByCaller).unwrap(),
            )
        })
        .await
        .unwrap()
    };
    let fenced_events = connect_with(&server, &options).await.event_log();
    let refusal = |error: String| {
        assert!(
            error.contains("was not sent") && error.contains("lease"),
            "{error}"
        );
    };
    // Shut: refused, every store.
    let (to_transcripts, to_inbox) = (fenced_transcripts.clone(), fenced_inbox.clone());
    let (wrote, took) = tokio::task::spawn_blocking(move || {
        (
            to_transcripts.append_steps(key, &[message(1, "late")]),
            to_inbox.append(
                key,
                &crate::store_contracts::input_of(key, "late", Some("k-late")),
            ),
        )
    })
    .await
    .unwrap();
    refusal(
        wrote
            .expect_err("a shut fence refuses transcripts")
            .to_string(),
    );
    refusal(took.expect_err("a shut fence refuses inboxes").to_string());
    let appended = fenced_events.append(event(key, 1, "late"), 7).await;
    refusal(
        appended
            .expect_err("a shut fence refuses events")
            .to_string(),
    );
    // Nothing of them is stored, as an unfenced host reads it.
    let reader_transcripts = transcripts(&server, Redactor::default());
    let reader_inbox = inbox(&server, &ClusterOptions::default(), "reader", "1");
    let reader_events = connect(&server).await.event_log();
    let (stored_messages, stored_inputs) = tokio::task::spawn_blocking(move || {
        (
            reader_transcripts.load(key, 100).unwrap().messages.len(),
            reader_inbox.pending(key).unwrap().len(),
        )
    })
    .await
    .unwrap();
    assert_eq!((stored_messages, stored_inputs), (0, 0));
    assert_eq!(reader_events.last_seq(key).await.unwrap(), 0);
    // Renewed: open again.
    fence.open_until(std::time::Instant::now() + Duration::from_secs(60));
    let (to_transcripts, to_inbox) = (fenced_transcripts.clone(), fenced_inbox.clone());
    tokio::task::spawn_blocking(move || {
        to_transcripts
            .append_steps(key, &[message(1, "fresh")])
            .unwrap();
        to_inbox
            .append(
                key,
                &crate::store_contracts::input_of(key, "fresh", Some("k-fresh")),
            )
            .unwrap();
    })
    .await
    .unwrap();
    fenced_events
        .append(event(key, 1, "fresh"), 7)
        .await
        .unwrap();
    assert_eq!(reader_events.last_seq(key).await.unwrap(), 1);
    // Lost for good: shut again, and a renewal racing the loss does not reopen it.
    fence.close();
    fence.open_until(std::time::Instant::now() + Duration::from_secs(60));
    let to_transcripts = fenced_transcripts.clone();
    let wrote = tokio::task::spawn_blocking(move || {
        to_transcripts.append_steps(key, &[message(2, "after the loss")])
    })
    .await
    .unwrap();
    refusal(
        wrote
            .expect_err("a lost lease's fence stays shut")
            .to_string(),
    );
}
