//! Secret values in the model's own text are scrubbed everywhere, end to end: `clawcage gateway`
//! as a process beside the scripted LLM server (the Anthropic wire format, streamed in 7-byte
//! network chunks with each secret cut across two `text_delta` events), a fake Telegram Bot API
//! and a webhook receiver, all on 127.0.0.1. The model repeats the Telegram bot token, a webhook
//! secret, the provider API key and a `[[network.secrets]]` value — in streamed text, in a tool
//! call's arguments, in a compaction summary, in a `message` tool text — and a person pastes
//! one. None of them may appear in the gateway's events (the streamed deltas, which still add up
//! to the final text), `chat.history`, the Telegram messages, the signed webhook replies, what
//! the model is sent, any file under the state directory or the workspace, or the gateway's
//! output.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clawcage_tests::channels::{FakeBotApi, HookReceiver, post, signed_headers, unix_now};
use clawcage_tests::files_beneath;
use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic};
use serde_json::{Value, json};

const TOKEN: &str = "gateway-redaction-token-0123456789";
const BOT_TOKEN: &str = "7000002:AAE-redaction-bot-token-Qw8ZxR4mN";
const BOT_TOKEN_ENV: &str = "CLAWCAGE_TEST_TELEGRAM_TOKEN";
const HOOK_SECRET: &str = "hook-secret-redaction-0a1b2c3d4e5f";
const HOOK_SECRET_ENV: &str = "CLAWCAGE_TEST_HOOK_SECRET";
const API_KEY: &str = "sk-ant-redaction-test-key-9f8e7d6c5b4a";
const NET_SECRET: &str = "net-secret-redaction-5566778899aabb";
const NET_SECRET_ENV: &str = "CLAWCAGE_TEST_NET_SECRET";
const SECRETS: [&str; 4] = [BOT_TOKEN, HOOK_SECRET, API_KEY, NET_SECRET];
const WAIT: Duration = Duration::from_secs(60);

fn cache_dir() -> PathBuf {
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    clawcage_tests::cli_state::shared_state_dir().join("cache")
}

/// An Anthropic stream of one text block whose `text_delta`s are exactly `pieces`, sent in
/// 7-byte network chunks.
fn deltas(pieces: &[String]) -> Reply {
    let mut events = Vec::new();
    let mut push = |name: &str, data: Value| {
        events.push(format!("event: {name}\ndata: {data}\n\n"));
    };
    push(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_r", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
    );
    push(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    for piece in pieces {
        push(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        );
    }
    push(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    push(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 20}}),
    );
    push("message_stop", json!({"type": "message_stop"}));
    Reply::Sse {
        text: events.concat(),
        chunk: 7,
    }
}

/// Text deltas in which every secret is cut in two, the halves in neighbouring deltas.
fn leaking_stream(lead: &str) -> Reply {
    let mut pieces = vec![format!("{lead} ")];
    for (index, secret) in SECRETS.iter().enumerate() {
        let (head, tail) = secret.split_at(secret.len() / 2);
        pieces.push(format!("secret {index}: {head}"));
        pieces.push(format!("{tail}; "));
    }
    pieces.push("done.".to_string());
    deltas(&pieces)
}

/// `text` holds none of the secrets.
fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} holds {secret}: {text}");
        let (head, tail) = secret.split_at(secret.len() / 2);
        assert!(
            !text.contains(head) && !text.contains(tail),
            "{what} holds half of {secret}: {text}"
        );
    }
}

struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(llm: &str, bot: &FakeBotApi, receiver: &str) -> Setup {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(cache_dir()).unwrap();
        std::os::unix::fs::symlink(cache_dir(), state.join("cache")).unwrap();
        let port = receiver.rsplit(':').next().unwrap();
        let config = root.path().join("clawcage.toml");
        std::fs::write(
            &config,
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n\
                 [models.\"claude-test\"]\ncontext_window = 200000\n\n\
                 [subagents]\nenabled = false\n\n[cron]\nenabled = false\n\n\
                 [network]\nallow = [\"127.0.0.1:{port}\", \"search.example.com\"]\n\n\
                 [[network.secrets]]\nhost = \"search.example.com\"\nheader = \"X-Token\"\nenv = \"{NET_SECRET_ENV}\"\n\n\
                 [channels.telegram]\ntoken_env = \"{BOT_TOKEN_ENV}\"\napi_base = \"{}\"\npoll_timeout_secs = 2\nallow_from = [42]\n\n\
                 [channels.webhooks.ops]\nsecret_env = \"{HOOK_SECRET_ENV}\"\nreply_url = \"{receiver}/reply\"\n",
                bot.url()
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

    fn gateway(&self) -> GatewayProcess {
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
            .env("ANTHROPIC_API_KEY", API_KEY)
            .env(BOT_TOKEN_ENV, BOT_TOKEN)
            .env(HOOK_SECRET_ENV, HOOK_SECRET)
            .env(NET_SECRET_ENV, NET_SECRET)
            .args(["-v", "gateway", "--bind", "127.0.0.1:0", "--token", TOKEN]);
        GatewayProcess::start(command)
    }

    /// No secret, nor half of one, in any file under the state directory (the shared component
    /// cache aside) or the workspace.
    fn assert_files_clean(&self) {
        let files = files_beneath(&[&self.state, &self.workspace]);
        for (path, bytes) in &files {
            assert_clean(&path.display().to_string(), &String::from_utf8_lossy(bytes));
        }
        assert!(
            files.len() >= 3,
            "the state directory holds files to search"
        );
    }
}

fn send_params(session: &str, message: &str, idempotency: &str) -> Value {
    json!({"sessionKey": session, "message": message, "idempotencyKey": idempotency})
}

fn is_end(event: &Value) -> bool {
    event["stream"] == "lifecycle"
        && matches!(event["data"]["phase"].as_str(), Some("end" | "error"))
}

/// Sends `message` to `session` and returns the run's agent events up to its end.
async fn turn(client: &mut GatewayClient, session: &str, message: &str, id: &str) -> Vec<Value> {
    let sent = client
        .request("chat.send", send_params(session, message, id))
        .await;
    let run = sent["payload"]["runId"].as_str().unwrap().to_string();
    client
        .agent_events_until(WAIT, |event| {
            is_end(event) && event["runId"] == run.as_str()
        })
        .await
}

/// The run's streamed text and its final text.
fn streamed_and_final(events: &[Value]) -> (String, String) {
    let streamed: String = events
        .iter()
        .filter(|event| event["stream"] == "assistant")
        .filter_map(|event| event["data"]["delta"].as_str())
        .collect();
    let end = events.last().unwrap();
    assert_eq!(end["data"]["phase"], "end", "{end}");
    (streamed, end["data"]["text"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_in_the_models_text_reach_no_output_and_no_file() {
    let refused = Reply::status(
        400,
        "prompt is too long: 210000 tokens > 200000 maximum",
        &[],
    );
    let server = LlmServer::start(vec![
        // The web chat: a streamed answer repeating every secret…
        leaking_stream("Here they are:"),
        // …a tool call writing them into the workspace…
        anthropic::message(&[anthropic::tool(
            "w-1",
            "write_file",
            json!({"path": "notes.txt", "content": format!("token={BOT_TOKEN} key={API_KEY} net={NET_SECRET} hook={HOOK_SECRET}")}),
        )]),
        anthropic::message(&[anthropic::text("Saved.")]),
        // …and a context-length refusal, whose compaction summary repeats them.
        refused,
        anthropic::message(&[anthropic::text(&format!(
            "S: the user gave {BOT_TOKEN}; keys {API_KEY}, {NET_SECRET}, {HOOK_SECRET}."
        ))]),
        leaking_stream("After the summary:"),
        // Telegram.
        leaking_stream("Telegram:"),
        // The webhook: a `message` tool text, then the reply.
        anthropic::message(&[anthropic::tool(
            "m-1",
            "message",
            json!({"content": format!("progress {API_KEY} {BOT_TOKEN}")}),
        )]),
        leaking_stream("Webhook:"),
    ])
    .await;
    let bot = FakeBotApi::start(BOT_TOKEN).await;
    let receiver = HookReceiver::start().await;
    let setup = Setup::new(server.url(), &bot, receiver.url());
    let gateway = setup.gateway();
    let (mut client, _) = GatewayClient::connect(gateway.addr, TOKEN).await;
    let session = "agent:main:web:redaction";

    // A person pastes the bot token; the model repeats every secret, each cut across deltas.
    let events = turn(
        &mut client,
        session,
        &format!("my bot token is {BOT_TOKEN}"),
        "r1",
    )
    .await;
    let (streamed, final_text) = streamed_and_final(&events);
    assert_eq!(streamed, final_text, "the deltas add up to the final text");
    for label in [
        BOT_TOKEN_ENV,
        HOOK_SECRET_ENV,
        "ANTHROPIC_API_KEY",
        NET_SECRET_ENV,
    ] {
        assert!(
            final_text.contains(&format!("[redacted: {label}]")),
            "{label}: {final_text}"
        );
    }
    assert_clean("the first run's events", &Value::from(events).to_string());

    let events = turn(&mut client, session, "write them down", "r2").await;
    assert_clean("the tool call's events", &Value::from(events).to_string());
    let notes = std::fs::read_to_string(setup.workspace.join("notes.txt")).unwrap();
    assert!(
        notes.contains("[redacted: CLAWCAGE_TEST_TELEGRAM_TOKEN]"),
        "{notes}"
    );

    let events = turn(&mut client, session, "and now?", "r3").await;
    let compaction: Vec<&Value> = events
        .iter()
        .filter(|event| event["stream"] == "compaction")
        .collect();
    assert_eq!(compaction.len(), 1, "{events:#?}");
    assert!(
        compaction[0]["data"]["summary"]
            .as_str()
            .unwrap()
            .contains("[redacted: ANTHROPIC_API_KEY]"),
        "{compaction:?}"
    );
    let (streamed, final_text) = streamed_and_final(&events);
    assert_eq!(streamed, final_text);
    assert_clean(
        "the compacted run's events",
        &Value::from(events).to_string(),
    );

    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await;
    assert!(
        history["payload"]["messages"].as_array().is_some(),
        "{history}"
    );
    assert_clean("chat.history", &history.to_string());

    // Telegram: the person pastes the webhook secret; the reply repeats everything.
    bot.private_message(42, "Ada", &format!("the hook secret is {HOOK_SECRET}"));
    bot.wait_delivered(42, 1).await;
    let delivered = bot.delivered_texts(42).concat();
    assert!(
        delivered.contains("[redacted: CLAWCAGE_TEST_TELEGRAM_TOKEN]"),
        "{delivered}"
    );
    assert_clean("the Telegram messages", &delivered);

    // A signed webhook: the `message` tool's text and the reply are both scrubbed and signed.
    let body = json!({"message": format!("status? {NET_SECRET}"), "peer": "ada", "id": "req-1"})
        .to_string()
        .into_bytes();
    let url = format!("http://{}/hooks/ops", gateway.addr);
    let (status, text) = post(&url, &signed_headers(HOOK_SECRET, unix_now(), &body), body).await;
    assert_eq!(status, 202, "{text}");
    let received = receiver.wait_for(2).await;
    let progress: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(
        progress["text"],
        "progress [redacted: ANTHROPIC_API_KEY] [redacted: CLAWCAGE_TEST_TELEGRAM_TOKEN]"
    );
    let reply: Value = serde_json::from_slice(&received[1].body).unwrap();
    assert!(
        reply["text"]
            .as_str()
            .unwrap()
            .contains("[redacted: CLAWCAGE_TEST_HOOK_SECRET]"),
        "{reply}"
    );
    for request in &received {
        assert_clean("a webhook POST", &String::from_utf8_lossy(&request.body));
    }

    // The model was never sent a secret, not even the ones people pasted.
    assert_eq!(server.remaining(), 0, "every scripted reply was used");
    for body in server.bodies() {
        assert_clean("a request to the model", &body.to_string());
    }

    client.close().await;
    let (_, printed) = gateway.terminate();
    assert_clean("the gateway's output", &printed);
    setup.assert_files_clean();
}

/// An OpenAI chat-completions stream whose content deltas are exactly `pieces`, then (if any)
/// one tool call, sent in 5-byte network chunks.
fn openai_deltas(pieces: &[String], call: Option<(&str, &str, &str)>) -> Reply {
    let mut events = Vec::new();
    let mut push = |data: Value| events.push(format!("data: {data}\n\n"));
    push(
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
    );
    for piece in pieces {
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}),
        );
    }
    if let Some((id, name, arguments)) = call {
        push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}, "finish_reason": null}]}),
        );
    }
    push(
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": if call.is_some() { "tool_calls" } else { "stop" }}]}),
    );
    push(
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}),
    );
    events.push("data: [DONE]\n\n".to_string());
    Reply::Sse {
        text: events.concat(),
        chunk: 5,
    }
}

/// `clawcage run` over the OpenAI wire format: the provider key and the Brave key (a credential
/// the process holds) repeated by the model, cut across deltas and inside a tool call, reach
/// neither stdout, stderr, the transcript, the audit log nor the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_over_the_openai_format_prints_and_stores_no_secret() {
    const OPENAI_KEY: &str = "sk-openai-redaction-key-31415926535";
    const BRAVE_KEY: &str = "BSA-brave-redaction-key-2718281828";
    let cut = |secret: &str| {
        let (head, tail) = secret.split_at(secret.len() / 2);
        (head.to_string(), tail.to_string())
    };
    let (key_head, key_tail) = cut(OPENAI_KEY);
    let (brave_head, brave_tail) = cut(BRAVE_KEY);
    let arguments =
        json!({"path": "keys.txt", "content": format!("{OPENAI_KEY} {BRAVE_KEY}")}).to_string();
    let server = LlmServer::start(vec![
        openai_deltas(
            &[format!("Writing {key_head}"), format!("{key_tail} down. ")],
            Some(("call_1", "write_file", &arguments)),
        ),
        openai_deltas(
            &[
                format!("Done: {brave_head}"),
                format!("{brave_tail} and {key_head}"),
                key_tail.clone(),
            ],
            None,
        ),
    ])
    .await;
    let state = clawcage_tests::cli_state::private_state_dir();
    let workspace = tempfile::tempdir().unwrap();
    let output = tokio::task::spawn_blocking({
        let (url, state, workspace) = (
            server.url().to_string(),
            state.path().to_path_buf(),
            workspace.path().to_path_buf(),
        );
        move || {
            Command::new(env!("CARGO_BIN_EXE_clawcage"))
                .args([
                    "run",
                    &format!("remember {BRAVE_KEY}"),
                    "--provider",
                    "openai",
                ])
                .args([
                    "--model",
                    "gpt-test",
                    "--base-url",
                    &url,
                    "--session",
                    "redaction",
                ])
                .arg("--workspace")
                .arg(&workspace)
                .arg("--state-dir")
                .arg(&state)
                .env_remove("RUST_LOG")
                .env_remove("ANTHROPIC_API_KEY")
                .env("OPENAI_API_KEY", OPENAI_KEY)
                .env("BRAVE_API_KEY", BRAVE_KEY)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(output.status.success(), "{stderr}");
    let secrets = [OPENAI_KEY, BRAVE_KEY];
    let clean = |what: &str, text: &str| {
        for secret in secrets {
            let (head, tail) = secret.split_at(secret.len() / 2);
            assert!(
                !text.contains(head) && !text.contains(tail),
                "{what} holds (part of) {secret}: {text}"
            );
        }
    };
    assert_eq!(
        stdout,
        "Done: [redacted: BRAVE_API_KEY] and [redacted: OPENAI_API_KEY]\n"
    );
    clean("stderr", &stderr);
    for body in server.bodies() {
        clean("a request to the model", &body.to_string());
    }
    let keys = std::fs::read_to_string(workspace.path().join("keys.txt")).unwrap();
    assert_eq!(keys, "[redacted: OPENAI_API_KEY] [redacted: BRAVE_API_KEY]");
    let files = files_beneath(&[state.path()]);
    for (path, bytes) in &files {
        clean(&path.display().to_string(), &String::from_utf8_lossy(bytes));
    }
    assert!(files.len() >= 2, "a transcript and an audit log to search");
}
