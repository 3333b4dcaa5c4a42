//! Any host of a cluster accepts any client: two `clawcage gateway` hosts on a real
//! `nats-server`, the second a standby that listens all the same. A client connected to the
//! standby is relayed to the active host: it sends, follows the session's events and waits for
//! its run there as it would on the active host, and a webhook posted to the standby is
//! forwarded whole (its replay to the active host refused). The standby holds its clients to
//! the same checks as the active host (a wrong token, a foreign origin, a connection relayed by
//! another standby are refused there), and its `/healthz` says it is a standby. When the active
//! host is killed while the relayed client's turn waits for the model, the relayed connection
//! stays open: its request in flight is answered `UNAVAILABLE`, a request sent meanwhile is
//! held until the standby serves, and the client's events go on from the last one it got, none
//! missed and none twice, until its turn resumes and ends once.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::time::Duration;

use clawcage_tests::channels::{get, post, signed_headers, unix_now};
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};

#[path = "cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "shared with the failover tests, which use all of it"
)]
mod host;
use host::{
    HOOK_SECRET, HOOK_SECRET_ENV, Host, TOKEN, answering_after, relayed_client, standby_started,
    stop_both,
};

/// The largest `seq` among `events`' `agent` and `chat` frames.
fn last_seq(events: &[Value], before: u64) -> u64 {
    events
        .iter()
        .filter_map(|event| event["seq"].as_u64())
        .fold(before, u64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_relays_its_clients_to_the_active_host_and_serves_them_once_it_takes_over() {
    let Some(nats) = NatsServer::start("a_standby_relays_its_clients") else {
        return;
    };
    // The model holds its first answer until the test opens the gate; after that it answers.
    let gate = ReplyGate::new();
    let model = answering_after(&gate).await;
    let hook = format!("[channels.webhooks.ops]\nsecret_env = \"{HOOK_SECRET_ENV}\"\n");
    let workspace = tempfile::tempdir().unwrap();
    let first = Host::with(&nats.url(), model.url(), "host-a", &hook);
    let second = Host::with(&nats.url(), model.url(), "host-b", &hook);
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let (standby, relay) = second.standby_relaying(workspace.path()).await;

    // Its health check says it is a standby, and who is active (once it has looked).
    let mut health = (0, String::new());
    for _ in 0..100 {
        health = get(&format!("http://{relay}/healthz")).await;
        if health.1.contains("host-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(health.0, 503, "{health:?}");
    assert!(
        health.1.contains("standby (host-b)") && health.1.contains("the active gateway is host-a"),
        "{health:?}"
    );
    // The web chat's page is served there too.
    assert_eq!(get(&format!("http://{relay}/")).await.0, 200);

    // The standby's own checks: a wrong token, a foreign origin, a connection another standby
    // relays.
    let refused = GatewayClient::try_connect(relay, "not-the-token-of-this-cluster").await;
    let refused = refused.err().expect("a wrong token is refused");
    assert!(refused.contains("wrong token"), "{refused}");
    let foreign = GatewayClient::open(relay, Some("https://evil.example")).await;
    assert!(foreign.is_err(), "a foreign origin is refused");
    let relayed = GatewayClient::open_with(relay, &[("x-clawcage-relayed-by", "host-z")]).await;
    let relayed = relayed
        .err()
        .expect("a relayed connection is refused by a standby");
    assert!(relayed.contains("503"), "{relayed}");

    // A client of the standby is served by the active host.
    let (mut client, hello) = GatewayClient::connect(relay, TOKEN).await;
    assert_eq!(hello["payload"]["type"], "hello-ok", "{hello}");
    let session = "agent:main:test:relayed";
    let subscribed = client
        .request("sessions.subscribe", json!({"sessionKey": session}))
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "through the standby", "idempotencyKey": "r1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run_id = sent["payload"]["runId"].as_str().unwrap().to_string();
    // The turn waits for the model on the active host; its start came through the relay.
    gate.reached(1).await;
    let mut seen = Vec::new();
    while let Some(event) = client.next_event(Duration::from_secs(2)).await {
        seen.push(event);
    }
    assert!(
        seen.iter()
            .any(|event| event["payload"]["runId"] == run_id.as_str()),
        "the run's events reach the relayed client: {seen:#?}"
    );
    let since = last_seq(&seen, 0);
    assert!(since > 0, "{seen:#?}");

    // A webhook posted to the standby is forwarded to the active host, which takes it once.
    let body = json!({"message": "deploy done", "id": "d-1"})
        .to_string()
        .into_bytes();
    let headers = signed_headers(HOOK_SECRET, unix_now(), &body);
    // One that another standby relays here is refused, not relayed again.
    let mut relayed = headers.clone();
    relayed.push(("x-clawcage-relayed-by".to_string(), "host-z".to_string()));
    let (status, text) = post(&format!("http://{relay}/hooks/ops"), &relayed, body.clone()).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("a standby too"), "{text}");
    let (status, text) = post(&format!("http://{relay}/hooks/ops"), &headers, body.clone()).await;
    assert_eq!(status, 202, "{text}");
    let (status, text) = post(&format!("http://{}/hooks/ops", active.addr), &headers, body).await;
    assert_eq!(
        status, 401,
        "the replay to the active host is refused: {text}"
    );

    // The active host dies while the relayed client's turn waits, and while the client waits
    // on the run: that request goes unanswered, and the client is told so.
    let waiting = client
        .send_request("agent.wait", json!({"runId": run_id, "timeoutMs": 60000}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let said = active.kill();
    assert!(!said.contains("panicked"), "{said}");
    let unanswered = client.response(&waiting).await;
    assert_eq!(unanswered["ok"], false, "{unanswered}");
    assert_eq!(unanswered["error"]["code"], "UNAVAILABLE", "{unanswered}");
    assert!(
        unanswered["error"]["message"]
            .as_str()
            .unwrap()
            .contains("went away before it answered agent.wait"),
        "{unanswered}"
    );
    // A request sent while no host serves is held until one does (this standby, taking over).
    let held = client
        .send_request("chat.history", json!({"sessionKey": session}))
        .await;
    let standby = tokio::time::timeout(Duration::from_secs(60), standby)
        .await
        .expect("the standby took over within 60 s")
        .unwrap()
        .expect("the standby serves");
    assert_eq!(standby.addr, relay, "it serves where it relayed");
    let history = client.response(&held).await;
    assert_eq!(history["ok"], true, "{history}");

    // The same connection goes on: the session's events after the last one it got, none
    // missed and none twice, until its turn ends.
    gate.reached(2).await;
    gate.open();
    let mut after = Vec::new();
    loop {
        let event = client
            .next_event(Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("the resumed turn did not end; saw {after:#?}"));
        if event["event"] != "agent" {
            continue;
        }
        let seq = event["seq"].as_u64().expect("an agent event is numbered");
        assert!(seq > last_seq(&after, since), "{seq} after {after:#?}");
        let payload = &event["payload"];
        let ended = payload["runId"] == run_id.as_str()
            && payload["stream"] == "lifecycle"
            && payload["data"]["phase"] == "end";
        after.push(event);
        if ended {
            break;
        }
    }
    assert_eq!(
        after[0]["seq"].as_u64(),
        Some(since + 1),
        "the first event after {since} comes first: {after:#?}"
    );
    assert!(
        after
            .iter()
            .any(|event| event["payload"]["data"]["phase"] == "resumed"),
        "the turn resumed on the host that took over: {after:#?}"
    );
    let waited = client
        .request("agent.wait", json!({"runId": run_id, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    assert_eq!(
        history.matches("Answered: through the standby").count(),
        1,
        "the turn ended once: {history}"
    );
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}

/// A standby holds the connections it relays to the same limits as the active host: one that
/// does not present the token in time is closed, an oversized frame closes its connection with
/// 1009 there, and the authenticated connections have their cap. (A relayed client that does
/// not read is cut off: `host/gateway/src/relay/tests.rs`, against an active gateway that
/// floods.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_holds_the_clients_it_relays_to_the_gateways_limits() {
    let Some(nats) = NatsServer::start("a_standby_holds_its_clients_to_limits") else {
        return;
    };
    let model = LlmServer::start_routed(|_| anthropic::message(&[anthropic::text("ok")])).await;
    let workspace = tempfile::tempdir().unwrap();
    let first = Host::new(&nats.url(), model.url(), "host-a");
    let second = Host::new(&nats.url(), model.url(), "host-b");
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let (standby, relay) = standby_started(second.command(
        workspace.path(),
        &[
            "gateway",
            "--bind",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--unauthenticated-timeout",
            "1",
            "--max-connections",
            "5",
            "--max-unauthenticated",
            "2",
        ],
    ))
    .await;

    // Silent after the challenge: closed by the standby within its timeout.
    let (mut silent, challenge) = GatewayClient::open(relay, None).await.unwrap();
    assert_eq!(challenge["event"], "connect.challenge", "{challenge}");
    let (_, closed) = silent.until_closed().await;
    assert_eq!(closed.code, 1008, "{closed:?}");
    assert!(closed.reason.contains("handshake timeout"), "{closed:?}");

    // An oversized frame from a relayed client: closed with 1009 by the standby.
    let mut huge = relayed_client(relay, TOKEN).await;
    let _ = huge.try_send_text("x".repeat(300 * 1024)).await;
    let (_, closed) = huge.until_closed().await;
    assert_eq!(closed.code, 1009, "{closed:?}");
    assert!(closed.reason.contains("too large"), "{closed:?}");

    // Three authenticated connections at most (five less two unauthenticated): the fourth is
    // told so, and is served once one of them closes.
    let first_client = relayed_client(relay, TOKEN).await;
    let _second = relayed_client(relay, TOKEN).await;
    let mut third = relayed_client(relay, TOKEN).await;
    let refused = GatewayClient::try_connect(relay, TOKEN)
        .await
        .err()
        .expect("the fourth authenticated connection is refused");
    assert!(refused.contains("too many connections"), "{refused}");
    first_client.close().await;
    let mut fourth = None;
    for _ in 0..50 {
        if let Ok((client, _)) = GatewayClient::try_connect(relay, TOKEN).await {
            fourth = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut fourth = fourth.expect("a place freed is taken");
    for client in [&mut third, &mut fourth] {
        let health = client.request("health", json!({})).await;
        assert_eq!(health["payload"]["ok"], true, "{health}");
    }

    stop_both(active, standby).await;
}

/// An approver connected to a standby hears the active host's approval requests through it and
/// answers them there: the first answer wins on the active host, and the command runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_connected_to_a_standby_answers_the_active_hosts_requests() {
    let Some(nats) = NatsServer::start("an_approver_connected_to_a_standby") else {
        return;
    };
    let model = host::removing_model().await;
    let approvals = "[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n";
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("build")).unwrap();
    let first = Host::with(&nats.url(), model.url(), "host-a", approvals);
    let second = Host::with(&nats.url(), model.url(), "host-b", approvals);
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let (standby, relay) = second.standby_relaying(workspace.path()).await;

    // The approver connects to the standby, with the approvals scope.
    let mut approver = None;
    for _ in 0..100 {
        let (mut client, _) = GatewayClient::open(relay, None).await.unwrap();
        let mut params = clawcage_tests::gateway_client::connect_params(TOKEN);
        params["scopes"] = json!(["operator.approvals"]);
        let hello = client.request("connect", params).await;
        if hello["ok"] == true {
            approver = Some(client);
            break;
        }
        // The standby has not seen the active host yet.
        assert_eq!(hello["error"]["code"], "UNAVAILABLE", "{hello}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut approver = approver.expect("the standby relays the approver");

    // A client of the active host asks for a command the allowlist does not cover.
    let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
    host::approve_a_removal(
        &mut approver,
        &mut client,
        "agent:main:test:approved",
        workspace.path(),
    )
    .await;
    stop_both(active, standby).await;
}
