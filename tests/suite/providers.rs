//! Providers over real HTTP: retries with backoff honouring `retry-after`, fail-over along the
//! chain, streams reassembled in both formats, and hostile servers — an endless body, a body that
//! is not JSON, a server that never answers, an error inside a stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_agent::provider::{
    self, ChatRequest, FailoverChain, ProviderConfig, ProviderError, ProviderEvents, RetryPolicy,
    Retrying, StopReason,
};
use clawcage_agent::{Provider, ToolRegistry};
use clawcage_core::{ChatMessage, ContentBlock};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai};
use serde_json::json;

use crate::agent_loop::{anthropic_provider, openai_provider, settings};

/// Records what providers report.
#[derive(Default)]
struct Recorder {
    text: Mutex<String>,
    retries: Mutex<Vec<(String, Duration)>>,
    failovers: Mutex<Vec<(String, String)>>,
}

impl ProviderEvents for Recorder {
    fn text_delta(&self, text: &str) {
        self.text.lock().unwrap().push_str(text);
    }
    fn retrying(&self, _provider: &str, reason: &str, delay: Duration) {
        self.retries
            .lock()
            .unwrap()
            .push((reason.to_string(), delay));
    }
    fn failing_over(&self, from: &str, to: &str, _reason: &str) {
        self.failovers
            .lock()
            .unwrap()
            .push((from.to_string(), to.to_string()));
    }
}

fn fast_policy(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
        max_retry_after: Duration::from_secs(5),
    }
}

async fn ask(
    provider: &dyn Provider,
    events: &dyn ProviderEvents,
    stream: bool,
) -> Result<provider::ChatResponse, ProviderError> {
    let tools = ToolRegistry::new();
    let messages = [ChatMessage::user("hi")];
    provider
        .complete(
            ChatRequest {
                system: "",
                messages: &messages,
                tools: &tools,
                stream,
                max_tokens: None,
            },
            events,
        )
        .await
}

#[tokio::test]
async fn a_429_is_retried_after_the_wait_the_server_asked_for() {
    let server = LlmServer::start(vec![
        Reply::status(429, "rate limited", &[("retry-after", "1")]),
        Reply::status(529, "overloaded", &[("retry-after-ms", "50")]),
        anthropic::message(&[anthropic::text("finally")]),
    ])
    .await;
    let provider = Retrying::new(anthropic_provider(&server), fast_policy(3));
    let events = Recorder::default();
    let response = ask(&provider, &events, false).await.unwrap();
    assert_eq!(response.content, vec![ContentBlock::text("finally")]);

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    // The bodies are identical: a retry sends the same request again.
    assert_eq!(requests[0].body, requests[1].body);
    // The waits asked for were honoured (lower bounds only: the machine may be slower).
    assert!(requests[1].at - requests[0].at >= Duration::from_secs(1));
    assert!(requests[2].at - requests[1].at >= Duration::from_millis(50));
    let retries = events.retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 2);
    assert_eq!(retries[0].1, Duration::from_secs(1));
    assert!(
        retries[0].0.contains("HTTP 429: rate limited"),
        "{}",
        retries[0].0
    );
    assert_eq!(retries[1].1, Duration::from_millis(50));
}

#[tokio::test]
async fn retries_back_off_and_give_up_and_client_errors_are_not_retried() {
    let server = LlmServer::start(vec![
        Reply::status(500, "boom", &[]),
        Reply::status(502, "bad gateway", &[]),
        Reply::status(503, "unavailable", &[]),
    ])
    .await;
    let provider = Retrying::new(anthropic_provider(&server), fast_policy(2));
    let events = Recorder::default();
    let error = ask(&provider, &events, false).await.unwrap_err();
    assert!(
        matches!(error, ProviderError::Status { status: 503, .. }),
        "{error}"
    );
    assert_eq!(server.requests().len(), 3);
    let delays: Vec<Duration> = events
        .retries
        .lock()
        .unwrap()
        .iter()
        .map(|(_, d)| *d)
        .collect();
    // Exponential with jitter: the first in [10, 20] ms, the second in [20, 40] ms.
    assert!(
        delays[0] >= Duration::from_millis(10) && delays[0] <= Duration::from_millis(20),
        "{delays:?}"
    );
    assert!(
        delays[1] >= Duration::from_millis(20) && delays[1] <= Duration::from_millis(40),
        "{delays:?}"
    );

    let server = LlmServer::start(vec![Reply::status(400, "bad request: max_tokens", &[])]).await;
    let provider = Retrying::new(anthropic_provider(&server), fast_policy(3));
    let error = ask(&provider, &Recorder::default(), false)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("HTTP 400: bad request: max_tokens"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);

    // A retry-after beyond the policy's limit fails at once rather than sleeping for an hour.
    let server = LlmServer::start(vec![Reply::status(
        429,
        "slow down",
        &[("retry-after", "3600")],
    )])
    .await;
    let provider = Retrying::new(anthropic_provider(&server), fast_policy(3));
    assert!(ask(&provider, &Recorder::default(), false).await.is_err());
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_failing_primary_fails_over_to_the_next_provider_and_model() {
    let primary = LlmServer::start(vec![
        Reply::status(500, "primary down", &[]),
        Reply::status(500, "still down", &[]),
    ])
    .await;
    let secondary = LlmServer::start(vec![openai::message(Some("from the fallback"), &[])]).await;
    let chain = FailoverChain::new(vec![
        Arc::new(Retrying::new(anthropic_provider(&primary), fast_policy(1))),
        Arc::new(Retrying::new(openai_provider(&secondary), fast_policy(1))),
    ])
    .unwrap();
    assert_eq!(chain.label(), "anthropic/claude-test -> openai/test-model");
    let events = Recorder::default();
    let response = ask(&chain, &events, false).await.unwrap();
    assert_eq!(
        response.content,
        vec![ContentBlock::text("from the fallback")]
    );
    assert_eq!(response.answered_by, "openai/test-model");
    assert_eq!(
        primary.requests().len(),
        2,
        "the primary was retried once before failing over"
    );
    assert_eq!(secondary.requests().len(), 1);
    assert_eq!(secondary.bodies()[0]["model"], "test-model");
    assert_eq!(
        events.failovers.lock().unwrap().clone(),
        vec![(
            "anthropic/claude-test".to_string(),
            "openai/test-model".to_string()
        )]
    );

    // When every member fails, the error names each failure.
    let first = LlmServer::start(vec![Reply::status(500, "first broken", &[])]).await;
    let second = LlmServer::start(vec![Reply::status(401, "bad key", &[])]).await;
    let chain =
        FailoverChain::new(vec![anthropic_provider(&first), openai_provider(&second)]).unwrap();
    let error = ask(&chain, &Recorder::default(), false)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("first broken") && error.contains("bad key"),
        "{error}"
    );
}

#[tokio::test]
async fn anthropic_streams_are_reassembled() {
    let blocks = [
        anthropic::text("Reading the file now, then I will summarise it."),
        anthropic::tool(
            "toolu_1",
            "read",
            json!({"path": "docs/a b.txt", "limit": 20, "nested": {"k": [1, 2, "ü"]}}),
        ),
        anthropic::tool("toolu_2", "list", json!({})),
    ];
    for chunk in [1, 3, 64, 100_000] {
        let server = LlmServer::start(vec![anthropic::stream(&blocks, chunk)]).await;
        let events = Recorder::default();
        let response = ask(anthropic_provider(&server).as_ref(), &events, true)
            .await
            .unwrap();
        assert_eq!(server.bodies()[0]["stream"], true);
        assert_eq!(
            response.content,
            vec![
                ContentBlock::text("Reading the file now, then I will summarise it."),
                ContentBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "read".into(),
                    input: json!({"path": "docs/a b.txt", "limit": 20, "nested": {"k": [1, 2, "ü"]}}),
                },
                ContentBlock::ToolUse {
                    id: "toolu_2".into(),
                    name: "list".into(),
                    input: json!({})
                },
            ],
            "chunk size {chunk}"
        );
        assert_eq!(response.stop_reason, StopReason::ToolUse);
        assert_eq!(
            (response.usage.input_tokens, response.usage.output_tokens),
            (100, 20)
        );
        assert_eq!(
            *events.text.lock().unwrap(),
            "Reading the file now, then I will summarise it."
        );
        assert!(response.malformed.is_empty() && response.repairs.is_empty());
    }
}

#[tokio::test]
async fn openai_streams_are_reassembled() {
    let calls = [
        ("call_a", "read", r#"{"path": "x.txt", "limit": 3}"#),
        ("call_b", "list", "{}"),
    ];
    for chunk in [2, 50, 100_000] {
        let server = LlmServer::start(vec![openai::stream(
            Some("Two calls coming."),
            &calls,
            chunk,
        )])
        .await;
        let events = Recorder::default();
        let response = ask(openai_provider(&server).as_ref(), &events, true)
            .await
            .unwrap();
        assert_eq!(
            server.bodies()[0]["stream_options"],
            json!({"include_usage": true})
        );
        assert_eq!(
            response.content,
            vec![
                ContentBlock::text("Two calls coming."),
                ContentBlock::ToolUse {
                    id: "call_a".into(),
                    name: "read".into(),
                    input: json!({"path": "x.txt", "limit": 3})
                },
                ContentBlock::ToolUse {
                    id: "call_b".into(),
                    name: "list".into(),
                    input: json!({})
                },
            ]
        );
        assert_eq!(response.stop_reason, StopReason::ToolUse);
        assert_eq!(
            (response.usage.input_tokens, response.usage.output_tokens),
            (50, 10)
        );
        assert_eq!(*events.text.lock().unwrap(), "Two calls coming.");
    }
}

#[tokio::test]
async fn a_huge_body_is_refused_without_exhausting_memory() {
    for (reply, stream) in [
        (
            Reply::Endless {
                content_type: "application/json".into(),
                fill: b' ',
                total: 64 << 20,
            },
            false,
        ),
        (
            Reply::Endless {
                content_type: "text/event-stream".into(),
                fill: b':',
                total: 64 << 20,
            },
            true,
        ),
    ] {
        let server = LlmServer::start(vec![reply]).await;
        let mut settings = settings(&server, "claude-test");
        settings.max_response_bytes = 4 << 20;
        let provider = provider::build(ProviderConfig::Anthropic(settings), &[]).unwrap();
        let error = ask(provider.as_ref(), &Recorder::default(), stream)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("larger than 4 MiB"), "{error}");
        assert!(!error.is_retryable());
    }
}

#[tokio::test]
async fn malformed_bodies_are_errors_not_panics() {
    let cases = [
        (Reply::Json { status: 200, headers: vec![], body: "{not json".into() }, "not valid JSON"),
        (Reply::json(json!({"content": "a string"})), "no `content` array"),
        (Reply::json(json!({"content": [{"type": "tool_use", "name": "x", "input": {}}]})), "no id"),
        (Reply::Sse { text: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n".into(), chunk: 10 }, "ended before `message_stop`"),
        (Reply::Sse { text: "data: {{{\n\n".into(), chunk: 10 }, "not JSON"),
        (Reply::Sse { text: "data: {\"type\":\"content_block_delta\",\"index\":99999999999,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n".into(), chunk: 10 }, "never started"),
    ];
    for (reply, expected) in cases {
        let server = LlmServer::start(vec![reply]).await;
        let error = ask(
            anthropic_provider(&server).as_ref(),
            &Recorder::default(),
            false,
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains(expected), "{expected}: {error}");
    }
    let server = LlmServer::start(vec![Reply::json(json!({"choices": []}))]).await;
    let error = ask(
        openai_provider(&server).as_ref(),
        &Recorder::default(),
        false,
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("no `choices[0]`"), "{error}");
}

#[tokio::test]
async fn an_error_event_inside_a_stream_is_reported_and_retryable() {
    let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let server = LlmServer::start(vec![
        Reply::Sse {
            text: stream.into(),
            chunk: 16,
        },
        anthropic::stream(&[anthropic::text("recovered")], 16),
    ])
    .await;
    let provider = Retrying::new(anthropic_provider(&server), fast_policy(2));
    let events = Recorder::default();
    let response = ask(&provider, &events, true).await.unwrap();
    assert_eq!(response.content, vec![ContentBlock::text("recovered")]);
    assert!(
        events.retries.lock().unwrap()[0]
            .0
            .contains("overloaded_error: Overloaded")
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let server = LlmServer::start(vec![Reply::Hang, Reply::Hang]).await;
    let mut settings = settings(&server, "claude-test");
    settings.timeout = Duration::from_millis(500);
    let provider = Retrying::new(
        provider::build(ProviderConfig::Anthropic(settings), &[]).unwrap(),
        fast_policy(1),
    );
    let started = Instant::now();
    let error = ask(&provider, &Recorder::default(), false)
        .await
        .unwrap_err();
    assert!(matches!(error, ProviderError::Timeout { .. }), "{error}");
    assert!(error.to_string().contains("did not answer"), "{error}");
    assert_eq!(server.requests().len(), 2, "a timeout is retried");
    // Generous: it stopped, long before the server would have answered.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_and_keys_are_required() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut settings = clawcage_agent::provider::HttpSettings::new(&url, "m");
    settings.api_key = Some(clawcage_agent::provider::ApiKey::new("k"));
    let provider = provider::build(ProviderConfig::Anthropic(settings.clone()), &[]).unwrap();
    let error = ask(provider.as_ref(), &Recorder::default(), false)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("cannot reach anthropic/m"),
        "{error}"
    );
    assert!(error.to_string().contains("--base-url"), "{error}");

    settings.api_key = None;
    let error = provider::build(ProviderConfig::Anthropic(settings), &[]).unwrap_err();
    assert!(error.to_string().contains("ANTHROPIC_API_KEY"), "{error}");
}

#[tokio::test]
async fn block_kinds_we_do_not_keep_are_skipped_in_streams() {
    let stream = [
        r#"{"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"answer"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"a_kind_added_later"}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"a_delta_added_later","x":"y"}}"#,
        r#"{"type":"content_block_stop","index":2}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
        r#"{"type":"message_stop"}"#,
    ]
    .iter()
    .map(|data| format!("data: {data}\n\n"))
    .collect::<String>();
    let server = LlmServer::start(vec![Reply::Sse {
        text: stream,
        chunk: 13,
    }])
    .await;
    let response = ask(
        anthropic_provider(&server).as_ref(),
        &Recorder::default(),
        true,
    )
    .await
    .unwrap();
    // Thinking is kept as reasoning, apart from the answer (tests/suite/reasoning.rs).
    assert_eq!(
        response.content,
        vec![
            ContentBlock::Reasoning {
                text: "hmm".into(),
                signature: Some("abc".into()),
                encrypted: None,
            },
            ContentBlock::text("answer")
        ]
    );
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (7, 3)
    );
}

/// A base URL that points at something other than a model API (a plain web server's HTML error
/// page, llama-server's answer to a wrong path): the error names the URL tried and where to fix
/// it, with a short excerpt of the page instead of its whole markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_a_model_api_is_named_with_its_url_and_the_fix() {
    let page = format!(
        "<!DOCTYPE HTML>\n<html lang=\"en\"><head><title>Error response</title></head>\n<body>\n<h1>Error response</h1>\n<p>Error code: 404</p>\n{}</body>\n</html>\n",
        "<p>Message: File not found.</p>\n".repeat(32)
    );
    let web_server = LlmServer::start(vec![Reply::Json {
        status: 404,
        headers: vec![("content-type".into(), "text/html".into())],
        body: page,
    }])
    .await;
    let error = ask(
        openai_provider(&web_server).as_ref(),
        &Recorder::default(),
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    let url = format!("{}/chat/completions", web_server.url());
    assert!(error.contains("HTTP 404: Error response"), "{error}");
    assert!(
        error.contains(&url) && error.contains("--base-url"),
        "{error}"
    );
    assert!(
        !error.contains('<') && error.lines().count() == 1,
        "{error}"
    );

    let llama = LlmServer::start(vec![Reply::Json {
        status: 404,
        headers: Vec::new(),
        body: r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#
            .into(),
    }])
    .await;
    let error = ask(
        openai_provider(&llama).as_ref(),
        &Recorder::default(),
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("HTTP 404: File Not Found; ") && error.contains("--base-url"),
        "{error}"
    );
}
