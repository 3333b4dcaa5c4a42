//! A reply cut at the output-token limit is unfinished: its tool calls are never run, whatever
//! the arguments look like (a server may re-serialise a cut call into complete-looking JSON), in
//! both wire formats, streamed or not; the model is told why and asked again. The tool is the real
//! file component writing into a real temporary workspace.

use std::sync::Arc;

use clawcage_agent::agent_loop::CUT_AT_OUTPUT_LIMIT;
use clawcage_agent::provider::NoEvents;
use clawcage_agent::{AgentConfig, AgentLoop, ToolRegistry, TurnEnd};
use clawcage_core::ChatMessage;
use clawcage_sandbox::{FsMode, Limits, components};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai, tool_result_of};
use clawcage_tests::{grants, sandbox};
use serde_json::{Value, json};

use crate::agent_loop::{anthropic_provider, openai_provider};

/// The bundled file tools, granted `dir` read-write.
async fn file_tools(dir: &std::path::Path) -> ToolRegistry {
    let component = sandbox()
        .load(
            "file",
            "bundled:file",
            components::bundled::FILE,
            grants(dir, FsMode::ReadWrite, Limits::default()),
        )
        .await
        .unwrap();
    let mut registry = ToolRegistry::new();
    for tool in component.tools() {
        registry.register(Arc::new(tool.clone())).unwrap();
    }
    registry
}

fn config() -> AgentConfig {
    AgentConfig {
        system_prompt: "You are a test agent.".into(),
        max_iterations: 4,
        repeat_limit: 3,
        stream: false,
    }
}

/// The arguments a server re-serialised from a cut call: complete-looking JSON.
fn cut_arguments() -> Value {
    json!({"content": "Dear team,\n\nThe report is attached.\n\nRegards", "path": "out_here"})
}

/// An Anthropic reply stopped at `max_tokens` holding a `write_file` call.
fn anthropic_cut() -> Reply {
    Reply::json(json!({
        "id": "msg_cut",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "text", "text": "Writing the letter now."},
            {"type": "tool_use", "id": "toolu_cut", "name": "write_file", "input": cut_arguments()}
        ],
        "stop_reason": "max_tokens",
        "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 3},
    }))
}

/// An OpenAI-compatible reply stopped with `finish_reason: "length"` holding the same call.
fn openai_cut() -> Reply {
    Reply::json(json!({
        "id": "chatcmpl-cut",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{"id": "call_cut", "type": "function", "function": {"name": "write_file", "arguments": cut_arguments().to_string()}}]
            },
            "finish_reason": "length"
        }],
        "usage": {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53},
    }))
}

async fn run_cut_turn(server: &LlmServer, provider: Arc<dyn clawcage_agent::Provider>) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentLoop::new(provider, file_tools(dir.path()).await, config());
    let mut history = vec![ChatMessage::user("Write the letter to out_here.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(outcome.text, "I will write it in parts.");
    assert!(
        !dir.path().join("out_here").exists(),
        "a call from a reply cut at the limit must not run"
    );
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2, "the model is asked again");
    let last = bodies[1]["messages"].as_array().unwrap().last().unwrap();
    let result = tool_result_of(last).unwrap_or_else(|| {
        // OpenAI: the tool result is its own message with role `tool`.
        last["content"].as_str().unwrap_or_default().to_string()
    });
    assert_eq!(result, CUT_AT_OUTPUT_LIMIT, "{last}");
    assert!(result.contains("max_tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_call_cut_at_max_tokens_is_never_run() {
    let server = LlmServer::start(vec![
        anthropic_cut(),
        anthropic::message(&[anthropic::text("I will write it in parts.")]),
    ])
    .await;
    run_cut_turn(&server, anthropic_provider(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_call_cut_by_length_is_never_run() {
    let server = LlmServer::start(vec![
        openai_cut(),
        openai::message(Some("I will write it in parts."), &[]),
    ])
    .await;
    run_cut_turn(&server, openai_provider(&server)).await;
}

/// A streamed reply whose last event says `max_tokens`: the arguments were still arriving when
/// the limit struck, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_call_cut_at_max_tokens_is_never_run() {
    let stream = match anthropic::stream(
        &[anthropic::tool("toolu_cut", "write_file", cut_arguments())],
        64,
    ) {
        Reply::Sse { text, chunk } => Reply::Sse {
            text: text.replace(
                "\"stop_reason\":\"tool_use\"",
                "\"stop_reason\":\"max_tokens\"",
            ),
            chunk,
        },
        _ => panic!("a stream was expected"),
    };
    let server = LlmServer::start(vec![
        stream,
        anthropic::message(&[anthropic::text("I will write it in parts.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.stream = true;
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        file_tools(dir.path()).await,
        config,
    );
    let mut history = vec![ChatMessage::user("Write the letter to out_here.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.text, "I will write it in parts.");
    assert!(!dir.path().join("out_here").exists());
    let bodies = server.bodies();
    let last = bodies[1]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(
        tool_result_of(last).as_deref(),
        Some(CUT_AT_OUTPUT_LIMIT),
        "{last}"
    );
}

/// The control: the same call from a finished reply runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_from_a_finished_reply_runs() {
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool("toolu_ok", "write_file", cut_arguments())]),
        anthropic::message(&[anthropic::text("Done.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        file_tools(dir.path()).await,
        config(),
    );
    let mut history = vec![ChatMessage::user("Write the letter to out_here.")];
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert!(dir.path().join("out_here").exists());
}
