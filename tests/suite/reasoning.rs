//! Reasoning from real wire formats against the scripted LLM server: `reasoning_content` and
//! `reasoning`, streamed and not (OpenAI-compatible: llama.cpp, vLLM, DeepSeek), Anthropic
//! `thinking` and `redacted_thinking` blocks. Reasoning is kept apart from the answer, reported
//! on its own, never sent back to an OpenAI-compatible server, sent back to Anthropic only signed
//! and before a tool call of the same message; a reply of reasoning only ends the turn as
//! `NoAnswer`, and resuming such a session sends no `null` content; a secret value in reasoning
//! reaches neither the transcript nor the events; a text answer cut at the output-token limit is
//! marked in the transcript and loaded back with the mark.

use std::sync::{Arc, Mutex};

use clawcage_agent::events::{EventObserver, Stream};
use clawcage_agent::provider::{NoEvents, ProviderEvents, Redacting};
use clawcage_agent::{
    AgentConfig, AgentLoop, JsonlTranscripts, Provider, Sessions, ToolRegistry, TranscriptStore,
    TurnEnd, TurnObserver,
};
use clawcage_core::redact::Redactor;
use clawcage_core::{ChatMessage, ContentBlock, Cut, Role, ToolOutput};
use clawcage_tests::host_tools::HostTool;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai};
use serde_json::{Value, json};

use crate::agent_loop::{anthropic_provider, openai_provider};

/// What a turn reported: reasoning and text apart.
#[derive(Default)]
struct Heard {
    reasoning: Mutex<String>,
    text: Mutex<String>,
}

impl ProviderEvents for Heard {
    fn text_delta(&self, text: &str) {
        self.text.lock().unwrap().push_str(text);
    }
    fn reasoning_delta(&self, text: &str) {
        self.reasoning.lock().unwrap().push_str(text);
    }
}

impl TurnObserver for Heard {}

fn config(stream: bool) -> AgentConfig {
    AgentConfig {
        system_prompt: "You are a test agent.".into(),
        max_iterations: 4,
        repeat_limit: 3,
        stream,
    }
}

fn reasoning_block(text: &str) -> ContentBlock {
    ContentBlock::Reasoning {
        text: text.into(),
        signature: None,
        encrypted: None,
    }
}

/// Every assistant message of an OpenAI-compatible request body: none has `null` content
/// without tool calls, none carries reasoning.
fn assert_sendable(body: &Value) {
    for message in body["messages"].as_array().unwrap() {
        if message["role"] == "assistant" {
            assert!(
                message["content"].is_string() || message["tool_calls"].is_array(),
                "an assistant message with null content and no tool calls: {message}"
            );
            assert!(
                message.get("reasoning_content").is_none() && message.get("reasoning").is_none(),
                "{message}"
            );
        }
    }
    let text = body.to_string();
    assert!(
        !text.contains("Let me think") && !text.contains("\"type\":\"reasoning\""),
        "reasoning was sent back: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_of_reasoning_only_is_no_answer_and_the_next_request_sends_no_null_content() {
    let server = LlmServer::start(vec![
        openai::reasoning(
            "reasoning_content",
            "Let me think about a greeting.",
            "",
            "stop",
        ),
        openai::message(Some("Hello!"), &[]),
    ])
    .await;
    let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config(false));
    let mut history = vec![ChatMessage::user("Say hi")];
    let heard = Heard::default();
    let outcome = agent.run_turn(&mut history, &heard).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::NoAnswer);
    assert!(
        outcome
            .text
            .starts_with("the model returned no answer text (only reasoning)"),
        "{}",
        outcome.text
    );
    assert!(outcome.text.contains("max_tokens"), "{}", outcome.text);
    // Not streamed, the reasoning is still reported, whole, and kept apart from any text.
    assert_eq!(
        heard.reasoning.lock().unwrap().as_str(),
        "Let me think about a greeting."
    );
    assert_eq!(heard.text.lock().unwrap().as_str(), "");
    assert_eq!(history.len(), 2);
    assert_eq!(
        history[1].content,
        vec![reasoning_block("Let me think about a greeting.")]
    );

    history.push(ChatMessage::user("Say hi, please"));
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(outcome.text, "Hello!");
    let body = &server.bodies()[1];
    assert_sendable(body);
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": ""})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_reasoning_is_reported_apart_and_kept_before_the_answer() {
    for field in ["reasoning_content", "reasoning"] {
        let server = LlmServer::start(vec![openai::reasoning_stream(
            field,
            "Let me think: the user wants a greeting.",
            "Hello there!",
            "stop",
            7,
        )])
        .await;
        let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config(true));
        let mut history = vec![ChatMessage::user("Say hi")];
        let heard = Heard::default();
        let outcome = agent.run_turn(&mut history, &heard).await.unwrap();
        assert_eq!(outcome.end, TurnEnd::Answered, "{field}");
        assert_eq!(outcome.text, "Hello there!");
        assert_eq!(
            heard.reasoning.lock().unwrap().as_str(),
            "Let me think: the user wants a greeting."
        );
        assert_eq!(heard.text.lock().unwrap().as_str(), "Hello there!");
        assert_eq!(
            history[1].content,
            vec![
                reasoning_block("Let me think: the user wants a greeting."),
                ContentBlock::text("Hello there!"),
            ]
        );
        assert_eq!(history[1].cut, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_that_used_up_the_output_limit_says_so_and_is_stored_marked() {
    let server = LlmServer::start(vec![openai::reasoning_stream(
        "reasoning_content",
        "Let me think step by step about",
        "",
        "length",
        16,
    )])
    .await;
    let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config(true));
    let mut history = vec![ChatMessage::user("Say hi")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::NoAnswer);
    assert!(
        outcome.text.contains("output-token limit") && outcome.text.contains("max_tokens"),
        "{}",
        outcome.text
    );
    assert_eq!(history[1].cut, Some(Cut::MaxTokens));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_reply_is_no_answer_and_is_not_stored() {
    let server = LlmServer::start(vec![openai::message(None, &[])]).await;
    let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config(false));
    let mut history = vec![ChatMessage::user("Say hi")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::NoAnswer);
    assert!(outcome.text.contains("empty reply"), "{}", outcome.text);
    assert_eq!(
        history,
        vec![ChatMessage::user("Say hi")],
        "no empty assistant message"
    );
}

fn echo_tool() -> ToolRegistry {
    let tool = HostTool::new(
        "echo",
        "Echo the text.",
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}),
        |args| Ok(ToolOutput::text(args["text"].as_str().unwrap_or_default())),
    );
    let mut registry = ToolRegistry::new();
    registry.register(tool).unwrap();
    registry
}

/// Anthropic: signed thinking before a tool call goes back unchanged in the tool-use turn;
/// thinking before an answer, and unsigned thinking, never do.
async fn anthropic_thinking_round_trip(stream: bool) {
    let replies = if stream {
        vec![
            anthropic::stream(
                &[
                    anthropic::thinking("I should echo it.", "sig-one"),
                    anthropic::redacted_thinking("EncRypted=="),
                    anthropic::tool("toolu_1", "echo", json!({"text": "ping"})),
                ],
                9,
            ),
            anthropic::stream(
                &[
                    anthropic::thinking("It echoed ping.", "sig-two"),
                    anthropic::text("It said ping."),
                ],
                9,
            ),
            anthropic::stream(&[anthropic::text("Yes.")], 9),
        ]
    } else {
        vec![
            anthropic::message(&[
                anthropic::thinking("I should echo it.", "sig-one"),
                anthropic::redacted_thinking("EncRypted=="),
                anthropic::tool("toolu_1", "echo", json!({"text": "ping"})),
            ]),
            anthropic::message(&[
                anthropic::thinking("It echoed ping.", "sig-two"),
                anthropic::text("It said ping."),
            ]),
            anthropic::message(&[anthropic::text("Yes.")]),
        ]
    };
    let server = LlmServer::start(replies).await;
    let agent = AgentLoop::new(anthropic_provider(&server), echo_tool(), config(stream));
    let mut history = vec![ChatMessage::user("Echo ping")];
    let heard = Heard::default();
    let outcome = agent.run_turn(&mut history, &heard).await.unwrap();
    assert_eq!(outcome.text, "It said ping.");
    assert_eq!(
        heard.reasoning.lock().unwrap().as_str(),
        "I should echo it.It echoed ping."
    );
    let bodies = server.bodies();
    // The tool-use turn: thinking and redacted thinking sent back as they came, before the call.
    assert_eq!(
        bodies[1]["messages"][1]["content"],
        json!([
            {"type": "thinking", "thinking": "I should echo it.", "signature": "sig-one"},
            {"type": "redacted_thinking", "data": "EncRypted=="},
            {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "ping"}},
        ])
    );
    history.push(ChatMessage::user("Sure?"));
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    let bodies = server.bodies();
    let sent = bodies[2]["messages"].to_string();
    // The answer's thinking is not part of a tool-use turn: dropped.
    assert!(!sent.contains("It echoed ping."), "{sent}");
    assert!(!sent.contains("\"reasoning\""), "{sent}");
    assert_eq!(
        bodies[2]["messages"][3]["content"],
        json!([{"type": "text", "text": "It said ping."}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_goes_back_only_in_its_tool_use_turn() {
    anthropic_thinking_round_trip(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_anthropic_thinking_goes_back_only_in_its_tool_use_turn() {
    anthropic_thinking_round_trip(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_thinking_is_never_sent_back_and_a_thinking_only_message_is_left_out() {
    let server = LlmServer::start(vec![
        Reply::json(json!({
            "id": "m", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [
                {"type": "thinking", "thinking": "unsigned thought"},
                {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "x"}},
            ],
            "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1},
        })),
        anthropic::message(&[anthropic::thinking("only a thought", "sig")]),
        anthropic::message(&[anthropic::text("Done.")]),
    ])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), echo_tool(), config(false));
    let mut history = vec![ChatMessage::user("Echo x")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::NoAnswer);
    history.push(ChatMessage::user("Well?"));
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    let bodies = server.bodies();
    assert_eq!(
        bodies[1]["messages"][1]["content"],
        json!([{"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "x"}}])
    );
    let last = bodies[2]["messages"].as_array().unwrap();
    let text = bodies[2]["messages"].to_string();
    assert!(!text.contains("only a thought") && !text.contains("unsigned thought"));
    // The message of reasoning only is left out; no assistant message is empty.
    for message in last {
        assert_ne!(message["content"], json!([]), "{message}");
    }
    assert_eq!(last.last().unwrap()["role"], "user");
}

fn sessions(provider: Arc<dyn Provider>, dir: &std::path::Path, redactor: &Redactor) -> Sessions {
    let agent = AgentLoop::new(
        Redacting::wrap(provider, redactor),
        ToolRegistry::new(),
        config(true),
    )
    .with_redactor(redactor.clone());
    Sessions::new(
        agent,
        Some(
            JsonlTranscripts::new(dir)
                .with_redactor(redactor.clone())
                .shared(),
        ),
        100,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_with_reasoning_sends_no_null_content() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        openai::reasoning_stream("reasoning_content", "Let me think hard.", "", "stop", 11),
        openai::message(Some("Hi!"), &[]),
    ])
    .await;
    let redactor = Redactor::default();
    {
        let sessions = sessions(openai_provider(&server), state.path(), &redactor);
        let outcome = sessions
            .send_user("s", "Say hi", Arc::new(NoEvents))
            .await
            .unwrap();
        assert_eq!(outcome.end, TurnEnd::NoAnswer);
    }
    let file = JsonlTranscripts::new(state.path()).path("s");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(!written.contains("\"content\":[]"), "{written}");
    assert!(
        written.contains(r#"{"type":"reasoning","text":"Let me think hard."}"#),
        "{written}"
    );
    // A new process on the same state directory resumes it.
    let sessions = sessions(openai_provider(&server), state.path(), &redactor);
    let outcome = sessions
        .send_user("s", "Say hi now", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(outcome.text, "Hi!");
    let body = &server.bodies()[1];
    assert_sendable(body);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_reasoning_reaches_neither_the_transcript_nor_the_events() {
    const SECRET: &str = "sk-live-reasoning-0123456789abcdef";
    let state = tempfile::tempdir().unwrap();
    let redactor = Redactor::new([("OPENAI_API_KEY", SECRET)]);
    for (number, reply) in [
        openai::reasoning_stream(
            "reasoning_content",
            &format!("The key is {SECRET} so I must not say it."),
            "I cannot share that.",
            "stop",
            5,
        ),
        openai::reasoning(
            "reasoning",
            &format!("The key is {SECRET} again."),
            "No.",
            "stop",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let server = LlmServer::start(vec![reply]).await;
        let sessions = sessions(openai_provider(&server), state.path(), &redactor);
        let key = format!("s{number}");
        let (observer, mut events) = EventObserver::channel(&key, "r1");
        let outcome = sessions
            .send_user(&key, "What is the key?", Arc::new(observer))
            .await
            .unwrap();
        assert_eq!(outcome.end, TurnEnd::Answered);
        let mut reasoning = String::new();
        while let Ok(event) = events.try_recv() {
            let text = serde_json::to_string(&event).unwrap();
            assert!(!text.contains(SECRET), "{text}");
            if event.stream == Stream::Reasoning {
                reasoning.push_str(event.data["delta"].as_str().unwrap_or_default());
            }
        }
        assert!(
            reasoning.starts_with("The key is [redacted: OPENAI_API_KEY]"),
            "{reasoning}"
        );
        let written =
            std::fs::read_to_string(JsonlTranscripts::new(state.path()).path(&key)).unwrap();
        assert!(!written.contains(SECRET), "{written}");
        assert!(
            written.contains("The key is [redacted: OPENAI_API_KEY]"),
            "{written}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_answer_cut_at_the_limit_is_marked_in_the_transcript_and_loaded_back() {
    let state = tempfile::tempdir().unwrap();
    let cut = Reply::json(json!({
        "id": "chatcmpl-cut", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Dear team, the report is"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 8, "total_tokens": 58},
    }));
    let server = LlmServer::start(vec![cut, openai::message(Some("Whole."), &[])]).await;
    let redactor = Redactor::default();
    {
        let sessions = sessions(openai_provider(&server), state.path(), &redactor);
        let outcome = sessions
            .send_user("s", "Write the letter", Arc::new(NoEvents))
            .await
            .unwrap();
        assert_eq!(outcome.end, TurnEnd::Answered);
        assert_eq!(outcome.text, "Dear team, the report is");
        sessions
            .send_user("s", "Shorter", Arc::new(NoEvents))
            .await
            .unwrap();
    }
    let store = JsonlTranscripts::new(state.path());
    let written = std::fs::read_to_string(store.path("s")).unwrap();
    let marked: Vec<&str> = written
        .lines()
        .filter(|line| line.contains(r#""cut":"max_tokens""#))
        .collect();
    assert_eq!(marked.len(), 1, "{written}");
    assert!(marked[0].contains("Dear team, the report is"));
    let loaded = store.load("s", 100).unwrap();
    assert_eq!(loaded.skipped_lines, 0);
    let cut_message = &loaded.messages[1];
    assert_eq!(cut_message.role, Role::Assistant);
    assert_eq!(cut_message.cut, Some(Cut::MaxTokens));
    assert_eq!(loaded.messages[3].cut, None);
    // Re-shown (the gateway's history is these messages as JSON), the mark is there.
    let shown = serde_json::to_value(&loaded.messages).unwrap();
    assert_eq!(shown[1]["cut"], "max_tokens");
    assert!(shown[3].get("cut").is_none());
    // The mark is never sent to the model.
    let body = &server.bodies()[1];
    assert!(!body.to_string().contains("\"cut\""), "{body}");
    assert!(body["messages"][2].get("cut").is_none());
}
