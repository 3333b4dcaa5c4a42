//! Sessions: lanes run different sessions in parallel and one session's turns in order;
//! transcripts survive a restart, respect the history limit and a reset, and keep a failed turn;
//! notifications published on the bus reach a session through its lane.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_agent::provider::{
    ChatRequest, ChatResponse, NoEvents, ProviderError, ProviderEvents, StopReason,
};
use clawcage_agent::{
    AgentConfig, AgentError, AgentLoop, JsonlTranscripts, LaneInput, MessageBus, Provider,
    Sessions, ToolRegistry, TranscriptStore,
};
use clawcage_core::{BoxFuture, ContentBlock, InboundMessage, Usage};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, message_texts};
use tokio::sync::Barrier;

use crate::agent_loop::anthropic_provider;

/// A provider that answers `done <input>`, keeps a log of when each session's requests start and
/// end, and holds the first request of sessions A and B until both have started.
#[derive(Debug)]
struct GateProvider {
    barrier: Barrier,
    log: Mutex<Vec<String>>,
    in_flight: Mutex<HashMap<char, usize>>,
    most_in_flight: Mutex<HashMap<char, usize>>,
}

impl Provider for GateProvider {
    fn label(&self) -> String {
        "test/gate".into()
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        _events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let input = request.messages.last().unwrap().text();
            let session = input.chars().next().unwrap();
            {
                let mut in_flight = self.in_flight.lock().unwrap();
                let now = in_flight.entry(session).or_default();
                *now += 1;
                let most = *now;
                let mut record = self.most_in_flight.lock().unwrap();
                let entry = record.entry(session).or_default();
                *entry = (*entry).max(most);
            }
            self.log.lock().unwrap().push(format!("start {input}"));
            if input == "A1" || input == "B1" {
                // Completes only if both sessions' first turns run at the same time.
                self.barrier.wait().await;
            }
            tokio::task::yield_now().await;
            self.log.lock().unwrap().push(format!("end {input}"));
            *self.in_flight.lock().unwrap().get_mut(&session).unwrap() -= 1;
            Ok(ChatResponse {
                content: vec![ContentBlock::text(format!("done {input}"))],
                stop_reason: StopReason::EndTurn,
                usage: Usage {
                    input_tokens: 1,
                    output_tokens: 1,
                    ..Usage::default()
                },
                answered_by: "test/gate".into(),
                malformed: vec![],
                repairs: vec![],
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_in_parallel_and_turns_within_one_stay_in_order() {
    let provider = Arc::new(GateProvider {
        barrier: Barrier::new(2),
        log: Mutex::new(Vec::new()),
        in_flight: Mutex::new(HashMap::new()),
        most_in_flight: Mutex::new(HashMap::new()),
    });
    let agent = AgentLoop::new(
        provider.clone(),
        ToolRegistry::new(),
        AgentConfig::default(),
    );
    let sessions = Sessions::new(agent, None, 100);
    let observer = Arc::new(NoEvents);
    // A's three turns are queued before B's first; B1 must not wait for A2 and A3, and A1 must
    // not finish before B1 starts (the barrier), so a single global queue would deadlock.
    let pending: Vec<_> = ["A1", "A2", "A3", "B1", "B2"]
        .iter()
        .map(|input| {
            let key = if input.starts_with('A') {
                "session-a"
            } else {
                "session-b"
            };
            (
                *input,
                sessions.submit(key, LaneInput::User(input.to_string()), observer.clone()),
            )
        })
        .collect();
    let outcomes = tokio::time::timeout(Duration::from_secs(60), async {
        let mut texts = Vec::new();
        for (input, turn) in pending {
            texts.push((input, turn.wait().await.unwrap().unwrap().text));
        }
        texts
    })
    .await
    .expect("the two sessions' first turns ran at the same time");
    for (input, text) in outcomes {
        assert_eq!(text, format!("done {input}"));
    }

    let log = provider.log.lock().unwrap().clone();
    let position = |entry: &str| log.iter().position(|line| line == entry).unwrap();
    assert!(position("end A1") < position("start A2"), "{log:?}");
    assert!(position("end A2") < position("start A3"), "{log:?}");
    assert!(position("end B1") < position("start B2"), "{log:?}");
    assert!(position("start B1") < position("end A1"), "{log:?}");
    let most = provider.most_in_flight.lock().unwrap().clone();
    assert_eq!(most[&'A'], 1, "never two turns of one session at once");
    assert_eq!(most[&'B'], 1);
    assert_eq!(
        sessions.usage("session-a"),
        Usage {
            input_tokens: 3,
            output_tokens: 3,
            ..Usage::default()
        }
    );
    // Each session's history holds only its own turns: A3's request saw A1..A3 and B's saw B's.
}

fn sessions_with(server: &LlmServer, dir: &std::path::Path, limit: usize) -> Sessions {
    let agent = AgentLoop::new(
        anthropic_provider(server),
        ToolRegistry::new(),
        AgentConfig::default(),
    );
    Sessions::new(agent, Some(JsonlTranscripts::new(dir).shared()), limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transcript_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("Noted: 42.")]),
        anthropic::message(&[anthropic::text("Also noted.")]),
        anthropic::message(&[anthropic::text("You said 42.")]),
    ])
    .await;
    {
        let sessions = sessions_with(&server, state.path(), 100);
        sessions
            .send_user("cli:main", "Remember 42.", Arc::new(NoEvents))
            .await
            .unwrap();
        sessions
            .send_user("cli:main", "And 43.", Arc::new(NoEvents))
            .await
            .unwrap();
    }
    let file = JsonlTranscripts::new(state.path()).path("cli:main");
    let lines = std::fs::read_to_string(&file).unwrap();
    let kinds: Vec<String> = lines
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["kind"].to_string())
        .collect();
    assert_eq!(
        kinds.join(" ").replace('"', ""),
        "start message used message turn start message used message turn",
        "each turn journaled as it happened, then committed:\n{lines}"
    );
    assert!(
        !lines.contains("test-key"),
        "the key never reaches a transcript"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a transcript is private to its owner");
    }

    // A new runtime on the same state directory continues the conversation.
    let sessions = sessions_with(&server, state.path(), 100);
    assert_eq!(
        sessions
            .send_user("cli:main", "What did I say?", Arc::new(NoEvents))
            .await
            .unwrap()
            .text,
        "You said 42."
    );
    assert_eq!(
        message_texts(&server.bodies()[2]),
        [
            "Remember 42.",
            "Noted: 42.",
            "And 43.",
            "Also noted.",
            "What did I say?"
        ]
    );
    assert_eq!(
        sessions.usage("cli:main"),
        Usage {
            input_tokens: 300,
            output_tokens: 60,
            ..Usage::default()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_bounded_reset_is_recorded_and_a_damaged_line_is_skipped() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(
        (0..6)
            .map(|i| anthropic::message(&[anthropic::text(&format!("answer {i}"))]))
            .collect(),
    )
    .await;
    {
        let sessions = sessions_with(&server, state.path(), 3);
        for i in 0..3 {
            sessions
                .send_user("s", format!("question {i}"), Arc::new(NoEvents))
                .await
                .unwrap();
        }
        // Within one run the limit holds: after each turn the history keeps at most 3 messages,
        // cut so that it starts with a user message; the next request adds the new input.
        assert_eq!(
            message_texts(&server.bodies()[2]),
            ["question 1", "answer 1", "question 2"]
        );
        assert_eq!(
            message_texts(&server.bodies()[1]),
            ["question 0", "answer 0", "question 1"]
        );
    }
    // A crash mid-write leaves half a line; it is skipped, the rest loads.
    let file = JsonlTranscripts::new(state.path()).path("s");
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("{\"kind\":\"message\",\"at_ms\":1,\"mess");
    std::fs::write(&file, text).unwrap();
    let loaded = JsonlTranscripts::new(state.path()).load("s", 3).unwrap();
    assert_eq!(loaded.skipped_lines, 1);
    assert_eq!(loaded.messages.len(), 2);

    let sessions = sessions_with(&server, state.path(), 3);
    sessions
        .send_user("s", "question 3", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(
        message_texts(&server.bodies()[3]),
        ["question 2", "answer 2", "question 3"]
    );
    sessions.reset("s").await.unwrap();
    sessions
        .send_user("s", "fresh start", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(message_texts(&server.bodies()[4]), ["fresh start"]);
    drop(sessions);
    let loaded = JsonlTranscripts::new(state.path()).load("s", 100).unwrap();
    assert_eq!(
        loaded.messages.len(),
        2,
        "only what follows the reset is loaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_is_still_recorded() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![Reply::status(400, "invalid request", &[])]).await;
    let sessions = sessions_with(&server, state.path(), 100);
    let error = sessions
        .send_user("s", "this will fail", Arc::new(NoEvents))
        .await
        .unwrap_err();
    assert!(matches!(error, AgentError::Provider(_)), "{error}");
    let text = std::fs::read_to_string(JsonlTranscripts::new(state.path()).path("s")).unwrap();
    assert!(text.contains("this will fail"), "{text}");
    assert!(
        text.contains("error: anthropic/claude-test answered HTTP 400"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_on_the_bus_reach_the_session_through_its_lane() {
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::text("Hello.")]),
        anthropic::message(&[anthropic::text("The sub-agent found 3 files.")]),
    ])
    .await;
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        ToolRegistry::new(),
        AgentConfig::default(),
    );
    let sessions = Sessions::new(agent, None, 100);
    let bus = MessageBus::new();
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let router = sessions.deliver_notifications(
        bus.subscribe("system"),
        Arc::new(NoEvents),
        Arc::new(
            move |message: &InboundMessage, outcome: Result<_, AgentError>| {
                let _ = sender.send((message.sender.clone(), outcome.map(|o| o.text)));
            },
        ),
    );
    sessions
        .send_user("cli", "Hi", Arc::new(NoEvents))
        .await
        .unwrap();
    bus.publish(InboundMessage {
        channel: "system".into(),
        sender: "subagent:1".into(),
        session_key: "cli".into(),
        content: "Task finished: 3 files found.".into(),
    })
    .unwrap();
    let (sender, outcome) = tokio::time::timeout(Duration::from_secs(30), outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sender, "subagent:1");
    assert_eq!(outcome.unwrap(), "The sub-agent found 3 files.");
    assert_eq!(
        message_texts(&server.bodies()[1]),
        [
            "Hi",
            "Hello.",
            "[notification on the `system` channel from subagent:1]\nTask finished: 3 files found."
        ]
    );
    assert_eq!(bus.queued("system"), 0);
    router.stop();
}

/// Ctrl-C in the REPL: the running turn stops, what it did is kept (a call left without a result
/// gets one, so the history stays valid), and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_turn_keeps_what_it_did_and_the_session_goes_on() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Waiting at the gate."),
            anthropic::tool("g1", "gate", serde_json::json!({})),
        ]),
        anthropic::message(&[anthropic::text("Back again.")]),
    ])
    .await;
    let (gate, _never_opened) = crate::subagents::gate();
    let mut tools = ToolRegistry::new();
    tools.register(gate).unwrap();
    let agent = AgentLoop::new(anthropic_provider(&server), tools, AgentConfig::default());
    let sessions = Sessions::new(
        agent,
        Some(JsonlTranscripts::new(state.path()).shared()),
        100,
    );

    let pending = sessions.submit(
        "s",
        LaneInput::User("Go through the gate.".into()),
        Arc::new(NoEvents),
    );
    // Interrupt once the tool is running (the model has answered).
    for _ in 0..600 {
        if server.requests().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    sessions.interrupt("s");
    let error = tokio::time::timeout(Duration::from_secs(10), pending.wait())
        .await
        .expect("the interrupt ends the turn")
        .unwrap_err();
    assert_eq!(error, AgentError::Interrupted);

    let transcript =
        std::fs::read_to_string(JsonlTranscripts::new(state.path()).path("s")).unwrap();
    assert!(transcript.contains("Go through the gate."), "{transcript}");
    assert!(transcript.contains("Waiting at the gate."), "{transcript}");
    assert!(
        transcript.contains("interrupted by the user"),
        "{transcript}"
    );

    // The next turn sends a valid history: the call, its result, then the new input.
    let outcome = sessions
        .send_user("s", "Never mind.", Arc::new(NoEvents))
        .await
        .unwrap();
    assert_eq!(outcome.text, "Back again.");
    let messages = server.bodies()[1]["messages"].clone();
    let last = &messages.as_array().unwrap()[2];
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"][0]["type"], "tool_result");
    assert_eq!(last["content"][0]["tool_use_id"], "g1");
    assert_eq!(last["content"][0]["is_error"], true);
    assert_eq!(last["content"][1]["text"], "Never mind.");
}
