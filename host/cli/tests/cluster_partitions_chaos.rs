//! Hosts serving partitions under churn (`[cluster] serve = "partitions"`): three `clawcage
//! gateway` hosts on one nats-server (2 s leases), twelve sessions each sent six messages in
//! turn with idempotency keys, each through a host picked at random (so most are forwarded to
//! the host serving the session), while a random host is killed with SIGKILL every 3 to 5 s and
//! started again (at once, or after its partitions moved: the others take them over, and it is
//! handed its share back when it returns). A send answered `UNAVAILABLE` or cut by a kill is
//! sent again with its key through another host, and a wait cut by a kill is waited again
//! elsewhere. A client follows one session throughout, through one host after another,
//! subscribing again from the last event it saw whenever its connection ends. Then every
//! session's history holds each answer exactly once, in the order sent, every run ended `ok`,
//! and the following client saw exactly that session's event log: each event once, in order,
//! none missed. Two seeds, one fixed and one new each run, each printed;
//! `CLAWCAGE_CHAOS_SEED` replays one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user};
use clawcage_tests::nats::NatsServer;
use clawcage_tests::seeded::Seeded;
use serde_json::{Value, json};

#[path = "cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "shared with the failover tests, which use the rest"
)]
mod host;
use host::{Host, TOKEN};

const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
const SESSIONS: usize = 12;
const MESSAGES: usize = 6;
const KILLS: usize = 4;
/// How long the whole run may take once the hosts serve.
const BUDGET: Duration = Duration::from_secs(240);

/// Where each host listens while it runs (`None`: killed, not back yet).
type Addresses = Arc<Mutex<Vec<Option<SocketAddr>>>>;

fn live(addresses: &Addresses) -> Vec<SocketAddr> {
    addresses
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .copied()
        .collect()
}

/// A client of a live host other than `not` when there is one; `None` when none answers yet.
async fn client_of(
    addresses: &Addresses,
    seeded: &mut Seeded,
    not: Option<SocketAddr>,
) -> Option<(GatewayClient, SocketAddr)> {
    let mut hosts = live(addresses);
    if hosts.len() > 1 {
        hosts.retain(|addr| Some(*addr) != not);
    }
    if hosts.is_empty() {
        return None;
    }
    let addr = hosts[seeded.below(hosts.len() as u64) as usize];
    GatewayClient::try_connect(addr, TOKEN)
        .await
        .ok()
        .map(|(client, _)| (client, addr))
}

/// Sends message `text` to `key` under `idempotency` until a host accepts it, then waits for
/// its run to end `ok`, through whichever hosts live; the run's id.
async fn deliver(
    addresses: &Addresses,
    seed: u64,
    key: &str,
    text: &str,
    idempotency: &str,
) -> String {
    let mut seeded = Seeded::new(seed);
    let started = Instant::now();
    let mut last = None;
    let mut run = None;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{text} to {key} was not answered within 120 s"
        );
        let Some((mut client, addr)) = client_of(addresses, &mut seeded, last).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        last = Some(addr);
        let run_id = match &run {
            Some(run) => run,
            None => {
                let Ok(id) = client
                    .try_send_request(
                        "chat.send",
                        json!({"sessionKey": key, "message": text, "idempotencyKey": idempotency}),
                    )
                    .await
                else {
                    continue;
                };
                let Ok(sent) = client.try_response(&id).await else {
                    continue;
                };
                if sent["ok"] != true {
                    assert_eq!(sent["error"]["code"], "UNAVAILABLE", "{sent}");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
                run = Some(sent["payload"]["runId"].as_str().unwrap().to_string());
                run.as_ref().unwrap()
            }
        };
        let Ok(id) = client
            .try_send_request("agent.wait", json!({"runId": run_id, "timeoutMs": 30000}))
            .await
        else {
            continue;
        };
        let Ok(waited) = client.try_response(&id).await else {
            continue;
        };
        match waited["payload"]["status"].as_str() {
            Some("ok") => return run_id.clone(),
            Some("timeout") => continue,
            _ => panic!("{text} to {key}: the run {run_id} ended {waited}"),
        }
    }
}

/// Follows `key`'s events from its first, as a client whose host dies would: through one live
/// host after another, subscribing again from the last event it saw whenever its connection
/// ends. Every event seen is pushed to `seen`.
async fn watch(addresses: Addresses, key: String, seen: Arc<Mutex<Vec<Value>>>) {
    let mut turn = 0usize;
    loop {
        turn += 1;
        let hosts = live(&addresses);
        if hosts.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let addr = hosts[turn % hosts.len()];
        let since = seen
            .lock()
            .unwrap()
            .last()
            .and_then(|event| event["seq"].as_u64())
            .unwrap_or(0);
        let subscribed = async {
            let (mut client, _) = GatewayClient::try_connect(addr, TOKEN).await?;
            let id = client
                .try_send_request(
                    "sessions.subscribe",
                    json!({"sessionKey": key, "since": since}),
                )
                .await?;
            let answer = client.try_response(&id).await?;
            if answer["ok"] != true {
                return Err(format!("{answer}"));
            }
            Ok::<_, String>(client)
        };
        let Ok(mut client) = subscribed.await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut probed = Instant::now();
        loop {
            // The host may die: its connection's end is found by a request that cannot be sent.
            if probed.elapsed() >= Duration::from_millis(500) {
                probed = Instant::now();
                if client.try_send_request("health", json!({})).await.is_err() {
                    break;
                }
            }
            match client.next_event(Duration::from_millis(200)).await {
                Some(event)
                    if event["event"] == "agent" && event["payload"]["sessionKey"] == key =>
                {
                    seen.lock().unwrap().push(event["payload"].clone());
                }
                Some(_) | None => {}
            }
        }
    }
}

/// The session the watcher follows.
const WATCHED: &str = "agent:main:chaos:p0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stay_whole_while_hosts_serving_partitions_die_and_come_back() {
    // Two seeds: one fixed (the same run every time) and one new each run; or the one given.
    let seeds = match std::env::var("CLAWCAGE_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![0x5eed_0101, clawcage_agent::transcript::now_ms() | 1],
    };
    for seed in seeds {
        if !chaos(seed).await {
            return;
        }
    }
}

/// One run under `seed`; `false` when no nats-server could be started (outside CI).
async fn chaos(seed: u64) -> bool {
    let Some(nats) = NatsServer::start("partitions_chaos") else {
        return false;
    };
    eprintln!("partitions chaos: seed {seed} (CLAWCAGE_CHAOS_SEED={seed} replays it)");
    let model = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        Reply::Delayed(
            Duration::from_millis(150),
            Box::new(anthropic::message(&[anthropic::text(&format!(
                "Answered: {text}"
            ))])),
        )
    })
    .await;
    let workspace = tempfile::tempdir().unwrap();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .map(|id| {
            Host::with(
                &nats.url(),
                model.url(),
                id,
                "serve = \"partitions\"\n\n[queue]\nmode = \"followup\"\n",
            )
        })
        .collect();
    let mut processes: Vec<Option<GatewayProcess>> = Vec::new();
    for host in &hosts {
        processes.push(Some(GatewayProcess::start(host.gateway(workspace.path()))));
    }
    let addresses: Addresses = Arc::new(Mutex::new(
        processes
            .iter()
            .map(|process| process.as_ref().map(|process| process.addr))
            .collect(),
    ));
    let began = Instant::now();
    // A client following one session throughout, from host to host.
    let watched: Arc<Mutex<Vec<Value>>> = Arc::default();
    let watching = tokio::spawn(watch(
        addresses.clone(),
        WATCHED.to_string(),
        watched.clone(),
    ));

    let senders: Vec<_> = (0..SESSIONS)
        .map(|session| {
            let addresses = addresses.clone();
            tokio::spawn(async move {
                let key = format!("agent:main:chaos:p{session}");
                let mut pace = Seeded::new(seed ^ (session as u64 + 1));
                for message in 0..MESSAGES {
                    let text = format!("p{session} m{message}");
                    deliver(
                        &addresses,
                        pace.next_number(),
                        &key,
                        &text,
                        &format!("k-{session}-{message}"),
                    )
                    .await;
                    tokio::time::sleep(Duration::from_millis(200 + pace.below(600))).await;
                }
                key
            })
        })
        .collect();

    // The chaos: a random host killed every 3 to 5 s, started again at once or after 3 s.
    let mut chaos = Seeded::new(seed);
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(3000 + chaos.below(2000))).await;
        let victim = chaos.below(HOSTS.len() as u64) as usize;
        let Some(process) = processes[victim].take() else {
            continue;
        };
        addresses.lock().unwrap()[victim] = None;
        let said = tokio::task::spawn_blocking(move || process.kill())
            .await
            .unwrap();
        assert!(!said.contains("panicked"), "{said}");
        let later = chaos.below(2) == 1;
        eprintln!(
            "killed {} at {:?}, back {}",
            HOSTS[victim],
            began.elapsed(),
            if later { "in 3 s" } else { "at once" }
        );
        if later {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let command = hosts[victim].gateway(workspace.path());
        let back = tokio::task::spawn_blocking(move || GatewayProcess::start(command))
            .await
            .unwrap();
        addresses.lock().unwrap()[victim] = Some(back.addr);
        processes[victim] = Some(back);
    }

    let mut keys = Vec::new();
    for sender in senders {
        keys.push(
            tokio::time::timeout(BUDGET, sender)
                .await
                .expect("the sends ended within the budget")
                .unwrap(),
        );
    }
    eprintln!(
        "{SESSIONS} sessions x {MESSAGES} messages answered through {KILLS} kills in {:?}",
        began.elapsed()
    );

    // Every answer exactly once, in the order sent.
    let addr = live(&addresses)[0];
    let (mut client, _) = GatewayClient::connect(addr, TOKEN).await;
    // The watcher saw the watched session's log exactly: each event once, in order, none
    // missed, through every kill.
    let subscribed = client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": WATCHED, "since": 0}),
        )
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let last = subscribed["payload"]["lastSeq"].as_u64().unwrap();
    let log: Vec<Value> = client
        .agent_events_until(Duration::from_secs(60), |event| {
            event["sessionKey"] == WATCHED && event["seq"] == last
        })
        .await
        .into_iter()
        .filter(|event| event["sessionKey"] == WATCHED)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while watched
        .lock()
        .unwrap()
        .last()
        .and_then(|event| event["seq"].as_u64())
        < Some(last)
    {
        assert!(
            Instant::now() < deadline,
            "the watching client stopped at {:?} of {last} (seed {seed})",
            watched
                .lock()
                .unwrap()
                .last()
                .map(|event| event["seq"].clone())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watching.abort();
    let brief = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{} {} {} {}", e["seq"], e["runId"], e["stream"], e["data"]))
            .collect()
    };
    let seen = watched.lock().unwrap().clone();
    assert_eq!(
        brief(&seen),
        brief(&log),
        "the watching client saw its session's log exactly (seed {seed})"
    );
    eprintln!("the watcher saw all {last} events of {WATCHED}, each once, in order");
    for (session, key) in keys.iter().enumerate() {
        let history = client
            .request("chat.history", json!({"sessionKey": key, "limit": 200}))
            .await;
        assert_eq!(history["ok"], true, "{history}");
        let answers: Vec<String> = history["payload"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|message| message["role"] == "assistant")
            .map(|message| message.to_string())
            .collect();
        let expected: Vec<String> = (0..MESSAGES)
            .map(|message| format!("Answered: p{session} m{message}"))
            .collect();
        let found: Vec<String> = answers
            .iter()
            .filter_map(|answer| {
                expected
                    .iter()
                    .find(|wanted| answer.contains(wanted.as_str()))
                    .cloned()
            })
            .collect();
        assert_eq!(found, expected, "{key}: {answers:#?}");
    }
    for process in processes.into_iter().flatten() {
        let (exit, output) = process.terminate();
        assert!(exit.success(), "{}", tail(&output));
    }
    true
}

fn tail(output: &str) -> &str {
    let start = output.len().saturating_sub(4000);
    let mut start = start;
    while !output.is_char_boundary(start) {
        start += 1;
    }
    &output[start..]
}
