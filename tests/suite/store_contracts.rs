//! The contracts of the durable stores, written once against the traits: every implementation
//! of [`LaneInbox`], [`TranscriptStore`], [`EventLog`] and [`RunRegistry`] must pass them (the
//! files and memory, and the event log and run registry on NATS JetStream against a real
//! `nats-server`; a backend adds its constructor to the lists). Each contract starts from an
//! empty store and a second handle on the same storage stands for the next process.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use clawcage_agent::events::{AgentEvent, DiskEventLog, EventLog, EventLogError, Stream};
use clawcage_agent::inbox::{Appended, InputRecord, InputStatus, LaneInbox};
use clawcage_agent::runs::{InMemoryRuns, Registered, RunRegistry, RunStatus};
use clawcage_agent::session::queue::{Origin, QueueMode, QueueOverride, QueuedJob};
use clawcage_agent::transcript::{Entry, Position, now_ms};
use clawcage_agent::{FileInbox, JsonlTranscripts, TranscriptStore};
use clawcage_cluster::{
    Claims, Cluster, ClusterOptions, Holder, JetStreamInbox, JetStreamTranscripts,
};
use clawcage_core::redact::Redactor;
use clawcage_core::{ChatMessage, Usage};
use clawcage_tests::nats::NatsServer;
use serde_json::json;

/// Opens a handle on one empty inbox storage, as each new process does (on JetStream: each on
/// another host); the storage lives as long as the opener.
type OpenInbox = Box<dyn Fn() -> Arc<dyn LaneInbox>>;

/// Makes an inbox storage for the test named, or gives `None` after saying why it is skipped
/// (a failure under CI).
type MakeInbox = fn(&'static str) -> Option<OpenInbox>;

const INBOXES: &[(&str, MakeInbox)] = &[
    ("files", |_| {
        let dir = tempfile::tempdir().unwrap();
        Some(Box::new(move || {
            Arc::new(FileInbox::new(dir.path())) as Arc<dyn LaneInbox>
        }))
    }),
    ("jetstream", |test| {
        let server = NatsServer::start(test)?;
        let hosts = std::sync::atomic::AtomicUsize::new(0);
        Some(Box::new(move || {
            let host = hosts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let me = Holder {
                host: format!("host-{host}"),
                incarnation: "1".to_string(),
            };
            Arc::new(
                JetStreamInbox::connect(
                    &server.url(),
                    &ClusterOptions::default(),
                    me,
                    Claims::PerSession,
                )
                .unwrap_or_else(|error| panic!("{error}\n{}", server.log())),
            ) as Arc<dyn LaneInbox>
        }))
    }),
];

/// Opens a handle on one empty transcript storage, as each new process does; the storage (a
/// directory, a server) lives as long as the opener.
type OpenTranscripts = Box<dyn Fn() -> Arc<dyn TranscriptStore>>;

/// Makes a transcript storage for the test named, or gives `None` after saying why it is
/// skipped (a failure under CI).
type MakeTranscripts = fn(&'static str) -> Option<OpenTranscripts>;

const TRANSCRIPTS: &[(&str, MakeTranscripts)] = &[
    ("jsonl", |_| {
        let dir = tempfile::tempdir().unwrap();
        Some(Box::new(move || JsonlTranscripts::new(dir.path()).shared()))
    }),
    ("jetstream", |test| {
        let server = NatsServer::start(test)?;
        Some(Box::new(move || {
            Arc::new(
                JetStreamTranscripts::connect(
                    &server.url(),
                    &ClusterOptions::default(),
                    Redactor::default(),
                )
                .unwrap_or_else(|error| panic!("{error}\n{}", server.log())),
            ) as Arc<dyn TranscriptStore>
        }))
    }),
];

type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One empty storage a contract runs on; each [`Storage::open`] is a handle on it as a new
/// process opens it.
trait Storage<T: ?Sized>: Send + Sync {
    fn open(&self) -> Pending<'_, Arc<T>>;
}

/// Makes a storage for the test named, or gives `None` after saying why it is skipped (a
/// failure under CI).
type MakeStorage<T> = fn(&'static str) -> Pending<'static, Option<Box<dyn Storage<T>>>>;

const EVENT_LOGS: &[(&str, MakeStorage<dyn EventLog>)] = &[
    ("files", |_| {
        Box::pin(async { Some(Box::new(EventFiles(tempfile::tempdir().unwrap())) as _) })
    }),
    ("jetstream", |test| {
        Box::pin(async move { NatsServer::start(test).map(|server| Box::new(OnNats(server)) as _) })
    }),
];
const RUN_REGISTRIES: &[(&str, MakeStorage<dyn RunRegistry>)] = &[
    ("memory", |_| {
        Box::pin(async { Some(Box::new(RunsInMemory(InMemoryRuns::default())) as _) })
    }),
    ("jetstream", |test| {
        Box::pin(async move { NatsServer::start(test).map(|server| Box::new(OnNats(server)) as _) })
    }),
];

struct EventFiles(tempfile::TempDir);

impl Storage<dyn EventLog> for EventFiles {
    fn open(&self) -> Pending<'_, Arc<dyn EventLog>> {
        Box::pin(async { Arc::new(DiskEventLog::new(self.0.path())) as _ })
    }
}

struct RunsInMemory(InMemoryRuns);

impl Storage<dyn RunRegistry> for RunsInMemory {
    fn open(&self) -> Pending<'_, Arc<dyn RunRegistry>> {
        // One process's memory: every handle shares it.
        Box::pin(async { Arc::new(self.0.clone()) as _ })
    }
}

/// A `nats-server` of the test's own; each handle is a connection of its own.
struct OnNats(NatsServer);

impl OnNats {
    async fn connect(&self) -> Cluster {
        Cluster::connect(&self.0.url(), &ClusterOptions::default())
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", self.0.log()))
    }
}

impl Storage<dyn EventLog> for OnNats {
    fn open(&self) -> Pending<'_, Arc<dyn EventLog>> {
        Box::pin(async { self.connect().await.event_log() })
    }
}

impl Storage<dyn RunRegistry> for OnNats {
    fn open(&self) -> Pending<'_, Arc<dyn RunRegistry>> {
        Box::pin(async { self.connect().await.run_registry() })
    }
}

fn input(id: &str, key: Option<&str>) -> InputRecord {
    input_of("agent:main:test:contract", id, key)
}

/// A user input `id` of the session `session`, with idempotency `key`.
pub(crate) fn input_of(session: &str, id: &str, key: Option<&str>) -> InputRecord {
    InputRecord {
        id: id.to_string(),
        at_ms: now_ms(),
        idempotency: key.map(str::to_string),
        job: QueuedJob::User {
            text: format!("text of {id}"),
            origin: Origin::of_key(session),
        },
        stop_requested: false,
    }
}

#[test]
fn every_inbox_keeps_order_keys_fates_stops_settings_and_one_owner() {
    for (name, make) in INBOXES {
        let Some(open_inbox) = make("every_inbox_keeps_order_keys_fates") else {
            continue;
        };
        let key = "agent:main:test:contract";
        let first = open_inbox();
        assert!(
            first.pending(key).unwrap().is_empty(),
            "{name}: empty at first"
        );
        for (id, idempotency) in [("a", Some("ka")), ("b", None), ("c", Some("kc"))] {
            assert_eq!(
                first.append(key, &input(id, idempotency)).unwrap(),
                Appended::New,
                "{name}"
            );
        }
        assert_eq!(
            first.append(key, &input("z", Some("ka"))).unwrap(),
            Appended::Duplicate("a".into()),
            "{name}: a key seen is a duplicate"
        );
        first.done(key, &["b".into()], InputStatus::Ok).unwrap();
        first
            .done(key, &["c".into()], InputStatus::Refused)
            .unwrap();
        first.request_stop(key, "a").unwrap();
        let collect = QueueOverride {
            mode: QueueMode::Collect,
            debounce_ms: None,
            cap: Some(3),
            drop: None,
        };
        first.set_queue_override(key, Some(collect)).unwrap();
        assert!(first.claim(key).unwrap(), "{name}: the first owner");

        // The next process.
        let next = open_inbox();
        assert!(!next.claim(key).unwrap(), "{name}: one live owner");
        let pending = next.pending(key).unwrap();
        let ids: Vec<&str> = pending.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a"], "{name}: pending in order, done ones gone");
        assert!(pending[0].stop_requested, "{name}: the stop is kept");
        assert_eq!(next.queue_override(key).unwrap(), Some(collect), "{name}");
        let finished = next.finished(key).unwrap();
        assert!(
            finished
                .iter()
                .any(|f| f.id == "b" && f.status == InputStatus::Ok),
            "{name}: {finished:?}"
        );
        assert_eq!(
            next.append(key, &input("c2", Some("kc"))).unwrap(),
            Appended::New,
            "{name}: a refused input's key may be sent again"
        );
        assert_eq!(next.sessions().unwrap(), [key], "{name}");
        drop(first);
        assert!(next.claim(key).unwrap(), "{name}: an ended owner frees it");
        next.remove(key).unwrap();
        assert!(next.pending(key).unwrap().is_empty(), "{name}: removed");
    }
}

#[test]
fn every_transcript_store_journals_commits_and_knows_the_open_turn() {
    for (name, make) in TRANSCRIPTS {
        let Some(open_store) = make("every_transcript_store_journals_commits") else {
            continue;
        };
        let key = "agent:main:test:contract";
        let store = open_store();
        assert!(!store.exists(key).unwrap(), "{name}");
        assert_eq!(
            store.committed_position(key).unwrap(),
            Position(0),
            "{name}"
        );
        let turn = |input: &str, answer: &str| {
            vec![
                Entry::Start {
                    at_ms: 1,
                    inputs: vec![input.to_string()],
                },
                Entry::Message {
                    at_ms: 1,
                    message: ChatMessage::user(format!("question {input}")),
                },
                Entry::Message {
                    at_ms: 2,
                    message: ChatMessage::assistant(answer),
                },
            ]
        };
        store.append_steps(key, &turn("r1", "one")).unwrap();
        let open = store.load(key, 100).unwrap();
        assert_eq!(
            open.open.as_ref().map(|o| o.inputs.clone()),
            Some(vec!["r1".to_string()]),
            "{name}: a start without its turn is open"
        );
        assert_eq!(
            store.committed_position(key).unwrap(),
            Position(0),
            "{name}: nothing committed yet"
        );
        let commit = Entry::Turn {
            at_ms: 3,
            usage: Usage {
                input_tokens: 5,
                output_tokens: 2,
                ..Usage::default()
            },
            outcome: "test/model".into(),
        };
        store.commit(key, std::slice::from_ref(&commit)).unwrap();
        let after_first = store.committed_position(key).unwrap();
        assert!(after_first > Position(0), "{name}");
        store.append_steps(key, &turn("r2", "two")).unwrap();
        assert_eq!(
            store.committed_position(key).unwrap(),
            after_first,
            "{name}: an open turn does not move the committed position"
        );

        // The next process sees the same.
        let next = open_store();
        assert_eq!(next.committed_position(key).unwrap(), after_first, "{name}");
        let loaded = next.load(key, 100).unwrap();
        assert_eq!(loaded.answered["r1"].text, "one", "{name}");
        assert_eq!(loaded.usage.input_tokens, 5, "{name}");
        assert!(loaded.open.is_some(), "{name}");
        let until = next.load_until(key, 100, after_first).unwrap();
        assert_eq!(until.messages.len(), 2, "{name}: the committed part only");
        assert!(until.open.is_none(), "{name}");
        assert_eq!(until.turns.len(), 1, "{name}");
        assert_eq!(until.turns[0].after_messages, 2, "{name}");
        let listed: Vec<String> = next
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(listed, [key], "{name}");
        next.remove(key).unwrap();
        assert!(!next.exists(key).unwrap(), "{name}");
        assert_eq!(next.committed_position(key).unwrap(), Position(0), "{name}");
    }
}

/// Event `seq` of `key`, numbered as its owner numbers it.
fn numbered(key: &str, seq: u64) -> AgentEvent {
    let mut event = AgentEvent::new(
        key,
        "r",
        Stream::Assistant,
        json!({"delta": seq.to_string()}),
    );
    event.seq = seq;
    event
}

#[tokio::test]
async fn every_event_log_keeps_the_owners_numbering_and_fences_older_owners() {
    for (name, make) in EVENT_LOGS {
        let Some(storage) = make("every_event_log_keeps_the_owners_numbering").await else {
            continue;
        };
        let key = "agent:main:test:events";
        let log = storage.open().await;
        assert_eq!(log.last_seq(key).await.unwrap(), 0, "{name}");
        for seq in 1..=5 {
            let stored = log.append(numbered(key, seq), 2).await.unwrap();
            assert_eq!(stored.seq, seq, "{name}");
        }
        let page = log.read(key, 2, 2).await.unwrap();
        let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4], "{name}");
        assert_eq!((page.first_retained, page.last_seq), (1, 5), "{name}");
        let again = log.append(numbered(key, 5), 2).await;
        assert!(
            matches!(
                again,
                Err(EventLogError::OutOfOrder {
                    seq: 5,
                    last: 5,
                    ..
                })
            ),
            "{name}: a place already numbered is refused: {again:?}"
        );
        let stale = log.append(numbered(key, 6), 1).await;
        assert!(
            matches!(
                stale,
                Err(EventLogError::Fenced {
                    epoch: 1,
                    current: 2,
                    ..
                })
            ),
            "{name}: an older owner is refused: {stale:?}"
        );
        assert_eq!(
            log.last_seq(key).await.unwrap(),
            5,
            "{name}: nothing refused was kept"
        );

        // The next process: the numbering and the fence hold; a newer owner goes on.
        let next = storage.open().await;
        assert_eq!(next.last_seq(key).await.unwrap(), 5, "{name}");
        assert!(
            matches!(
                next.append(numbered(key, 6), 1).await,
                Err(EventLogError::Fenced { .. })
            ),
            "{name}: the fence survives the process"
        );
        next.append(numbered(key, 6), 3).await.unwrap();
        assert_eq!(
            next.read(key, 0, 100).await.unwrap().events.len(),
            6,
            "{name}"
        );
        next.remove(key).await.unwrap();
        assert_eq!(next.last_seq(key).await.unwrap(), 0, "{name}");
        next.append(numbered(key, 1), 3).await.unwrap();
        assert_eq!(
            next.last_seq(key).await.unwrap(),
            1,
            "{name}: numbered from 1 again"
        );
    }
}

/// Collects `count` events from `events`, failing after 30 s.
async fn collect(events: &mut tokio::sync::mpsc::Receiver<AgentEvent>, count: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.len() < count {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(event)) => seqs.push(event.seq),
            Ok(None) => panic!("the follower ended after {seqs:?}"),
            Err(_) => panic!("no event for 30 s after {} of {count}", seqs.len()),
        }
    }
    seqs
}

#[tokio::test]
async fn every_event_log_feeds_each_follower_every_event_once_in_order() {
    const TOTAL: u64 = 3_000;
    for (name, make) in EVENT_LOGS {
        let Some(storage) = make("every_event_log_feeds_each_follower").await else {
            continue;
        };
        let key = "agent:main:test:follow";
        let log = storage.open().await;
        for seq in 1..=10 {
            log.append(numbered(key, seq), 1).await.unwrap();
        }
        let mut from_start = log.follow(key, 0).await.unwrap();
        assert_eq!(
            (from_start.first_retained, from_start.last_seq),
            (1, 10),
            "{name}"
        );
        // The owner writes on while others start following in the middle.
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                for seq in 11..=TOTAL {
                    log.append(numbered(key, seq), 1).await.unwrap();
                    if seq % 100 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        let mut midway = log.follow(key, 7).await.unwrap();
        // Ahead of what is stored (an owner's numbering runs ahead of its writes).
        let mut ahead = log.follow(key, TOTAL + 2).await.unwrap();
        let first = collect(&mut from_start.events, TOTAL as usize).await;
        assert_eq!(
            first,
            (1..=TOTAL).collect::<Vec<_>>(),
            "{name}: from the start"
        );
        let second = collect(&mut midway.events, (TOTAL - 7) as usize).await;
        assert_eq!(
            second,
            (8..=TOTAL).collect::<Vec<_>>(),
            "{name}: from the middle"
        );
        writer.await.unwrap();
        log.append(numbered(key, TOTAL + 1), 1).await.unwrap();
        log.append(numbered(key, TOTAL + 3), 1).await.unwrap();
        let third = collect(&mut ahead.events, 1).await;
        assert_eq!(third, [TOTAL + 3], "{name}: only what is after `since`");
        // A removed session's followers end.
        log.remove(key).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(30), async {
            while from_start.events.recv().await.is_some() {}
        })
        .await;
        assert!(end.is_ok(), "{name}: a follower of a removed session ends");
    }
}

#[tokio::test]
async fn every_run_registry_dedupes_keys_once_even_when_raced_and_reports_results() {
    for (name, make) in RUN_REGISTRIES {
        let Some(storage) = make("every_run_registry_dedupes_keys_once").await else {
            continue;
        };
        // Two processes' handles on the same registry.
        let (runs, other) = (storage.open().await, storage.open().await);
        let session = "agent:main:test:runs";
        // Fifty sends with one key at once, through both handles: exactly one run.
        let racing: Vec<_> = (0..50)
            .map(|n| {
                let handle = if n % 2 == 0 { &runs } else { &other };
                tokio::spawn(handle.register(session, &format!("run-{n}"), Some("key")))
            })
            .collect();
        let mut new = Vec::new();
        let mut duplicates = Vec::new();
        for (n, registering) in racing.into_iter().enumerate() {
            match registering.await.unwrap().unwrap() {
                Registered::New => new.push(format!("run-{n}")),
                Registered::Duplicate { run_id, status } => {
                    assert_eq!(status, RunStatus::InFlight, "{name}");
                    duplicates.push(run_id);
                }
            }
        }
        assert_eq!(new.len(), 1, "{name}: one run for one key: {new:?}");
        assert!(
            duplicates.iter().all(|id| *id == new[0]),
            "{name}: {duplicates:?}"
        );
        let winner = new[0].clone();
        // The winner registered again with its key (a process taking over its session): a
        // duplicate of itself, and it stays known and in flight.
        match other.register(session, &winner, Some("key")).await.unwrap() {
            Registered::Duplicate { run_id, status } => {
                assert_eq!(
                    (run_id.as_str(), status),
                    (winner.as_str(), RunStatus::InFlight),
                    "{name}"
                );
            }
            Registered::New => panic!("{name}: the same run registered again is not new"),
        }
        assert_eq!(
            runs.status(&winner).await.unwrap(),
            Some((session.to_string(), RunStatus::InFlight)),
            "{name}: still known"
        );
        let waiting = tokio::spawn(other.wait(&winner, Duration::from_secs(30)));
        runs.finish(&winner, RunStatus::Ok, json!({"text": "done"}))
            .await
            .unwrap();
        let result = waiting.await.unwrap().unwrap().unwrap().unwrap();
        assert_eq!(result.status, RunStatus::Ok, "{name}");
        assert_eq!(result.payload["text"], "done", "{name}");
        assert_eq!(result.payload["runId"], winner.as_str(), "{name}");
        assert_eq!(result.payload["sessionKey"], session, "{name}");
        assert_eq!(
            other.status(&winner).await.unwrap(),
            Some((session.to_string(), RunStatus::Ok)),
            "{name}: seen by the other process"
        );
        assert_eq!(
            runs.register(session, "late", Some("key")).await.unwrap(),
            Registered::Duplicate {
                run_id: winner.clone(),
                status: RunStatus::Ok
            },
            "{name}: a finished run's key still answers with it"
        );
        assert!(
            runs.wait("late", Duration::ZERO).await.unwrap().is_none(),
            "{name}: a duplicate send made no run"
        );
        runs.forget_key(session, "key").await.unwrap();
        assert_eq!(
            runs.register(session, "again", Some("key")).await.unwrap(),
            Registered::New,
            "{name}: a forgotten key may be sent again"
        );
        assert!(
            matches!(
                runs.wait("again", Duration::from_millis(50)).await.unwrap(),
                Some(None)
            ),
            "{name}: in flight when the time is up"
        );
        assert_eq!(
            runs.register("agent:main:test:elsewhere", "other-session", Some("key"))
                .await
                .unwrap(),
            Registered::New,
            "{name}: keys are per session"
        );
        // Runs that ended before this process started keep their keys for the rest of the window.
        runs.remember(
            session,
            "before",
            Some("kb"),
            RunStatus::Aborted,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(
            other.register(session, "retry", Some("kb")).await.unwrap(),
            Registered::Duplicate {
                run_id: "before".into(),
                status: RunStatus::Aborted
            },
            "{name}"
        );
        runs.remember(
            session,
            "ancient",
            Some("ka"),
            RunStatus::Ok,
            clawcage_agent::runs::IDEMPOTENCY_WINDOW,
        )
        .await
        .unwrap();
        assert_eq!(
            other.register(session, "fresh", Some("ka")).await.unwrap(),
            Registered::New,
            "{name}: a key older than the window is forgotten"
        );
        assert!(runs.status("unknown").await.unwrap().is_none(), "{name}");
        assert!(
            runs.wait("unknown", Duration::ZERO)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
    }
}
