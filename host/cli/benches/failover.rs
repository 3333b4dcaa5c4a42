//! Failover with the default lease (10 s), measured on the `clawcage` binary: two gateway hosts
//! of a cluster on a local one-node `nats-server`, a turn waiting for the model on the active
//! host when it is killed with SIGKILL, and a client that was connected through the standby (it
//! relays it to the active host). The standby carries the client's connection over to itself
//! once it serves (the client does nothing), and the time from the kill to the resumed turn's
//! first event on that connection, and to its end, is taken. Three runs, each on a fresh server
//! and fresh hosts; the medians are reported.
//!
//! Run: `cargo bench -p clawcage-cli --bench failover` (needs nats-server, installed by
//! tests/nats/setup.sh).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clawcage_tests::bench::report;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic, last_user};
use clawcage_tests::nats::NatsServer;
use serde_json::json;

#[path = "../tests/cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "the cluster tests' hosts; this benchmark uses their configuration, with the default lease"
)]
mod host;

const TOKEN: &str = "failover-bench-token-0123456789";
const RUNS: usize = 3;
const SESSION: &str = "agent:main:bench:failover";

/// `clawcage gateway` for `host` (the default lease) on `workspace`.
fn gateway(host: &host::Host, workspace: &Path) -> Command {
    host.command(
        workspace,
        &["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN],
    )
}

/// One failover: from the kill to the resumed turn's first event and to its end.
async fn failover(run: usize) -> (Duration, Duration) {
    let nats = NatsServer::start("failover bench").expect("nats-server");
    let gate = ReplyGate::new();
    let model = LlmServer::start_routed({
        let gate = gate.clone();
        move |body| {
            let (text, _) = last_user(body);
            gate.hold(anthropic::message(&[anthropic::text(&format!(
                "Answered: {text}"
            ))]))
        }
    })
    .await;
    let workspace = tempfile::tempdir().unwrap();
    let (first, second) = (
        host::Host::with_cluster(&nats.url(), model.url(), "host-a", "", ""),
        host::Host::with_cluster(&nats.url(), model.url(), "host-b", "", ""),
    );
    let active = GatewayProcess::start(gateway(&first, workspace.path()));
    let (standby, relay) = host::standby_started(gateway(&second, workspace.path())).await;
    let mut client = host::relayed_client(relay, TOKEN).await;
    let subscribed = client
        .request("sessions.subscribe", json!({"sessionKey": SESSION}))
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": SESSION, "message": format!("run {run}"), "idempotencyKey": format!("k{run}")}),
        )
        .await;
    let run_id = sent["payload"]["runId"].as_str().unwrap().to_string();
    gate.reached(1).await;
    while client
        .next_event(Duration::from_millis(500))
        .await
        .is_some()
    {}
    let killed = Instant::now();
    active.kill();
    // The model answers from now on (the resumed turn asks it again).
    gate.open();
    // The same connection: the standby carries it over to the host that takes over (itself).
    let mut first = None;
    loop {
        let event = client
            .next_event(Duration::from_secs(60))
            .await
            .expect("the resumed turn goes on");
        if event["event"] != "agent" || event["payload"]["runId"] != run_id.as_str() {
            continue;
        }
        first.get_or_insert_with(|| killed.elapsed());
        let payload = &event["payload"];
        if payload["stream"] == "lifecycle" && payload["data"]["phase"] == "end" {
            break;
        }
    }
    let ended = killed.elapsed();
    let standby = standby.await.unwrap().unwrap();
    let _ = standby.terminate();
    (first.unwrap(), ended)
}

fn main() {
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        println!(
            "failover benchmark: default lease (10 s), {RUNS} runs, client through the standby"
        );
        let (mut firsts, mut ends) = (Vec::new(), Vec::new());
        for run in 0..RUNS {
            let (first, end) = failover(run).await;
            println!(
                "run {run}: kill -9 to the resumed turn's first event {:.2} s, to its end {:.2} s",
                first.as_secs_f64(),
                end.as_secs_f64()
            );
            firsts.push(first);
            ends.push(end);
        }
        report("kill -9 to the resumed turn's first event", firsts);
        report("kill -9 to the resumed turn's end", ends);
    });
}
