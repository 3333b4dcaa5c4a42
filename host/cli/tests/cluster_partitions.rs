//! Two `clawcage gateway` hosts serving at once (`[cluster] serve = "partitions"`, a real
//! `nats-server`, each host with its own state directory, one shared workspace): they share the
//! sessions' 64 partitions as the rendezvous placement says (`clawcage cluster status` shows it),
//! each answers the sessions of its own partitions, and what a client of one host asks of the
//! other's session is forwarded there and answered on the client's connection, the run's events
//! followed from the session's log (a connection forwarded is never forwarded again). One host
//! is killed with SIGKILL while a turn of its session, sent through the other, waits for the
//! model: the other takes its partitions after the lease's time to live, resumes the turn from
//! the journal and ends it once, and both the client that sent it and one that followed the
//! session from the surviving host see the turn resume and end on their connections. The killed host, started again, is handed its share back and serves its
//! session again (the follower on the other host following on); a host that stops gives its
//! partitions back at once. An approver connected to one host hears the other host's approval
//! requests and answers them there. (The channels with hosts serving partitions are
//! `cluster_partitions_channels.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::time::{Duration, Instant};

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, ReplyGate, anthropic, last_user};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};

#[path = "cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "shared with the failover tests, which use the rest"
)]
mod host;
#[path = "cluster_partitions/placement.rs"]
mod placement;
use host::{Host, TOKEN};
use placement::{partitioned, session_of, settled};

/// A model that answers "Answered: <the user's message>" at once, except a message with `slow`
/// in it, whose answer `gate` holds until the test opens it.
async fn model_holding_slow_ones(gate: &ReplyGate) -> LlmServer {
    let gate = gate.clone();
    LlmServer::start_routed(move |body| {
        let (text, _) = last_user(body);
        let answer = anthropic::message(&[anthropic::text(&format!("Answered: {text}"))]);
        if text.contains("slow") {
            gate.hold(answer)
        } else {
            answer
        }
    })
    .await
}

/// The `agent` events of `run` a follower sees until its lifecycle ends.
async fn until_run_ends(follower: &mut GatewayClient, run: &str) -> Vec<Value> {
    follower
        .agent_events_until(Duration::from_secs(60), |event| {
            event["runId"] == run
                && event["stream"] == "lifecycle"
                && matches!(event["data"]["phase"].as_str(), Some("end" | "error"))
        })
        .await
}

/// A client of `host` that sent `text` (with `slow` in it) to `session`, and the run's id, once
/// the model holds its answer at `gate`.
async fn slow_turn(
    host: &GatewayProcess,
    session: &str,
    text: &str,
    gate: &ReplyGate,
) -> (GatewayClient, String) {
    let (mut client, _) = GatewayClient::connect(host.addr, TOKEN).await;
    let sent = client
        .request("chat.send", json!({"sessionKey": session, "message": text}))
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    gate.reached(1).await;
    (client, run)
}

/// The lifecycle phases of `run` among `events`, in order.
fn lifecycle_phases<'a>(events: &'a [Value], run: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|event| event["runId"] == run && event["stream"] == "lifecycle")
        .filter_map(|event| event["data"]["phase"].as_str())
        .collect()
}

/// A cluster of two hosts serving partitions, not started yet.
struct TwoHosts {
    nats: NatsServer,
    /// Holds the model's answers to messages with `slow` in them.
    gate: ReplyGate,
    model: LlmServer,
    workspace: tempfile::TempDir,
    a: Host,
    b: Host,
}

/// A nats-server for `test`, a model holding its `slow` answers at a gate, one workspace, and
/// hosts host-a and host-b serving partitions of the cluster; `None` where no server starts.
async fn two_hosts(test: &str) -> Option<TwoHosts> {
    let nats = NatsServer::start(test)?;
    let gate = ReplyGate::new();
    let model = model_holding_slow_ones(&gate).await;
    let (a, b) = (
        partitioned(&nats, &model, "host-a"),
        partitioned(&nats, &model, "host-b"),
    );
    Some(TwoHosts {
        nats,
        gate,
        model,
        workspace: tempfile::tempdir().unwrap(),
        a,
        b,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_serve_their_partitions_at_once_and_take_a_killed_ones_over() {
    let Some(TwoHosts {
        nats: _nats,
        gate,
        model: _model,
        workspace,
        a,
        b,
    }) = two_hosts("hosts_serve_their_partitions").await
    else {
        return;
    };
    let host_a = GatewayProcess::start(a.gateway(workspace.path()));
    assert!(
        host_a
            .output()
            .contains("cluster: this host (host-a) serves its share of the sessions' partitions"),
        "{}",
        host_a.output()
    );
    let host_b = GatewayProcess::start(b.gateway(workspace.path()));
    let both = ["host-a", "host-b"];
    let took = settled(&a, workspace.path(), &both).await;
    eprintln!("two hosts settled on their shares {took:?} after the second started");
    let (of_a, of_b) = (
        session_of("host-a", &both, "a"),
        session_of("host-b", &both, "b"),
    );

    // Each host answers its own sessions, and refuses another's saying why.
    let (mut client_a, _) = GatewayClient::connect(host_a.addr, TOKEN).await;
    let (mut client_b, _) = GatewayClient::connect(host_b.addr, TOKEN).await;
    for (client, key, text) in [
        (&mut client_a, &of_a, "hello a"),
        (&mut client_b, &of_b, "hello b"),
    ] {
        let sent = client
            .request("chat.send", json!({"sessionKey": key, "message": text}))
            .await;
        assert_eq!(sent["ok"], true, "{sent}");
        let run = sent["payload"]["runId"].clone();
        let waited = client
            .request("agent.wait", json!({"runId": run, "timeoutMs": 60000}))
            .await;
        assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    }
    // A client of host-a asks of host-b's session: forwarded there, answered here, the run's
    // events followed here from the session's log.
    let sent = client_a
        .request(
            "chat.send",
            json!({"sessionKey": of_b, "message": "through host-a"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    let events = until_run_ends(&mut client_a, &run).await;
    assert_eq!(events.last().unwrap()["data"]["phase"], "end", "{events:?}");
    let waited = client_a
        .request("agent.wait", json!({"runId": run, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let history = client_a
        .request("chat.history", json!({"sessionKey": of_b}))
        .await;
    assert_eq!(history["ok"], true, "{history}");
    let history = history.to_string();
    assert!(
        history.contains("Answered: hello b") && history.contains("Answered: through host-a"),
        "{history}"
    );
    // A connection another host forwards is never forwarded again: a host that does not serve
    // the session says so.
    let (mut forwarded, _) =
        GatewayClient::open_with(host_a.addr, &[("x-clawcage-relayed-by", "host-b")])
            .await
            .unwrap();
    let hello = forwarded
        .request(
            "connect",
            clawcage_tests::gateway_client::connect_params(TOKEN),
        )
        .await;
    assert_eq!(hello["ok"], true, "{hello}");
    let refused = forwarded
        .request(
            "chat.send",
            json!({"sessionKey": of_b, "message": "round and round"}),
        )
        .await;
    assert_eq!(refused["error"]["code"], "UNAVAILABLE", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("served by another host"),
        "{refused}"
    );

    // A client of host-a follows host-b's session, and sends a turn to it through host-a.
    let (mut follower, _) = GatewayClient::connect(host_a.addr, TOKEN).await;
    let subscribed = follower
        .request("sessions.subscribe", json!({"sessionKey": of_b}))
        .await;
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let sent = client_a
        .request(
            "chat.send",
            json!({"sessionKey": of_b, "message": "slow one", "idempotencyKey": "k-slow"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    let started = follower
        .agent_events_until(Duration::from_secs(30), |event| {
            event["runId"] == run.as_str() && event["data"]["phase"] == "start"
        })
        .await;
    assert!(!started.is_empty());

    // host-b dies while its turn waits for the model; host-a takes its partitions over.
    gate.reached(1).await;
    let killed = Instant::now();
    let said = host_b.kill();
    assert!(!said.contains("panicked"), "{said}");
    settled(&a, workspace.path(), &["host-a"]).await;
    let moved = killed.elapsed();
    eprintln!("a killed host's partitions were served by the other {moved:?} after the kill");
    // The turn resumes on host-a: the model is asked again; let it answer.
    gate.reached(2).await;
    gate.open();
    let events = until_run_ends(&mut follower, &run).await;
    let phases = lifecycle_phases(&events, &run);
    assert!(phases.contains(&"resumed"), "{phases:?}");
    assert_eq!(phases.last(), Some(&"end"), "{phases:?}");
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|event| event["seq"].as_u64())
        .collect();
    assert!(
        seqs.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "the follower saw every event once, in order: {seqs:?}"
    );
    // The client that sent it through host-a saw it resume and end too, on its connection.
    let sender_saw = until_run_ends(&mut client_a, &run).await;
    assert!(
        sender_saw
            .iter()
            .any(|event| event["runId"] == run.as_str() && event["data"]["phase"] == "resumed"),
        "{sender_saw:?}"
    );
    // host-a serves the session now: it knows its idempotency keys.
    host::ended_once(
        &mut client_a,
        &run,
        &of_b,
        ("slow one", "k-slow", "Answered: slow one"),
    )
    .await;

    // host-b comes back: host-a hands its share over (each partition let go before it is given
    // up), and host-b serves the session again; host-a's follower follows what host-b writes.
    let joined = Instant::now();
    let host_b = GatewayProcess::start(b.gateway(workspace.path()));
    settled(&a, workspace.path(), &both).await;
    eprintln!(
        "a host that came back served its share {:?} after it started",
        joined.elapsed()
    );
    let (mut client_b, _) = GatewayClient::connect(host_b.addr, TOKEN).await;
    let sent = client_b
        .request(
            "chat.send",
            json!({"sessionKey": of_b, "message": "hello again"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    until_run_ends(&mut follower, &run).await;
    // host-a forwards to host-b again, over a new connection.
    let sent = client_a
        .request(
            "chat.send",
            json!({"sessionKey": of_b, "message": "via a again"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    until_run_ends(&mut client_a, &run).await;
    let history = client_b
        .request("chat.history", json!({"sessionKey": of_b}))
        .await
        .to_string();
    for answer in [
        "Answered: hello b",
        "Answered: slow one",
        "Answered: hello again",
    ] {
        assert_eq!(history.matches(answer).count(), 1, "{answer}: {history}");
    }

    // host-a stops: it gives its partitions back at once, and host-b serves its sessions.
    let stopping = Instant::now();
    let (exit, output) = host_a.terminate();
    assert!(exit.success(), "{output}");
    settled(&b, workspace.path(), &["host-b"]).await;
    let back = stopping.elapsed();
    eprintln!(
        "a stopping host's partitions were served by the other {back:?} after it was told to stop"
    );
    assert!(
        back < Duration::from_secs(2),
        "given back, yet served only after {back:?} (the lease lives 2 s)"
    );
    let sent = client_b
        .request(
            "chat.send",
            json!({"sessionKey": of_a, "message": "to b now"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let waited = client_b
        .request(
            "agent.wait",
            json!({"runId": sent["payload"]["runId"], "timeoutMs": 60000}),
        )
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let (exit, output) = host_b.terminate();
    assert!(exit.success(), "{output}");
}

/// An approver connected to one host hears the approvals the other host asks (its turns' tool
/// calls) and answers them there: the command runs once, after the answer; a second answer is
/// refused by the host that asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_on_one_host_answers_the_other_hosts_approvals() {
    let Some(nats) = NatsServer::start("an_approver_on_one_host") else {
        return;
    };
    let model = host::removing_model().await;
    let extra = "serve = \"partitions\"\n\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n";
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("build")).unwrap();
    let a = Host::with(&nats.url(), model.url(), "host-a", extra);
    let b = Host::with(&nats.url(), model.url(), "host-b", extra);
    let host_a = GatewayProcess::start(a.gateway(workspace.path()));
    let host_b = GatewayProcess::start(b.gateway(workspace.path()));
    let both = ["host-a", "host-b"];
    settled(&a, workspace.path(), &both).await;

    // The approver connects to host-a; a turn of host-b's session asks.
    let (mut approver, _) = GatewayClient::open(host_a.addr, None).await.unwrap();
    let mut params = clawcage_tests::gateway_client::connect_params(TOKEN);
    params["scopes"] = json!(["operator.approvals"]);
    let hello = approver.request("connect", params).await;
    assert_eq!(hello["ok"], true, "{hello}");
    let session = session_of("host-b", &both, "approved");
    let (mut client, _) = GatewayClient::connect(host_b.addr, TOKEN).await;
    host::approve_a_removal(&mut approver, &mut client, &session, workspace.path()).await;
    for host in [host_a, host_b] {
        let (exit, output) = host.terminate();
        assert!(exit.success(), "{output}");
    }
}

/// A partition handed over to a host that joins lets the turn running in it end first: the
/// host that held it takes no new input for it, waits for the turn (within the hand-over's
/// grace), and only then gives the partition up; the turn ends there once, the model asked once,
/// and the session goes on on the host that joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_lets_the_running_turn_end_first() {
    let Some(TwoHosts {
        nats: _nats,
        gate,
        model,
        workspace,
        a,
        b,
    }) = two_hosts("a_hand_over_lets_the_turn_end").await
    else {
        return;
    };
    let host_a = GatewayProcess::start(a.gateway(workspace.path()));
    settled(&a, workspace.path(), &["host-a"]).await;
    // A session host-b will be handed once it joins; its turn waits for the model on host-a.
    let both = ["host-a", "host-b"];
    let session = session_of("host-b", &both, "handed");
    let (mut client, run) = slow_turn(&host_a, &session, "slow handed", &gate).await;

    let command = b.gateway(workspace.path());
    let joining = tokio::task::spawn_blocking(move || GatewayProcess::start(command));
    // Once host-a is handing the partition over, the model answers.
    let asked = Instant::now();
    while !host_a
        .output()
        .contains("handing a partition over: its running turns may end first")
    {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "host-a never handed the partition over: {}",
            host_a.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gate.open();
    let events = until_run_ends(&mut client, &run).await;
    let phases = lifecycle_phases(&events, &run);
    assert_eq!(phases.last(), Some(&"end"), "{phases:?}");
    assert!(
        !phases.contains(&"resumed"),
        "the turn was not cut: {phases:?}"
    );
    let host_b = joining.await.unwrap();
    settled(&a, workspace.path(), &both).await;
    let asked_for_it = model
        .bodies()
        .iter()
        .filter(|body| last_user(body).0 == "slow handed")
        .count();
    assert_eq!(asked_for_it, 1, "the model was asked once");
    let ended = format!("turn ended session=\"{session}\"");
    assert!(host_a.output().contains(&ended), "{}", host_a.output());
    assert!(!host_b.output().contains(&ended), "{}", host_b.output());

    // The session goes on on host-b (forwarded there from host-a).
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "after"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    until_run_ends(&mut client, sent["payload"]["runId"].as_str().unwrap()).await;
    assert!(host_b.output().contains(&ended), "{}", host_b.output());
    for host in [host_a, host_b] {
        let (exit, output) = host.terminate();
        assert!(exit.success(), "{output}");
    }
}

/// A NATS server that hangs longer than the lease while a turn waits for the model: the host's
/// renewals do not come back, its partitions' fences shut, and the turn's next write is refused.
/// The run is not failed for that (a client waiting for its end all along hears `ok`): it is
/// left as a crash leaves it, and once the server goes on the host takes its partitions again
/// and resumes the turn, which ends once. (Whether the lane's answer or the partition's loss
/// reaches the hub first after the server goes on is a race; the old code failed the run
/// whenever the answer came first, as it does here on an idle machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_write_the_shut_fence_refuses_is_resumed_not_failed() {
    let Some(TwoHosts {
        nats,
        gate,
        model,
        workspace,
        a,
        b: _,
    }) = two_hosts("a_turn_the_fence_refuses").await
    else {
        return;
    };
    let host_a = GatewayProcess::start(a.gateway(workspace.path()));
    settled(&a, workspace.path(), &["host-a"]).await;
    let session = session_of("host-a", &["host-a"], "fenced");
    let (mut client, run) = slow_turn(&host_a, &session, "slow fenced", &gate).await;
    // A client waits for the run's end from before the server hangs until after it goes on.
    let (mut waiter, _) = GatewayClient::connect(host_a.addr, TOKEN).await;
    let waited = tokio::spawn({
        let run = run.clone();
        async move {
            waiter
                .request("agent.wait", json!({"runId": run, "timeoutMs": 90000}))
                .await
        }
    });

    // The server hangs for longer than the 2 s lease; meanwhile the model answers, and the
    // turn's write of the answer finds the fence shut.
    nats.pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    gate.open();
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.resume();

    let events = until_run_ends(&mut client, &run).await;
    let phases = lifecycle_phases(&events, &run);
    assert_eq!(
        phases.last(),
        Some(&"end"),
        "{phases:?}\n{}",
        host_a.output()
    );
    assert!(phases.contains(&"resumed"), "{phases:?}");
    let waited = waited.await.unwrap();
    assert_eq!(
        waited["payload"]["status"],
        "ok",
        "{waited}\n{}",
        host_a.output()
    );
    // Refused by the shut fence: the run is left to the next owner either by the hub when the
    // lane answers (`may_write`), or by the partition's loss, whichever comes first once the
    // server goes on.
    assert!(
        host_a
            .output()
            .contains("cannot journal a step of the turn"),
        "the turn's write was not refused, so this tested nothing: {}",
        host_a.output()
    );
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    assert_eq!(
        history.matches("Answered: slow fenced").count(),
        1,
        "{history}"
    );
    assert!(model.bodies().len() >= 2, "the resumed turn asked again");
    let (exit, output) = host_a.terminate();
    assert!(exit.success(), "{output}");
}
