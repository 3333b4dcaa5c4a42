//! The gateway's channels end to end: `clawcage gateway` as a process beside the scripted LLM
//! server, a fake Telegram Bot API and a webhook receiver, all on 127.0.0.1 and speaking the
//! real formats. A direct message gets a turn and its reply (a long one split in order, HTML
//! escaped); an unknown sender is paired and nothing of theirs reaches the model before the
//! operator approves; groups answer a mention or a reply to the bot only; a 429 is retried after
//! its `retry_after` and an undeliverable reply shows in `gateway status`; polling backs off
//! after errors and waits out a 429; a kill -9 mid-turn and
//! a restart (and a SIGTERM mid-turn and a restart) answer every update exactly once; webhooks with a bad, replayed, stale or missing
//! signature, an oversized or malformed body get refused and start nothing, a signed one is
//! answered with a signed POST; an exec approval asked in a chat is answered there with
//! `/approve` by an approved person only, and `/queue` sets the queue mode; an approved person's
//! conversation gets its turns' approval requests even when the turn did not come from the chat
//! (a stranger's gets none), and so does a group an approved person wrote in, after a restart
//! too (a group nobody approved wrote in gets none); the `message` tool
//! reaches its own chat and only the configured others. After each test, the bot token is in no file under the state
//! directory and in none of the gateway's output. It is one file (over 700 lines) because every
//! test runs the same `Setup` (gateway, scripted model, fake Bot API, webhook receiver) and the
//! same secret check after it, one test per behaviour.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clawcage_tests::channels::{
    BOT_ID, BOT_USERNAME, CHAT_NOT_FOUND, FakeBotApi, HookReceiver, decode_html, hmac_sha256, post,
    signed_headers, unix_now,
};
use clawcage_tests::files_beneath;
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, ReplyGate, anthropic, text_of};
use serde_json::{Value, json};

const TOKEN: &str = "gateway-channels-token-0123456789";
const BOT_TOKEN: &str = "7000001:AAE-test-bot-token-Zq9xVb3RtY7uKw";
const BOT_TOKEN_ENV: &str = "CLAWCAGE_TEST_TELEGRAM_TOKEN";
const HOOK_SECRET: &str = "hook-secret-5c1f0e9a7b3d2468ace0";
const HOOK_SECRET_ENV: &str = "CLAWCAGE_TEST_HOOK_SECRET";

fn cache_dir() -> PathBuf {
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    clawcage_tests::cli_state::shared_state_dir().join("cache")
}

/// A state directory, workspace and configuration of a test's own.
struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(llm: &str, channels: &str) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(cache_dir()).unwrap();
        std::os::unix::fs::symlink(cache_dir(), state.join("cache")).unwrap();
        let config = root.path().join("clawcage.toml");
        std::fs::write(
            &config,
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n[subagents]\nenabled = false\n\n[cron]\nenabled = false\n\n{channels}"
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

    /// `[channels.telegram]` at `bot` plus `extra` lines.
    fn telegram(llm: &str, bot: &FakeBotApi, extra: &str) -> Setup {
        Setup::new(
            llm,
            &format!(
                "[channels.telegram]\ntoken_env = \"{BOT_TOKEN_ENV}\"\napi_base = \"{}\"\npoll_timeout_secs = 2\n{extra}\n",
                bot.url()
            ),
        )
    }

    fn clawcage(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--workspace")
            .arg(&self.workspace)
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-channels-test")
            .env(BOT_TOKEN_ENV, BOT_TOKEN)
            .env(HOOK_SECRET_ENV, HOOK_SECRET);
        command
    }

    /// Runs `clawcage ARGS` to its end: status, stdout, stderr.
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let output = self.clawcage().args(args).output().unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Waits until the Telegram journal holds no update (every one answered and recorded so).
    async fn wait_journal_empty(&self) {
        let file = self.state.join("channels").join("telegram.json");
        for _ in 0..2000 {
            let pending = std::fs::read(&file)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .map(|journal| journal["pending"].as_array().map_or(0, Vec::len));
            if pending == Some(0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the Telegram journal {} kept its records", file.display());
    }

    /// The bot token and the webhook secret are in no file under the state directory (the
    /// shared component cache aside) and in none of `output`.
    fn assert_secrets_nowhere(&self, output: &str) {
        for secret in [BOT_TOKEN, HOOK_SECRET] {
            assert!(!output.contains(secret), "a secret was printed: {output}");
            // The state directory, and the workspace the sandbox writes into.
            let files = files_beneath(&[&self.state, &self.workspace]);
            for (path, bytes) in &files {
                assert!(
                    !bytes
                        .windows(secret.len())
                        .any(|window| window == secret.as_bytes()),
                    "{} holds a secret",
                    path.display()
                );
            }
            assert!(
                !files.is_empty(),
                "the state directory holds files to search"
            );
        }
    }
}

/// A running `clawcage gateway` of a test's own setup; killed when dropped.
struct Gateway(GatewayProcess);

impl Gateway {
    fn start(setup: &Setup) -> Gateway {
        let mut command = setup.clawcage();
        command.args(["-v", "gateway", "--bind", "127.0.0.1:0", "--token", TOKEN]);
        Gateway(GatewayProcess::start(command))
    }

    async fn client(&self) -> GatewayClient {
        GatewayClient::connect(self.0.addr, TOKEN).await.0
    }

    fn hook_url(&self, name: &str) -> String {
        format!("http://{}/hooks/{name}", self.0.addr)
    }

    /// kill -9; returns what it printed.
    fn kill(self) -> String {
        self.0.kill()
    }

    /// SIGTERM, waits for the exit; returns what it printed.
    fn terminate(self) -> String {
        self.0.terminate().1
    }
}

fn answer(text: &str) -> Reply {
    anthropic::stream(&[anthropic::text(text)], 512)
}

/// The text of the last user message of each request the model got.
fn model_inputs(server: &LlmServer) -> Vec<String> {
    server
        .bodies()
        .iter()
        .map(|body| {
            body["messages"]
                .as_array()
                .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
                .map(text_of)
                .unwrap_or_default()
        })
        .collect()
}

fn everything_the_model_saw(server: &LlmServer) -> String {
    server
        .bodies()
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_message_is_answered_and_a_long_reply_is_split_in_order() {
    let long: String = (0..100)
        .map(|line| {
            format!(
                "line {line}: <b>bold?</b> & \"quoted\" — ünïcödé 😀 {}\n",
                "x".repeat(60)
            )
        })
        .collect();
    assert!(long.encode_utf16().count() > 2 * 4096);
    let server = LlmServer::start(vec![answer(&long)]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, "allow_from = [42]");
    let gateway = Gateway::start(&setup);
    let (_, message_id) = bot.private_message(42, "Ada", "hello <there> & you");
    bot.wait_for("the whole reply", |calls| {
        let texts: String = calls
            .iter()
            .filter(|call| call.method == "sendMessage" && call.status == 200)
            .filter_map(|call| decode_html(call.body["text"].as_str()?).ok())
            .collect();
        texts.len() >= long.len()
    })
    .await;
    let delivered = bot.delivered(42);
    assert!(delivered.len() >= 3, "{delivered:?}");
    assert_eq!(
        bot.delivered_texts(42).concat(),
        long,
        "in order, nothing lost or added"
    );
    for call in &delivered {
        assert_eq!(call.body["parse_mode"], "HTML");
        assert!(call.body["text"].as_str().unwrap().contains("&lt;b&gt;"));
    }
    assert_eq!(
        delivered[0].body["reply_parameters"]["message_id"], message_id,
        "the first piece answers the message"
    );
    assert!(delivered[1].body.get("reply_parameters").is_none());
    let typing = bot
        .calls()
        .into_iter()
        .filter(|call| call.method == "sendChatAction")
        .count();
    assert!(typing >= 1, "the typing indicator was shown");
    assert_eq!(model_inputs(&server), ["hello <there> & you"]);
    // `/queue` sets the session's queue mode from the chat, as in the web chat.
    bot.private_message(42, "Ada", "/queue collect");
    bot.wait_delivered(42, delivered.len() + 1).await;
    let answer = bot.delivered_texts(42).pop().unwrap();
    assert!(answer.contains("collect"), "{answer}");
    bot.private_message(42, "Ada", "/queue sideways");
    bot.wait_delivered(42, delivered.len() + 2).await;
    let answer = bot.delivered_texts(42).pop().unwrap();
    assert!(answer.contains("steer"), "names the valid modes: {answer}");
    assert_eq!(server.requests().len(), 1, "commands run no turn");

    // The session is the gateway's like any other.
    let mut client = gateway.client().await;
    let history = client
        .request(
            "chat.history",
            json!({"sessionKey": "agent:main:telegram:42"}),
        )
        .await;
    let messages = history["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{history}");
    assert_eq!(messages[0]["content"][0]["text"], "hello <there> & you");
    let status = client.request("status", json!({})).await;
    assert_eq!(
        status["payload"]["channels"]["channels"]["telegram"]["state"], "polling",
        "{status}"
    );
    let (code, out, _) = setup.run(&["gateway", "status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("channel telegram: polling (@{BOT_USERNAME})")),
        "{out}"
    );
    client.close().await;
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_sender_is_paired_and_nothing_reaches_the_model_before_approval() {
    let server = LlmServer::start(vec![answer("hi Ada"), answer("welcome, Bob")]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, "allow_from = [42]");
    let gateway = Gateway::start(&setup);
    bot.private_message(77, "Bob", "secret plan alpha");
    bot.wait_delivered(77, 1).await;
    let pairing = bot.delivered_texts(77).remove(0);
    let code = pairing
        .split_whitespace()
        .find(|word| word.len() == 9 && word.as_bytes()[4] == b'-')
        .expect("the reply holds the code")
        .trim_end_matches(['.', ','])
        .to_string();
    assert!(pairing.contains("clawcage pairing approve"), "{pairing}");
    // A second message while the code is pending gets nothing; a known sender's message after
    // it is answered, so the second one has been judged by then.
    bot.private_message(77, "Bob", "still secret beta");
    bot.private_message(42, "Ada", "hello");
    bot.wait_delivered(42, 1).await;
    assert_eq!(bot.delivered(77).len(), 1, "{:?}", bot.delivered_texts(77));
    let seen = everything_the_model_saw(&server);
    assert!(!seen.contains("secret plan alpha") && !seen.contains("still secret beta"));
    assert_eq!(model_inputs(&server), ["hello"]);

    let (status, out, err) = setup.run(&["pairing", "list"]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains(&code) && out.contains("telegram:77"), "{out}");
    let (status, _, err) = setup.run(&["pairing", "approve", "NOPE-NOPE"]);
    assert_eq!(status, 2, "a wrong code is a usage error");
    assert!(err.contains("no pending pairing"), "{err}");
    let (status, out, err) = setup.run(&["pairing", "approve", &code.to_lowercase()]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains("approved telegram:77"), "{out}");
    // The same code again: it says whom the code admitted, not that it does not exist.
    let (status, _, err) = setup.run(&["pairing", "approve", &code]);
    assert_eq!(status, 2, "{err}");
    assert!(
        err.contains("already approved: telegram:77") && !err.contains("no pending pairing"),
        "{err}"
    );

    bot.private_message(77, "Bob", "hello after pairing");
    bot.wait_delivered(77, 2).await;
    assert_eq!(bot.delivered_texts(77)[1], "welcome, Bob");
    assert_eq!(model_inputs(&server), ["hello", "hello after pairing"]);
    let seen = everything_the_model_saw(&server);
    assert!(!seen.contains("secret plan alpha") && !seen.contains("still secret beta"));

    let (status, out, _) = setup.run(&["pairing", "revoke", "telegram:77"]);
    assert_eq!(status, 0);
    assert!(out.contains("revoked telegram:77"), "{out}");
    let (_, out, _) = setup.run(&["pairing", "list"]);
    assert!(out.contains("no sender is approved"), "{out}");
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_answer_only_a_mention_or_a_reply_to_the_bot() {
    let server =
        LlmServer::start(vec![answer("four"), answer("six"), answer("topic answer")]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, "");
    let gateway = Gateway::start(&setup);
    let group = -100_200_300;
    bot.group_message(group, 51, "Ada", "just chatting among ourselves", json!({}));
    let (_, asked) = bot.group_message(
        group,
        51,
        "Ada",
        &format!("@{BOT_USERNAME} what is 2+2?"),
        json!({}),
    );
    bot.wait_delivered(group, 1).await;
    let first = &bot.delivered(group)[0];
    assert_eq!(first.body["reply_parameters"]["message_id"], asked);
    bot.group_message(group, 52, "Bob", "nobody asked the bot this", json!({}));
    bot.group_message(
        group,
        52,
        "Bob",
        "and 3+3?",
        json!({"reply_to_message": {"message_id": 1, "from": {"id": BOT_ID, "is_bot": true, "first_name": "Test bot"}, "chat": {"id": group, "type": "supergroup"}, "text": "four"}}),
    );
    bot.wait_delivered(group, 2).await;
    bot.group_message(
        group,
        51,
        "Ada",
        &format!("@{BOT_USERNAME} in the topic"),
        json!({"is_topic_message": true, "message_thread_id": 9}),
    );
    bot.wait_delivered(group, 3).await;
    assert_eq!(bot.delivered_texts(group), ["four", "six", "topic answer"]);
    assert_eq!(bot.delivered(group)[2].body["message_thread_id"], 9);
    assert_eq!(
        model_inputs(&server),
        ["[Ada] what is 2+2?", "[Bob] and 3+3?", "[Ada] in the topic"]
    );
    let seen = everything_the_model_saw(&server);
    assert!(!seen.contains("just chatting") && !seen.contains("nobody asked"));
    let mut client = gateway.client().await;
    let topic = client
        .request(
            "chat.history",
            json!({"sessionKey": "agent:main:telegram:-100200300:topic:9"}),
        )
        .await;
    assert_eq!(
        topic["payload"]["messages"].as_array().unwrap().len(),
        2,
        "{topic}"
    );
    client.close().await;
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_after_retry_after_and_an_undeliverable_reply_is_reported() {
    let server = LlmServer::start(vec![answer("after the wait"), answer("to nowhere")]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(
        server.url(),
        &bot,
        &format!("allow_from = [42, {CHAT_NOT_FOUND}]"),
    );
    bot.script_send(vec![(
        429,
        json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 2", "parameters": {"retry_after": 2}}),
    )]);
    let gateway = Gateway::start(&setup);
    bot.private_message(42, "Ada", "hello");
    bot.wait_delivered(42, 1).await;
    let sends: Vec<_> = bot
        .calls()
        .into_iter()
        .filter(|call| call.method == "sendMessage")
        .collect();
    assert_eq!(sends.len(), 2, "one refused, one retried");
    assert_eq!(sends[0].status, 429);
    assert_eq!(sends[0].body["text"], sends[1].body["text"]);
    assert!(
        sends[1].at.duration_since(sends[0].at) >= Duration::from_secs(2),
        "the retry waited retry_after"
    );
    assert_eq!(bot.delivered_texts(42), ["after the wait"]);

    // Telegram refuses the chat: reported, not retried forever, not silent.
    bot.private_message(CHAT_NOT_FOUND, "Gone", "hello?");
    bot.wait_for("the refused reply", |calls| {
        calls
            .iter()
            .any(|call| call.method == "sendMessage" && call.body["chat_id"] == CHAT_NOT_FOUND)
    })
    .await;
    let mut status = Value::Null;
    for _ in 0..200 {
        let mut client = gateway.client().await;
        status = client.request("status", json!({})).await;
        client.close().await;
        if status["payload"]["channels"]["failedDeliveries"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status["payload"]["channels"]["failedDeliveries"], 1,
        "{status}"
    );
    let (code, out, _) = setup.run(&["gateway", "status"]);
    assert_eq!(code, 0);
    assert!(out.contains("1 replies could not be delivered"), "{out}");
    assert!(out.contains("chat not found"), "{out}");
    let printed = gateway.terminate();
    assert!(
        printed.contains("could not be delivered"),
        "the log says so"
    );
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_backs_off_after_errors_and_waits_out_a_429() {
    let server = LlmServer::start(vec![answer("made it")]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    bot.script_updates(vec![
        (502, json!({"ok": false, "error_code": 502, "description": "Bad Gateway"})),
        (502, json!({"ok": false, "error_code": 502, "description": "Bad Gateway"})),
        (
            429,
            json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 1", "parameters": {"retry_after": 1}}),
        ),
    ]);
    let setup = Setup::telegram(server.url(), &bot, "allow_from = [42]");
    let gateway = Gateway::start(&setup);
    bot.private_message(42, "Ada", "are you there?");
    bot.wait_delivered(42, 1).await;
    assert_eq!(bot.delivered_texts(42), ["made it"]);
    let polls: Vec<_> = bot
        .calls()
        .into_iter()
        .filter(|call| call.method == "getUpdates")
        .collect();
    let statuses: Vec<u16> = polls.iter().take(4).map(|call| call.status).collect();
    assert_eq!(statuses, [502, 502, 429, 200]);
    // Waits of at least 1 s, then 2 s (backoff), then the 429's retry_after of 1 s.
    for (index, least) in [(1, 1), (2, 2), (3, 1)] {
        let waited = polls[index].at.duration_since(polls[index - 1].at);
        assert!(
            waited >= Duration::from_secs(least),
            "poll {index} came {waited:?} after the one before"
        );
    }
    let printed = gateway.terminate();
    assert!(printed.contains("getUpdates failed"), "the log says so");
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_turn_and_a_restart_answer_every_update_exactly_once() {
    let gate = ReplyGate::new();
    let stopping = ReplyGate::new();
    let server = LlmServer::start(vec![
        answer("first answer"),
        gate.hold(answer("never sent: the gateway is killed first")),
        answer("second answer"),
        answer("third answer"),
        stopping.hold(answer("never sent: the gateway stops first")),
        answer("fourth answer"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, "allow_from = [42]");
    let gateway = Gateway::start(&setup);
    let (_, first) = bot.private_message(42, "Ada", "first");
    bot.wait_delivered(42, 1).await;
    // Done means recorded as done: a kill between the send and the record would send the
    // reply again (no Bot API call can tell whether a message was sent).
    setup.wait_journal_empty().await;
    let (second_update, second) = bot.private_message(42, "Ada", "second");
    gate.reached(1).await;
    let mut printed = gateway.kill();
    assert_eq!(bot.delivered(42).len(), 1);
    let before_restart = bot.calls().len();

    let gateway = Gateway::start(&setup);
    bot.wait_delivered(42, 2).await;
    let (_, third) = bot.private_message(42, "Ada", "third");
    bot.wait_delivered(42, 3).await;
    assert_eq!(
        bot.delivered_texts(42),
        ["first answer", "second answer", "third answer"]
    );
    let answered: Vec<Value> = bot
        .delivered(42)
        .iter()
        .map(|call| call.body["reply_parameters"]["message_id"].clone())
        .collect();
    assert_eq!(answered, [json!(first), json!(second), json!(third)]);
    // The restarted gateway asked for the updates after the ones it had recorded.
    let polls: Vec<u64> = bot.calls()[before_restart..]
        .iter()
        .filter(|call| call.method == "getUpdates")
        .map(|call| call.body["offset"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(polls[0], second_update + 1, "{polls:?}");
    // "first" went to the model once; "second" twice (the killed turn saved nothing).
    assert_eq!(
        model_inputs(&server),
        ["first", "second", "second", "third"]
    );
    let mut client = gateway.client().await;
    let history = client
        .request(
            "chat.history",
            json!({"sessionKey": "agent:main:telegram:42"}),
        )
        .await;
    let texts: Vec<String> = history["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text_of)
        .collect();
    assert_eq!(
        texts,
        [
            "first",
            "first answer",
            "second",
            "second answer",
            "third",
            "third answer"
        ]
    );
    client.close().await;

    // A graceful stop mid-turn: the message is kept and answered once after the restart.
    setup.wait_journal_empty().await;
    let (_, fourth) = bot.private_message(42, "Ada", "fourth");
    stopping.reached(1).await;
    printed.push_str(&gateway.terminate());
    assert_eq!(bot.delivered(42).len(), 3);
    let gateway = Gateway::start(&setup);
    bot.wait_delivered(42, 4).await;
    let last = bot.delivered(42).pop().unwrap();
    assert_eq!(last.body["reply_parameters"]["message_id"], fourth);
    assert_eq!(bot.delivered_texts(42).pop().unwrap(), "fourth answer");
    printed.push_str(&gateway.terminate());
    assert_eq!(bot.delivered(42).len(), 4, "nothing was answered twice");
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_updates_are_skipped_and_a_bad_token_is_reported_without_the_token() {
    let server = LlmServer::start(vec![answer("still here")]).await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, "dm_policy = \"open\"");
    // A flood of an answer is cut off, not read whole.
    let flood = "x".repeat(17 << 20);
    bot.script_updates(vec![(
        200,
        json!({"ok": true, "result": [{"update_id": 1, "message": {"from": {"id": 43, "is_bot": false, "first_name": "Eve"}, "chat": {"id": 43, "type": "private"}, "text": flood}}]}),
    )]);
    drop(flood);
    let gateway = Gateway::start(&setup);
    bot.push_raw(json!({"message": "not an object"}));
    bot.push_raw(json!({"message": {"chat": {"id": "x"}, "text": 5}}));
    bot.push_raw(json!({"edited_message": {"chat": {"id": 1, "type": "private"}, "text": "edit"}}));
    bot.push_raw(json!({"message": {"from": {"id": 9, "is_bot": true}, "chat": {"id": 9, "type": "private"}, "text": "a bot"}}));
    bot.private_message(43, "Eve", "open door");
    bot.wait_delivered(43, 1).await;
    assert_eq!(model_inputs(&server), ["open door"]);
    let printed = gateway.terminate();
    assert!(
        printed.contains("larger than 16 MiB"),
        "the flood was refused"
    );
    setup.assert_secrets_nowhere(&printed);

    // A token the Bot API refuses: said in the status and the log, the token never shown.
    let wrong = FakeBotApi::start("someone-else:token").await;
    let setup = Setup::telegram(server.url(), &wrong, "");
    let gateway = Gateway::start(&setup);
    let mut status = Value::Null;
    for _ in 0..200 {
        let mut client = gateway.client().await;
        status = client.request("status", json!({})).await;
        client.close().await;
        if status["payload"]["channels"]["channels"]["telegram"]["state"] == "error" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let error = status["payload"]["channels"]["channels"]["telegram"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains(BOT_TOKEN_ENV), "{status}");
    // Asked again in a minute, then less and less often; said once as an error.
    assert_eq!(
        status["payload"]["channels"]["channels"]["telegram"]["retryInS"], 60,
        "{status}"
    );
    let printed = gateway.terminate();
    assert!(printed.contains("refused the token"), "{printed}");
    assert_eq!(printed.matches("refused the token").count(), 1, "{printed}");
    assert!(
        printed.contains("channel telegram: started"),
        "the banner lists the channel: {printed}"
    );
    setup.assert_secrets_nowhere(&printed);

    // Unset, the token is a start-up error naming the variable.
    let (code, _, err) = {
        let output = setup
            .clawcage()
            .env_remove(BOT_TOKEN_ENV)
            .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("export {BOT_TOKEN_ENV}=")), "{err}");
}

/// The tool result blocks the model got in its last message.
fn tool_results(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .and_then(|message| message["content"].as_array())
        .map(|blocks| {
            blocks
                .iter()
                .filter(|block| block["type"] == "tool_result")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The model's answer calling `exec` with `command` (call `id`).
fn exec_call(id: &str, command: &str) -> Reply {
    anthropic::message(&[anthropic::tool(id, "exec", json!({"command": command}))])
}

/// The `[channels.telegram]` rest and `[approvals]` of a gateway whose exec asks for every
/// program, approved people `allowed` (e.g. `42, 43`).
fn approving(allowed: &str) -> String {
    format!(
        "allow_from = [{allowed}]\n\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\nsafe_bins = []\n"
    )
}

/// The id of the approval request `posted` (`Approval needed (ID): …`), after checking that it
/// asks to run `command`.
fn approval_id(posted: &str, command: &str) -> String {
    assert!(posted.starts_with("Approval needed ("), "{posted}");
    assert!(posted.contains(command), "{posted}");
    posted["Approval needed (".len()..]
        .split(')')
        .next()
        .unwrap()
        .to_string()
}

/// Once the model got its `requests`-th request, nothing reaches `chat` for a while.
async fn nothing_posted_to(bot: &FakeBotApi, server: &LlmServer, chat: i64, requests: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.requests().len() < requests {
        assert!(
            std::time::Instant::now() < deadline,
            "the turn asked nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        bot.delivered_texts(chat).is_empty(),
        "{:?}",
        bot.delivered_texts(chat)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_request_is_posted_to_the_chat_and_answered_with_approve() {
    let server = LlmServer::start(vec![
        exec_call("call-1", "basename /tmp/approved-run"),
        answer("it printed approved-run"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, &approving("42, 43"));
    let gateway = Gateway::start(&setup);
    bot.private_message(42, "Ada", "run it");
    bot.wait_delivered(42, 1).await;
    let request = bot.delivered_texts(42).remove(0);
    assert!(
        request.starts_with("Approval needed ("),
        "{request}; the model got {:?}",
        server.bodies().get(1).map(tool_results)
    );
    let id = approval_id(&request, "basename /tmp/approved-run");
    // Only this conversation's requests, only by an approved person.
    bot.private_message(42, "Ada", "/approve apr-000000000000 allow-once");
    bot.wait_delivered(42, 2).await;
    assert!(
        bot.delivered_texts(42)[1].contains("no approval request apr-000000000000 waits"),
        "{:?}",
        bot.delivered_texts(42)
    );
    // The real id, from another approved person's own conversation: not theirs to answer.
    bot.private_message(43, "Eve", &format!("/approve {id} allow-once"));
    bot.wait_delivered(43, 1).await;
    assert!(
        bot.delivered_texts(43)[0].contains(&format!(
            "no approval request {id} waits in this conversation"
        )),
        "{:?}",
        bot.delivered_texts(43)
    );
    assert_eq!(server.requests().len(), 1, "the turn still waits");
    let group = -100_555;
    bot.group_message(
        group,
        66,
        "Mallory",
        &format!("/approve@{BOT_USERNAME} {id} allow-always"),
        json!({}),
    );
    bot.wait_delivered(group, 1).await;
    assert!(
        bot.delivered_texts(group)[0].contains("for approved people"),
        "{:?}",
        bot.delivered_texts(group)
    );
    assert_eq!(server.requests().len(), 1, "the turn still waits");
    // A word too many is refused, as in every front end (one parser), and decides nothing.
    bot.private_message(42, "Ada", &format!("/approve {id} allow-once please"));
    bot.wait_delivered(42, 3).await;
    assert!(
        bot.delivered_texts(42)[2].contains("`please` is one word too many; use /approve ID"),
        "{:?}",
        bot.delivered_texts(42)
    );
    assert_eq!(server.requests().len(), 1, "the turn still waits");

    bot.private_message(
        42,
        "Ada",
        &format!("/approve@{BOT_USERNAME} {id} allow-once"),
    );
    bot.wait_delivered(42, 5).await;
    let texts = bot.delivered_texts(42);
    assert!(texts.contains(&format!("{id}: allow-once")), "{texts:?}");
    assert!(
        texts.contains(&"it printed approved-run".to_string()),
        "{texts:?}"
    );
    let results = tool_results(&server.bodies()[1]);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].to_string().contains("approved-run"),
        "{results:?}"
    );
    assert_ne!(results[0]["is_error"], true, "{results:?}");
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

/// A turn of an approved person's private conversation that did not come from the chat (as a
/// turn resumed after a restart does not) still gets its approval request posted there, and
/// answered from the chat; the conversation of a person not approved gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_of_a_known_persons_conversation_is_posted_without_a_message_first() {
    let server = LlmServer::start(vec![
        exec_call("call-1", "basename /tmp/approved-run"),
        answer("it printed approved-run"),
        exec_call("call-2", "basename /tmp/stranger-run"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, &approving("42"));
    let gateway = Gateway::start(&setup);
    let mut client = gateway.client().await;
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": "agent:main:telegram:42", "message": "run it", "idempotencyKey": "r1"}),
        )
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    bot.wait_delivered(42, 1).await;
    let id = approval_id(
        &bot.delivered_texts(42).remove(0),
        "basename /tmp/approved-run",
    );
    bot.private_message(42, "Ada", &format!("/approve {id} allow-once"));
    bot.wait_delivered(42, 2).await;
    assert_eq!(bot.delivered_texts(42)[1], format!("{id}: allow-once"));
    let waited = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 30000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");

    // Chat 43 is nobody approved: its turn's request is not posted there.
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": "agent:main:telegram:43", "message": "run it", "idempotencyKey": "r2"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    nothing_posted_to(&bot, &server, 43, 3).await;
    assert_eq!(
        bot.delivered_texts(42).len(),
        2,
        "{:?}",
        bot.delivered_texts(42)
    );
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

/// A group an approved person wrote in gets its turns' approval requests posted there, also
/// from a gateway started again that has seen no message of the group since (the journal
/// remembers the conversation, as it does for whichever host of a cluster serves it), and
/// answered from the group; a group no approved person wrote in gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_an_approved_person_wrote_in_gets_its_approval_requests_after_a_restart() {
    let server = LlmServer::start(vec![
        answer("hello group"),
        exec_call("call-1", "basename /tmp/group-run"),
        answer("it printed group-run"),
        exec_call("call-2", "basename /tmp/quiet-group-run"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::telegram(server.url(), &bot, &approving("42"));
    let (group, quiet_group) = (-100_777_i64, -100_888_i64);
    let gateway = Gateway::start(&setup);
    bot.group_message(
        group,
        42,
        "Ada",
        &format!("@{BOT_USERNAME} hello"),
        json!({}),
    );
    bot.wait_delivered(group, 1).await;
    setup.wait_journal_empty().await;
    gateway.terminate();

    // Started again: no message of the group comes through this process.
    let gateway = Gateway::start(&setup);
    let mut client = gateway.client().await;
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": format!("agent:main:telegram:{group}"), "message": "run it", "idempotencyKey": "g1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    bot.wait_delivered(group, 2).await;
    let id = approval_id(
        &bot.delivered_texts(group).remove(1),
        "basename /tmp/group-run",
    );
    bot.group_message(
        group,
        42,
        "Ada",
        &format!("/approve@{BOT_USERNAME} {id} allow-once"),
        json!({}),
    );
    let waited = client
        .request("agent.wait", json!({"runId": run, "timeoutMs": 30000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    assert_eq!(
        waited["payload"]["text"], "it printed group-run",
        "{waited}"
    );
    bot.wait_delivered(group, 3).await;
    assert_eq!(
        bot.delivered_texts(group)[2],
        format!("{id}: allow-once"),
        "{:?}",
        bot.delivered_texts(group)
    );

    // A group no approved person wrote in: its turn's request is not posted there.
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": format!("agent:main:telegram:{quiet_group}"), "message": "run it", "idempotencyKey": "g2"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    nothing_posted_to(&bot, &server, quiet_group, 4).await;
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_tool_reaches_its_own_chat_and_only_the_configured_others() {
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "m-1",
            "message",
            json!({"content": "working on it"}),
        )]),
        anthropic::message(&[anthropic::tool(
            "m-2",
            "message",
            json!({"content": "psst", "channel": "telegram:999"}),
        )]),
        anthropic::message(&[anthropic::tool(
            "m-3",
            "message",
            json!({"content": "for the ops chat", "channel": "telegram:43"}),
        )]),
        answer("done"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let setup = Setup::new(
        server.url(),
        &format!(
            "[channels]\nmessage_targets = [\"telegram:43\"]\n\n[channels.telegram]\ntoken_env = \"{BOT_TOKEN_ENV}\"\napi_base = \"{}\"\nallow_from = [42]\n",
            bot.url()
        ),
    );
    let gateway = Gateway::start(&setup);
    bot.private_message(42, "Ada", "tell me as you go");
    bot.wait_delivered(42, 2).await;
    assert_eq!(bot.delivered_texts(42), ["working on it", "done"]);
    assert_eq!(bot.delivered_texts(43), ["for the ops chat"]);
    assert!(
        bot.delivered(999).is_empty(),
        "not a configured destination"
    );
    let bodies = server.bodies();
    let refused = tool_results(&bodies[2]);
    assert_eq!(refused[0]["is_error"], true, "{refused:?}");
    assert!(
        refused[0].to_string().contains("message_targets"),
        "{refused:?}"
    );
    assert_ne!(tool_results(&bodies[1])[0]["is_error"], true);
    assert_ne!(tool_results(&bodies[3])[0]["is_error"], true);
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}

fn hook_config(receiver: &str, reply_port_allowed: bool) -> String {
    let port = receiver.rsplit(':').next().unwrap();
    let allow = if reply_port_allowed {
        format!("[network]\nallow = [\"127.0.0.1:{port}\"]\n\n")
    } else {
        String::new()
    };
    format!(
        "{allow}[channels.webhooks.ops]\nsecret_env = \"{HOOK_SECRET_ENV}\"\nreply_url = \"{receiver}/reply\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replayed_stale_or_oversized_webhooks_are_refused_and_a_signed_one_is_answered() {
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "m-1",
            "message",
            json!({"content": "checking the deploy"}),
        )]),
        answer("all green"),
    ])
    .await;
    let receiver = HookReceiver::start().await;
    let setup = Setup::new(server.url(), &hook_config(receiver.url(), true));
    let gateway = Gateway::start(&setup);
    let url = gateway.hook_url("ops");
    let body = json!({"message": "deploy status?", "peer": "ada", "id": "req-1"})
        .to_string()
        .into_bytes();
    let now = unix_now();

    // Refusals first: none of these may start anything.
    let mut wrong = signed_headers("not-the-secret-at-all-0000", now, &body);
    let (status, text) = post(&url, &wrong, body.clone()).await;
    assert_eq!(status, 401, "{text}");
    wrong = signed_headers(HOOK_SECRET, now, b"another body");
    assert_eq!(post(&url, &wrong, body.clone()).await.0, 401);
    let stale = signed_headers(HOOK_SECRET, now - 400, &body);
    let (status, text) = post(&url, &stale, body.clone()).await;
    assert_eq!(status, 401);
    assert!(text.contains("replay window"), "{text}");
    let future = signed_headers(HOOK_SECRET, now + 400, &body);
    assert_eq!(post(&url, &future, body.clone()).await.0, 401);
    let (status, text) = post(&url, &[], body.clone()).await;
    assert_eq!(status, 401);
    assert!(text.contains("X-Clawcage-Signature"), "{text}");
    let mut garbled = signed_headers(HOOK_SECRET, now, &body);
    garbled[1].1 = "sha256=zz".to_string();
    assert_eq!(post(&url, &garbled, body.clone()).await.0, 401);
    let huge = vec![b'x'; 70 << 10];
    let (status, _) = post(&url, &signed_headers(HOOK_SECRET, now, &huge), huge).await;
    assert_eq!(status, 413);
    let malformed = b"{\"message\": ".to_vec();
    let (status, _) = post(
        &url,
        &signed_headers(HOOK_SECRET, now, &malformed),
        malformed,
    )
    .await;
    assert_eq!(status, 400);
    let bad_peer = json!({"message": "hi", "peer": "../etc"})
        .to_string()
        .into_bytes();
    let (status, _) = post(&url, &signed_headers(HOOK_SECRET, now, &bad_peer), bad_peer).await;
    assert_eq!(status, 400);
    let (status, _) = post(
        &gateway.hook_url("nope"),
        &signed_headers(HOOK_SECRET, now, &body),
        body.clone(),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        clawcage_tests::channels::get_status(&url).await,
        405,
        "webhooks take POST only"
    );
    assert!(server.requests().is_empty(), "nothing reached the model");
    let mut client = gateway.client().await;
    let sessions = client.request("sessions.list", json!({})).await;
    assert_eq!(sessions["payload"]["sessions"], json!([]), "{sessions}");

    // A signed request: accepted, answered by a signed POST to reply_url.
    let signed = signed_headers(HOOK_SECRET, now, &body);
    let (status, text) = post(&url, &signed, body.clone()).await;
    assert_eq!(status, 202, "{text}");
    let accepted: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(accepted["sessionKey"], "agent:main:webhook:ops:ada");
    // The same signed request again is a replay.
    let (status, text) = post(&url, &signed, body.clone()).await;
    assert_eq!(status, 401);
    assert!(text.contains("replay"), "{text}");
    let received = receiver.wait_for(2).await;
    // The message tool's text first (during the turn), then the reply.
    let progress: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(progress["kind"], "message");
    assert_eq!(progress["text"], "checking the deploy");
    assert_eq!(progress["peer"], "ada");
    let reply = &received[1];
    assert_eq!(reply.path, "/reply");
    let payload: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(payload["text"], "all green");
    assert_eq!(payload["inReplyTo"], "req-1");
    assert_eq!(payload["peer"], "ada");
    assert_eq!(payload["runId"], accepted["runId"]);
    let timestamp = reply.header("x-clawcage-timestamp").unwrap();
    assert!(timestamp.parse::<u64>().unwrap().abs_diff(unix_now()) < 300);
    let mut signed_message = format!("{timestamp}.").into_bytes();
    signed_message.extend_from_slice(&reply.body);
    assert_eq!(
        reply.header("x-clawcage-signature").unwrap(),
        format!(
            "sha256={}",
            hex::encode(hmac_sha256(HOOK_SECRET.as_bytes(), &signed_message))
        )
    );
    assert_eq!(model_inputs(&server)[0], "deploy status?");
    assert_eq!(server.requests().len(), 2);
    let sessions = client.request("sessions.list", json!({})).await;
    let keys: Vec<&str> = sessions["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|session| session["key"].as_str())
        .collect();
    assert_eq!(keys, ["agent:main:webhook:ops:ada"]);
    client.close().await;
    let mut printed = gateway.terminate();
    // The replay cache survives a restart: the same request inside its window is still refused.
    let gateway = Gateway::start(&setup);
    let (status, text) = post(&gateway.hook_url("ops"), &signed, body.clone()).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("replay"), "{text}");
    assert_eq!(server.requests().len(), 2, "nothing new reached the model");
    printed.push_str(&gateway.terminate());
    setup.assert_secrets_nowhere(&printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_reply_to_a_host_off_the_allow_list_is_refused_and_reported() {
    let server = LlmServer::start(vec![answer("nobody will get this")]).await;
    let receiver = HookReceiver::start().await;
    let setup = Setup::new(server.url(), &hook_config(receiver.url(), false));
    let gateway = Gateway::start(&setup);
    let body = json!({"message": "ping"}).to_string().into_bytes();
    let (status, text) = post(
        &gateway.hook_url("ops"),
        &signed_headers(HOOK_SECRET, unix_now(), &body),
        body,
    )
    .await;
    assert_eq!(status, 202, "{text}");
    let mut out = String::new();
    for _ in 0..400 {
        out = setup.run(&["gateway", "status"]).1;
        if out.contains("could not be delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(out.contains("1 replies could not be delivered"), "{out}");
    assert!(out.contains("webhook:ops"), "{out}");
    assert!(out.contains("[network] allow"), "{out}");
    assert!(receiver.received().is_empty(), "the policy sent nothing");
    let printed = gateway.terminate();
    setup.assert_secrets_nowhere(&printed);
}
