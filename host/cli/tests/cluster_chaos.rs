//! The cluster's chaos suite, active/standby: three `clawcage gateway` hosts on one real
//! `nats-server` (each with its own state directory, one workspace), five sessions receiving
//! messages with idempotency keys while the active host is killed with SIGKILL at seeded random
//! moments, under three seeds (two fixed, one new each run; each printed, and
//! `CLAWCAGE_CHAOS_SEED` replays one). A killed host is started
//! again, mostly after another host took over (a failover once the lease lapses), sometimes at
//! once (it takes its own earlier lease back), and then waits as a standby. Sends that were on their way at a kill are sent again
//! to the next active host with the same key. Then, on the last active host:
//! - every message sent is answered exactly once, in its session's order (nothing lost, nothing
//!   doubled, whichever host took it and however many times it was sent; the sessions queue in
//!   `followup` mode, so each message is a turn of its own);
//! - every run ends `ok` for `agent.wait` on the host that finished it;
//! - the epochs of the successive active hosts only grow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user, text_of};
use clawcage_tests::nats::NatsServer;
use clawcage_tests::seeded::Seeded;
use serde_json::json;

const TOKEN: &str = "cluster-chaos-token-0123";
const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
const SESSIONS: usize = 5;
const MESSAGES: usize = 6;
const KILLS: usize = 4;

/// One host's configuration and state directory.
struct Host {
    config: PathBuf,
    state: tempfile::TempDir,
    _root: tempfile::TempDir,
}

fn host(nats: &str, model: &str, id: &str) -> Host {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{model}\"\nmax_retries = 0\n\n\
             [queue]\nmode = \"followup\"\n\n\
             [cluster]\nnats = \"{nats}\"\nhost_id = \"{id}\"\nlease_secs = 2\n"
        ),
    )
    .unwrap();
    Host {
        config,
        state: clawcage_tests::cli_state::private_state_dir(),
        _root: root,
    }
}

/// Where a host's start reports: the host serving, or why it stopped before it served.
type Serving = mpsc::Sender<Result<(usize, GatewayProcess), String>>;

/// Starts host `index` in a thread of its own; it reports on `serving` once it serves (a
/// standby waits until then).
fn start(hosts: &[Host], index: usize, workspace: &Path, serving: &Serving) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .arg("--config")
        .arg(&hosts[index].config)
        .arg("--state-dir")
        .arg(hosts[index].state.path())
        .arg("--workspace")
        .arg(workspace)
        .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .args(["--sends-per-minute", "10000"])
        .env_remove("RUST_LOG")
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .env("ANTHROPIC_API_KEY", "sk-chaos-test");
    let serving = serving.clone();
    std::thread::spawn(move || {
        // A standby still waiting when its run ends stops with its cluster (nobody listens).
        let _ = serving.send(GatewayProcess::try_start(command).map(|process| (index, process)));
    });
}

fn text(session: usize, message: usize) -> String {
    format!("s{session} m{message}")
}

/// The parameters of `chat.send` for message `message` of session `session`, with its
/// idempotency key (the same key each time that message is sent).
fn send_params(session: usize, message: usize) -> serde_json::Value {
    json!({
        "sessionKey": format!("agent:main:chaos:s{session}"),
        "message": text(session, message),
        "idempotencyKey": format!("k-{session}-{message}"),
    })
}

/// The epoch a host printed when it became active.
fn epoch_of(output: &str) -> u64 {
    output
        .split("is the active gateway (epoch ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|epoch| epoch.parse().ok())
        .unwrap_or_else(|| panic!("no epoch in: {output}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_gateway_at_random_loses_and_doubles_nothing() {
    // Three seeds: two fixed (the same runs every time) and one new each run; or the one given.
    let seeds = match std::env::var("CLAWCAGE_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![
            0x5eed_0001,
            0x5eed_0002,
            clawcage_agent::transcript::now_ms() | 1,
        ],
    };
    for seed in seeds {
        if !chaos(seed).await {
            return;
        }
    }
}

/// One run of the suite under `seed`; false when it is skipped (no nats-server, outside CI).
async fn chaos(seed: u64) -> bool {
    let Some(nats) = NatsServer::start("killing_the_active_gateway_at_random") else {
        return false;
    };
    eprintln!("cluster chaos: seed {seed} (CLAWCAGE_CHAOS_SEED={seed} replays it)");
    let mut random = Seeded::new(seed);
    // Each answer takes 50 to 400 ms, so kills land during model calls as well as between them.
    let model = LlmServer::start_routed(move |body| {
        let (text, _) = last_user(body);
        let wait = 50 + (text.len() as u64 * 37) % 350;
        Reply::Delayed(
            Duration::from_millis(wait),
            Box::new(anthropic::message(&[anthropic::text(&format!(
                "Answered: {text}"
            ))])),
        )
    })
    .await;
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let workspace = tempfile::tempdir().unwrap();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .map(|id| host(&nats.url(), model.url(), id))
        .collect();
    let (serving, served) = mpsc::channel();
    for index in 0..HOSTS.len() {
        start(&hosts, index, workspace.path(), &serving);
    }
    let next_active = |served: &mpsc::Receiver<Result<(usize, GatewayProcess), String>>| {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut stopped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match served.recv_timeout(left) {
                Ok(Ok(active)) => return active,
                // A host that stopped before serving: said, and the others are waited for.
                Ok(Err(why)) => stopped.push(why),
                Err(_) => panic!(
                    "no standby took over within 90 s (seed {seed}); hosts that stopped: {stopped:#?}"
                ),
            }
        }
    };
    let (mut index, mut active) = next_active(&served);
    let mut epochs = vec![epoch_of(&active.output())];
    // Every send: (session, message) -> its key and the run id it was acknowledged with.
    let mut acked: BTreeMap<(usize, usize), String> = BTreeMap::new();
    let mut next = [0usize; SESSIONS];
    let mut kills = 0;
    loop {
        let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
        let kill_after = if kills < KILLS {
            Some(Duration::from_millis(400 + random.below(1600)))
        } else {
            None
        };
        let started = Instant::now();
        // Send until the kill is due (or, after the last kill, until everything is sent).
        'sending: loop {
            let pending: Vec<usize> = (0..SESSIONS).filter(|&s| next[s] < MESSAGES).collect();
            if pending.is_empty() {
                break;
            }
            let session = pending[random.below(pending.len() as u64) as usize];
            let message = next[session];
            let id = client
                .send_request("chat.send", send_params(session, message))
                .await;
            let response =
                tokio::time::timeout(Duration::from_secs(10), client.response(&id)).await;
            match response {
                Ok(response) if response["ok"] == true => {
                    acked.insert(
                        (session, message),
                        response["payload"]["runId"].as_str().unwrap().to_string(),
                    );
                    next[session] += 1;
                }
                // A full queue says so: sent again later.
                Ok(response) if response["error"]["code"] == "RATE_LIMITED" => {}
                Ok(response) => panic!("a send failed: {response} (seed {seed})"),
                Err(_) => panic!("no answer to a send within 10 s (seed {seed})"),
            }
            if kill_after.is_some_and(|after| started.elapsed() >= after) {
                break 'sending;
            }
            tokio::time::sleep(Duration::from_millis(random.below(120))).await;
        }
        if kill_after.is_none() {
            break;
        }
        // The kill; sometimes a send is on its way as it lands (resent below with its key).
        let (session, message) = (0..SESSIONS)
            .find(|&s| next[s] < MESSAGES)
            .map(|s| (s, next[s]))
            .unwrap_or((0, 0));
        if next[session] < MESSAGES && random.below(2) == 0 {
            let _ = client
                .send_request("chat.send", send_params(session, message))
                .await;
        }
        let said = active.kill();
        assert!(!said.contains("panicked"), "{said}");
        kills += 1;
        eprintln!("cluster chaos: killed {} (kill {kills})", HOSTS[index]);
        // The killed host starts again: mostly once another host serves (a failover after the
        // lease lapses), sometimes at once (it takes its own earlier lease back).
        let killed = index;
        let at_once = random.below(4) == 0;
        if at_once {
            start(&hosts, killed, workspace.path(), &serving);
        }
        (index, active) = next_active(&served);
        if !at_once {
            start(&hosts, killed, workspace.path(), &serving);
        }
        epochs.push(epoch_of(&active.output()));
        eprintln!("cluster chaos: {} serves", HOSTS[index]);
    }

    // Every run ends; each message is answered once, in order.
    let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
    for ((session, message), run_id) in &acked {
        let waited = client
            .request("agent.wait", json!({"runId": run_id, "timeoutMs": 120000}))
            .await;
        assert_eq!(
            waited["payload"]["status"], "ok",
            "s{session} m{message}: {waited} (seed {seed})"
        );
    }
    assert_eq!(
        acked.len(),
        SESSIONS * MESSAGES,
        "every message was acknowledged"
    );
    for session in 0..SESSIONS {
        let history = client
            .request(
                "chat.history",
                json!({"sessionKey": format!("agent:main:chaos:s{session}"), "limit": 1000}),
            )
            .await;
        let texts: Vec<String> = history["payload"]["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{history}"))
            .iter()
            .filter(|message| message["role"] == "assistant")
            .map(text_of)
            .collect();
        let expected: Vec<String> = (0..MESSAGES)
            .map(|message| format!("Answered: {}", text(session, message)))
            .collect();
        let answered: Vec<String> = texts
            .into_iter()
            .filter(|text| text.starts_with("Answered: "))
            .collect();
        assert_eq!(
            answered, expected,
            "session {session}: each message answered once, in order (seed {seed})"
        );
    }
    assert!(
        epochs.windows(2).all(|pair| pair[0] < pair[1]),
        "epochs only grow: {epochs:?} (seed {seed})"
    );
    eprintln!(
        "cluster chaos: {kills} kills, {} messages answered once each, epochs {epochs:?}, {} model requests",
        acked.len(),
        model.bodies().len()
    );
    drop(served);
    let (status, output) = active.terminate();
    assert!(status.success(), "{output}");
    true
}
