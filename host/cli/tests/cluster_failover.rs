//! Two `clawcage gateway` hosts in one cluster (a real `nats-server`, each host with its own
//! state directory, the same workspace): the first serves, the second waits as a standby and
//! says who is active. The active host is killed with SIGKILL while a turn waits for the model;
//! the standby takes the lease over within the lease's time to live, takes the session up from
//! the stream, asks the model again for the step that had not finished, and ends the turn once:
//! a client of the new host finds the answer exactly once in the history, `agent.wait` on the
//! run's id answers there, and a resent idempotency key is a duplicate of that run. `clawcage
//! cluster status` then names the new holder of the gateway lease. An active host whose NATS
//! server stalls stops writing before its lease can lapse, and stops serving.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::process::Command;
use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic, last_user};
use clawcage_tests::nats::NatsServer;
use serde_json::json;

#[path = "cluster_failover/host.rs"]
#[allow(dead_code, reason = "shared with the relay tests, which use the rest")]
mod host;
use host::{HOOK_SECRET, HOOK_SECRET_ENV, Host, TOKEN, answering_after, fail_over, standby_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_a_killed_active_gateway_and_ends_its_turn_once() {
    let Some(nats) = NatsServer::start("the_standby_takes_over") else {
        return;
    };
    // The model holds its first answer until the test opens the gate; after that it answers.
    let gate = ReplyGate::new();
    let model = answering_after(&gate).await;
    let workspace = tempfile::tempdir().unwrap();
    let first = Host::new(&nats.url(), model.url(), "host-a");
    let second = Host::new(&nats.url(), model.url(), "host-b");

    let active = GatewayProcess::start(first.gateway(workspace.path()));
    assert!(
        active
            .output()
            .contains("cluster: this host (host-a) is the active gateway"),
        "{}",
        active.output()
    );
    // The standby waits (it prints its address only when it serves).
    let standby = standby_of(&second, workspace.path());

    let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
    let session = "agent:main:test:failover";
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "hello cluster", "idempotencyKey": "k1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run_id = sent["payload"]["runId"].as_str().unwrap().to_string();
    // The turn is waiting for the model when the active host dies.
    gate.reached(1).await;
    let killed_at = Instant::now();
    let standby = fail_over(active, standby).await;
    let took_over = killed_at.elapsed();
    let output = standby.output();
    assert!(
        output.contains("standby in the cluster; the active gateway is host-a"),
        "{output}"
    );
    assert!(
        output.contains("cluster: this host (host-b) is the active gateway"),
        "{output}"
    );
    // The turn resumes on the new host: the model is asked again; let it answer now.
    gate.reached(2).await;
    gate.open();
    let (mut client, _) = GatewayClient::connect(standby.addr, TOKEN).await;
    // The idempotency key is remembered across hosts: a resend is that run.
    host::ended_once(
        &mut client,
        &run_id,
        session,
        ("hello cluster", "k1", "Answered: hello cluster"),
    )
    .await;

    // The cluster's status names the new holder.
    let status = tokio::task::spawn_blocking({
        let mut command = second.command(workspace.path(), &["cluster", "status", "--json"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let gateway_lease = status["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lease| lease[0] == "gateway")
        .cloned()
        .expect("the gateway lease is held");
    assert_eq!(gateway_lease[1]["host"], "host-b", "{status}");
    eprintln!("failover: the standby served {took_over:?} after the kill (lease 2 s)");
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}

/// An active host whose NATS server stalls (every request, its lease renewal too, waits
/// without an answer) stops writing before its lease can lapse and another host take over:
/// its renewal is given up when the lease stops being fresh (70% of the 2 s time to live after
/// the last renewal was sent), not when the request times out (10 s), and it then stops
/// serving, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_host_whose_server_stalls_stops_before_its_lease_can_lapse() {
    let Some(nats) = NatsServer::start("an_active_host_whose_server_stalls") else {
        return;
    };
    let model = LlmServer::start_routed(|_| anthropic::message(&[anthropic::text("hello")])).await;
    let workspace = tempfile::tempdir().unwrap();
    let host = Host::new(&nats.url(), model.url(), "host-a");
    let command = host.gateway(workspace.path());
    let mut active = tokio::task::spawn_blocking(move || GatewayProcess::start(command))
        .await
        .unwrap();
    // A few renewals go through first.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    nats.pause();
    let stalled = Instant::now();
    let stopped_writing = loop {
        if active.output().contains("could not be renewed in time") {
            break stalled.elapsed();
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(20),
            "the host went on past its lease: {}",
            active.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    nats.resume();
    assert!(
        stopped_writing < Duration::from_secs(2),
        "the host stopped writing {stopped_writing:?} after its server stalled: past its lease's 2 s time to live"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = active.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the host serves on: {}",
            active.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", active.output());
    assert!(
        active.output().contains("lost the cluster's gateway lease"),
        "{}",
        active.output()
    );
}

/// A host that registered a send's run and idempotency key in the cluster's registry, then died
/// before its inbox took the input, leaves a run in flight that no host will ever run. The
/// sender's resend with the same key is then taken, under that run's id, and answered: neither
/// lost nor reported as a duplicate of a run that never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_host_died_before_its_inbox_took_it_is_taken_when_sent_again() {
    let Some(nats) = NatsServer::start("a_send_whose_host_died_before_its_inbox_took_it") else {
        return;
    };
    let model = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        anthropic::message(&[anthropic::text(&format!("Answered: {text}"))])
    })
    .await;
    let session = "agent:main:test:phantom";
    // What the dead host left: the run and its key registered, nothing in the inbox.
    let cluster = clawcage_cluster::Cluster::connect(&nats.url(), &Default::default())
        .await
        .unwrap();
    let registered = cluster
        .run_registry()
        .register(session, "run-dead-host-1", Some("k-phantom"))
        .await
        .unwrap();
    assert_eq!(registered, clawcage_agent::runs::Registered::New);

    let workspace = tempfile::tempdir().unwrap();
    let only = Host::new(&nats.url(), model.url(), "host-a");
    let gateway = GatewayProcess::start(only.gateway(workspace.path()));
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "are you there", "idempotencyKey": "k-phantom"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    assert_eq!(sent["payload"]["runId"], "run-dead-host-1", "{sent}");
    assert_ne!(
        sent["payload"]["duplicate"], true,
        "taken, not a duplicate: {sent}"
    );
    let waited = client
        .request(
            "agent.wait",
            json!({"runId": "run-dead-host-1", "timeoutMs": 60000}),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    // And now it is a real duplicate.
    let again = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "are you there", "idempotencyKey": "k-phantom"}),
        )
        .await;
    assert_eq!(again["payload"]["duplicate"], true, "{again}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    assert_eq!(
        history.matches("Answered: are you there").count(),
        1,
        "{history}"
    );
    let (status, output) = gateway.terminate();
    assert!(status.success(), "{output}");
}

/// Every host runs every session's tools, so all must see one workspace: a host started on
/// another directory than the one the cluster recorded refuses to join, saying so; one on the
/// cluster's workspace joins (as a standby here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_on_another_workspace_refuses_to_join() {
    let Some(nats) = NatsServer::start("a_host_on_another_workspace_refuses_to_join") else {
        return;
    };
    let model = LlmServer::start_routed(|_| anthropic::message(&[anthropic::text("ok")])).await;
    let shared = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let first = Host::new(&nats.url(), model.url(), "host-a");
    let active = GatewayProcess::start(first.gateway(shared.path()));
    let identity = std::fs::read_to_string(shared.path().join(".clawcage-workspace-id")).unwrap();
    assert_eq!(identity.trim().len(), 32, "{identity:?}");

    let second = Host::new(&nats.url(), model.url(), "host-b");
    let refused = tokio::task::spawn_blocking({
        let mut command = second.gateway(elsewhere.path());
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not the cluster's") && stderr.contains(identity.trim()),
        "{stderr}"
    );
    // On the shared workspace it joins, as a standby while host-a serves.
    let mut standby = second
        .gateway(shared.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(standby.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !line.contains("standby in the cluster") {
        line.clear();
        assert!(Instant::now() < deadline, "the standby never said so");
        if std::io::BufRead::read_line(&mut out, &mut line).unwrap() == 0 {
            panic!("the standby exited");
        }
    }
    let _ = standby.kill();
    let _ = standby.wait();
    let (status, output) = active.terminate();
    assert!(status.success(), "{output}");
}

/// The `ticker` job's firings the model answered in `session`, as `chat.history` shows them,
/// and the firings (user messages) themselves.
async fn answered_firings(client: &mut GatewayClient, session: &str) -> (usize, usize) {
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    // A firing reaches the model as a notification from the job.
    let firing = "[notification on the `system` channel from cron:job-1]\\n[cron job ticker] tick";
    let answered = history.matches(&format!("Noted: {firing}")).count();
    let firings = history.matches(firing).count() - answered;
    (answered, firings)
}

/// Polls until `ticker` was answered at least `count` times in `session`.
async fn until_answered(client: &mut GatewayClient, session: &str, count: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (answered, _) = answered_firings(client, session).await;
        if answered >= count {
            return answered;
        }
        if Instant::now() >= deadline {
            let history = client
                .request("chat.history", json!({"sessionKey": session}))
                .await;
            panic!("only {answered} of {count} firings answered within 60 s: {history}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Cron jobs are the cluster's, not a host's: a job added with the standby's configuration is
/// listed with the active host's and fired by the active host into its session; when the active
/// host is killed, the standby that takes over fires the same job on, and every firing is
/// answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_jobs_are_the_clusters_and_keep_firing_after_the_active_host_dies() {
    let Some(nats) = NatsServer::start("cron_jobs_are_the_clusters") else {
        return;
    };
    let model = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        anthropic::message(&[anthropic::text(&format!("Noted: {text}"))])
    })
    .await;
    let workspace = tempfile::tempdir().unwrap();
    let first = Host::new(&nats.url(), model.url(), "host-a");
    let second = Host::new(&nats.url(), model.url(), "host-b");
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let standby = standby_of(&second, workspace.path());
    let session = "agent:main:test:cron";
    let run = |mut command: Command| {
        tokio::task::spawn_blocking(move || {
            let output = command.output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.status.success(), "{text}");
            text
        })
    };
    let added = run(second.command(
        workspace.path(),
        &[
            "cron",
            "add",
            "--every",
            "2",
            "--message",
            "tick",
            "--name",
            "ticker",
            "--session",
            session,
        ],
    ))
    .await
    .unwrap();
    assert!(added.contains("job-1"), "{added}");
    let listed = run(first.command(workspace.path(), &["cron", "list"]))
        .await
        .unwrap();
    assert!(listed.contains("ticker"), "{listed}");

    let (mut client, _) = GatewayClient::connect(active.addr, TOKEN).await;
    let before = until_answered(&mut client, session, 2).await;
    let standby = fail_over(active, standby).await;
    let (mut client, _) = GatewayClient::connect(standby.addr, TOKEN).await;
    until_answered(&mut client, session, before + 2).await;
    // Let a firing under way end, then compare: every firing answered exactly once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let removed = run(second.command(workspace.path(), &["cron", "remove", "job-1"]))
        .await
        .unwrap();
    assert!(removed.contains("ticker"), "{removed}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (answered, firings) = answered_firings(&mut client, session).await;
    assert_eq!(answered, firings, "each firing answered once");
    let listed = run(first.command(workspace.path(), &["cron", "list"]))
        .await
        .unwrap();
    assert!(
        !listed.contains("ticker"),
        "removed for every host: {listed}"
    );
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}

/// A signed webhook request is taken once across the cluster: replayed to the host that took
/// over from the one that accepted it, it is refused as a replay, while a new signed request is
/// taken there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_replayed_to_the_host_that_took_over_is_refused() {
    use clawcage_tests::channels::{post, signed_headers, unix_now};
    let Some(nats) = NatsServer::start("a_webhook_replayed_after_a_takeover") else {
        return;
    };
    let model = LlmServer::start_routed(|_| anthropic::message(&[anthropic::text("ok")])).await;
    let hook = format!("[channels.webhooks.ops]\nsecret_env = \"{HOOK_SECRET_ENV}\"\n");
    let workspace = tempfile::tempdir().unwrap();
    let first = Host::with(&nats.url(), model.url(), "host-a", &hook);
    let second = Host::with(&nats.url(), model.url(), "host-b", &hook);
    let active = GatewayProcess::start(first.gateway(workspace.path()));
    let standby = standby_of(&second, workspace.path());
    let body = json!({"message": "deploy done", "id": "d-1"})
        .to_string()
        .into_bytes();
    let headers = signed_headers(HOOK_SECRET, unix_now(), &body);
    let url = |addr: std::net::SocketAddr| format!("http://{addr}/hooks/ops");
    let (status, text) = post(&url(active.addr), &headers, body.clone()).await;
    assert_eq!(status, 202, "{text}");
    // The same request again, to the same host: a replay.
    let (status, text) = post(&url(active.addr), &headers, body.clone()).await;
    assert_eq!(status, 401, "{text}");
    let standby = fail_over(active, standby).await;
    let (status, text) = post(&url(standby.addr), &headers, body.clone()).await;
    assert_eq!(status, 401, "a replay to the new host is refused: {text}");
    assert!(text.contains("replay"), "{text}");
    let fresh = json!({"message": "deploy done again", "id": "d-2"})
        .to_string()
        .into_bytes();
    let (status, text) = post(
        &url(standby.addr),
        &signed_headers(HOOK_SECRET, unix_now(), &fresh),
        fresh,
    )
    .await;
    assert_eq!(status, 202, "{text}");
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}
