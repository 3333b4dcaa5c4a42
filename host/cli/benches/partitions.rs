//! Several hosts serving partitions (`[cluster] serve = "partitions"`), measured on the
//! `clawcage` binary on one local `nats-server`: one host serving all 64 partitions beside two
//! hosts serving half each, in the same run, round after round (the machine is shared and
//! noisy: the medians of the rounds are reported).
//! 1. A turn one after another (chat.send to the end of the run on the client's connection):
//!    to a session of the host the client is connected to, and to a session of the other host
//!    (forwarded there, its events followed from the log on the client's host).
//! 2. 200 sessions, one turn each, sent at once by 200 clients spread over the hosts: turns per
//!    second from the first send to the last end.
//!
//! Both hosts run on this 2-core machine, so two hosts cannot add cores here; what this shows is
//! what forwarding and sharing the partitions cost, not the scale-out of separate machines.
//!
//! Run: `cargo bench -p clawcage-cli --bench partitions` (needs nats-server, installed by
//! tests/nats/setup.sh).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clawcage_cluster::leases::{PARTITIONS, partition_of, partitions_won};
use clawcage_tests::bench::report;
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, anthropic};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};

#[path = "../tests/cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "the cluster tests' hosts; this benchmark uses their configuration, with the default lease"
)]
mod host;

const TOKEN: &str = "partitions-bench-token-0123456789";
const ROUNDS: usize = 3;
const ONE_AFTER_ANOTHER: usize = 100;
const AT_ONCE: usize = 200;

/// A host serving partitions of the cluster at `nats` (the default lease), its sessions'
/// queues in `followup` mode.
fn partitioned(nats: &str, model: &str, id: &str) -> host::Host {
    host::Host::with_cluster(
        nats,
        model,
        id,
        "serve = \"partitions\"\n",
        "[queue]\nmode = \"followup\"\n",
    )
}

/// `clawcage gateway` for `host` on `workspace`, taking as many sends as the benchmark makes.
fn gateway(host: &host::Host, workspace: &Path) -> Command {
    host.command(
        workspace,
        &[
            "gateway",
            "--bind",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--sends-per-minute",
            "100000",
        ],
    )
}

/// Waits until the partition leases are held exactly as the placement among `hosts` says (the
/// hand-overs after the last host joined are done), as `clawcage cluster status` shows them.
fn placed(host: &host::Host, workspace: &Path, hosts: &[&str]) {
    let started = Instant::now();
    let live: Vec<String> = hosts.iter().map(|host| host.to_string()).collect();
    loop {
        let output = host
            .command(workspace, &["cluster", "status", "--json"])
            .output()
            .unwrap();
        let status: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        let holders: Vec<(u32, String)> = status["leases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|lease| {
                let partition = lease[0].as_str()?.strip_prefix("part.")?.parse().ok()?;
                Some((partition, lease[1]["host"].as_str()?.to_string()))
            })
            .collect();
        let settled = holders.len() == PARTITIONS as usize
            && live.iter().all(|name| {
                let mut held: Vec<u32> = holders
                    .iter()
                    .filter(|(_, holder)| holder == name)
                    .map(|(partition, _)| *partition)
                    .collect();
                held.sort_unstable();
                held == partitions_won(name, &live, PARTITIONS)
            });
        if settled {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the partitions did not settle: {holders:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until a turn to each of `sessions` is answered through `addr` (every host serves its
/// share).
async fn settled(addr: SocketAddr, sessions: &[String]) {
    let started = Instant::now();
    let (mut client, _) = GatewayClient::connect(addr, TOKEN).await;
    for session in sessions {
        loop {
            let sent = client
                .request(
                    "chat.send",
                    json!({"sessionKey": session, "message": "warm"}),
                )
                .await;
            if sent["ok"] == true {
                let run = sent["payload"]["runId"].as_str().unwrap().to_string();
                until_end(&mut client, &run).await;
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the hosts did not settle: {sent}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn until_end(client: &mut GatewayClient, run: &str) {
    client
        .agent_events_until(Duration::from_secs(60), |event| {
            event["runId"] == run
                && event["stream"] == "lifecycle"
                && matches!(event["data"]["phase"].as_str(), Some("end" | "error"))
        })
        .await;
}

/// One turn to `session` through `client`, from the send to the run's end on the connection.
async fn turn(client: &mut GatewayClient, session: &str) -> Duration {
    let started = Instant::now();
    let sent: Value = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "hello"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    until_end(client, sent["payload"]["runId"].as_str().unwrap()).await;
    started.elapsed()
}

/// `count` sessions of host `owner` among `hosts`, named after `name`.
fn sessions_of(owner: &str, hosts: &[&str], name: &str, count: usize) -> Vec<String> {
    let live: Vec<String> = hosts.iter().map(|host| host.to_string()).collect();
    let won = partitions_won(owner, &live, PARTITIONS);
    (0..)
        .map(|n| format!("agent:main:bench:{name}-{n}"))
        .filter(|key| won.contains(&partition_of(key)))
        .take(count)
        .collect()
}

/// What one round measures.
struct Round {
    direct: Vec<Duration>,
    forwarded: Vec<Duration>,
    turns_per_second: f64,
}

/// One round with `hosts` serving partitions: fresh server, fresh hosts.
async fn round(model: &LlmServer, hosts: &[&str], round: usize) -> Round {
    let nats = NatsServer::start("partitions bench").expect("nats-server");
    let workspace = tempfile::tempdir().unwrap();
    let configured: Vec<host::Host> = hosts
        .iter()
        .map(|id| partitioned(&nats.url(), model.url(), id))
        .collect();
    let mut processes = Vec::new();
    for host in &configured {
        processes.push(GatewayProcess::start(gateway(host, workspace.path())));
    }
    let first = processes[0].addr;
    let mine = sessions_of(hosts[0], hosts, &format!("mine{round}"), ONE_AFTER_ANOTHER);
    let theirs = hosts
        .get(1)
        .map(|other| sessions_of(other, hosts, &format!("theirs{round}"), ONE_AFTER_ANOTHER))
        .unwrap_or_default();
    tokio::task::block_in_place(|| placed(&configured[0], workspace.path(), hosts));
    let mut warm = vec![mine[0].clone()];
    warm.extend(theirs.first().cloned());
    settled(first, &warm).await;

    let (mut client, _) = GatewayClient::connect(first, TOKEN).await;
    let mut direct = Vec::new();
    for session in &mine {
        direct.push(turn(&mut client, session).await);
    }
    let mut forwarded = Vec::new();
    for session in &theirs {
        forwarded.push(turn(&mut client, session).await);
    }

    // 200 sessions at once, the clients spread over the hosts.
    let mut clients = Vec::new();
    for n in 0..AT_ONCE {
        let addr = processes[n % processes.len()].addr;
        clients.push(GatewayClient::connect(addr, TOKEN).await.0);
    }
    let started = Instant::now();
    let turns: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(n, mut client)| {
            tokio::spawn(async move {
                turn(&mut client, &format!("agent:main:bench:at-once{round}-{n}")).await;
            })
        })
        .collect();
    for turn in turns {
        turn.await.unwrap();
    }
    let turns_per_second = AT_ONCE as f64 / started.elapsed().as_secs_f64();
    for process in processes {
        let (exit, output) = process.terminate();
        assert!(exit.success(), "{output}");
    }
    Round {
        direct,
        forwarded,
        turns_per_second,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let model = LlmServer::start_routed(|_| anthropic::message(&[anthropic::text("ok")])).await;
        let (mut one_direct, mut two_direct, mut two_forwarded) = (Vec::new(), Vec::new(), Vec::new());
        let (mut one_rate, mut two_rate) = (Vec::new(), Vec::new());
        for n in 0..ROUNDS {
            let one = round(&model, &["host-a"], n).await;
            let two = round(&model, &["host-a", "host-b"], n).await;
            eprintln!(
                "round {n}: one host {:.0} turns/s, two hosts {:.0} turns/s",
                one.turns_per_second, two.turns_per_second
            );
            one_direct.extend(one.direct);
            two_direct.extend(two.direct);
            two_forwarded.extend(two.forwarded);
            one_rate.push(one.turns_per_second);
            two_rate.push(two.turns_per_second);
        }
        report("turn, one host serving every partition", one_direct);
        report("turn to a session of the client's host, two hosts", two_direct);
        report(
            "turn to a session of the other host (forwarded), two hosts",
            two_forwarded,
        );
        println!(
            "{AT_ONCE} sessions, one turn each at once: one host {:.0} turns/s, two hosts {:.0} turns/s (medians of {ROUNDS} rounds)",
            median(one_rate),
            median(two_rate)
        );
    });
}
