//! The channels when the hosts of a cluster serve partitions (`[cluster] serve =
//! "partitions"`, two `clawcage gateway` hosts on a real `nats-server`, one shared workspace):
//! a webhook posted to one host runs where its session is served; one host polls Telegram and
//! another takes the polling over when it dies; and a Telegram conversation served by the host
//! that does not poll gets its approval requests posted by that host, while its `/approve` and
//! `/queue`, taken by the polling host, are carried out where the session is served.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::time::{Duration, Instant};

use clawcage_cluster::leases::{PARTITIONS, partition_of, partitions_won};
use clawcage_tests::channels::FakeBotApi;
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, anthropic, last_user};
use clawcage_tests::nats::NatsServer;
use serde_json::{Value, json};

#[path = "cluster_failover/host.rs"]
#[allow(
    dead_code,
    reason = "shared with the failover tests, which use the rest"
)]
mod host;
#[path = "cluster_partitions/placement.rs"]
#[allow(
    dead_code,
    reason = "shared with the partition tests, which use the rest"
)]
mod placement;
use host::{Host, TOKEN};
use placement::settled;

const BOT_TOKEN: &str = "7000001:AAE-test-bot-token-Zq9xVb3RtY7uKw";
const BOT_TOKEN_ENV: &str = "CLAWCAGE_TEST_TELEGRAM_TOKEN";

/// The host holding the Telegram poller's lease, as `clawcage cluster status` shows it, once
/// one does.
async fn telegram_poller(host: &Host, workspace: &std::path::Path) -> String {
    let started = Instant::now();
    loop {
        let output = host
            .command(workspace, &["cluster", "status", "--json"])
            .output()
            .unwrap();
        let status: Value = serde_json::from_slice(&output.stdout).unwrap();
        let poller = status["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|lease| lease[0] == "telegram")
            .and_then(|lease| lease[1]["host"].as_str())
            .map(str::to_string);
        if let Some(poller) = poller {
            return poller;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no host polls Telegram: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A webhook posted to one host for a session the other serves: taken once (the signature's
/// replay refused on either host), run by the host serving the session, its answer in the
/// session's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_posted_to_one_host_runs_where_its_session_is_served() {
    use clawcage_tests::channels::{post, signed_headers, unix_now};
    let Some(nats) = NatsServer::start("a_webhook_posted_to_one_host") else {
        return;
    };
    let model = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        anthropic::message(&[anthropic::text(&format!("Answered: {text}"))])
    })
    .await;
    let extra = format!(
        "serve = \"partitions\"\n\n[channels.webhooks.ops]\nsecret_env = \"{}\"\n",
        host::HOOK_SECRET_ENV
    );
    let workspace = tempfile::tempdir().unwrap();
    let a = Host::with(&nats.url(), model.url(), "host-a", &extra);
    let b = Host::with(&nats.url(), model.url(), "host-b", &extra);
    let host_a = GatewayProcess::start(a.gateway(workspace.path()));
    let host_b = GatewayProcess::start(b.gateway(workspace.path()));
    let both = ["host-a", "host-b"];
    settled(&a, workspace.path(), &both).await;
    let live: Vec<String> = both.iter().map(|host| host.to_string()).collect();
    let of_b = partitions_won("host-b", &live, PARTITIONS);
    let peer = (0..10_000)
        .map(|n| format!("peer-{n}"))
        .find(|peer| of_b.contains(&partition_of(&format!("agent:main:webhook:ops:{peer}"))))
        .unwrap();
    let session = format!("agent:main:webhook:ops:{peer}");

    let body = json!({"message": "deploy done", "peer": peer, "id": "d-1"})
        .to_string()
        .into_bytes();
    let headers = signed_headers(host::HOOK_SECRET, unix_now(), &body);
    let url = |addr: std::net::SocketAddr| format!("http://{addr}/hooks/ops");
    let (status, text) = post(&url(host_a.addr), &headers, body.clone()).await;
    assert_eq!(status, 202, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let run = answer["runId"].as_str().expect("the run's id").to_string();
    for addr in [host_a.addr, host_b.addr] {
        let (status, text) = post(&url(addr), &headers, body.clone()).await;
        assert_eq!(status, 401, "a replay is refused on either host: {text}");
    }
    let (mut client, _) = GatewayClient::connect(host_a.addr, TOKEN).await;
    let waited = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    assert_eq!(
        history.matches("Answered: deploy done").count(),
        1,
        "{history}"
    );
    let ran = format!("turn ended session=\"{session}\"");
    assert!(
        host_b.output().contains(&ran),
        "host-b ran it: {}",
        host_b.output()
    );
    assert!(!host_a.output().contains(&ran), "host-a did not");
    for host in [host_a, host_b] {
        let (exit, output) = host.terminate();
        assert!(exit.success(), "{output}");
    }
}

/// Telegram with hosts serving partitions: one host polls (the holder of the `telegram` lease)
/// and every message is answered once, whichever host serves its session; the poller killed,
/// the other host takes the lease over and polls on from the journal, and the next message is
/// answered once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_polls_telegram_and_another_takes_over_when_it_dies() {
    let Some(nats) = NatsServer::start("one_host_polls_telegram") else {
        return;
    };
    let model = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        anthropic::message(&[anthropic::text(&format!("Answered: {text}"))])
    })
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let extra = format!(
        "serve = \"partitions\"\n\n[channels.telegram]\ntoken_env = \"{BOT_TOKEN_ENV}\"\napi_base = \"{}\"\npoll_timeout_secs = 1\nallow_from = [42]\n",
        bot.url()
    );
    let workspace = tempfile::tempdir().unwrap();
    let hosts = [
        Host::with(&nats.url(), model.url(), "host-a", &extra),
        Host::with(&nats.url(), model.url(), "host-b", &extra),
    ];
    let start = |host: &Host| {
        let mut command = host.gateway(workspace.path());
        command.env(BOT_TOKEN_ENV, BOT_TOKEN);
        GatewayProcess::start(command)
    };
    let mut processes = [Some(start(&hosts[0])), Some(start(&hosts[1]))];
    settled(&hosts[0], workspace.path(), &["host-a", "host-b"]).await;

    bot.private_message(42, "Ada", "hello one");
    bot.wait_delivered(42, 1).await;
    assert!(bot.delivered_texts(42)[0].contains("Answered: hello one"));
    // Who polls: the holder of the `telegram` lease.
    let poller = telegram_poller(&hosts[0], workspace.path()).await;
    let (dead, alive) = if poller == "host-a" { (0, 1) } else { (1, 0) };

    let said = processes[dead].take().unwrap().kill();
    assert!(!said.contains("panicked"), "{said}");
    bot.private_message(42, "Ada", "hello two");
    bot.wait_delivered(42, 2).await;
    // Nothing more comes: each message answered once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let texts = bot.delivered_texts(42);
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[1].contains("Answered: hello two"), "{texts:?}");
    let survivor = processes[alive].take().unwrap();
    assert!(
        survivor
            .output()
            .contains("this host polls Telegram for the cluster"),
        "{}",
        survivor.output()
    );
    let (exit, output) = survivor.terminate();
    assert!(exit.success(), "{output}");
}

/// A Telegram conversation whose session the host that does not poll serves: `/queue collect`
/// sent in the chat (taken by the polling host) becomes the serving host's setting for the
/// session; the approval request of its turn is posted to the chat by the serving host; and
/// `/approve`, taken by the polling host, is carried out where the request waits: nothing runs
/// before it, the command runs once after, and the turn's answer reaches the chat. A client
/// asking the hosts' own method with a proof it made up is refused on either host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_served_by_the_host_not_polling_is_answered_from_the_chat() {
    let Some(nats) = NatsServer::start("conversation_served_elsewhere") else {
        return;
    };
    let model = host::removing_model().await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let chats: Vec<i64> = (42..=99).collect();
    let extra = format!(
        "serve = \"partitions\"\n\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n\n\
         [channels.telegram]\ntoken_env = \"{BOT_TOKEN_ENV}\"\napi_base = \"{}\"\npoll_timeout_secs = 1\nallow_from = {chats:?}\n",
        bot.url()
    );
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("build")).unwrap();
    let hosts = [
        Host::with(&nats.url(), model.url(), "host-a", &extra),
        Host::with(&nats.url(), model.url(), "host-b", &extra),
    ];
    let start = |host: &Host| {
        let mut command = host.gateway(workspace.path());
        command.env(BOT_TOKEN_ENV, BOT_TOKEN);
        GatewayProcess::start(command)
    };
    let processes = [start(&hosts[0]), start(&hosts[1])];
    let both = ["host-a", "host-b"];
    settled(&hosts[0], workspace.path(), &both).await;
    let poller = telegram_poller(&hosts[0], workspace.path()).await;
    let serving = if poller == "host-a" { 1 } else { 0 };
    // A conversation whose session the other host serves.
    let live: Vec<String> = both.iter().map(|host| host.to_string()).collect();
    let won = partitions_won(both[serving], &live, PARTITIONS);
    let chat = *chats
        .iter()
        .find(|chat| won.contains(&partition_of(&format!("agent:main:telegram:{chat}"))))
        .expect("a chat whose session the host not polling serves");
    let session = format!("agent:main:telegram:{chat}");

    bot.private_message(chat, "Ada", "/queue collect");
    bot.wait_delivered(chat, 1).await;
    assert!(
        bot.delivered_texts(chat)[0].contains("queue for this session: collect"),
        "{:?}",
        bot.delivered_texts(chat)
    );
    // The serving host holds the setting (asked of it directly: nothing forwarded).
    let (mut client, _) = GatewayClient::connect(processes[serving].addr, TOKEN).await;
    let shown = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "/queue"}),
        )
        .await;
    let shown = shown["payload"]["text"].as_str().unwrap_or_default();
    assert!(
        shown.contains("collect") && shown.contains("set for this session"),
        "{shown}"
    );

    bot.private_message(chat, "Ada", "remove build");
    bot.wait_delivered(chat, 2).await;
    let request = bot.delivered_texts(chat).remove(1);
    assert!(request.starts_with("Approval needed ("), "{request}");
    assert!(request.contains("rm -r build"), "{request}");
    let id = request["Approval needed (".len()..]
        .split(')')
        .next()
        .unwrap()
        .to_string();
    assert!(
        workspace.path().join("build").exists(),
        "nothing runs before the answer"
    );
    // A client holds the gateway's token but not the bot's: the method by which the hosts carry
    // a conversation's `/approve` to each other is refused to it, through either host (the
    // polling one forwards it to the serving one), with a proof made up or made with the
    // gateway's token; nothing is decided.
    for host in &processes {
        let (mut intruder, _) = GatewayClient::connect(host.addr, TOKEN).await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        for proof in ["00", "", TOKEN] {
            let refused = intruder
                .request(
                    "channels.conversation",
                    json!({"sessionKey": session, "by": "telegram:42", "line": format!("/approve {id} allow-once"), "at": now, "proof": proof}),
                )
                .await;
            assert_eq!(refused["error"]["code"], "UNAUTHORIZED", "{refused}");
        }
    }
    assert!(
        workspace.path().join("build").exists(),
        "nothing was decided"
    );
    bot.private_message(chat, "Ada", &format!("/approve {id} allow-once"));
    bot.wait_delivered(chat, 4).await;
    let texts = bot.delivered_texts(chat);
    assert!(
        texts.contains(&format!("{id}: allow-once")),
        "the answer is acknowledged: {texts:?}"
    );
    assert!(
        texts.iter().any(|text| text.starts_with("RESULT: ")),
        "the turn's answer reaches the chat: {texts:?}"
    );
    assert!(
        !workspace.path().join("build").exists(),
        "the command ran once allowed"
    );
    let ran = format!("turn ended session=\"{session}\"");
    assert!(
        processes[serving].output().contains(&ran),
        "the serving host ran the turn: {}",
        processes[serving].output()
    );
    assert!(
        !processes[1 - serving].output().contains(&ran),
        "the polling host did not"
    );
    // Nothing more comes (the request posted once, the answer given once).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        bot.delivered_texts(chat).len(),
        4,
        "{:?}",
        bot.delivered_texts(chat)
    );
    for process in processes {
        let (exit, output) = process.terminate();
        assert!(exit.success(), "{output}");
    }
}
