//! Long sessions against the scripted LLM server, with the exact request bodies: a session driven
//! past the compaction threshold is compacted (the summary request carries the older turns) and
//! every request stays inside the window; a restart keeps the summary; `/compact`; an enormous
//! tool result trimmed with a note; a summary reply that is itself too long; a provider that
//! refuses for context length gets exactly one compaction and one retry, then a clear message;
//! a message larger than the window is refused before any request; `cache_control` breakpoints
//! for a short and a long history and the cache tokens of both wire formats; budgets (notice at
//! 80 %, stop at 100 %, also inside a turn); `MEMORY.md` and the `memory` tool through the
//! sandboxed file component; the `compaction` event front ends receive.

use std::sync::{Arc, Mutex};

use clawcage_agent::agent_loop::{DEFAULT_SYSTEM_PROMPT, SUMMARY_CUT_NOTE, TurnObserver};
use clawcage_agent::compaction::{SUMMARY_HEADER, SUMMARY_SYSTEM_PROMPT};
use clawcage_agent::memory::MemoryTool;
use clawcage_agent::provider::{self, NoEvents, ProviderConfig, ProviderEvents};
use clawcage_agent::{
    AgentConfig, AgentError, AgentLoop, Budget, BudgetConfig, Compaction, ContextPolicy,
    JsonlTranscripts, Metered, Provider, Sessions, ToolRegistry,
};
use clawcage_core::{ChatMessage, Tool, ToolOutput, Usage};
use clawcage_sandbox::FsMode;
use clawcage_tests::host_tools::HostTool;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, openai};
use serde_json::{Value, json};

use crate::agent_loop::{anthropic_provider, openai_provider, settings};

/// Hears notes and compactions.
#[derive(Default)]
struct Heard {
    notes: Mutex<Vec<String>>,
    compactions: Mutex<Vec<Compaction>>,
}

impl ProviderEvents for Heard {}

impl TurnObserver for Heard {
    fn note(&self, text: &str) {
        self.notes.lock().unwrap().push(text.to_string());
    }

    fn compacted(&self, compaction: &Compaction) {
        self.compactions.lock().unwrap().push(compaction.clone());
    }
}

const SYSTEM: &str = "You help.";

fn config() -> AgentConfig {
    AgentConfig {
        system_prompt: SYSTEM.into(),
        ..AgentConfig::default()
    }
}

/// The `read` tool: `r<n>:` and 1600 x's.
fn read_tool() -> Arc<HostTool> {
    HostTool::new(
        "read",
        "Read part n.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}),
        |args| {
            Ok(ToolOutput::text(format!(
                "r{}:{}",
                args["n"],
                "x".repeat(1600)
            )))
        },
    )
}

fn registry(tools: &[Arc<HostTool>]) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for tool in tools {
        registry.register(tool.clone()).unwrap();
    }
    registry
}

/// The text of the last text block of the last message of a request body.
fn last_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .and_then(|message| message["content"].as_array())
        .and_then(|blocks| {
            blocks
                .iter()
                .rev()
                .find_map(|block| block["text"].as_str().map(str::to_string))
        })
        .unwrap_or_default()
}

fn last_tool_result_id(body: &Value) -> Option<String> {
    let message = body["messages"].as_array()?.last()?;
    message["content"]
        .as_array()?
        .iter()
        .find_map(|block| block["tool_use_id"].as_str().map(str::to_string))
}

const SUMMARY: &str = "The user asked for parts 1 to 4; each read returned x's.";

/// A model that reads part N for `turn N`, answers `done N` after the result, and summarises.
fn reader_server() -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    |body: &Value| {
        if body["system"] == SUMMARY_SYSTEM_PROMPT {
            return anthropic::message(&[anthropic::text(SUMMARY)]);
        }
        if let Some(id) = last_tool_result_id(body) {
            return anthropic::message(&[anthropic::text(&format!("done {}", &id[1..]))]);
        }
        let text = last_text(body);
        let n: u64 = text.trim_start_matches("turn ").parse().unwrap_or(0);
        anthropic::message(&[anthropic::tool(&format!("t{n}"), "read", json!({"n": n}))])
    }
}

fn small_window() -> ContextPolicy {
    ContextPolicy::new(4096, 512)
}

fn reader_sessions(server: &LlmServer, dir: &std::path::Path) -> Sessions {
    let agent = AgentLoop::new(
        anthropic_provider(server),
        registry(&[read_tool()]),
        config(),
    )
    .with_context(small_window());
    Sessions::new(agent, Some(JsonlTranscripts::new(dir).shared()), 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_is_compacted_every_request_fits_and_a_restart_keeps_the_summary() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start_routed(reader_server()).await;
    let heard = Arc::new(Heard::default());
    {
        let sessions = reader_sessions(&server, state.path());
        for n in 1..=8 {
            let outcome = sessions
                .send_user("s", format!("turn {n}"), heard.clone())
                .await
                .unwrap();
            assert_eq!(outcome.text, format!("done {n}"));
        }
    }
    let bodies = server.bodies();
    // Every request fits the window beside the reply, by a measure independent of the
    // estimator: the JSON text of the whole body at 4 bytes a token.
    for body in &bodies {
        assert!(
            body.to_string().len() / 4 < 4096 - 512,
            "{} bytes",
            body.to_string().len()
        );
    }
    let summaries: Vec<usize> = (0..bodies.len())
        .filter(|&i| bodies[i]["system"] == SUMMARY_SYSTEM_PROMPT)
        .collect();
    assert_eq!(summaries.len(), 1, "one compaction");
    // It happened inside turn 7, before its second model call: turns 1-6 took two requests
    // each, turn 7 one.
    assert_eq!(summaries[0], 13);
    let compactions = heard.compactions.lock().unwrap().clone();
    assert_eq!(compactions.len(), 1);
    assert_eq!((compactions[0].summarised, compactions[0].kept), (16, 11));
    assert!(compactions[0].tokens_before > small_window().compact_at());
    assert!(compactions[0].tokens_after < small_window().keep_recent() + 200);

    // The summary request carries turns 1 to 4, whole, and nothing else.
    let mut older = String::from("Summarise this conversation so far (oldest first):\n");
    for n in 1..=4 {
        older.push_str(&format!(
            "[user] turn {n}\n[assistant called read] {{\"n\":{n}}}\n[tool result] r{n}:{}\n[assistant] done {n}\n",
            "x".repeat(1600)
        ));
    }
    assert_eq!(
        bodies[summaries[0]],
        json!({
            "model": "claude-test",
            "max_tokens": 512, // the policy's max_tokens, below what the window leaves
            "system": SUMMARY_SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": [{"type": "text", "text": older}]}],
        })
    );
    // The next request starts with the summary in front of turn 5.
    let after = &bodies[summaries[0] + 1]["messages"];
    assert_eq!(
        after[0]["content"],
        json!([
            {"type": "text", "text": format!("{SUMMARY_HEADER}\n{SUMMARY}\n\n")},
            {"type": "text", "text": "turn 5"},
        ])
    );
    assert_eq!(after.as_array().unwrap().len(), 11);

    // The transcript keeps every message and records the compaction where it happened.
    let file = std::fs::read_to_string(JsonlTranscripts::new(state.path()).path("s")).unwrap();
    assert!(
        file.contains("\"r1:xxxx"),
        "turn 1's result is still in the file"
    );
    assert_eq!(file.matches("\"kind\":\"compaction\"").count(), 1);

    // A restart: the history the model sees is the summary and the recent turns, as before.
    let sessions = reader_sessions(&server, state.path());
    sessions
        .send_user("s", "turn 9", heard.clone())
        .await
        .unwrap();
    let bodies = server.bodies();
    let turn8_second = &bodies[bodies.len() - 3]["messages"];
    let resumed = &bodies[bodies.len() - 2]["messages"];
    let mut expected = turn8_second.as_array().unwrap().clone();
    expected.push(json!({"role": "assistant", "content": [{"type": "text", "text": "done 8"}]}));
    expected.push(json!({"role": "user", "content": [{"type": "text", "text": "turn 9"}]}));
    assert_eq!(resumed, &Value::Array(expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_on_demand_and_a_summary_that_is_itself_too_long_is_cut() {
    let state = tempfile::tempdir().unwrap();
    let long_summary = "s".repeat(100_000);
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("one")]),
        anthropic::message(&[anthropic::text("two")]),
        anthropic::message(&[anthropic::text(&long_summary)]),
        anthropic::message(&[anthropic::text("three")]),
    ])
    .await;
    let policy = ContextPolicy::new(20_000, 1000);
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(policy.clone());
    let sessions = Sessions::new(
        agent,
        Some(JsonlTranscripts::new(state.path()).shared()),
        200,
    );
    let said = sessions.compact("s", Arc::new(NoEvents)).await.unwrap();
    assert_eq!(said, "nothing to compact: the history is too short");
    sessions
        .send_user("s", "First.", Arc::new(NoEvents))
        .await
        .unwrap();
    sessions
        .send_user("s", "Second.", Arc::new(NoEvents))
        .await
        .unwrap();
    let said = sessions.compact("s", Arc::new(NoEvents)).await.unwrap();
    assert!(
        said.starts_with("history compacted (as asked): 2 older messages summarised, 2 kept"),
        "{said}"
    );
    sessions
        .send_user("s", "Third.", Arc::new(NoEvents))
        .await
        .unwrap();
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 4);
    assert_eq!(
        bodies[2]["messages"][0]["content"][0]["text"],
        "Summarise this conversation so far (oldest first):\n[user] First.\n[assistant] one\n"
    );
    let max_chars = policy.max_summary() * 4;
    let first = bodies[3]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(first.starts_with(SUMMARY_HEADER));
    assert!(
        first.ends_with(&format!(
            "[the summary was cut at {max_chars} characters]\n\n"
        )),
        "{}",
        &first[first.len() - 80..]
    );
    assert!(first.len() < max_chars as usize + 300);
    assert_eq!(bodies[3]["messages"][0]["content"][1]["text"], "Second.");
    // The summary's tokens count for the session.
    assert_eq!(sessions.usage("s").input_tokens, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enormous_tool_result_is_trimmed_with_a_note_and_kept_whole_in_the_transcript() {
    let state = tempfile::tempdir().unwrap();
    let content: String = (1..=30_000).map(|n| format!("line {n}\n")).collect();
    let big = content.clone();
    let read_file = HostTool::new(
        "read_file",
        "Read a file.",
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        move |_| Ok(ToolOutput::text(big.clone())),
    );
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "t1",
            "read_file",
            json!({"path": "big.txt"}),
        )]),
        anthropic::message(&[anthropic::text("It is long.")]),
    ])
    .await;
    let policy = ContextPolicy::new(32_768, 1024);
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        registry(&[read_file]),
        config(),
    )
    .with_context(policy.clone());
    let sessions = Sessions::new(
        agent,
        Some(JsonlTranscripts::new(state.path()).shared()),
        200,
    );
    sessions
        .send_user("s", "Read big.txt.", Arc::new(NoEvents))
        .await
        .unwrap();
    let bodies = server.bodies();
    let sent = bodies[1]["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap();
    let max_chars = (policy.max_tool_result() * 4) as usize;
    let shown = &content[..max_chars];
    let next_line = 1 + shown.matches('\n').count();
    assert_eq!(
        sent,
        format!(
            "{shown}\n[clawcage trimmed this tool result to keep the conversation within the model's context window: it had {} characters, the first {max_chars} are shown above. To see the rest, call read_file with path \"big.txt\" and offset={next_line} (and a smaller limit) to read on from there.]",
            content.len()
        )
    );
    assert!(bodies[1].to_string().len() / 4 < 32_768 - 1024);
    let file = std::fs::read_to_string(JsonlTranscripts::new(state.path()).path("s")).unwrap();
    assert!(
        file.contains("line 30000"),
        "the transcript keeps the whole result"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_length_error_gets_exactly_one_compaction_and_one_retry() {
    let refused = || {
        Reply::status(
            400,
            "prompt is too long: 210000 tokens > 200000 maximum",
            &[],
        )
    };
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("Noted.")]),
        anthropic::message(&[anthropic::text("Also noted.")]),
        refused(),
        anthropic::message(&[anthropic::text("S: the code is 7.")]),
        anthropic::message(&[anthropic::text("The code is 7.")]),
    ])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(200_000, 8192));
    let sessions = Sessions::new(agent, None, 200);
    let heard = Arc::new(Heard::default());
    for text in ["The code is 7.", "And 8 is not."] {
        sessions.send_user("s", text, heard.clone()).await.unwrap();
    }
    let outcome = sessions
        .send_user("s", "What is the code?", heard.clone())
        .await
        .unwrap();
    assert_eq!(outcome.text, "The code is 7.");
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 5, "refused, summarised, retried once");
    assert_eq!(bodies[3]["system"], SUMMARY_SYSTEM_PROMPT);
    assert_eq!(
        bodies[3]["messages"][0]["content"][0]["text"],
        "Summarise this conversation so far (oldest first):\n[user] The code is 7.\n[assistant] Noted.\n"
    );
    assert_eq!(
        bodies[4]["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": format!("{SUMMARY_HEADER}\nS: the code is 7.\n\n")},
                {"type": "text", "text": "And 8 is not."},
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "Also noted."}]},
            {"role": "user", "content": [{"type": "text", "text": "What is the code?"}]},
        ])
    );
    let compactions = heard.compactions.lock().unwrap();
    assert_eq!(compactions.len(), 1);
    assert_eq!(compactions[0].reason.as_str(), "overflow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_keeps_refusing_for_length_gets_one_retry_then_a_clear_message() {
    let refused = || {
        Reply::status(
            400,
            "prompt is too long: 210000 tokens > 200000 maximum",
            &[],
        )
    };
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("Noted.")]),
        refused(),
        anthropic::message(&[anthropic::text("S")]),
        refused(),
        refused(),
        refused(),
    ])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(200_000, 8192));
    let sessions = Sessions::new(agent, None, 200);
    sessions
        .send_user("s", "One.", Arc::new(NoEvents))
        .await
        .unwrap();
    let error = sessions
        .send_user("s", "Two.", Arc::new(NoEvents))
        .await
        .unwrap_err();
    assert!(matches!(error, AgentError::ContextFull(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("it was compacted once and is still too long"),
        "{message}"
    );
    assert!(message.contains("context_window"), "{message}");
    assert_eq!(server.bodies().len(), 4, "never a loop");
    assert_eq!(server.remaining(), 2);
}

/// A summary the model stopped at its output-token limit says so, in what the model is sent
/// next and in the compaction the person hears of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_cut_at_the_output_limit_says_so() {
    let mut cut = match anthropic::message(&[anthropic::text("The user asked for a rep")]) {
        Reply::Json { body, .. } => serde_json::from_str::<Value>(&body).unwrap(),
        _ => panic!("a JSON reply was expected"),
    };
    cut["stop_reason"] = json!("max_tokens");
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("one")]),
        anthropic::message(&[anthropic::text("two")]),
        Reply::json(cut),
        anthropic::message(&[anthropic::text("three")]),
    ])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(20_000, 1000));
    let sessions = Sessions::new(agent, None, 200);
    for text in ["First.", "Second."] {
        sessions
            .send_user("s", text, Arc::new(NoEvents))
            .await
            .unwrap();
    }
    let heard = Arc::new(Heard::default());
    sessions.compact("s", heard.clone()).await.unwrap();
    let summary = heard.compactions.lock().unwrap()[0].summary.clone();
    assert!(summary.ends_with(SUMMARY_CUT_NOTE), "{summary}");
    sessions
        .send_user("s", "Third.", Arc::new(NoEvents))
        .await
        .unwrap();
    let sent = server.bodies()[3]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.contains("output-token limit"), "{sent}");
}

/// One message the provider finds too long, with nothing before it: the person is told only
/// what happens (no compaction is promised that cannot be made), and nothing more is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_message_promises_no_compaction() {
    let server = LlmServer::start(vec![Reply::status(
        400,
        "prompt is too long: 210000 tokens > 200000 maximum",
        &[],
    )])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(200_000, 8192));
    let sessions = Sessions::new(agent, None, 200);
    let heard = Arc::new(Heard::default());
    let error = sessions
        .send_user("s", "One long message.", heard.clone())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("nothing older is left to compact"),
        "{message}"
    );
    let notes = heard.notes.lock().unwrap().clone();
    assert!(
        notes.iter().all(|note| !note.contains("compacting")),
        "{notes:?}"
    );
    assert!(heard.compactions.lock().unwrap().is_empty());
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_the_window_is_refused_before_any_request() {
    let server = LlmServer::start(vec![]).await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(4096, 512));
    let sessions = Sessions::new(agent, None, 200);
    let error = sessions
        .send_user("s", "y".repeat(40_000), Arc::new(NoEvents))
        .await
        .unwrap_err();
    assert!(matches!(error, AgentError::ContextFull(_)), "{error:?}");
    assert!(
        error.to_string().contains("Send a shorter message"),
        "{error}"
    );
    assert!(server.bodies().is_empty());
}

fn caching_provider(server: &LlmServer) -> Arc<dyn Provider> {
    let mut settings = settings(server, "claude-test");
    settings.prompt_cache = true;
    provider::build(ProviderConfig::Anthropic(settings), &[]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_marks_the_system_prompt_and_the_stable_history_prefix() {
    let server = LlmServer::start(vec![
        anthropic::message_with_usage(
            &[anthropic::tool("t1", "read", json!({"n": 1}))],
            json!({"input_tokens": 20, "cache_creation_input_tokens": 1500, "output_tokens": 10}),
        ),
        anthropic::message_with_usage(
            &[anthropic::text("done")],
            json!({"input_tokens": 30, "cache_read_input_tokens": 1500, "cache_creation_input_tokens": 450, "output_tokens": 5}),
        ),
    ])
    .await;
    let tool = HostTool::new("read", "Read part n.", json!({"type": "object"}), |_| {
        Ok(ToolOutput::text("part"))
    });
    let agent = AgentLoop::new(
        caching_provider(&server),
        registry(&[tool]),
        AgentConfig::default(),
    );
    let mut history = vec![ChatMessage::user("Read part 1.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(
        outcome.usage,
        Usage {
            input_tokens: 3500,
            output_tokens: 15,
            cache_read_tokens: 1500,
            cache_write_tokens: 1950,
        }
    );
    assert!((outcome.usage.cache_hit_ratio() - 1500.0 / 3500.0).abs() < 1e-9);
    let bodies = server.bodies();
    let ephemeral = json!({"type": "ephemeral"});
    let system =
        json!([{"type": "text", "text": DEFAULT_SYSTEM_PROMPT, "cache_control": ephemeral}]);
    let tools = json!([{"name": "read", "description": "Read part n.", "input_schema": {"type": "object"}}]);
    // A short history: the system prompt (with the tools before it) and the one message.
    assert_eq!(
        bodies[0],
        json!({
            "model": "claude-test",
            "max_tokens": 8192,
            "system": system,
            "tools": tools,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Read part 1.", "cache_control": ephemeral}]},
            ],
        })
    );
    // A longer one: the last message, where the next request will read from, and the user
    // message the previous request ended with.
    assert_eq!(
        bodies[1]["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Read part 1.", "cache_control": ephemeral}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"n": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "part", "cache_control": ephemeral}]},
        ])
    );
    assert_eq!(bodies[1]["system"], system);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_compatible_cached_tokens_are_recorded() {
    let server = LlmServer::start(vec![openai::message_with_usage(
        Some("Hi."),
        &[],
        json!({"prompt_tokens": 2000, "completion_tokens": 7, "total_tokens": 2007, "prompt_tokens_details": {"cached_tokens": 1536}}),
    )])
    .await;
    let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config());
    let mut history = vec![ChatMessage::user("Hello.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(
        outcome.usage,
        Usage {
            input_tokens: 2000,
            output_tokens: 7,
            cache_read_tokens: 1536,
            cache_write_tokens: 0,
        }
    );
    assert!((outcome.usage.cache_hit_ratio() - 0.768).abs() < 1e-9);
}

/// Sessions held to `budget` as the runtime holds them: the provider metered by the budget, and
/// the sessions counting against it.
fn budget_sessions(server: &LlmServer, tools: ToolRegistry, budget: BudgetConfig) -> Sessions {
    let budget = Arc::new(Budget::new(budget, None));
    let provider = Arc::new(Metered::new(anthropic_provider(server), budget.clone()));
    let agent = AgentLoop::new(provider, tools, config());
    let sessions = Sessions::new(agent, None, 200);
    assert!(sessions.set_budget(budget));
    sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_gives_notice_at_80_percent_and_stops_at_100() {
    // Every reply counts 100 in and 20 out.
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("one")]),
        anthropic::message(&[anthropic::text("two")]),
        anthropic::message(&[anthropic::text("three")]),
    ])
    .await;
    let sessions = budget_sessions(
        &server,
        ToolRegistry::new(),
        BudgetConfig {
            session_tokens: Some(300),
            daily_tokens: None,
        },
    );
    let heard = Arc::new(Heard::default());
    sessions.send_user("s", "1", heard.clone()).await.unwrap();
    assert!(heard.notes.lock().unwrap().is_empty());
    sessions.send_user("s", "2", heard.clone()).await.unwrap();
    assert_eq!(
        heard.notes.lock().unwrap().clone(),
        ["this session has used 80% of its 300 tokens ([budget] session_tokens)"]
    );
    sessions.send_user("s", "3", heard.clone()).await.unwrap();
    assert!(heard.notes.lock().unwrap()[1].contains("has used all of its 300 tokens"));
    let error = sessions
        .send_user("s", "4", heard.clone())
        .await
        .unwrap_err();
    assert!(matches!(error, AgentError::Budget(_)), "{error:?}");
    assert!(
        error.to_string().contains("/reset starts it afresh"),
        "{error}"
    );
    assert_eq!(server.bodies().len(), 3, "a spent budget sends nothing");
    // Nor does /compact: its summary is a model call too.
    let refused = sessions.compact("s", heard.clone()).await.unwrap_err();
    assert!(matches!(refused, AgentError::Budget(_)), "{refused:?}");
    assert_eq!(server.bodies().len(), 3, "a spent budget compacts nothing");
    let report = sessions.usage_report("s");
    assert_eq!(
        report,
        "tokens since the last reset: 300 in, 60 out; cache: 0 read, 0 written (0% of the input read from the cache)\nsession budget: 360 of 300 tokens (120%), its sub-agents included"
    );
    // A reset starts the session's budget afresh.
    sessions.reset("s").await.unwrap();
    assert_eq!(sessions.usage("s"), Usage::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stops_inside_when_the_budget_is_spent() {
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool("t1", "read", json!({"n": 1}))]),
        anthropic::message(&[anthropic::text("never asked")]),
    ])
    .await;
    let sessions = budget_sessions(
        &server,
        registry(&[read_tool()]),
        BudgetConfig {
            session_tokens: None,
            daily_tokens: Some(100),
        },
    );
    let error = sessions
        .send_user("s", "turn 1", Arc::new(NoEvents))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("today's budget of 100 tokens is spent"),
        "{error}"
    );
    assert_eq!(server.bodies().len(), 1);
    // What the stopped turn used counts: the day is spent.
    let error = sessions
        .send_user("s", "turn 2", Arc::new(NoEvents))
        .await
        .unwrap_err();
    assert!(matches!(error, AgentError::Budget(_)));
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_tool_appends_through_the_sandboxed_file_component() {
    let dir = tempfile::tempdir().unwrap();
    let files = clawcage_tests::file_registry(dir.path(), FsMode::ReadWrite).await;
    let memory = MemoryTool::new(
        files.get("read_file").unwrap().clone(),
        files.get("write_file").unwrap().clone(),
    );
    memory
        .call(&json!({"fact": "The user prefers tea."}))
        .await
        .unwrap();
    let said = memory
        .call(&json!({"fact": "Deploys  happen\non Fridays."}))
        .await
        .unwrap();
    assert!(said.text.contains("of 16384 bytes used"), "{}", said.text);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("MEMORY.md")).unwrap(),
        "- The user prefers tea.\n- Deploys happen on Fridays.\n"
    );
    let error = memory
        .call(&json!({"fact": "y".repeat(501)}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "invalid_args", "{error}");
    // A fact that would grow the file past what the prompt reads is refused.
    std::fs::write(dir.path().join("MEMORY.md"), "- f\n".repeat(5000)).unwrap();
    let error = memory.call(&json!({"fact": "one more"})).await.unwrap_err();
    assert!(error.to_string().contains("past the 16384"), "{error}");

    // A read-only workspace refuses the write as it refuses any.
    let read_only = clawcage_tests::file_registry(dir.path(), FsMode::ReadOnly).await;
    let memory = MemoryTool::new(
        read_only.get("read_file").unwrap().clone(),
        read_only.get("write_file").unwrap().clone(),
    );
    std::fs::write(dir.path().join("MEMORY.md"), "").unwrap();
    let error = memory.call(&json!({"fact": "x"})).await.unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("MEMORY.md")).unwrap(),
        ""
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_file_linked_outside_the_workspace_is_neither_read_nor_written() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "- the root password\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&secret, dir.path().join("MEMORY.md")).unwrap();
    let files = clawcage_tests::file_registry(dir.path(), FsMode::ReadWrite).await;
    let memory = MemoryTool::new(
        files.get("read_file").unwrap().clone(),
        files.get("write_file").unwrap().clone(),
    );
    assert!(memory.call(&json!({"fact": "x"})).await.is_err());
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "- the root password\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_compatible_length_refusal_is_compacted_and_retried_in_its_wire_format() {
    let refused = Reply::Json {
        status: 400,
        headers: Vec::new(),
        body: json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}).to_string(),
    };
    let server = LlmServer::start(vec![
        openai::message(Some("Noted."), &[]),
        refused,
        openai::message(Some("S: the code is 7."), &[]),
        openai::message(Some("The code is 7."), &[]),
    ])
    .await;
    let agent = AgentLoop::new(openai_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(8192, 1024));
    let sessions = Sessions::new(agent, None, 200);
    sessions
        .send_user("s", "The code is 7.", Arc::new(NoEvents))
        .await
        .unwrap();
    let outcome = sessions
        .send_user("s", "What is the code?", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(outcome.text, "The code is 7.");
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 4);
    assert_eq!(
        bodies[2],
        json!({
            "model": "test-model",
            "max_tokens": 1024,
            "messages": [
                {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
                {"role": "user", "content": "Summarise this conversation so far (oldest first):\n[user] The code is 7.\n[assistant] Noted.\n"},
            ],
        })
    );
    assert_eq!(
        bodies[3]["messages"],
        json!([
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": format!("{SUMMARY_HEADER}\nS: the code is 7.\n\nWhat is the code?")},
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_reaches_front_ends_as_an_event_on_the_compaction_stream() {
    use clawcage_agent::events::{EventObserver, Stream};

    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("one")]),
        anthropic::message(&[anthropic::text("two")]),
        anthropic::message(&[anthropic::text("The user said First.")]),
    ])
    .await;
    let agent = AgentLoop::new(anthropic_provider(&server), ToolRegistry::new(), config())
        .with_context(ContextPolicy::new(20_000, 1000));
    let sessions = Sessions::new(agent, None, 200);
    for text in ["First.", "Second."] {
        sessions
            .send_user("s", text, Arc::new(NoEvents))
            .await
            .unwrap();
    }
    let (observer, mut events) = EventObserver::channel("s", "run-1");
    sessions.compact("s", Arc::new(observer)).await.unwrap();
    let event = events.try_recv().unwrap();
    assert_eq!(event.stream, Stream::Compaction);
    assert_eq!(event.run_id, "run-1");
    assert_eq!(event.data["reason"], "requested");
    assert_eq!(event.data["summarisedMessages"], 2);
    assert_eq!(event.data["keptMessages"], 2);
    assert_eq!(event.data["summary"], "The user said First.");
}
