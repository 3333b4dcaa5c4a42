//! The chaos suites' workload and its exact checks, the same whichever way the hosts serve
//! (one active host and standbys, or every host serving partitions): twenty sessions over the
//! four queue modes receiving ten messages each under idempotency keys, one session followed by
//! a client throughout, a cron job firing into another; then every acknowledged run waited for,
//! every message sent once more to see its key recognised, the followed events compared with
//! the stored log, every session's stored events checked for holes, repeats and epochs going
//! back, and every session's history read for messages lost, doubled or out of order.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user, text_of};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};

pub(super) const SESSIONS: usize = 20;
pub(super) const MESSAGES: usize = 10;
/// The session a client follows across every kill.
pub(super) const WATCHED: &str = "agent:main:chaos:s0";
/// The session the cron job fires into.
pub(super) const CRON_SESSION: &str = "agent:main:chaos:cron";
/// How a firing of the cron job reaches the model, as JSON writes it.
pub(super) const FIRING: &str =
    "[notification on the `system` channel from cron:job-1]\\n[cron job ticker] tick";

/// The queue modes by channel, as a host's configuration sets them.
pub(super) const QUEUE_CONFIG: &str = "[queue]\nmode = \"followup\"\n\n\
     [queue.by_channel]\nsteer = \"steer\"\ncollect = \"collect\"\ninterrupt = \"interrupt\"\n";

/// What was acknowledged: (session, message) -> the run id it was acknowledged with.
pub(super) type Acked = BTreeMap<(usize, usize), String>;

/// The queue mode of session `session` (its key's channel picks it): half the sessions
/// `followup` (each message a turn of its own, checked in order), the rest `steer`, `collect`
/// and `interrupt`.
pub(super) fn mode_of(session: usize) -> &'static str {
    match session * 4 / SESSIONS {
        0 | 1 => "followup",
        2 => "steer",
        _ if session.is_multiple_of(2) => "collect",
        _ => "interrupt",
    }
}

/// Session `session`'s key: its channel names its queue mode (`chaos` for `followup`).
pub(super) fn session_key(session: usize) -> String {
    match mode_of(session) {
        "followup" => format!("agent:main:chaos:s{session}"),
        mode => format!("agent:main:{mode}:s{session}"),
    }
}

/// How often `text` (`s<session> m<message>`) stands in `within` as a whole, not as part of a
/// longer one (`s1 m2` is not in `s11 m2`).
fn occurrences(within: &str, text: &str) -> usize {
    let words: Vec<&str> = within
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    let wanted: Vec<&str> = text.split(' ').collect();
    words
        .windows(wanted.len())
        .filter(|window| *window == wanted.as_slice())
        .count()
}

pub(super) fn text(session: usize, message: usize) -> String {
    format!("s{session} m{message}")
}

/// The parameters of `chat.send` for message `message` of session `session`, with its
/// idempotency key (the same key each time that message is sent).
pub(super) fn send_params(session: usize, message: usize) -> Value {
    json!({
        "sessionKey": session_key(session),
        "message": text(session, message),
        "idempotencyKey": format!("k-{session}-{message}"),
    })
}

/// The NATS servers of one run of `test`: three, formed and taking replicated writes (one is
/// killed once), or one under `CLAWCAGE_CHAOS_ONE_SERVER=1` (a quicker run while working on the
/// hosts; nothing killed but hosts); with the URL naming them all. `None` where no server starts
/// (outside CI).
pub(super) async fn nats_servers(test: &str, seed: u64) -> Option<(Vec<NatsServer>, String)> {
    let servers = if std::env::var_os("CLAWCAGE_CHAOS_ONE_SERVER").is_none() {
        NatsServer::start_cluster(test)?
    } else {
        vec![NatsServer::start(test)?]
    };
    let url = NatsServer::urls(&servers);
    super::observe::cluster_ready(&url, servers.len(), seed).await;
    Some((servers, url))
}

/// The suites' model: "Answered: <the message>" after 50 to 400 ms (by the message's length), so
/// that kills land during model calls as well as between them.
pub(super) async fn answering_model() -> LlmServer {
    LlmServer::start_routed(move |body| {
        let (text, _) = last_user(body);
        let wait = 50 + (text.len() as u64 * 37) % 350;
        Reply::Delayed(
            Duration::from_millis(wait),
            Box::new(anthropic::message(&[anthropic::text(&format!(
                "Answered: {text}"
            ))])),
        )
    })
    .await
}

/// Adds the cron job firing every 2 s into [`CRON_SESSION`] with `clawcage` (one host's
/// configuration: the job is the cluster's).
pub(super) fn add_cron_job(mut clawcage: std::process::Command) {
    let added = clawcage
        .args([
            "cron",
            "add",
            "--every",
            "2",
            "--message",
            "tick",
            "--name",
            "ticker",
        ])
        .args(["--session", CRON_SESSION])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
}

/// What became of one send.
pub(super) enum Sent {
    /// Acknowledged, under this run id.
    Acked(String),
    /// To be sent again later with its key.
    Again,
    /// The connection closed, or the host behind it went away before it answered: why.
    Closed(String),
}

/// Sends message `message` of session `session` through `client` and waits up to 30 s for the
/// answer. A full queue, and an error the gateway calls retryable (a store that could not
/// answer in time while a NATS server's streams elect new leaders), are sent again with the
/// key; with `moving_passes`, so is `UNAVAILABLE` (the session moving between hosts serving
/// partitions), while without it an answer that the host behind the connection went away
/// counts as the connection's end (a standby carrying it over to the next active host). Any
/// other error fails the test.
pub(super) async fn send_once(
    client: &mut GatewayClient,
    (session, message): (usize, usize),
    moving_passes: bool,
    seed: u64,
) -> Sent {
    let answered = match client
        .try_send_request("chat.send", send_params(session, message))
        .await
    {
        Ok(id) => tokio::time::timeout(Duration::from_secs(30), client.try_response(&id)).await,
        Err(closed) => Ok(Err(closed)),
    };
    let response = match answered {
        Ok(Ok(response)) => response,
        Ok(Err(closed)) => return Sent::Closed(closed),
        Err(_) => panic!("no answer to a send within 30 s (seed {seed})"),
    };
    if response["ok"] == true {
        return Sent::Acked(response["payload"]["runId"].as_str().unwrap().to_string());
    }
    let error = &response["error"];
    if error["code"] == "RATE_LIMITED" {
        return Sent::Again;
    }
    let went_away = error["message"]
        .as_str()
        .is_some_and(|text| text.contains("went away before it answered"));
    if went_away && !moving_passes {
        return Sent::Closed(response.to_string());
    }
    if error["retryable"] == true || (moving_passes && error["code"] == "UNAVAILABLE") {
        eprintln!("chaos: a send is sent again: {response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        return Sent::Again;
    }
    panic!("a send failed: {response} (seed {seed})");
}

/// Every acknowledged run waited for through `client`: each ends `ok` (in `interrupt` mode a
/// newer message stops the run it finds, `aborted`, or replaces one still waiting, `dropped`).
/// The status of each.
pub(super) async fn runs_ended(
    client: &mut GatewayClient,
    acked: &Acked,
    seed: u64,
) -> BTreeMap<(usize, usize), String> {
    assert_eq!(
        acked.len(),
        SESSIONS * MESSAGES,
        "every message was acknowledged (seed {seed})"
    );
    let mut statuses = BTreeMap::new();
    for ((session, message), run_id) in acked {
        let waited = client
            .request("agent.wait", json!({"runId": run_id, "timeoutMs": 120000}))
            .await;
        let status = waited["payload"]["status"].as_str().unwrap_or("?");
        let allowed: &[&str] = if mode_of(*session) == "interrupt" {
            &["ok", "aborted", "dropped"]
        } else {
            &["ok"]
        };
        if !allowed.contains(&status) {
            // What the session's log says of the run, for the failure's message.
            let key = session_key(*session);
            let subscribed = client
                .request("sessions.subscribe", json!({"sessionKey": key, "since": 0}))
                .await;
            let last = subscribed["payload"]["lastSeq"].as_u64().unwrap_or(0);
            let told: Vec<Value> = client
                .agent_events_until(Duration::from_secs(10), |e| {
                    e["sessionKey"] == key.as_str() && e["seq"] == last
                })
                .await
                .into_iter()
                .filter(|e| e["sessionKey"] == key.as_str())
                .collect();
            panic!(
                "s{session} m{message} ({} mode): {waited} (seed {seed}); the session's events: {told:#?}",
                mode_of(*session)
            );
        }
        statuses.insert((*session, *message), status.to_string());
    }
    statuses
}

/// Every message sent once more with its key through `client`: recognised as the run it was
/// acknowledged as (`duplicate`), not taken again.
pub(super) async fn keys_recognised(client: &mut GatewayClient, acked: &Acked, seed: u64) {
    for ((session, message), run_id) in acked {
        let again = client
            .request("chat.send", send_params(*session, *message))
            .await;
        assert_eq!(
            (&again["payload"]["runId"], &again["payload"]["duplicate"]),
            (&json!(run_id), &json!(true)),
            "s{session} m{message} sent again with its key: {again} (seed {seed})"
        );
    }
}

/// The client that followed [`WATCHED`] (its events in `watched`) saw exactly the session's
/// stored log: each event once, in order, none missed, the ends of the turns that resumed on
/// another host included. How many events it followed.
pub(super) async fn followed_exactly(
    client: &mut GatewayClient,
    watched: &Mutex<Vec<Value>>,
    seed: u64,
) -> usize {
    let subscribed = client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": WATCHED, "since": 0}),
        )
        .await;
    let last = subscribed["payload"]["lastSeq"]
        .as_u64()
        .unwrap_or_else(|| panic!("{subscribed}"));
    let log: Vec<Value> = client
        .agent_events_until(Duration::from_secs(60), |e| {
            e["sessionKey"] == WATCHED && e["seq"] == last
        })
        .await
        .into_iter()
        .filter(|e| e["sessionKey"] == WATCHED)
        .collect();
    let seen_last = || lock(watched).last().and_then(|event| event["seq"].as_u64());
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen_last() < Some(last) {
        assert!(
            Instant::now() < deadline,
            "the watching client stopped at {:?} of {last} (seed {seed})",
            seen_last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let brief = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{} {} {} {}", e["seq"], e["runId"], e["stream"], e["data"]))
            .collect()
    };
    let seen = lock(watched).clone();
    assert_eq!(
        brief(&seen),
        brief(&log),
        "the watching client saw its session's log exactly (seed {seed})"
    );
    let ended = log
        .iter()
        .filter(|e| e["stream"] == "lifecycle" && e["data"]["phase"] == "end")
        .count();
    assert!(ended >= MESSAGES, "{ended} turn ends seen (seed {seed})");
    seen.len()
}

/// Every session's stored events, read from the event stream itself: their `seq`s run 1, 2, …
/// without a hole or a repeat, and their writers' epochs never go back (a host that lost a
/// session wrote nothing after its next owner). How many epochs wrote, across the sessions.
pub(super) async fn events_fenced(cluster: &clawcage_cluster::Cluster, seed: u64) -> usize {
    let mut writers = 0;
    for key in (0..SESSIONS)
        .map(session_key)
        .chain([CRON_SESSION.to_string()])
    {
        let stored = cluster.event_writers(&key).await.unwrap();
        assert!(
            !stored.is_empty(),
            "{key} has no stored events (seed {seed})"
        );
        let seqs: Vec<u64> = stored.iter().map(|(seq, _)| *seq).collect();
        let expected: Vec<u64> = (1..=stored.len() as u64).collect();
        assert_eq!(
            seqs, expected,
            "{key}: its stored events' seqs (seed {seed})"
        );
        let epochs: Vec<u64> = stored.iter().map(|(_, epoch)| *epoch).collect();
        assert!(
            epochs.windows(2).all(|pair| pair[0] <= pair[1]),
            "{key}: an epoch went back along its events: {epochs:?} (seed {seed})"
        );
        writers += epochs.iter().collect::<BTreeSet<_>>().len();
    }
    writers
}

/// Every session's history, read through `client`: in the `followup` sessions every message
/// answered exactly once, in the order sent; in the others every message in the history once
/// (none lost, none taken twice) unless the queue dropped it (`statuses`), and no answer given
/// twice (no turn ran twice).
pub(super) async fn histories_whole(
    client: &mut GatewayClient,
    statuses: &BTreeMap<(usize, usize), String>,
    seed: u64,
) {
    for session in 0..SESSIONS {
        let history = client
            .request(
                "chat.history",
                json!({"sessionKey": session_key(session), "limit": 1000}),
            )
            .await;
        let messages = history["payload"]["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{history}"));
        let answers: Vec<String> = messages
            .iter()
            .filter(|message| message["role"] == "assistant")
            .map(text_of)
            .filter(|text| text.starts_with("Answered: "))
            .collect();
        if mode_of(session) == "followup" {
            let expected: Vec<String> = (0..MESSAGES)
                .map(|message| format!("Answered: {}", text(session, message)))
                .collect();
            assert_eq!(
                answers, expected,
                "session {session}: each message answered once, in order (seed {seed})"
            );
            continue;
        }
        // Each text block apart (a message interrupted before its answer and the next one are
        // one user message of two blocks).
        let asked: String = messages
            .iter()
            .filter(|message| message["role"] == "user")
            .flat_map(|message| match &message["content"] {
                Value::Array(blocks) => blocks
                    .iter()
                    .filter_map(|block| block["text"].as_str().map(str::to_string))
                    .collect(),
                other => vec![other.as_str().unwrap_or_default().to_string()],
            })
            .collect::<Vec<String>>()
            .join("\n");
        for message in 0..MESSAGES {
            let dropped = statuses[&(session, message)] == "dropped";
            let times = occurrences(&asked, &text(session, message));
            assert!(
                times == 1 || (dropped && times == 0),
                "s{session} m{message} ({} mode) is in the history {times} times (seed {seed}): {asked:?}",
                mode_of(session)
            );
        }
        let distinct: BTreeSet<&String> = answers.iter().collect();
        assert_eq!(
            distinct.len(),
            answers.len(),
            "s{session} ({} mode): an answer given twice (seed {seed}): {answers:?}",
            mode_of(session)
        );
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Events a following client saw, shared with the task that follows.
pub(super) type Seen = Arc<Mutex<Vec<Value>>>;
