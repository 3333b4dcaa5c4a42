//! Benchmarks of the gateway against the scripted LLM server on 127.0.0.1, beside a baseline
//! measured in the same run: the same streamed turn run in-process through a session lane (with
//! its transcript) and through the gateway (a `chat.send` over the WebSocket, its events logged
//! and sent until the run's end event arrives), with the added latency at the median; then 200
//! clients connected at once: the gateway's resident memory per idle connection, and one turn
//! per client, each in its own session, all sent together (every turn must complete). The gateway
//! runs in a child process (this program started again) so its memory is its own. Then the same
//! for a gateway of a cluster, whose sessions live on a local one-node `nats-server` (events,
//! runs, transcripts, inboxes on JetStream), with the NATS traffic per turn read from the
//! server's `/varz`; and the same turns through a standby's relay to that gateway.
//!
//! Run: `cargo bench -p clawcage-tests --bench gateway` (the cluster part needs nats-server,
//! installed by tests/nats/setup.sh, and is skipped with a note without it).
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

use clawcage_agent::events::{DiskEventLog, EventLog, EventObserver};
use clawcage_agent::runs::RunRegistry;
use clawcage_agent::{
    AgentConfig, AgentLoop, FileInbox, JsonlTranscripts, LaneInbox, MessageBus, Sessions,
    ToolRegistry, TranscriptStore,
};
use clawcage_cluster::{
    Claims, Cluster, ClusterOptions, Holder, JetStreamInbox, JetStreamTranscripts,
};
use clawcage_core::redact::Redactor;
use clawcage_gateway::cluster::ActiveGateway;
use clawcage_gateway::{Gateway, GatewayParts, Settings, Token};
use clawcage_tests::bench::{percentile, report, report_against};
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TURNS: usize = 300;
const WARMUP: usize = 20;
const CLIENTS: usize = 200;
const TOKEN: &str = "gateway-bench-token-0123456789";
const CHILD: &str = "CLAWCAGE_BENCH_GATEWAY_LLM";
/// Set for a child whose sessions live on the NATS server it names.
const NATS_CHILD: &str = "CLAWCAGE_BENCH_GATEWAY_NATS";
/// The nats-server's monitoring port in this benchmark.
const NATS_MONITOR: u16 = 18_222;
const HISTORY: usize = 20;

fn reply() -> Reply {
    anthropic::stream(
        &[anthropic::text(
            "The value of colour is blue, as the lookup says; nothing else to do.",
        )],
        512,
    )
}

/// Where the sessions keep their transcripts and inboxes.
fn file_stores(dir: &Path) -> (Arc<dyn TranscriptStore>, Arc<dyn LaneInbox>) {
    (
        JsonlTranscripts::new(dir.join("sessions")).shared(),
        Arc::new(FileInbox::new(dir.join("inbox"))),
    )
}

fn sessions(llm: &str, dir: &Path) -> (Sessions, Arc<dyn TranscriptStore>) {
    sessions_on(llm, file_stores(dir))
}

fn sessions_on(
    llm: &str,
    (store, inbox): (Arc<dyn TranscriptStore>, Arc<dyn LaneInbox>),
) -> (Sessions, Arc<dyn TranscriptStore>) {
    let provider = clawcage_tests::bench::anthropic_provider(llm, "bench");
    let agent = AgentLoop::new(
        provider,
        ToolRegistry::new(),
        AgentConfig {
            stream: true,
            ..AgentConfig::default()
        },
    );
    (
        Sessions::new(agent, Some(store.clone()), HISTORY).with_inbox(inbox),
        store,
    )
}

/// A gateway's sessions and the stores under them.
type Stores = (
    Sessions,
    Arc<dyn TranscriptStore>,
    Arc<dyn EventLog>,
    Arc<dyn RunRegistry>,
);

/// The child: a gateway over `llm` (its sessions on the NATS server `nats` names, if any), its
/// address on stdout, until stdin closes.
fn child(llm: &str, nats: Option<String>) {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let state = tempfile::tempdir().unwrap();
        let (sessions, transcripts, events, runs): Stores = match nats {
            None => {
                let (sessions, transcripts) = sessions(llm, state.path());
                (
                    sessions,
                    transcripts,
                    Arc::new(DiskEventLog::new(state.path().join("events"))),
                    Arc::new(clawcage_agent::runs::InMemoryRuns::default()),
                )
            }
            Some(url) => {
                let options = ClusterOptions::default();
                let cluster = Cluster::connect(&url, &options).await.unwrap();
                let me = Holder {
                    host: "bench".to_string(),
                    incarnation: "1".to_string(),
                };
                let transcripts: Arc<dyn TranscriptStore> = Arc::new(
                    JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap(),
                );
                let inbox: Arc<dyn LaneInbox> = Arc::new(
                    JetStreamInbox::connect(&url, &options, me, Claims::CoveredByCaller).unwrap(),
                );
                let (sessions, transcripts) = sessions_on(llm, (transcripts, inbox));
                (
                    sessions,
                    transcripts,
                    cluster.event_log(),
                    cluster.run_registry(),
                )
            }
        };
        let parts = GatewayParts {
            sessions,
            tools: ToolRegistry::new(),
            bus: MessageBus::new(),
            subagents: None,
            cron: None,
            cron_note: "not in this benchmark".to_string(),
            transcripts,
            events,
            epoch: 1,
            runs,
            runs_dir: state.path().join("runs"),
            history_limit: HISTORY,
            label: "anthropic/bench".to_string(),
            workspace: state.path().display().to_string(),
            state_dir: state.path().to_path_buf(),
            shared_records: None,
            partitions: None,
            write_fences: None,
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

/// A gateway child over `llm` (on the NATS server `nats`, if any) and its address.
fn spawn_gateway(llm: &str, nats: Option<&str>) -> (std::process::Child, SocketAddr) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(CHILD, llm)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = nats {
        command.env(NATS_CHILD, url);
    }
    let mut gateway = command.spawn().unwrap();
    let mut lines = BufReader::new(gateway.stdout.take().unwrap()).lines();
    let addr: SocketAddr = lines
        .next()
        .unwrap()
        .unwrap()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();
    (gateway, addr)
}

/// `TURNS` turns one after another through `addr`, against `baseline`; the median turn.
async fn one_after_another(
    label: &str,
    addr: SocketAddr,
    baseline: Duration,
    traffic: Option<&dyn Fn() -> [u64; 4]>,
) -> Duration {
    let (mut client, _) = GatewayClient::connect(addr, TOKEN).await;
    let mut samples = Vec::new();
    let mut before = [0; 4];
    for round in 0..TURNS + WARMUP {
        if round == WARMUP
            && let Some(traffic) = traffic
        {
            before = traffic();
        }
        let elapsed = turn(
            &mut client,
            &format!("agent:main:bench:{label}"),
            "What is the colour?",
            &format!("t{round}"),
        )
        .await;
        if round >= WARMUP {
            samples.push(elapsed);
        }
    }
    if let Some(traffic) = traffic {
        let after = traffic();
        let per_turn = |index: usize| (after[index] - before[index]) as f64 / TURNS as f64;
        println!(
            "{:<52} {:>9.1} msgs in, {:.1} out; {:.1} KiB in, {:.1} KiB out",
            "  NATS traffic per turn (the server's /varz)",
            per_turn(0),
            per_turn(1),
            per_turn(2) / 1024.0,
            per_turn(3) / 1024.0
        );
    }
    let through = report_against(
        &format!("turn through the gateway ({label})"),
        samples,
        Some(baseline),
    );
    println!(
        "{:<52} p50 {:>9.2} µs",
        format!("added by the gateway ({label}, p50 difference)"),
        (through.as_secs_f64() - baseline.as_secs_f64()) * 1e6
    );
    client.close().await;
    through
}

/// The turns of one gateway: `TURNS` one after another against `baseline`, then 200 clients
/// (memory per idle connection, one turn each, all at once); the median turn.
async fn measure(
    label: &str,
    gateway: &std::process::Child,
    addr: SocketAddr,
    baseline: Duration,
    traffic: Option<&dyn Fn() -> [u64; 4]>,
) -> Duration {
    let through = one_after_another(label, addr, baseline, traffic).await;

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
    let label = label.to_string();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(n, mut client)| {
            let label = label.clone();
            tokio::spawn(async move {
                let elapsed = turn(
                    &mut client,
                    &format!("agent:main:bench:{label}-c{n}"),
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
        "{:<52} {:>9.2} ms   (slowest {:.2} ms; all {CLIENTS} completed; {:.0} turns/s)",
        "  wall time for all turns",
        wall.as_secs_f64() * 1e3,
        percentile(&sorted, 1.0).as_secs_f64() * 1e3,
        CLIENTS as f64 / wall.as_secs_f64()
    );
    through
}

fn main() {
    if let Ok(llm) = std::env::var(CHILD) {
        return child(&llm, std::env::var(NATS_CHILD).ok());
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

        // The gateway on this machine's files, in a process of its own.
        let (mut gateway, addr) = spawn_gateway(server.url(), None);
        let on_files = measure("files", &gateway, addr, baseline, None).await;
        drop(gateway.stdin.take());
        let _ = gateway.wait();

        // The gateway of a cluster: every store on a local one-node nats-server.
        let Some(nats) = NatsServer::start_monitored("gateway benchmark", NATS_MONITOR) else {
            return;
        };
        let (mut gateway, addr) = spawn_gateway(server.url(), Some(&nats.url()));
        let traffic = || nats.traffic();
        let on_nats = measure("jetstream", &gateway, addr, baseline, Some(&traffic)).await;
        println!(
            "{:<52} p50 {:>9.2} µs   ({:.2}x the files' median)",
            "added by JetStream over the files (p50 difference)",
            (on_nats.as_secs_f64() - on_files.as_secs_f64()) * 1e6,
            on_nats.as_secs_f64() / on_files.as_secs_f64()
        );

        // The same turns through a standby's relay (in this process) to that gateway.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = listener.local_addr().unwrap();
        let (_tell, active) = tokio::sync::watch::channel(Some(ActiveGateway {
            host: "bench".to_string(),
            url: Some(format!("http://{addr}/")),
        }));
        tokio::spawn(clawcage_gateway::relay_clients(
            listener,
            Settings::new(Token::explicit(TOKEN)),
            active,
            "bench-standby".to_string(),
            CancellationToken::new(),
        ));
        let relayed = one_after_another("jetstream-relayed", relay, baseline, None).await;
        println!(
            "{:<52} p50 {:>9.2} µs   ({:.2}x the direct median)",
            "added by a standby's relay (p50 difference)",
            (relayed.as_secs_f64() - on_nats.as_secs_f64()) * 1e6,
            relayed.as_secs_f64() / on_nats.as_secs_f64()
        );
        drop(gateway.stdin.take());
        let _ = gateway.wait();
    });
}
