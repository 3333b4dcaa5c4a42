//! The agent loop against the scripted LLM server, in both wire formats: multi-step tool use with
//! the exact request bodies, tool errors going back as error results, the iteration cap, loop
//! detection, a tool outside the registry, and malformed tool-call JSON.

use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::agent_loop::DEFAULT_SYSTEM_PROMPT;
use clawcage_agent::provider::{self, ApiKey, HttpSettings, NoEvents, ProviderConfig};
use clawcage_agent::{AgentConfig, AgentLoop, Provider, ToolRegistry, TurnEnd};
use clawcage_core::{ChatMessage, ToolError, ToolOutput};
use clawcage_tests::host_tools::HostTool;
use clawcage_tests::llm_server::{LlmServer, anthropic, openai};
use serde_json::{Value, json};

pub fn settings(server: &LlmServer, model: &str) -> HttpSettings {
    let mut settings = HttpSettings::new(server.url(), model);
    settings.api_key = Some(ApiKey::new("test-key-123"));
    settings.timeout = Duration::from_secs(10);
    settings
}

pub fn anthropic_provider(server: &LlmServer) -> Arc<dyn Provider> {
    provider::build(
        ProviderConfig::Anthropic(settings(server, "claude-test")),
        &[],
    )
    .unwrap()
}

pub fn openai_provider(server: &LlmServer) -> Arc<dyn Provider> {
    provider::build(ProviderConfig::OpenAi(settings(server, "test-model")), &[]).unwrap()
}

fn list_schema() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn read_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": false
    })
}

/// `list` answers with two names; `read` knows one file and fails on others.
pub fn file_like_tools() -> (ToolRegistry, Arc<HostTool>, Arc<HostTool>) {
    let list = HostTool::new("list", "List the files.", list_schema(), |_| {
        Ok(ToolOutput::text("a.txt\nnotes.txt"))
    });
    let read = HostTool::new("read", "Read one file.", read_schema(), |args| {
        match args["path"].as_str() {
            Some("notes.txt") => Ok(ToolOutput::text("buy milk")),
            Some(other) => Err(ToolError::Failed(format!("{other}: no such file"))),
            None => Err(ToolError::InvalidArgs("path".into())),
        }
    });
    let mut registry = ToolRegistry::new();
    registry.register(list.clone()).unwrap();
    registry.register(read.clone()).unwrap();
    (registry, list, read)
}

fn agent(provider: Arc<dyn Provider>, tools: ToolRegistry) -> AgentLoop {
    AgentLoop::new(provider, tools, AgentConfig::default())
}

#[tokio::test]
async fn multi_step_tool_use_sends_exact_anthropic_bodies() {
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Let me look."),
            anthropic::tool("t1", "list", json!({})),
        ]),
        anthropic::message(&[anthropic::tool("t2", "read", json!({"path": "notes.txt"}))]),
        anthropic::message(&[anthropic::text("The notes say: buy milk.")]),
    ])
    .await;
    let (tools, list, read) = file_like_tools();
    let agent = agent(anthropic_provider(&server), tools.clone());
    let mut history = vec![ChatMessage::user("What do my notes say?")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();

    assert_eq!(outcome.text, "The notes say: buy milk.");
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(outcome.iterations, 3);
    assert_eq!(outcome.usage.input_tokens, 300);
    assert_eq!(outcome.usage.output_tokens, 60);
    assert_eq!(outcome.answered_by, "anthropic/claude-test");
    assert_eq!((list.calls(), read.calls()), (1, 1));
    assert_eq!(history.len(), 6);

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.header("x-api-key"), Some("test-key-123"));
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(request.header("authorization"), None);
    }
    let tool_definitions = json!([
        {"name": "list", "description": "List the files.", "input_schema": list_schema()},
        {"name": "read", "description": "Read one file.", "input_schema": read_schema()},
    ]);
    assert_eq!(
        requests[2].body,
        json!({
            "model": "claude-test",
            "max_tokens": 8192,
            "system": DEFAULT_SYSTEM_PROMPT,
            "tools": tool_definitions,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What do my notes say?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "list", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt\nnotes.txt"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {"path": "notes.txt"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "buy milk"},
                ]},
            ],
        })
    );
    // Each request carries the history up to that point, no more.
    assert_eq!(requests[0].body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(requests[1].body["messages"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn multi_step_tool_use_sends_exact_openai_bodies() {
    let server = LlmServer::start(vec![
        openai::message(None, &[("call_1", "read", r#"{"path":"missing.txt"}"#)]),
        openai::message(
            Some("Looking at the notes instead."),
            &[("call_2", "read", r#"{"path":"notes.txt"}"#)],
        ),
        openai::message(Some("buy milk"), &[]),
    ])
    .await;
    let (tools, _, read) = file_like_tools();
    let agent = agent(openai_provider(&server), tools);
    let mut history = vec![ChatMessage::user("Read my notes.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.text, "buy milk");
    assert_eq!(read.calls(), 2);
    assert_eq!(outcome.usage.input_tokens, 150);

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].path, "/chat/completions");
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer test-key-123")
    );
    assert_eq!(requests[0].header("x-api-key"), None);
    assert_eq!(
        requests[2].body,
        json!({
            "model": "test-model",
            "max_tokens": 8192,
            "tools": [
                {"type": "function", "function": {"name": "list", "description": "List the files.", "parameters": list_schema()}},
                {"type": "function", "function": {"name": "read", "description": "Read one file.", "parameters": read_schema()}},
            ],
            "messages": [
                {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                {"role": "user", "content": "Read my notes."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": r#"{"path":"missing.txt"}"#}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "failed: missing.txt: no such file"},
                {"role": "assistant", "content": "Looking at the notes instead.", "tool_calls": [
                    {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": r#"{"path":"notes.txt"}"#}},
                ]},
                {"role": "tool", "tool_call_id": "call_2", "content": "buy milk"},
            ],
        })
    );
}

#[tokio::test]
async fn tool_errors_go_back_as_error_results() {
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::tool("t1", "read", json!({"path": "gone.txt"})),
            anthropic::tool("t2", "read", json!({"path": 42})),
            anthropic::tool("t3", "delete_everything", json!({})),
        ]),
        anthropic::message(&[anthropic::text("Those did not work.")]),
    ])
    .await;
    let (tools, _, read) = file_like_tools();
    let agent = agent(anthropic_provider(&server), tools);
    let mut history = vec![ChatMessage::user("go")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.text, "Those did not work.");
    // Only the call with valid arguments reached the tool.
    assert_eq!(read.calls(), 1);

    let results = &server.requests()[1].body["messages"][2]["content"];
    assert_eq!(
        results[0],
        json!({"type": "tool_result", "tool_use_id": "t1", "content": "failed: gone.txt: no such file", "is_error": true})
    );
    assert_eq!(results[1]["is_error"], true);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("field `path`"),
        "{results}"
    );
    // A tool outside the registry is an error result naming the tools that exist; nothing runs.
    assert_eq!(results[2]["is_error"], true);
    assert_eq!(
        results[2]["content"],
        "invalid arguments: unknown tool `delete_everything`; the available tools are: list, read"
    );
}

#[tokio::test]
async fn the_iteration_cap_stops_a_turn_and_leaves_a_valid_history() {
    let replies = (0..10)
        .map(|i| {
            anthropic::message(&[anthropic::tool(
                &format!("t{i}"),
                "read",
                json!({"path": format!("f{i}")}),
            )])
        })
        .collect();
    let server = LlmServer::start(replies).await;
    let (tools, _, read) = file_like_tools();
    let config = AgentConfig {
        max_iterations: 3,
        ..AgentConfig::default()
    };
    let agent = AgentLoop::new(anthropic_provider(&server), tools, config);
    let mut history = vec![ChatMessage::user("loop forever")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();

    assert_eq!(outcome.end, TurnEnd::IterationLimit);
    assert_eq!(outcome.iterations, 3);
    assert!(
        outcome.text.contains("after 3 model calls"),
        "{}",
        outcome.text
    );
    assert_eq!(server.requests().len(), 3);
    // The third request's calls are answered but not run.
    assert_eq!(read.calls(), 2);
    let last = history.last().unwrap();
    assert!(last.has_tool_results());
    let text = serde_json::to_string(last).unwrap();
    assert!(
        text.contains("not run: the turn reached its limit of 3 model calls"),
        "{text}"
    );
}

#[tokio::test]
async fn repeated_identical_calls_are_detected_and_stopped() {
    let same = || anthropic::message(&[anthropic::tool("t", "read", json!({"path": "notes.txt"}))]);
    let server = LlmServer::start(vec![same(), same(), same(), same(), same()]).await;
    let (tools, _, read) = file_like_tools();
    let agent = agent(anthropic_provider(&server), tools);
    let mut history = vec![ChatMessage::user("read it")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();

    assert_eq!(
        outcome.end,
        TurnEnd::LoopDetected {
            tool: "read".into()
        }
    );
    assert!(
        outcome
            .text
            .contains("`read` with the same arguments 3 times"),
        "{}",
        outcome.text
    );
    assert_eq!(
        server.requests().len(),
        3,
        "no request after the loop is detected"
    );
    assert_eq!(read.calls(), 2, "the third identical call is not run");

    // Different arguments in between reset the count.
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool("a", "read", json!({"path": "notes.txt"}))]),
        anthropic::message(&[anthropic::tool("b", "read", json!({"path": "notes.txt"}))]),
        anthropic::message(&[anthropic::tool("c", "list", json!({}))]),
        anthropic::message(&[anthropic::tool("d", "read", json!({"path": "notes.txt"}))]),
        anthropic::message(&[anthropic::text("done")]),
    ])
    .await;
    let (tools, _, read) = file_like_tools();
    let agent = self::agent(anthropic_provider(&server), tools);
    let mut history = vec![ChatMessage::user("read it")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(read.calls(), 3);
}

#[tokio::test]
async fn repeated_operator_denials_end_the_turn_instead_of_asking_again() {
    // Each call differs (so it is not a repeat), and each is denied by the operator.
    let server = LlmServer::start(
        (0..5)
            .map(|n| {
                anthropic::message(&[anthropic::tool(
                    &format!("t{n}"),
                    "run",
                    json!({"command": format!("rm -r build{n}")}),
                )])
            })
            .collect(),
    )
    .await;
    let run = HostTool::new(
        "run",
        "Run a command.",
        json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        |_| {
            Err(ToolError::Denied(
                "denied by the operator: the user refused this command".into(),
            ))
        },
    );
    let mut tools = ToolRegistry::new();
    tools.register(run.clone()).unwrap();
    let agent = agent(anthropic_provider(&server), tools);
    let mut history = vec![ChatMessage::user("clean up")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::LoopDetected { tool: "run".into() });
    assert!(
        outcome.text.contains("the operator denied 3 `run` calls"),
        "{}",
        outcome.text
    );
    assert_eq!(run.calls(), 3);
    assert_eq!(
        server.requests().len(),
        3,
        "no model call after the third denial"
    );
}

#[tokio::test]
async fn malformed_tool_call_json_is_repaired_or_returned_as_an_error() {
    // Streaming delivers the arguments as text: one call has a stray closing brace (repaired),
    // one is cut inside a string (refused), one is not an object (refused).
    let server = LlmServer::start(vec![
        anthropic::stream(
            &[
                anthropic::raw_tool("t1", "read", r#"{"path": "notes.txt"}}"#),
                anthropic::raw_tool("t2", "read", r#"{"path": "not"#),
                anthropic::raw_tool("t3", "list", r#"[1, 2]"#),
            ],
            7,
        ),
        openai::message(Some("ok"), &[]),
    ])
    .await;
    let (tools, list, read) = file_like_tools();
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        tools,
        AgentConfig {
            stream: true,
            ..AgentConfig::default()
        },
    );
    let mut history = vec![ChatMessage::user("go")];
    // The second reply is in the wrong format on purpose: the loop must report, not panic.
    let error = agent.run_turn(&mut history, &NoEvents).await.unwrap_err();
    assert!(error.to_string().contains("no `content` array"), "{error}");
    assert_eq!((read.calls(), list.calls()), (1, 0));

    let second = &server.requests()[1].body;
    let calls = &second["messages"][1]["content"];
    assert_eq!(calls[0]["input"], json!({"path": "notes.txt"}));
    assert_eq!(
        calls[1]["input"],
        json!({}),
        "an unreadable call is echoed with empty input"
    );
    let results = &second["messages"][2]["content"];
    assert_eq!(
        results[0],
        json!({"type": "tool_result", "tool_use_id": "t1", "content": "buy milk"})
    );
    for (index, problem) in [(1, "not valid JSON"), (2, "must be a JSON object")] {
        assert_eq!(results[index]["is_error"], true);
        let text = results[index]["content"].as_str().unwrap();
        assert!(
            text.contains(problem) && text.contains("nothing was run"),
            "{text}"
        );
    }
    // What happened before the failure is kept in the history.
    assert_eq!(history.len(), 3);
}

#[tokio::test]
async fn openai_arguments_are_repaired_only_when_unambiguous() {
    let server = LlmServer::start(vec![
        openai::message(
            None,
            &[
                ("c1", "read", "```json\n{\"path\": \"notes.txt\"}\n```"),
                ("c2", "list", ""),
                ("c3", "read", r#"{"path": "a"}{"path": "b"}"#),
            ],
        ),
        openai::message(Some("done"), &[]),
    ])
    .await;
    let (tools, list, read) = file_like_tools();
    let agent = agent(openai_provider(&server), tools);
    let mut history = vec![ChatMessage::user("go")];
    agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!((read.calls(), list.calls()), (1, 1));
    let messages = &server.requests()[1].body["messages"];
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"path":"notes.txt"}"#
    );
    assert_eq!(messages[3]["content"], "buy milk");
    assert_eq!(messages[4]["content"], "a.txt\nnotes.txt");
    let refused = messages[5]["content"].as_str().unwrap();
    assert!(
        refused.contains("unexpected text after the arguments"),
        "{refused}"
    );
}
