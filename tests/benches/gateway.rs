//! Benchmarks of the gateway against the scripted LLM server on 127.0.0.1, beside a baseline
//! measured in the same run: the same streamed turn run in-process through a session lane (with
//! its transcript) and through the gateway (a `chat.send` over the WebSocket, its events logged
//! and sent until the run's end event arrives), with the added latency at the median; then 200
//! clients connected at once: the gateway's resident memory per idle connection, and one turn
//! per client, each in its own session, all sent together (every turn must complete). The gateway
//! runs in a child process (this program started again) so its memory is its own.
//!
//! Run: `cargo bench -p clawcage-tests --bench gateway`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::events::{DiskEventLog, EventObserver};
use clawcage_agent::{
    AgentConfig, AgentLoop, FileInbox, JsonlTranscripts, MessageBus, Sessions, ToolRegistry,
    TranscriptStore,
};
use clawcage_gateway::{Gateway, GatewayParts, Settings, Token};
use clawcage_tests::bench::{percentile, report, report_against};
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TURNS: usize = 300;
const WARMUP: usize = 20;
const CLIENTS: usize = 200;
const TOKEN: &str = "gateway-bench-token-0123456789";
const CHILD: &str = "CLAWCAGE_BENCH_GATEWAY_LLM";
const HISTORY: usize = 20;

fn reply() -> Reply {
    anthropic::stream(
        &[anthropic::text(
            "The value of colour is blue, as the lookup says; nothing else to do.",
        )],
        512,
    )
}

fn sessions(llm: &str, dir: &Path) -> (Sessions, Arc<dyn TranscriptStore>) {
    let provider = clawcage_tests::bench::anthropic_provider(llm, "bench");
    let agent = AgentLoop::new(
        provider,
        ToolRegistry::new(),
        AgentConfig {
            stream: true,
            ..AgentConfig::default()
        },
    );
    let store = JsonlTranscripts::new(dir.join("sessions")).shared();
    (
        Sessions::new(agent, Some(store.clone()), HISTORY)
            .with_inbox(Arc::new(FileInbox::new(dir.join("inbox")))),
        store,
    )
}

/// The child: a gateway over `llm`, its address on stdout, until stdin closes.
fn child(llm: &str) {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let state = tempfile::tempdir().unwrap();
        let (sessions, transcripts) = sessions(llm, state.path());
        let parts = GatewayParts {
            sessions,
            tools: ToolRegistry::new(),
            bus: MessageBus::new(),
            subagents: None,
            cron: None,
            cron_note: "not in this benchmark".to_string(),
            transcripts,
            events: Arc::new(DiskEventLog::new(state.path().join("events"))),
            epoch: 1,
            runs: Arc::new(clawcage_agent::runs::InMemoryRuns::default()),
            runs_dir: state.path().join("runs"),
            history_limit: HISTORY,
            label: "anthropic/bench".to_string(),
            workspace: state.path().display().to_string(),
            state_dir: state.path().to_path_buf(),
        };
        let mut settings = Settings::new(Token::explicit(TOKEN));
        settings.sends_per_minute = 1_000_000;
        let gateway = Gateway::start(parts, settings).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening {}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.cancel();
        });
        gateway.serve(listener, shutdown).await;
    });
}

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok())
        .unwrap();
    kib * 1024
}

/// Sends `message` to `session` and waits for the run's end; returns how long that took.
async fn turn(client: &mut GatewayClient, session: &str, message: &str, key: &str) -> Duration {
    let started = Instant::now();
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": message, "idempotencyKey": key}),
        )
        .await;
    let run: Value = sent["payload"]["runId"].clone();
    assert_eq!(sent["payload"]["status"], "started", "{sent}");
    let events = client
        .agent_events_until(Duration::from_secs(120), |event| {
            event["runId"] == run
                && event["stream"] == "lifecycle"
                && matches!(event["data"]["phase"].as_str(), Some("end" | "error"))
        })
        .await;
    let end = events.last().unwrap();
    assert_eq!(end["data"]["phase"], "end", "{end}");
    started.elapsed()
}

fn main() {
    if let Ok(llm) = std::env::var(CHILD) {
        return child(&llm);
    }
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let server = LlmServer::start_routed(|_| reply()).await;
        println!("gateway benchmark: one streamed answer per turn, history limit {HISTORY}");

        // Baseline: the same turn in-process, through a lane with its transcript.
        let state = tempfile::tempdir().unwrap();
        let (lanes, _) = sessions(server.url(), state.path());
        let mut samples = Vec::new();
        for round in 0..TURNS + WARMUP {
            let (observer, mut events) = EventObserver::channel("agent:main:bench:local", "run");
            let started = Instant::now();
            lanes
                .send_user(
                    "agent:main:bench:local",
                    "What is the colour?",
                    Arc::new(observer),
                )
                .await
                .unwrap();
            let elapsed = started.elapsed();
            while events.try_recv().is_ok() {}
            if round >= WARMUP {
                samples.push(elapsed);
            }
        }
        let baseline = report("turn in-process: lane + transcript (baseline)", samples);

        // The gateway, in a process of its own.
        let mut gateway = Command::new(std::env::current_exe().unwrap())
            .env(CHILD, server.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(gateway.stdout.take().unwrap()).lines();
        let addr: SocketAddr = lines
            .next()
            .unwrap()
            .unwrap()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();

        let (mut client, _) = GatewayClient::connect(addr, TOKEN).await;
        let mut samples = Vec::new();
        for round in 0..TURNS + WARMUP {
            let elapsed = turn(
                &mut client,
                "agent:main:bench:gateway",
                "What is the colour?",
                &format!("t{round}"),
            )
            .await;
            if round >= WARMUP {
                samples.push(elapsed);
            }
        }
        let through = report_against(
            "turn through the gateway (WebSocket, events)",
            samples,
            Some(baseline),
        );
        println!(
            "{:<52} p50 {:>9.2} µs",
            "added by the gateway (p50 difference)",
            (through.as_secs_f64() - baseline.as_secs_f64()) * 1e6
        );
        client.close().await;

        // 200 clients: memory per idle connection, then one turn each, all at once.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = rss(gateway.id());
        let mut clients = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            clients.push(GatewayClient::connect(addr, TOKEN).await.0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss(gateway.id());
        let per_connection = after.saturating_sub(before) as f64 / CLIENTS as f64;
        println!(
            "{:<52} {:>9.1} KiB   (RSS {:.1} MiB -> {:.1} MiB)",
            format!("memory per idle connection ({CLIENTS} connected)"),
            per_connection / 1024.0,
            before as f64 / (1 << 20) as f64,
            after as f64 / (1 << 20) as f64
        );

        let started = Instant::now();
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(n, mut client)| {
                tokio::spawn(async move {
                    let elapsed = turn(
                        &mut client,
                        &format!("agent:main:bench:c{n}"),
                        "What is the colour?",
                        "once",
                    )
                    .await;
                    client.close().await;
                    elapsed
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(CLIENTS);
        for task in tasks {
            latencies.push(task.await.unwrap());
        }
        let wall = started.elapsed();
        assert_eq!(latencies.len(), CLIENTS, "every turn completed");
        let mut sorted = latencies.clone();
        sorted.sort();
        report(
            &format!("{CLIENTS} clients, one turn each, sent together"),
            latencies,
        );
        println!(
            "{:<52} {:>9.2} ms   (slowest {:.2} ms; all {CLIENTS} completed)",
            "  wall time for all turns",
            wall.as_secs_f64() * 1e3,
            percentile(&sorted, 1.0).as_secs_f64() * 1e3
        );

        drop(gateway.stdin.take());
        let _ = gateway.wait();
    });
}
