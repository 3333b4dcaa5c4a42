//! Benchmarks of a session's queue, each beside a baseline measured in the same run: the cost of
//! admitting one message to a busy session (`followup`, `collect` and `steer`: ticket, mode,
//! cap check, the waiter kept for the reply, the lane woken) beside a bare send on a tokio
//! unbounded channel; and a burst of 1,000 messages in `collect` mode, which must drain as one
//! turn, from the moment the running turn is released until all 1,000 senders have their
//! answer, beside a plain one-message turn measured the same way against the scripted LLM server.
//! Prints medians, p99 and ratios to the baseline.
//!
//! Run: `cargo bench -p clawcage-tests --bench queue`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::provider::{
    ChatRequest, ChatResponse, NoEvents, ProviderError, ProviderEvents,
};
use clawcage_agent::session::{Admission, DropPolicy, QueueConfig, QueueMode, QueueSettings};
use clawcage_agent::{
    AgentConfig, AgentLoop, LaneInput, Provider, Sessions, ToolRegistry, TurnObserver,
};
use clawcage_core::BoxFuture;
use clawcage_tests::bench::{report, report_against};
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic};

/// Messages per timed batch, and per burst.
const BATCH: usize = 1000;
/// Timed batches per measurement.
const BATCHES: usize = 200;
/// Bursts measured.
const BURSTS: usize = 20;

/// A provider whose every request waits for ever: the turn it serves stays busy.
#[derive(Debug)]
struct Busy;

impl Provider for Busy {
    fn label(&self) -> String {
        "bench/busy".into()
    }

    fn complete<'a>(
        &'a self,
        _request: ChatRequest<'a>,
        _events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(std::future::pending())
    }
}

fn queue(mode: QueueMode) -> QueueConfig {
    QueueConfig {
        settings: QueueSettings {
            mode,
            debounce_ms: 0,
            cap: BATCH + 1,
            drop: DropPolicy::Old,
        },
        by_channel: BTreeMap::new(),
    }
}

fn sessions(provider: Arc<dyn Provider>, mode: QueueMode) -> Sessions {
    Sessions::with_queue(
        AgentLoop::new(provider, ToolRegistry::new(), AgentConfig::default()),
        None,
        100,
        queue(mode),
    )
}

fn messages() -> Vec<String> {
    (0..BATCH)
        .map(|i| format!("message {i}: please also look at the tests"))
        .collect()
}

/// Per-message time of a bare unbounded-channel send, one sample per batch.
fn channel_sends() -> Vec<Duration> {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut samples = Vec::new();
    for _ in 0..BATCHES {
        let batch = messages();
        let started = Instant::now();
        for message in batch {
            sender.send(message).unwrap();
        }
        samples.push(started.elapsed() / BATCH as u32);
        while receiver.try_recv().is_ok() {}
    }
    samples
}

/// Per-message time of admitting to a busy session in `mode`, one sample per batch (each batch
/// on a fresh session whose first turn never ends).
async fn admissions(mode: QueueMode) -> Vec<Duration> {
    let sessions = sessions(Arc::new(Busy), mode);
    let observer: Arc<dyn TurnObserver> = Arc::new(NoEvents);
    let mut samples = Vec::new();
    let mut pending = Vec::with_capacity(BATCH);
    for round in 0..BATCHES {
        let key = format!("bench-{round}");
        let first = sessions.submit(&key, LaneInput::User("start".into()), observer.clone());
        assert_eq!(first.admission(), &Admission::Started);
        tokio::task::yield_now().await;
        let batch = messages();
        let started = Instant::now();
        for message in batch {
            pending.push(sessions.submit(&key, LaneInput::User(message), observer.clone()));
        }
        samples.push(started.elapsed() / BATCH as u32);
        let expected = match mode {
            QueueMode::Steer => Admission::Steered,
            _ => Admission::Queued { position: BATCH },
        };
        assert_eq!(pending.last().map(|turn| turn.admission()), Some(&expected));
        pending.clear();
    }
    samples
}

fn provider_for(server: &LlmServer) -> Arc<dyn Provider> {
    clawcage_tests::bench::anthropic_provider(server.url(), "bench")
}

/// A turn held at the server's gate with `queued` messages behind it in `collect` mode: the time
/// to admit them, and the time from releasing the turn until every sender has its answer.
async fn burst(queued: usize) -> (Duration, Duration) {
    let gate = ReplyGate::new();
    let server = LlmServer::start(vec![
        gate.hold(anthropic::message(&[anthropic::text("first")])),
        anthropic::message(&[anthropic::text("all of them")]),
    ])
    .await;
    let sessions = sessions(provider_for(&server), QueueMode::Collect);
    let observer: Arc<dyn TurnObserver> = Arc::new(NoEvents);
    let first = sessions.submit("burst", LaneInput::User("start".into()), observer.clone());
    gate.reached(1).await;
    let batch: Vec<String> = messages().into_iter().take(queued).collect();
    let started = Instant::now();
    let pending: Vec<_> = batch
        .into_iter()
        .map(|message| sessions.submit("burst", LaneInput::User(message), observer.clone()))
        .collect();
    let enqueue = started.elapsed();
    let released = Instant::now();
    gate.open();
    first.wait().await.unwrap();
    for turn in pending {
        assert_eq!(turn.wait().await.unwrap().unwrap().text, "all of them");
    }
    let drain = released.elapsed();
    let bodies = server.bodies();
    if queued > 0 {
        assert_eq!(bodies.len(), 2, "the burst drains as one turn");
        let collected = bodies[1]["messages"][2]["content"][0]["text"]
            .as_str()
            .unwrap();
        assert!(collected.contains(&format!("Queued #{queued}\n")));
        assert!(!collected.contains(&format!("Queued #{}\n", queued + 1)));
    }
    (enqueue, drain)
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let baseline = report(
            "bare unbounded channel send, per message (baseline)",
            channel_sends(),
        );
        for (label, mode) in [
            (
                "admit to a busy session, followup, per message",
                QueueMode::Followup,
            ),
            (
                "admit to a busy session, collect, per message",
                QueueMode::Collect,
            ),
            (
                "admit to a busy session, steer, per message",
                QueueMode::Steer,
            ),
        ] {
            report_against(label, admissions(mode).await, Some(baseline));
        }

        // One plain turn released from the gate, then the 1,000-message burst the same way.
        let mut plain = Vec::new();
        for _ in 0..BURSTS {
            plain.push(burst(0).await.1);
        }
        let plain = report("one plain turn released from the gate (baseline)", plain);
        let mut enqueue = Vec::new();
        let mut drain = Vec::new();
        for _ in 0..BURSTS {
            let (admitted, drained) = burst(BATCH).await;
            enqueue.push(admitted);
            drain.push(drained);
        }
        report("burst: admit 1,000 messages (collect), total", enqueue);
        report_against(
            "burst: 1,000 drain as one turn, all answered",
            drain,
            Some(plain),
        );
    });
}
