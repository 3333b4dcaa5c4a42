//! The cluster's chaos suite, active/standby (`cluster_partitions_chaos.rs` is the same with every
//! host serving partitions; the workload and its checks are `cluster_chaos/workload.rs`): three
//! `clawcage gateway` hosts (each with its own state directory, one workspace) on a three-server
//! NATS cluster (every stream and bucket with three replicas), twenty sessions receiving ten
//! messages each with idempotency keys and a cron job firing every 2 s into another, while every 8
//! to 15 s a random host is killed with SIGKILL (a standby, started again at once, or the active
//! host, at least three times) and, once, one of the NATS servers (started again a round later);
//! under three seeds (two fixed, one new each run; each printed, and `CLAWCAGE_CHAOS_SEED` replays
//! one). `CLAWCAGE_CHAOS_ONE_SERVER=1` runs it on one nats-server, which is not killed. A killed
//! active host is started again, mostly after another host took over (a failover once the lease
//! lapses), sometimes at once (it takes its own earlier lease back), and then waits as a standby;
//! an active host that stops on its own (it could not renew its lease while a NATS server's streams
//! elected new leaders) is started again the same way. Any host accepts the clients: each round's
//! sends go through another host (a standby relays them to the active host), and sends that were on
//! their way at a kill are sent again with the same key. Then, on the last active host:
//! - in the ten `followup` sessions (each message a turn of its own), every message sent is
//!   answered exactly once, in its session's order (nothing lost, nothing doubled, whichever host
//!   took it and however many times it was sent); in the `steer`, `collect` and `interrupt`
//!   sessions, every message is in the history once unless the queue dropped it, and no answer
//!   is given twice;
//! - every run ends `ok` for `agent.wait` (or, in `interrupt` mode, `aborted` or `dropped`),
//!   and every message sent once more with its key is recognised as the run it was;
//! - every session's events, read from the event stream itself, run 1, 2, … without a hole or
//!   a repeat, and their writers' epochs never go back;
//! - every cron firing is a turn answered once, each slot's key taken once by the inbox, and the
//!   job fired under more than one host;
//! - the epochs of the successive active hosts only grow;
//! - a client that followed one session throughout, through one host after another (subscribing
//!   again, from the last event it saw, whenever its connection ended or another host became
//!   active), saw exactly that session's event log: each event once, in order, none missed, the
//!   turns that resumed on another host ending there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::seeded::Seeded;

#[path = "cluster_chaos/hosts.rs"]
mod hosts;
#[path = "cluster_chaos/observe.rs"]
mod observe;
#[path = "cluster_chaos/workload.rs"]
mod workload;
use hosts::{Addresses, Host, Standbys, clawcage, host, start};
use observe::{client_through, cron_fired_once, watch_events};
use workload::{
    Acked, CRON_SESSION, MESSAGES, SESSIONS, Seen, Sent, WATCHED, lock, mode_of, send_params,
};

const TOKEN: &str = "cluster-chaos-token-0123";
const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
/// The active host is killed at least this often (the other kills may hit standbys).
const MIN_ACTIVE_KILLS: usize = 3;
/// The longest pause between two sends: about a minute of sending in all.
const SEND_PAUSE_MS: u64 = 500;
/// How long one seed's run may take, from a formed cluster to the last check (about 100 s here).
const SEED_BUDGET: Duration = Duration::from_secs(300);
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
    let Some((mut nats, nats_url)) =
        workload::nats_servers("killing_the_active_gateway_at_random", seed).await
    else {
        return false;
    };
    let replicas = nats.len();
    eprintln!("cluster chaos: seed {seed} (CLAWCAGE_CHAOS_SEED={seed} replays it)");
    let began = Instant::now();
    let mut random = Seeded::new(seed);
    let model = workload::answering_model().await;
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let workspace = tempfile::tempdir().unwrap();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .map(|id| host(&nats_url, model.url(), id, replicas, ""))
        .collect();
    let (serving, served) = mpsc::channel();
    let standbys: Standbys = Arc::default();
    let addresses: Addresses = Arc::default();
    let start_host = |index: usize| {
        start(
            &hosts,
            index,
            workspace.path(),
            &serving,
            &standbys,
            &addresses,
        )
    };
    for index in 0..HOSTS.len() {
        start_host(index);
    }
    let next_active = |served: &mpsc::Receiver<Result<(usize, GatewayProcess), String>>| {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut stopped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match served.recv_timeout(left) {
                Ok(Ok(active)) => return active,
                // A host that stopped before serving: said at once (an earlier wait may have
                // taken it), and the others are waited for.
                Ok(Err(why)) => {
                    eprintln!("cluster chaos: a host stopped before it served: {why}");
                    stopped.push(why);
                }
                Err(_) => panic!(
                    "no standby took over within 120 s (seed {seed}); hosts that stopped: {stopped:#?}"
                ),
            }
        }
    };
    let (mut index, mut active) = next_active(&served);
    // A client following one session's events throughout, moving to each new active host.
    let (active_addr, active_addrs) = tokio::sync::watch::channel(active.addr);
    let watched: Seen = Arc::default();
    let watching = tokio::spawn(watch_events(
        active_addrs,
        addresses.clone(),
        watched.clone(),
    ));
    let mut epochs = vec![epoch_of(&active.output())];
    // A cron job every 2 s, added with a standby's configuration: the cluster's, fired by
    // whichever host is active.
    workload::add_cron_job(clawcage(
        &hosts,
        (index + 1) % HOSTS.len(),
        workspace.path(),
    ));
    // Once, in a seeded round, a NATS server is killed while the active host serves; it starts
    // again after the next kill of a host.
    let nats_round = 1 + random.below(3) as usize;
    let nats_victim = random.below(nats.len() as u64) as usize;
    let kills_a_server = nats.len() > 1;
    let mut nats_down = false;
    let mut round = 0;
    // Every send: (session, message) -> its key and the run id it was acknowledged with.
    let mut acked = Acked::new();
    let mut next = [0usize; SESSIONS];
    let (mut kills, mut active_kills) = (0, 0);
    loop {
        round += 1;
        assert!(
            began.elapsed() < SEED_BUDGET,
            "the run ran out of time (seed {seed})"
        );
        if nats_down {
            nats[nats_victim].restart();
            nats_down = false;
            eprintln!("cluster chaos: NATS server n{nats_victim} started again");
        }
        // Any host accepts the sender: each round another one (a standby relays it).
        let mut client = client_through(&addresses, active.addr, round).await;
        let everything_sent = |next: &[usize; SESSIONS]| next.iter().all(|&n| n == MESSAGES);
        // The next kill of a host, 8 to 15 s from now; once everything is sent, of the active
        // host 1 to 3 s from now until it was killed often enough, then none.
        let kill_after = if !everything_sent(&next) {
            Some(Duration::from_millis(8000 + random.below(7000)))
        } else if active_kills < MIN_ACTIVE_KILLS {
            Some(Duration::from_millis(1000 + random.below(2000)))
        } else {
            None
        };
        let started = Instant::now();
        let mut stopped_itself = false;
        // Send until the kill is due (or, after the last kill, until everything is sent).
        'sending: loop {
            if kills_a_server
                && round == nats_round
                && !nats_down
                && kill_after.is_some_and(|after| started.elapsed() >= after / 2)
            {
                nats[nats_victim].kill();
                nats_down = true;
                eprintln!("cluster chaos: killed NATS server n{nats_victim}");
            }
            let pending: Vec<usize> = (0..SESSIONS).filter(|&s| next[s] < MESSAGES).collect();
            if pending.is_empty() {
                // Everything is sent: the host serves on (the cron job fires) until its kill.
                match kill_after {
                    Some(after) if started.elapsed() < after => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    _ => break,
                }
            }
            let session = pending[random.below(pending.len() as u64) as usize];
            let message = next[session];
            match workload::send_once(&mut client, (session, message), false, seed).await {
                Sent::Acked(run_id) => {
                    acked.insert((session, message), run_id);
                    next[session] += 1;
                }
                Sent::Again => {}
                // The active host is gone: it stopped itself when it could not keep its lease
                // (it closes its connections, then exits; a relayed send is told so).
                Sent::Closed(closed) => {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while active.exited().is_none() {
                        assert!(
                            Instant::now() < deadline,
                            "{closed}, and the gateway runs on (seed {seed})"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    eprintln!("cluster chaos: {} stopped itself ({closed})", HOSTS[index]);
                    stopped_itself = true;
                    break 'sending;
                }
            }
            if kill_after.is_some_and(|after| started.elapsed() >= after) {
                break 'sending;
            }
            tokio::time::sleep(Duration::from_millis(random.below(SEND_PAUSE_MS))).await;
        }
        if stopped_itself {
            let stopped = index;
            (index, active) = next_active(&served);
            active_addr.send_replace(active.addr);
            start_host(stopped);
            epochs.push(epoch_of(&active.output()));
            eprintln!("cluster chaos: {} serves", HOSTS[index]);
            continue;
        }
        if kill_after.is_none() {
            break;
        }
        // A random host is killed: a standby (started again at once), or the active host (the
        // active host once everything is sent).
        let victim = if everything_sent(&next) {
            index
        } else {
            random.below(HOSTS.len() as u64) as usize
        };
        kills += 1;
        if victim != index {
            let pid = lock(&standbys)[victim].take();
            if let Some(pid) = pid {
                let killed = Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .unwrap();
                assert!(killed.success(), "kill -9 {pid}");
                eprintln!(
                    "cluster chaos: killed standby {} (kill {kills})",
                    HOSTS[victim]
                );
                start_host(victim);
                continue;
            }
        }
        // The active host; sometimes a send is on its way as it lands (resent below with its
        // key).
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
        active_kills += 1;
        eprintln!("cluster chaos: killed {} (kill {kills})", HOSTS[index]);
        // The killed host starts again: mostly once another host serves (a failover after the
        // lease lapses), sometimes at once (it takes its own earlier lease back).
        let killed = index;
        let at_once = random.below(4) == 0;
        if at_once {
            start_host(killed);
        }
        (index, active) = next_active(&served);
        active_addr.send_replace(active.addr);
        if !at_once {
            start_host(killed);
        }
        epochs.push(epoch_of(&active.output()));
        eprintln!("cluster chaos: {} serves", HOSTS[index]);
    }

    // Every run ends; each key is recognised; the followed client saw its log exactly; the
    // stored events run on without holes under epochs that never go back; each message is
    // taken once (answered once, in order, in the followup sessions); every cron firing is
    // answered once.
    let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
    let statuses = workload::runs_ended(&mut client, &acked, seed).await;
    workload::keys_recognised(&mut client, &acked, seed).await;
    let followed = workload::followed_exactly(&mut client, &watched, seed).await;
    watching.abort();
    let writers =
        workload::events_fenced(&observe::cluster_of(&nats_url, replicas).await, seed).await;
    workload::histories_whole(&mut client, &statuses, seed).await;
    let remove = clawcage(&hosts, index, workspace.path());
    let firings = cron_fired_once(&mut client, remove, &nats_url, replicas, seed).await;
    assert!(
        epochs.windows(2).all(|pair| pair[0] < pair[1]),
        "epochs only grow: {epochs:?} (seed {seed})"
    );
    eprintln!(
        "cluster chaos: {kills} kills, {} messages each taken once ({} of them in followup sessions, answered once in order; {} interrupted or dropped), {firings} cron firings, {followed} events followed across takeovers, {writers} writers' epochs in the sessions' events, epochs {epochs:?}, {} model requests",
        acked.len(),
        acked
            .keys()
            .filter(|(session, _)| mode_of(*session) == "followup")
            .count(),
        statuses.values().filter(|status| *status != "ok").count(),
        model.bodies().len()
    );
    // The standbys still waiting stop with this run: left alone, they would go on trying this
    // run's stopped servers into the next seed's run.
    let waiting: Vec<u32> = lock(&standbys)
        .iter_mut()
        .filter_map(Option::take)
        .collect();
    for pid in waiting {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    drop(served);
    let (status, output) = active.terminate();
    assert!(status.success(), "{output}");
    true
}
