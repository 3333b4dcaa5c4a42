//! The crash suite: a real `clawcage gateway` process is killed with SIGKILL at seeded random
//! moments while five sessions (one per queue mode: steer, followup, collect, interrupt, and
//! steer again with a small cap) take ten messages each. The model is a server on 127.0.0.1
//! that answers each message with an `exec` call appending the message's token to a file in the
//! workspace and sleeping (so kills land during tool calls), then with a text answer; its replies
//! are slow, some streamed slowly (kills land during model calls and streams). The gateway is
//! restarted after every kill and at the end left to finish. Then:
//! - every acknowledged send has exactly one terminal status, never `interrupted`, and its text
//!   is in the committed transcript exactly once unless the queue dropped it (an event says so);
//! - no tool effect appears twice, and "may have partly run" results are at most the kills;
//! - every session's event `seq` runs 1..N without a hole or a repeat, and a client that
//!   resubscribed with `since` after each restart received exactly that log;
//! - a resend with the same idempotency key returns the same run id;
//! - stops asked just before a kill (`chat.abort`) hold across the restart (the run ends
//!   `aborted`, its message kept);
//! - a cron job firing every second into a sixth session through all of it: each firing (its
//!   job and due time) entered the session's inbox once and became exactly one committed turn.
//!
//! The seed changes per run and is printed; `CLAWCAGE_CRASH_SEED=N` replays one.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, text_of};
use clawcage_tests::seeded::Seeded as Rng;
use serde_json::{Value, json};

const TOKEN: &str = "crash-suite-token-0123456789";
const SESSIONS: [&str; 5] = [
    "agent:main:steer:a",
    "agent:main:followup:b",
    "agent:main:collect:c",
    "agent:main:interrupt:d",
    "agent:main:capped:e",
];
const MESSAGES: usize = 10;
const CRON_SESSION: &str = "agent:main:cron:z";
/// A small window, so histories are compacted during the run (and kills land in compactions).
const WINDOW: u64 = 8192;
const THRESHOLD: f64 = 0.3;
const KILLS: usize = 12;
/// How long the whole suite may take before it fails.
const BUDGET: Duration = Duration::from_secs(240);

/// The tokens (`s<session>m<message>`) a text carries.
fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| {
            let Some(rest) = word.strip_prefix('s') else {
                return false;
            };
            let mut parts = rest.splitn(2, 'm');
            matches!((parts.next(), parts.next()), (Some(a), Some(b))
                if !a.is_empty() && !b.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
        .collect()
}

/// The model: a new message (text in the last user message) gets an `exec` call writing its
/// tokens, a message of tool results alone gets the answer; every reply is late, some stream
/// slowly.
fn model(seed: u64) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let state = Mutex::new((Rng::new(seed ^ 0xABCD), 0u64));
    move |body: &Value| {
        let mut state = state.lock().unwrap();
        let (rng, calls) = &mut *state;
        *calls += 1;
        let last = body["messages"]
            .as_array()
            .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
            .cloned()
            .unwrap_or_default();
        let words = tokens(&text_of(&last));
        let summarising = body["system"]
            .to_string()
            .contains("You condense conversations");
        let block = if summarising {
            // A compaction's summary request.
            anthropic::text("Summary: tasks were noted in effects.log.")
        } else if words.is_empty() {
            anthropic::text("done.")
        } else {
            let command = format!("echo {} >> effects.log && sleep 0.3", words.join(" "));
            anthropic::tool(
                &format!("toolu_{calls}"),
                "exec",
                json!({"command": command}),
            )
        };
        let delay = Duration::from_millis(50 + rng.below(350));
        let reply = if rng.below(2) == 0 {
            match anthropic::stream(&[block], 24) {
                Reply::Sse { text, chunk } => Reply::SlowSse {
                    text,
                    chunk,
                    pause: Duration::from_millis(15),
                },
                other => other,
            }
        } else {
            anthropic::message(&[block])
        };
        Reply::Delayed(delay, Box::new(reply))
    }
}

struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(llm: &str) -> Setup {
        clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
        let cache = clawcage_tests::cli_state::shared_state_dir().join("cache");
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::os::unix::fs::symlink(&cache, state.join("cache")).unwrap();
        let config = root.path().join("clawcage.toml");
        std::fs::write(
            &config,
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n\
                 [subagents]\nenabled = false\n\n\
                 [queue]\nmode = \"steer\"\ndebounce_ms = 300\ncap = 4\ndrop = \"old\"\n\n\
                 [queue.by_channel]\nfollowup = \"followup\"\ncollect = \"collect\"\ninterrupt = \"interrupt\"\n\n\
                 [models.\"claude-test\"]\ncontext_window = {WINDOW}\n\n\
                 [context]\ncompact_threshold = {THRESHOLD}\n"
            ),
        )
        .unwrap();
        Setup {
            _root: root,
            state,
            workspace,
            config,
        }
    }

    /// `clawcage cron add …` on this state directory.
    fn add_cron_job(&self) {
        let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--workspace")
            .arg(&self.workspace)
            .args(["cron", "add", "--every", "1", "--name", "tick"])
            .args(["--message", "tick", "--session", CRON_SESSION])
            .env("ANTHROPIC_API_KEY", "sk-crash-test")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
    }

    fn start(&self) -> GatewayProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--workspace")
            .arg(&self.workspace)
            .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
            .args(["--sends-per-minute", "10000"])
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-crash-test");
        GatewayProcess::start(command)
    }
}

/// A send the gateway acknowledged.
#[derive(Debug, Clone)]
struct Acked {
    session: usize,
    text: String,
    key: String,
    run_id: String,
}

fn message_text(session: usize, message: usize) -> String {
    format!("task s{session}m{message}: note it")
}

fn params(session: usize, message: usize) -> Value {
    json!({
        "sessionKey": SESSIONS[session],
        "message": message_text(session, message),
        "idempotencyKey": format!("k-{session}-{message}"),
    })
}

/// Everything each session's follower received, across restarts.
type Received = Arc<Mutex<Vec<Vec<u64>>>>;

/// Follows every session's events on one connection from where it left off, until the socket
/// closes (the gateway was killed).
async fn follow(addr: SocketAddr, received: Received) {
    let Ok((mut client, _)) = GatewayClient::open(addr, None).await else {
        return;
    };
    let hello = client
        .request(
            "connect",
            clawcage_tests::gateway_client::connect_params(TOKEN),
        )
        .await;
    if hello["ok"] != true {
        return;
    }
    for (index, session) in SESSIONS.iter().enumerate() {
        let since = received.lock().unwrap()[index].last().copied().unwrap_or(0);
        let id = client
            .send_request(
                "sessions.subscribe",
                json!({"sessionKey": session, "since": since}),
            )
            .await;
        let _ = client.response(&id).await;
    }
    while let Some(event) = client.next_event(Duration::from_secs(600)).await {
        if event["event"] != "agent" {
            continue;
        }
        let payload = &event["payload"];
        let Some(index) = SESSIONS.iter().position(|s| payload["sessionKey"] == *s) else {
            continue;
        };
        received.lock().unwrap()[index].push(payload["seq"].as_u64().unwrap_or(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_and_doubles_nothing() {
    let seed = std::env::var("CLAWCAGE_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos() as u64)
        });
    eprintln!("crash suite seed: {seed} (replay with CLAWCAGE_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let server = LlmServer::start_routed(model(seed)).await;
    let setup = Setup::new(server.url());
    setup.add_cron_job();
    // The budget starts once the components are compiled (Setup::new warms them).
    let began = Instant::now();
    let received: Received = Arc::new(Mutex::new(vec![Vec::new(); SESSIONS.len()]));

    let mut next = [0usize; SESSIONS.len()];
    let mut acked: Vec<Acked> = Vec::new();
    let mut kills = 0;
    while kills < KILLS || next.iter().any(|&n| n < MESSAGES) {
        assert!(
            began.elapsed() < BUDGET,
            "the suite ran out of time (seed {seed})"
        );
        let gateway = setup.start();
        let follower = tokio::spawn(follow(gateway.addr, received.clone()));
        let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
        // A resend of an acknowledged message is recognised by its key, across restarts.
        if !acked.is_empty() {
            let earlier = acked[rng.below(acked.len() as u64) as usize].clone();
            let message = earlier.key.rsplit('-').next().unwrap().parse().unwrap();
            let again = client
                .request("chat.send", params(earlier.session, message))
                .await;
            assert_eq!(
                again["payload"]["runId"],
                earlier.run_id.as_str(),
                "{again}"
            );
            assert_eq!(again["payload"]["duplicate"], true, "{again}");
        }
        // A few messages, to random sessions, each in its session's order; after the last
        // kill, all the rest.
        let batch = if kills < KILLS {
            1 + rng.below(4)
        } else {
            (SESSIONS.len() * MESSAGES) as u64
        };
        for _ in 0..batch {
            let open: Vec<usize> = (0..SESSIONS.len())
                .filter(|&s| next[s] < MESSAGES)
                .collect();
            if open.is_empty() {
                break;
            }
            let session = open[rng.below(open.len() as u64) as usize];
            let message = next[session];
            let answer = client.request("chat.send", params(session, message)).await;
            next[session] += 1;
            if answer["ok"] != true {
                // Refused at once (a full queue with drop = new): never acknowledged.
                assert_eq!(answer["error"]["code"], "QUEUE_FULL", "{answer}");
                continue;
            }
            acked.push(Acked {
                session,
                text: message_text(session, message),
                key: format!("k-{session}-{message}"),
                run_id: answer["payload"]["runId"].as_str().unwrap().to_string(),
            });
            tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
        }
        if kills < KILLS {
            tokio::time::sleep(Duration::from_millis(100 + rng.below(1400))).await;
            // Sometimes a stop is asked for a session's running (or next) run just before the
            // kill: a restart keeps it.
            if rng.below(4) == 0 {
                let session = rng.below(SESSIONS.len() as u64) as usize;
                let _ = client
                    .request("chat.abort", json!({"sessionKey": SESSIONS[session]}))
                    .await;
            }
            // Sometimes a send is on its way when the kill lands: it is resent with its key.
            if rng.below(3) == 0 {
                let open: Vec<usize> = (0..SESSIONS.len())
                    .filter(|&s| next[s] < MESSAGES)
                    .collect();
                if let Some(&session) = open.first() {
                    let _ = client
                        .send_request("chat.send", params(session, next[session]))
                        .await;
                }
            }
            gateway.kill();
            kills += 1;
            let _ = tokio::time::timeout(Duration::from_secs(5), follower).await;
        } else {
            drop(client);
            // The last start: let everything finish.
            finish(&setup, gateway, follower, &acked, &received, kills, seed).await;
            return;
        }
    }
}

async fn finish(
    setup: &Setup,
    gateway: GatewayProcess,
    follower: tokio::task::JoinHandle<()>,
    acked: &[Acked],
    received: &Received,
    kills: usize,
    seed: u64,
) {
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    // Sends that were on their way at a kill and never acknowledged are sent again with their
    // key; the ones the gateway had recorded come back as duplicates.
    let mut statuses: HashMap<String, Value> = HashMap::new();
    for run in acked {
        let waited = client
            .request(
                "agent.wait",
                json!({"runId": run.run_id, "timeoutMs": 60_000}),
            )
            .await;
        let status = waited["payload"]["status"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        assert!(
            // `aborted`: stopped by a newer message in `interrupt` mode.
            matches!(status.as_str(), "ok" | "dropped" | "error" | "aborted"),
            "run {} of {:?} ended {status} (seed {seed}): {waited}",
            run.run_id,
            run.text
        );
        statuses.insert(run.run_id.clone(), waited["payload"].clone());
    }
    // Quiet: nothing runs any more.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut dropped_events = 0;
    for (index, session) in SESSIONS.iter().enumerate() {
        let transcript = std::fs::read_to_string(setup.state.join("sessions").join(format!(
            "{}.jsonl",
            clawcage_agent::transcript::key_file_stem(session)
        )))
        .unwrap_or_default();
        let committed = committed_user_texts(&transcript);
        // The whole event log, from the start.
        let subscribed = client
            .request(
                "sessions.subscribe",
                json!({"sessionKey": session, "since": 0}),
            )
            .await;
        let last = subscribed["payload"]["lastSeq"].as_u64().unwrap();
        let mut log = Vec::new();
        if last > 0 {
            log = client
                .agent_events_until(Duration::from_secs(30), |e| {
                    e["sessionKey"] == *session && e["seq"] == last
                })
                .await
                .into_iter()
                .filter(|e| e["sessionKey"] == *session)
                .collect();
        }
        let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=last).collect::<Vec<_>>(),
            "{session}: the event log has a hole or a repeat (seed {seed})"
        );
        // What the follower received across restarts is exactly that log.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = received.lock().unwrap()[index].clone();
        assert_eq!(
            got, seqs,
            "{session}: the follower got something else than the log (seed {seed})"
        );
        for run in acked.iter().filter(|run| run.session == index) {
            let status = statuses[&run.run_id]["status"].as_str().unwrap_or_default();
            let times = committed
                .iter()
                .filter(|text| text.contains(&run.text))
                .count();
            if status == "dropped" {
                assert_eq!(
                    times, 0,
                    "{:?} was dropped yet is in the transcript",
                    run.text
                );
                let said = log.iter().any(|e| {
                    e["runId"] == run.run_id.as_str()
                        && (e["data"]["status"] == "dropped" || e["data"]["phase"] == "error")
                });
                assert!(
                    said,
                    "{:?} was dropped without an event saying so",
                    run.text
                );
                dropped_events += 1;
            } else {
                assert_eq!(
                    times, 1,
                    "{:?} ({status}) is in the committed transcript {times} times (seed {seed})\n{transcript}",
                    run.text
                );
            }
        }
    }
    // The cron job: every firing went into the inbox once and became one committed turn.
    let cron_inbox = std::fs::read_to_string(setup.state.join("inbox").join(format!(
        "{}.jsonl",
        clawcage_agent::transcript::key_file_stem(CRON_SESSION)
    )))
    .unwrap_or_default();
    let mut firings: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut done = std::collections::HashSet::new();
    for line in cron_inbox.lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let key = record["idempotency"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let id = record["id"].as_str().unwrap_or_default().to_string();
        match record["op"].as_str() {
            Some("in") if key.starts_with("cron:") => {
                *firings.entry(key.clone()).or_default() += 1;
                ids.insert(id, key);
            }
            Some("finished") if key.starts_with("cron:") => {
                *firings.entry(key.clone()).or_default() += 1;
                done.insert(key);
            }
            Some("done") => {
                for id in record["ids"].as_array().into_iter().flatten() {
                    if let Some(key) = ids.get(id.as_str().unwrap_or_default()) {
                        done.insert(key.clone());
                    }
                }
            }
            _ => {}
        }
    }
    let twice: Vec<_> = firings.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "cron firings recorded twice: {twice:?} (seed {seed})"
    );
    let cron_transcript = std::fs::read_to_string(setup.state.join("sessions").join(format!(
        "{}.jsonl",
        clawcage_agent::transcript::key_file_stem(CRON_SESSION)
    )))
    .unwrap_or_default();
    let cron_turns = committed_user_texts(&cron_transcript)
        .iter()
        .filter(|text| text.contains("[cron job tick]"))
        .count();
    assert!(
        firings.len() >= 5,
        "the job fired only {} times",
        firings.len()
    );
    // The job goes on firing: the newest firings may still be on their way.
    assert!(
        done.len() <= cron_turns && cron_turns <= firings.len(),
        "each firing is one committed turn: {} done, {cron_turns} turns, {} firings (seed {seed})",
        done.len(),
        firings.len()
    );

    let effects = std::fs::read_to_string(setup.workspace.join("effects.log")).unwrap_or_default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for token in effects.split_whitespace() {
        *seen.entry(token.to_string()).or_default() += 1;
    }
    let doubled: Vec<_> = seen.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(
        doubled.is_empty(),
        "tool effects ran twice: {doubled:?} (seed {seed})"
    );
    let transcripts: Vec<String> = std::fs::read_dir(setup.state.join("sessions"))
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default())
        .collect();
    let partly = transcripts
        .iter()
        .map(|text| text.matches("it may have partly run").count())
        .sum::<usize>();
    let compactions = transcripts
        .iter()
        .map(|text| text.matches("\"kind\":\"compaction\"").count())
        .sum::<usize>();
    assert!(
        partly <= kills,
        "{partly} 'may have partly run' results for {kills} kills (seed {seed})"
    );
    let aborted = statuses
        .values()
        .filter(|payload| payload["status"] == "aborted")
        .count();
    eprintln!(
        "crash suite: {kills} kills, {} acknowledged sends, {dropped_events} dropped by their queue, {aborted} stopped, {} effects, {partly} calls that may have partly run, {compactions} compactions, {} cron firings",
        acked.len(),
        seen.len(),
        firings.len()
    );
    drop(client);
    gateway.kill();
    let _ = follower.await;
}

/// The texts of the user messages of committed turns (an open turn's lines are left out).
fn committed_user_texts(transcript: &str) -> Vec<String> {
    let mut committed = Vec::new();
    let mut pending = Vec::new();
    for line in transcript.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match entry["kind"].as_str() {
            Some("start") => pending.clear(),
            Some("message") if entry["message"]["role"] == "user" => {
                pending.push(text_of(&entry["message"]));
            }
            Some("turn") => committed.append(&mut pending),
            _ => {}
        }
    }
    committed
}
