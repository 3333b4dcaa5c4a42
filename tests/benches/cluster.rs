//! What the event log on NATS JetStream costs beside the file log, measured in the same run on
//! one local `nats-server` (one node, file store, R1) and a temporary directory, interleaved
//! round by round so both see the same machine:
//! 1. One append of an assistant delta (the owner's write, acknowledged by the server), and one
//!    event from its append to a follower's receiver.
//! 2. A 16-event turn (16 appends one after another, as a turn's start, deltas, tool events and
//!    end are written) with one follower subscribed: from the first append's start to the
//!    follower receiving the sixteenth event (what a client waits for a turn to reach it).
//! 3. Following from the middle of a long session (5,000 events among two other sessions'):
//!    from `follow(since)` to the first event after `since` (the start's lookup); and reading
//!    the whole session (what the gateway's history and recovery read).
//! 4. A takeover's take-up of 200 sessions (a marker on each one's transcript and inbox, so the
//!    replaced host's late writes are refused), beside what the new host does with them anyway:
//!    reading each one's pending inputs.
//!
//! Run: `cargo bench -p clawcage-tests --bench cluster` (installs nats-server 2.15.1 through
//! tests/nats/setup.sh on first use, or uses the binary `NATS_SERVER` names).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::events::{AgentEvent, DiskEventLog, EventLog, Stream};
use clawcage_cluster::{Cluster, ClusterOptions};
use clawcage_tests::bench::{report, report_against, runtime};
use clawcage_tests::nats::NatsServer;
use serde_json::json;

const APPENDS: usize = 2_000;
const TURNS: usize = 200;
const TURN_EVENTS: u64 = 16;
const ROUNDS: usize = 20;
const LONG_SESSION: u64 = 5_000;
const FOLLOWS: usize = 100;
const READS: usize = 20;
/// Sessions taken up at once, and how many takeovers are timed.
const TAKEN_UP: usize = 200;
const TAKEOVERS: usize = 10;

/// One backend under measurement, with the next `seq` of each session it writes.
struct Backend {
    name: &'static str,
    log: Arc<dyn EventLog>,
    next: std::collections::HashMap<String, u64>,
}

impl Backend {
    fn event(&mut self, key: &str, text: &str) -> AgentEvent {
        let seq = self.next.entry(key.to_string()).or_insert(1);
        let mut event =
            AgentEvent::new(key, "run-bench", Stream::Assistant, json!({"delta": text}));
        event.seq = *seq;
        *seq += 1;
        event
    }

    async fn append(&mut self, key: &str, text: &str) -> Duration {
        let event = self.event(key, text);
        let started = Instant::now();
        self.log.append(event, 1).await.unwrap();
        started.elapsed()
    }

    /// One turn of [`TURN_EVENTS`] appends with a follower: how long the appends took, and
    /// how long until the follower had the last.
    async fn turn(
        &mut self,
        key: &str,
        follower: &mut tokio::sync::mpsc::Receiver<AgentEvent>,
    ) -> (Duration, Duration) {
        let started = Instant::now();
        let mut last = 0;
        for n in 0..TURN_EVENTS {
            let event = self.event(key, &format!("word {n} "));
            last = event.seq;
            self.log.append(event, 1).await.unwrap();
        }
        let appended = started.elapsed();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(30), follower.recv())
                .await
                .expect("the follower receives within 30 s")
                .expect("the follower goes on");
            if event.seq == last {
                return (appended, started.elapsed());
            }
        }
    }
}

fn main() {
    let Some(server) = NatsServer::start("bench cluster") else {
        eprintln!("nats-server is not available: nothing measured");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let cluster = Cluster::connect(&server.url(), &ClusterOptions::default())
            .await
            .unwrap();
        println!(
            "nats-server {} on 127.0.0.1 (1 node, file store), against DiskEventLog in {}",
            cluster.server_version(),
            dir.path().display()
        );
        let mut backends = [
            Backend {
                name: "files",
                log: Arc::new(DiskEventLog::new(dir.path())),
                next: Default::default(),
            },
            Backend {
                name: "jetstream",
                log: cluster.event_log(),
                next: Default::default(),
            },
        ];
        // Warm up: connections, files, the stream's first blocks.
        for backend in &mut backends {
            for _ in 0..100 {
                backend.append("bench:warm", "x").await;
            }
        }

        let mut appends: [Vec<Duration>; 2] = Default::default();
        for _ in 0..ROUNDS {
            for (n, backend) in backends.iter_mut().enumerate() {
                for _ in 0..APPENDS / ROUNDS {
                    appends[n].push(
                        backend
                            .append("bench:appends", "a delta of a few words")
                            .await,
                    );
                }
            }
        }
        let [files, jetstream] = appends;
        let base = report("append: files (DiskEventLog, one write, no sync)", files);
        report_against(
            "append: jetstream (publish, acknowledged)",
            jetstream,
            Some(base),
        );

        let mut followers = Vec::new();
        for backend in &backends {
            followers.push(backend.log.follow("bench:turns", 0).await.unwrap().events);
        }
        let mut singles: [Vec<Duration>; 2] = Default::default();
        for _ in 0..ROUNDS {
            for (n, backend) in backends.iter_mut().enumerate() {
                for _ in 0..APPENDS / ROUNDS / 4 {
                    let event = backend.event("bench:turns", "one");
                    let started = Instant::now();
                    backend.log.append(event, 1).await.unwrap();
                    followers[n].recv().await.unwrap();
                    singles[n].push(started.elapsed());
                }
            }
        }
        let [files, jetstream] = singles;
        let base = report("one event, append to follower: files", files);
        report_against(
            "one event, append to follower: jetstream",
            jetstream,
            Some(base),
        );

        let mut appended: [Vec<Duration>; 2] = Default::default();
        let mut turns: [Vec<Duration>; 2] = Default::default();
        for _ in 0..ROUNDS {
            for (n, backend) in backends.iter_mut().enumerate() {
                for _ in 0..TURNS / ROUNDS {
                    let (appends, turn) = backend.turn("bench:turns", &mut followers[n]).await;
                    appended[n].push(appends);
                    turns[n].push(turn);
                }
            }
        }
        let [files, jetstream] = appended;
        let base = report("16-event turn, its appends: files", files);
        report_against(
            "16-event turn, its appends: jetstream",
            jetstream,
            Some(base),
        );
        let [files, jetstream] = turns;
        let base = report("16-event turn to its follower: files", files);
        report_against(
            "16-event turn to its follower: jetstream",
            jetstream,
            Some(base),
        );

        // A long session among others, then followers from its middle.
        for backend in &mut backends {
            for n in 0..LONG_SESSION {
                backend.append("bench:long", "x").await;
                if n % 2 == 0 {
                    backend.append("bench:other-a", "y").await;
                } else {
                    backend.append("bench:other-b", "z").await;
                }
            }
        }
        let mut starts: [Vec<Duration>; 2] = Default::default();
        for round in 0..FOLLOWS {
            for (n, backend) in backends.iter().enumerate() {
                let since = LONG_SESSION / 2 + round as u64;
                let started = Instant::now();
                let mut follow = backend.log.follow("bench:long", since).await.unwrap();
                let first = follow.events.recv().await.unwrap();
                starts[n].push(started.elapsed());
                assert_eq!(first.seq, since + 1, "{}", backend.name);
            }
        }
        let [files, jetstream] = starts;
        let base = report("follow from the middle of 5,000 events: files", files);
        report_against(
            "follow from the middle of 5,000 events: jetstream",
            jetstream,
            Some(base),
        );

        let mut reads: [Vec<Duration>; 2] = Default::default();
        for _ in 0..READS {
            for (n, backend) in backends.iter().enumerate() {
                let started = Instant::now();
                let replay = backend.log.read("bench:long", 0, usize::MAX).await.unwrap();
                reads[n].push(started.elapsed());
                assert_eq!(replay.events.len() as u64, LONG_SESSION, "{}", backend.name);
            }
        }
        let [files, jetstream] = reads;
        let base = report("read all 5,000 events of a session: files", files);
        report_against(
            "read all 5,000 events of a session: jetstream",
            jetstream,
            Some(base),
        );
    });
    take_ups(&server);
    drop(server);
}

/// Section 4: the take-up of [`TAKEN_UP`] sessions at each of [`TAKEOVERS`] takeovers, against
/// reading their pending inputs (each takeover by stores of its own, as a new host's).
fn take_ups(server: &NatsServer) {
    use clawcage_agent::inbox::InputRecord;
    use clawcage_agent::session::queue::{Origin, QueuedJob};
    use clawcage_agent::{LaneInbox, TranscriptStore};
    use clawcage_cluster::{Claims, Holder, JetStreamInbox, JetStreamTranscripts};
    let options = ClusterOptions::default();
    let stores = |host: &str| {
        let me = Holder {
            host: host.to_string(),
            incarnation: "1".to_string(),
        };
        (
            JetStreamTranscripts::connect(&server.url(), &options, Default::default()).unwrap(),
            JetStreamInbox::connect(&server.url(), &options, me, Claims::CoveredByCaller).unwrap(),
        )
    };
    let sessions: Vec<String> = (0..TAKEN_UP)
        .map(|n| format!("agent:main:bench:taken-{n}"))
        .collect();
    let (transcripts, inbox) = stores("first");
    for session in &sessions {
        transcripts
            .append_steps(
                session,
                &[clawcage_agent::transcript::Entry::Message {
                    at_ms: 1,
                    message: clawcage_core::ChatMessage::user("hello"),
                }],
            )
            .unwrap();
        let record = InputRecord {
            id: format!("{session}-in"),
            at_ms: 1,
            idempotency: None,
            job: QueuedJob::User {
                text: "hello".to_string(),
                origin: Origin::of_key(session),
            },
            stop_requested: false,
        };
        inbox.append(session, &record).unwrap();
    }
    let (mut reads, mut take_ups) = (Vec::new(), Vec::new());
    for takeover in 0..TAKEOVERS {
        let (transcripts, inbox) = stores(&format!("host-{takeover}"));
        let started = Instant::now();
        for session in &sessions {
            assert_eq!(inbox.pending(session).unwrap().len(), 1);
        }
        reads.push(started.elapsed());
        let started = Instant::now();
        transcripts.take_up(&sessions).unwrap();
        inbox.take_up(&sessions, "bench").unwrap();
        take_ups.push(started.elapsed());
    }
    let base = report(
        &format!("takeover: read {TAKEN_UP} sessions' pending inputs"),
        reads,
    );
    report_against(
        &format!("takeover: take {TAKEN_UP} sessions up (2 markers each)"),
        take_ups,
        Some(base),
    );
}
