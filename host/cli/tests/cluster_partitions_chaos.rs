//! The cluster's chaos suite with every host serving (`[cluster] serve = "partitions"`): the
//! workload of the active/standby suite (`cluster_chaos/workload.rs`: twenty sessions over the
//! four queue modes, ten messages each under idempotency keys, a cron job firing every 2 s into
//! another session, one session followed by a client throughout) on three `clawcage gateway`
//! hosts sharing the partitions of a three-server NATS cluster (every stream and bucket with
//! three replicas, 3 s leases). Every 8 to 15 s a random host is killed with SIGKILL and started
//! again 1 to 3 s later (once in a run 10 s later, so that its partitions move to the other two
//! and are handed back when it returns), and once one of the NATS servers is killed as well and
//! started again a round later (while the servers elect new leaders, renewals may come back too
//! late: a host whose fence shut under a running turn leaves the turn to the partition's next
//! owner, who resumes it, and one whose fence shut between marking a run's input done and
//! storing its end leaves the end for the next owner to say). Three seeds (two fixed, one new
//! each run; each printed, and `CLAWCAGE_CHAOS_SEED` replays one);
//! `CLAWCAGE_CHAOS_ONE_SERVER=1` runs it on one nats-server, which is not killed. Each round's sends go through another live host (most are
//! forwarded to the host serving their session); a send cut by a kill, or answered that its
//! session is moving or that a store could not answer in time, is sent again with its key
//! through the next live host. The client following one session moves from host to host,
//! subscribing again from the last event it saw. Then, through any host, the workload's checks:
//! every run ends; every message sent again with its key is recognised as its first run; the
//! following client saw exactly the session's log; every session's stored events run 1, 2, …
//! under writers' epochs that never go back; each message is taken once (answered once and in
//! order in the `followup` sessions); every cron firing is answered once and each slot taken
//! once. And the partitions' leases, watched throughout, changed holders (the kills moved them)
//! under revisions that only grew.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::seeded::Seeded;
use serde_json::json;

#[path = "cluster_chaos/hosts.rs"]
#[allow(
    dead_code,
    reason = "the standbys' start is the active/standby suite's"
)]
mod hosts;
#[path = "cluster_chaos/observe.rs"]
#[allow(
    dead_code,
    reason = "following the active host is the active/standby suite's"
)]
mod observe;
#[path = "cluster_chaos/workload.rs"]
mod workload;
use hosts::{Addresses, Host, clawcage, host};
use observe::{cluster_of, cron_fired_once};
use workload::{
    Acked, CRON_SESSION, MESSAGES, SESSIONS, Seen, Sent, WATCHED, lock, mode_of, send_params,
};

const TOKEN: &str = "cluster-chaos-token-0123";
const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
/// Hosts are killed at least this often in a run (the last ones after everything is sent).
const MIN_KILLS: usize = 4;
/// The longest pause between two sends: about a minute of sending in all.
const SEND_PAUSE_MS: u64 = 500;
/// How long one seed's run may take, from a formed cluster to the last check.
const SEED_BUDGET: Duration = Duration::from_secs(300);

/// The running host processes (`None`: killed, not started again yet).
type Processes = Arc<Mutex<[Option<GatewayProcess>; HOSTS.len()]>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_hosts_serving_partitions_at_random_loses_and_doubles_nothing() {
    // Three seeds: two fixed (the same runs every time) and one new each run; or the one given.
    let seeds = match std::env::var("CLAWCAGE_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![
            0x5eed_0201,
            0x5eed_0202,
            clawcage_agent::transcript::now_ms() | 1,
        ],
    };
    for seed in seeds {
        if !chaos(seed).await {
            return;
        }
    }
}

/// A client of a live host, the `turn`-th one (modulo those live) when it answers, else of
/// another; `None` while none answers.
async fn client_of_live(addresses: &Addresses, turn: usize) -> Option<(GatewayClient, usize)> {
    let live: Vec<(usize, std::net::SocketAddr)> = lock(addresses)
        .iter()
        .enumerate()
        .filter_map(|(index, addr)| addr.map(|addr| (index, addr)))
        .collect();
    for offset in 0..live.len() {
        let (index, addr) = live[(turn + offset) % live.len()];
        if let Ok((client, _)) = GatewayClient::try_connect(addr, TOKEN).await {
            return Some((client, index));
        }
    }
    None
}

/// Follows [`WATCHED`]'s events from its first, as a client whose host dies would: through one
/// live host after another, subscribing again from the last event it saw whenever its
/// connection ends. Every event seen is pushed to `seen`.
async fn watch_live(addresses: Addresses, seen: Seen) {
    let mut turn = 0usize;
    loop {
        turn += 1;
        let since = lock(&seen)
            .last()
            .and_then(|event| event["seq"].as_u64())
            .unwrap_or(0);
        let subscribed = async {
            let (mut client, _) = client_of_live(&addresses, turn)
                .await
                .ok_or("no host answers")?;
            let id = client
                .try_send_request(
                    "sessions.subscribe",
                    json!({"sessionKey": WATCHED, "since": since}),
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
                    if event["event"] == "agent" && event["payload"]["sessionKey"] == WATCHED =>
                {
                    lock(&seen).push(event["payload"].clone());
                }
                Some(_) | None => {}
            }
        }
    }
}

/// Each partition lease's holders as seen every 250 ms: (holder, revision) each time either
/// changed.
type LeaseHistory = Arc<Mutex<BTreeMap<String, Vec<(String, u64)>>>>;

/// Watches the partitions' leases into `history` (reads that fail while a NATS server is down
/// are tried again).
async fn watch_leases(cluster: clawcage_cluster::Cluster, history: LeaseHistory) {
    let reader = clawcage_cluster::Holder {
        host: "chaos-reader".to_string(),
        incarnation: std::process::id().to_string(),
    };
    let leases = loop {
        match cluster.leases(reader.clone()).await {
            Ok(leases) => break leases,
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    loop {
        if let Ok(held) = leases.all().await {
            let mut history = lock(&history);
            for (name, holder, revision) in held {
                if !name.starts_with("part.") {
                    continue;
                }
                let holder = format!("{} {}", holder.host, holder.incarnation);
                let seen = history.entry(name).or_default();
                if seen.last() != Some(&(holder.clone(), revision)) {
                    seen.push((holder, revision));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Starts host `index` after `delay`, in the background; it is put in `processes` and
/// `addresses` once it accepts clients.
fn start_later(
    command: std::process::Command,
    index: usize,
    delay: Duration,
    processes: &Processes,
    addresses: &Addresses,
) -> tokio::task::JoinHandle<()> {
    let (processes, addresses) = (processes.clone(), addresses.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let process = tokio::task::spawn_blocking(move || GatewayProcess::start(command))
            .await
            .unwrap();
        lock(&addresses)[index] = Some(process.addr);
        lock(&processes)[index] = Some(process);
        eprintln!("partitions chaos: {} started again", HOSTS[index]);
    })
}

/// One run under `seed`; false when it is skipped (no nats-server, outside CI).
async fn chaos(seed: u64) -> bool {
    let Some((mut nats, nats_url)) =
        workload::nats_servers("killing_hosts_serving_partitions", seed).await
    else {
        return false;
    };
    let replicas = nats.len();
    eprintln!("partitions chaos: seed {seed} (CLAWCAGE_CHAOS_SEED={seed} replays it)");
    let began = Instant::now();
    let mut random = Seeded::new(seed);
    let model = workload::answering_model().await;
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    let workspace = tempfile::tempdir().unwrap();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .map(|id| {
            host(
                &nats_url,
                model.url(),
                id,
                replicas,
                "serve = \"partitions\"\n",
            )
        })
        .collect();
    let gateway = |index: usize| {
        let mut command = clawcage(&hosts, index, workspace.path());
        command
            .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
            .args(["--sends-per-minute", "10000"])
            .env_remove("RUST_LOG")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-chaos-test");
        command
    };
    let processes: Processes = Arc::default();
    let addresses: Addresses = Arc::default();
    let starts: Vec<_> = (0..HOSTS.len())
        .map(|index| {
            start_later(
                gateway(index),
                index,
                Duration::ZERO,
                &processes,
                &addresses,
            )
        })
        .collect();
    for start in starts {
        start.await.unwrap();
    }
    let leases: LeaseHistory = Arc::default();
    let watching_leases = tokio::spawn(watch_leases(
        cluster_of(&nats_url, replicas).await,
        leases.clone(),
    ));
    let watched: Seen = Arc::default();
    let watching = tokio::spawn(watch_live(addresses.clone(), watched.clone()));
    // A cron job every 2 s, fired by whichever host serves its session.
    workload::add_cron_job(clawcage(&hosts, 1, workspace.path()));
    // Once, in a seeded round, a NATS server is killed halfway to the round's kill of a host;
    // it starts again the round after. Once, in another, the host killed stays down 10 s.
    let nats_round = 1 + random.below(3) as usize;
    let nats_victim = random.below(nats.len() as u64) as usize;
    let long_down_round = 1 + random.below(4) as usize;
    let kills_a_server = nats.len() > 1;
    let mut nats_down = false;
    let mut restarts = Vec::new();
    let mut round = 0;
    let mut acked = Acked::new();
    let mut next = [0usize; SESSIONS];
    let mut kills = 0;
    let mut turn = 0;
    loop {
        round += 1;
        assert!(
            began.elapsed() < SEED_BUDGET,
            "the run ran out of time (seed {seed})"
        );
        if nats_down {
            nats[nats_victim].restart();
            nats_down = false;
            eprintln!("partitions chaos: NATS server n{nats_victim} started again");
        }
        let everything_sent = |next: &[usize; SESSIONS]| next.iter().all(|&n| n == MESSAGES);
        // The next kill, 8 to 15 s from now; once everything is sent, 1 to 3 s from now until
        // hosts were killed often enough, then none.
        let kill_after = if !everything_sent(&next) {
            Some(Duration::from_millis(8000 + random.below(7000)))
        } else if kills < MIN_KILLS {
            Some(Duration::from_millis(1000 + random.below(2000)))
        } else {
            None
        };
        let started = Instant::now();
        // Each round's sends go through another live host.
        turn += 1;
        let mut sender = None;
        'sending: loop {
            if kills_a_server
                && round == nats_round
                && !nats_down
                && kill_after.is_some_and(|after| started.elapsed() >= after / 2)
            {
                nats[nats_victim].kill();
                nats_down = true;
                eprintln!("partitions chaos: killed NATS server n{nats_victim}");
            }
            let pending: Vec<usize> = (0..SESSIONS).filter(|&s| next[s] < MESSAGES).collect();
            if pending.is_empty() {
                // Everything is sent: the hosts serve on (the cron job fires) until the kill.
                match kill_after {
                    Some(after) if started.elapsed() < after => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    _ => break,
                }
            }
            let (client, _) = match &mut sender {
                Some(sender) => sender,
                None => match client_of_live(&addresses, turn).await {
                    Some(connected) => {
                        eprintln!("partitions chaos: sending through {}", HOSTS[connected.1]);
                        sender.insert(connected)
                    }
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let session = pending[random.below(pending.len() as u64) as usize];
            let message = next[session];
            match workload::send_once(client, (session, message), true, seed).await {
                Sent::Acked(run_id) => {
                    acked.insert((session, message), run_id);
                    next[session] += 1;
                }
                Sent::Again => {}
                // The host it went through was killed: the send goes again, with its key,
                // through the next live host.
                Sent::Closed(closed) => {
                    eprintln!("partitions chaos: the sender's host went away ({closed})");
                    sender = None;
                    turn += 1;
                }
            }
            if kill_after.is_some_and(|after| started.elapsed() >= after) {
                break 'sending;
            }
            tokio::time::sleep(Duration::from_millis(random.below(SEND_PAUSE_MS))).await;
        }
        if kill_after.is_none() {
            break;
        }
        for (index, process) in lock(&processes).iter_mut().enumerate() {
            if let Some(process) = process
                && let Some(status) = process.exited()
            {
                panic!(
                    "{} stopped on its own ({status}) (seed {seed}):\n{}",
                    HOSTS[index],
                    process.output()
                );
            }
        }
        // A random host that runs; sometimes a send is on its way through it as it is killed
        // (sent again with its key later).
        let up: Vec<usize> = (0..HOSTS.len())
            .filter(|&index| lock(&processes)[index].is_some())
            .collect();
        if up.len() < 2 {
            // The others are still starting again: this round's kill is left out.
            continue;
        }
        let victim = up[random.below(up.len() as u64) as usize];
        if let Some((client, through)) = &mut sender
            && *through == victim
            && random.below(2) == 0
            && let Some(session) = (0..SESSIONS).find(|&s| next[s] < MESSAGES)
        {
            let _ = client
                .try_send_request("chat.send", send_params(session, next[session]))
                .await;
        }
        lock(&addresses)[victim] = None;
        let process = lock(&processes)[victim].take().unwrap();
        let said = tokio::task::spawn_blocking(move || process.kill())
            .await
            .unwrap();
        assert!(!said.contains("panicked"), "{said}");
        kills += 1;
        let down = if round == long_down_round {
            Duration::from_secs(10)
        } else {
            Duration::from_millis(1000 + random.below(2000))
        };
        eprintln!(
            "partitions chaos: killed {} (kill {kills}), back in {down:?}",
            HOSTS[victim]
        );
        restarts.push(start_later(
            gateway(victim),
            victim,
            down,
            &processes,
            &addresses,
        ));
    }
    for restart in restarts {
        restart.await.unwrap();
    }

    // The checks, through a host other than the one serving most: answers forwarded.
    let (mut client, through) = client_of_live(&addresses, turn + 1).await.unwrap();
    eprintln!("partitions chaos: checking through {}", HOSTS[through]);
    let statuses = workload::runs_ended(&mut client, &acked, seed).await;
    workload::keys_recognised(&mut client, &acked, seed).await;
    let followed = workload::followed_exactly(&mut client, &watched, seed).await;
    watching.abort();
    let cluster = cluster_of(&nats_url, replicas).await;
    let writers = workload::events_fenced(&cluster, seed).await;
    workload::histories_whole(&mut client, &statuses, seed).await;
    let firings = cron_fired_once(
        &mut client,
        clawcage(&hosts, through, workspace.path()),
        &nats_url,
        replicas,
        seed,
    )
    .await;
    watching_leases.abort();
    let leases = lock(&leases).clone();
    let mut moves = 0;
    for (name, seen) in &leases {
        assert!(
            seen.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "{name}: a lease revision went back: {seen:?} (seed {seed})"
        );
        moves += seen
            .windows(2)
            .filter(|pair| pair[0].0 != pair[1].0)
            .count();
    }
    assert!(
        moves >= kills,
        "{moves} partition moves for {kills} kills (seed {seed}): {leases:#?}"
    );
    eprintln!(
        "partitions chaos: {kills} kills, {} messages each taken once ({} of them in followup sessions, answered once in order; {} interrupted or dropped), {firings} cron firings, {followed} events followed across kills, {writers} writers' epochs in the sessions' events, {moves} partition moves, {} model requests",
        acked.len(),
        acked
            .keys()
            .filter(|(session, _)| mode_of(*session) == "followup")
            .count(),
        statuses.values().filter(|status| *status != "ok").count(),
        model.bodies().len()
    );
    let stopping: Vec<GatewayProcess> = lock(&processes)
        .iter_mut()
        .filter_map(Option::take)
        .collect();
    for process in stopping {
        let (status, output) = tokio::task::spawn_blocking(move || process.terminate())
            .await
            .unwrap();
        assert!(status.success(), "{output}");
    }
    true
}
