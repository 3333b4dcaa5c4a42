//! The context window and the output budget against scripted servers: the `max_tokens` a
//! request carries is bounded by what the window leaves beside the prompt (both wire formats);
//! a window the configuration does not give is read from the model's server — llama.cpp
//! (`/v1/models` `meta.n_ctx`, older builds `/props`), vLLM (`max_model_len`), Ollama
//! (`/api/show`) — once per process, shown by `/usage`; a server that answers 404 or never
//! answers costs one short request and the turn goes on; llama.cpp's overflow error teaches the
//! window too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::context::{ModelWindow, UNKNOWN_MODEL_WINDOW};
use clawcage_agent::provider::window::{PROBE_TIMEOUT, ServerWindow};
use clawcage_agent::provider::{self, NoEvents, ProviderConfig, ProviderKind};
use clawcage_agent::{
    AgentConfig, AgentLoop, ContextPolicy, Provider, Sessions, ToolRegistry, WindowSource,
};
use clawcage_core::ChatMessage;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai};
use serde_json::{Value, json};

use crate::agent_loop::settings;

fn config() -> AgentConfig {
    AgentConfig {
        system_prompt: "You help.".to_string(),
        ..AgentConfig::default()
    }
}

/// An OpenAI-compatible provider at `server`'s `/v1`, as a llama.cpp, vLLM or Ollama base URL
/// is written.
fn local_openai(server: &LlmServer, model: &str) -> Arc<dyn Provider> {
    let mut settings = settings(server, model);
    settings.base_url = format!("{}/v1", server.url());
    provider::build(ProviderConfig::OpenAi(settings), &[]).unwrap()
}

/// A policy for `model` at `server` whose window the configuration does not give.
fn asking_policy(server: &LlmServer, model: &str, reply_tokens: u64) -> ContextPolicy {
    let asked = ServerWindow::new(
        ProviderKind::OpenAi,
        format!("{}/v1", server.url()),
        model,
        None,
    );
    ContextPolicy::for_models(
        vec![ModelWindow::new(model, None, Some(asked))],
        reply_tokens,
    )
    .unwrap()
}

/// The `max_tokens` of each chat request (the window questions carry none).
fn sent_max_tokens(server: &LlmServer) -> Vec<u64> {
    server
        .requests()
        .iter()
        .filter(|request| {
            request.path.ends_with("/chat/completions") || request.path.ends_with("/messages")
        })
        .map(|request| request.body["max_tokens"].as_u64().expect("max_tokens"))
        .collect()
}

fn paths(server: &LlmServer) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .map(|request| request.path)
        .collect()
}

#[tokio::test]
async fn max_tokens_is_what_the_window_leaves_beside_the_prompt_in_both_formats() {
    for anthropic_format in [false, true] {
        let server = LlmServer::start_answering_window_questions(vec![if anthropic_format {
            anthropic::message(&[anthropic::text("hi")])
        } else {
            openai::message(Some("hi"), &[])
        }])
        .await;
        let provider = if anthropic_format {
            provider::build(
                ProviderConfig::Anthropic(settings(&server, "claude-test")),
                &[],
            )
            .unwrap()
        } else {
            local_openai(&server, "smollm2")
        };
        // A 4096-token window with the default max_tokens of 8192, as `[models."smollm2"]
        // context_window = 4096` gives it.
        let policy = ContextPolicy::new(4096, 8192);
        let agent =
            AgentLoop::new(provider, ToolRegistry::new(), config()).with_context(policy.clone());
        let mut history = vec![ChatMessage::user("Say hi")];
        let estimate = agent.estimate(&history).unwrap();
        agent.run_turn(&mut history, &NoEvents).await.unwrap();
        let sent = sent_max_tokens(&server);
        assert_eq!(
            sent,
            vec![4096 - estimate - policy.margin()],
            "anthropic: {anthropic_format}"
        );
        assert!(sent[0] < 4096 && sent[0] > policy.reply_reserve());
    }
}

#[tokio::test]
async fn a_long_prompt_leaves_the_reply_its_reserve_and_a_small_max_tokens_is_kept() {
    // The prompt takes most of the window: the reply still gets at least the reserve the fit
    // check kept for it (a quarter of the window), never a sliver.
    let server =
        LlmServer::start_answering_window_questions(vec![openai::message(Some("ok"), &[])]).await;
    let policy = ContextPolicy::new(4096, 8192);
    let agent = AgentLoop::new(local_openai(&server, "m"), ToolRegistry::new(), config())
        .with_context(policy.clone());
    // About 2700 tokens: below the compaction threshold (2867), above what leaves the reserve.
    let mut history = vec![ChatMessage::user("word ".repeat(2150))];
    let estimate = agent.estimate(&history).unwrap();
    assert!(estimate < policy.compact_at(), "{estimate}");
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    let sent = sent_max_tokens(&server)[0];
    assert_eq!(
        sent,
        (4096 - estimate - policy.margin()).max(policy.reply_reserve())
    );
    assert!(sent >= policy.reply_reserve(), "{sent}");
    assert!(estimate + sent <= 4096, "{estimate} + {sent}");

    // A configured max_tokens smaller than the room is sent as it is.
    let server =
        LlmServer::start_answering_window_questions(vec![anthropic::message(&[anthropic::text(
            "ok",
        )])])
        .await;
    let mut small = settings(&server, "claude-test");
    small.max_tokens = 300;
    let provider = provider::build(ProviderConfig::Anthropic(small), &[]).unwrap();
    let agent = AgentLoop::new(provider, ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(200_000, 300));
    agent
        .run_turn(&mut vec![ChatMessage::user("hi")], &NoEvents)
        .await
        .unwrap();
    assert_eq!(sent_max_tokens(&server), vec![300]);
}

#[tokio::test]
async fn the_window_is_read_from_a_llama_cpp_server_once_and_shown_by_usage() {
    let server = LlmServer::start_answering_window_questions(vec![
        Reply::json(
            json!({"object": "list", "data": [{"id": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "object": "model", "owned_by": "llamacpp",
            "meta": {"n_ctx": 4096, "n_ctx_train": 8192, "n_vocab": 49152}}]}),
        ),
        openai::message(Some("one"), &[]),
        openai::message(Some("two"), &[]),
    ])
    .await;
    let policy = asking_policy(&server, "smollm2", 8192);
    assert_eq!(policy.window, UNKNOWN_MODEL_WINDOW);
    assert_eq!(policy.window_source, WindowSource::Default);
    let agent = AgentLoop::new(
        local_openai(&server, "smollm2"),
        ToolRegistry::new(),
        config(),
    )
    .with_context(policy);
    let sessions = Sessions::new(agent, None, 200);
    sessions
        .send_user("s", "Say hi", Arc::new(NoEvents))
        .await
        .unwrap();
    sessions
        .send_user("s", "Again", Arc::new(NoEvents))
        .await
        .unwrap();
    // Asked once, before the first model call; the second turn asks nothing.
    assert_eq!(
        paths(&server),
        ["/v1/models", "/v1/chat/completions", "/v1/chat/completions"]
    );
    let policy = sessions.agent().context_policy().unwrap();
    assert_eq!(
        (policy.window, policy.window_source),
        (4096, WindowSource::Server)
    );
    for sent in sent_max_tokens(&server) {
        assert!(sent < 4096 - policy.margin(), "{sent}");
    }
    let report = sessions.usage_report("s");
    assert!(
        report.contains("context window: 4096 tokens (from the server)"),
        "{report}"
    );
}

#[tokio::test]
async fn vllm_ollama_and_older_llama_cpp_answers_give_the_window() {
    // (the answers to the questions, the window expected, the paths asked)
    let cases: Vec<(Vec<Reply>, u64, Vec<&str>)> = vec![
        // vLLM: several models, the one asked about carries max_model_len.
        (
            vec![Reply::json(json!({"object": "list", "data": [
                {"id": "other", "max_model_len": 2048},
                {"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 16384}]}))],
            16384,
            vec!["/v1/models"],
        ),
        // Ollama: the list says nothing; /api/show has num_ctx in the parameters.
        (
            vec![
                Reply::json(
                    json!({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "library"}]}),
                ),
                Reply::json(
                    json!({"parameters": "num_ctx                        8192\nstop \"<|im_end|>\"",
                    "model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}}),
                ),
            ],
            8192,
            vec!["/v1/models", "/api/show"],
        ),
        // Ollama without num_ctx: the model's own context_length.
        (
            vec![
                Reply::json(
                    json!({"object": "list", "data": [{"id": "m", "owned_by": "library"}]}),
                ),
                Reply::json(json!({"model_info": {"llama.context_length": 131072}})),
            ],
            131_072,
            vec!["/v1/models", "/api/show"],
        ),
        // An older llama.cpp: no n_ctx in the list, /props has the slot's.
        (
            vec![
                Reply::json(
                    json!({"data": [{"id": "x.gguf", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}]}),
                ),
                Reply::json(
                    json!({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}),
                ),
            ],
            2048,
            vec!["/v1/models", "/props"],
        ),
    ];
    for (answers, window, asked) in cases {
        let mut replies = answers;
        replies.push(openai::message(Some("hi"), &[]));
        let server = LlmServer::start_answering_window_questions(replies).await;
        let agent = AgentLoop::new(local_openai(&server, "m"), ToolRegistry::new(), config())
            .with_context(asking_policy(&server, "m", 8192));
        agent
            .run_turn(&mut vec![ChatMessage::user("hi")], &NoEvents)
            .await
            .unwrap();
        let policy = agent.context_policy().unwrap();
        assert_eq!(
            (policy.window, policy.window_source),
            (window, WindowSource::Server)
        );
        let mut expected: Vec<String> = asked.iter().map(|path| path.to_string()).collect();
        expected.push("/v1/chat/completions".to_string());
        assert_eq!(paths(&server), expected);
        if asked.contains(&"/api/show") {
            let show = &server.requests()[1];
            assert_eq!(show.body["model"], "m");
        }
    }
}

#[tokio::test]
async fn a_server_that_answers_404_or_garbage_costs_one_request_and_the_table_is_used() {
    let not_found = || Reply::status(404, "File Not Found", &[]);
    let cases: Vec<(Vec<Reply>, Vec<&str>)> = vec![
        // Not a server that lists models: one request, nothing more asked.
        (vec![not_found()], vec!["/v1/models"]),
        (
            vec![Reply::Json {
                status: 200,
                headers: Vec::new(),
                body: "<html>not a list</html>".to_string(),
            }],
            vec!["/v1/models"],
        ),
        // A list without a usable window: Ollama's /api/show is tried, and answers 404.
        (
            vec![
                Reply::json(json!({"data": [{"id": "qwen2.5:7b", "max_model_len": -5}]})),
                not_found(),
            ],
            vec!["/v1/models", "/api/show"],
        ),
    ];
    for (answers, asked) in cases {
        let mut replies = answers;
        replies.push(openai::message(Some("hi"), &[]));
        // A model in the table: its window stands.
        let server = LlmServer::start_answering_window_questions(replies).await;
        let agent = AgentLoop::new(
            local_openai(&server, "qwen2.5:7b"),
            ToolRegistry::new(),
            config(),
        )
        .with_context(asking_policy(&server, "qwen2.5:7b", 8192));
        agent
            .run_turn(&mut vec![ChatMessage::user("hi")], &NoEvents)
            .await
            .unwrap();
        let mut expected: Vec<String> = asked.iter().map(|path| path.to_string()).collect();
        expected.push("/v1/chat/completions".to_string());
        assert_eq!(paths(&server), expected);
        let policy = agent.context_policy().unwrap();
        assert_eq!(
            (policy.window, policy.window_source),
            (32_768, WindowSource::Table)
        );
    }
}

#[tokio::test]
async fn a_server_that_never_answers_the_question_delays_the_first_turn_only_briefly() {
    let server = LlmServer::start_answering_window_questions(vec![
        Reply::Hang,
        openai::message(Some("one"), &[]),
        openai::message(Some("two"), &[]),
    ])
    .await;
    let agent = AgentLoop::new(
        local_openai(&server, "mystery"),
        ToolRegistry::new(),
        config(),
    )
    .with_context(asking_policy(&server, "mystery", 8192));
    let started = Instant::now();
    let mut history = vec![ChatMessage::user("hi")];
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    let first = started.elapsed();
    assert!(
        first >= PROBE_TIMEOUT - Duration::from_millis(100),
        "{first:?}"
    );
    assert!(first < PROBE_TIMEOUT + Duration::from_secs(2), "{first:?}");
    // The answer never came: the next turn does not ask again, and costs no wait.
    history.push(ChatMessage::user("again"));
    let started = Instant::now();
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        paths(&server),
        ["/v1/models", "/v1/chat/completions", "/v1/chat/completions"]
    );
    let policy = agent.context_policy().unwrap();
    assert_eq!(
        (policy.window, policy.window_source),
        (UNKNOWN_MODEL_WINDOW, WindowSource::Default)
    );
}

#[tokio::test]
async fn an_endless_or_deeply_nested_answer_is_refused_and_the_turn_goes_on() {
    for answer in [
        // 64 MiB of a model list that never closes: read up to the cap, then given up.
        Reply::Endless {
            content_type: "application/json".to_string(),
            fill: b'[',
            total: 64 << 20,
        },
        // Nesting deeper than the JSON reader follows.
        Reply::Json {
            status: 200,
            headers: Vec::new(),
            body: format!("{{\"data\": {}{}", "[".repeat(100_000), "]".repeat(100_000)),
        },
    ] {
        let server = LlmServer::start_answering_window_questions(vec![
            answer,
            openai::message(Some("hi"), &[]),
        ])
        .await;
        let agent = AgentLoop::new(local_openai(&server, "m"), ToolRegistry::new(), config())
            .with_context(asking_policy(&server, "m", 8192));
        let started = Instant::now();
        agent
            .run_turn(&mut vec![ChatMessage::user("hi")], &NoEvents)
            .await
            .unwrap();
        assert!(
            started.elapsed() < PROBE_TIMEOUT + Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(paths(&server), ["/v1/models", "/v1/chat/completions"]);
        let policy = agent.context_policy().unwrap();
        assert_eq!(
            (policy.window, policy.window_source),
            (UNKNOWN_MODEL_WINDOW, WindowSource::Default)
        );
    }
}

#[tokio::test]
async fn a_configured_window_is_not_asked_and_wins() {
    let server =
        LlmServer::start_answering_window_questions(vec![openai::message(Some("hi"), &[])]).await;
    let asked = ServerWindow::new(
        ProviderKind::OpenAi,
        format!("{}/v1", server.url()),
        "smollm2",
        None,
    );
    let policy = ContextPolicy::for_models(
        vec![ModelWindow::new("smollm2", Some(4096), Some(asked))],
        8192,
    )
    .unwrap();
    assert!(!policy.asks_servers());
    let agent = AgentLoop::new(
        local_openai(&server, "smollm2"),
        ToolRegistry::new(),
        config(),
    )
    .with_context(policy);
    agent
        .run_turn(&mut vec![ChatMessage::user("hi")], &NoEvents)
        .await
        .unwrap();
    assert_eq!(paths(&server), ["/v1/chat/completions"]);
    assert_eq!(
        agent.context_policy().unwrap().window_source,
        WindowSource::Configured
    );
}

/// llama.cpp's answer to a prompt longer than its window.
fn llama_overflow(prompt_tokens: u64, window: u64) -> Reply {
    Reply::Json {
        status: 400,
        headers: Vec::new(),
        body: json!({"error": {"code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": prompt_tokens, "n_ctx": window}})
        .to_string(),
    }
}

#[tokio::test]
async fn llama_cpps_overflow_error_names_the_window_which_is_then_kept_to() {
    let server = LlmServer::start_answering_window_questions(vec![
        Reply::status(404, "File Not Found", &[]),
        llama_overflow(3000, 2048),
        openai::message(Some("the summary"), &[]),
        openai::message(Some("answered"), &[]),
    ])
    .await;
    let agent = AgentLoop::new(local_openai(&server, "tiny"), ToolRegistry::new(), config())
        .with_context(asking_policy(&server, "tiny", 8192));
    // Older turns to compact, about 2400 tokens in all: too much for 2048.
    let mut history = Vec::new();
    for turn in 0..6 {
        history.push(ChatMessage::user(format!(
            "question {turn}: {}",
            "words ".repeat(260)
        )));
        history.push(ChatMessage::assistant(format!(
            "answer {turn}: {}",
            "more ".repeat(60)
        )));
    }
    history.push(ChatMessage::user("and now?"));
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.text, "answered");
    let policy = agent.context_policy().unwrap();
    assert_eq!(
        (policy.window, policy.window_source),
        (2048, WindowSource::Server)
    );
    let bodies: Vec<Value> = server.bodies();
    // The summary request and the retry fit the window the server named.
    for body in &bodies[2..] {
        let max_tokens = body["max_tokens"].as_u64().unwrap();
        assert!(max_tokens <= 2048 - policy.margin(), "{max_tokens}");
    }
    let retry = &bodies[3];
    let estimate = agent.estimate(&history[..history.len() - 1]).unwrap();
    assert!(
        estimate + retry["max_tokens"].as_u64().unwrap() <= 2048,
        "{estimate}"
    );
}
