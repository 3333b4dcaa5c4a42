//! Queue modes: what a message that reaches a busy session does. Each test holds a turn — at
//! the scripted LLM server's gate, or in a tool that waits at a gate — submits messages while it
//! is held, and asserts what each submission was told at once and the exact history the model
//! was sent afterwards: steered messages after the skipped calls' results, follow-up turns in
//! arrival order, the collected text per channel, the interrupted turn's kept messages, each drop
//! policy at the cap, the quiet window, concurrent senders, and the `/queue` override. Ordering
//! comes from events (a request reaching the gate, a tool starting), never from sleeping; most
//! tests run on one thread, so messages submitted together arrive together.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::agent_loop::SKIPPED_FOR_NEW_MESSAGE;
use clawcage_agent::provider::{NoEvents, ProviderEvents};
use clawcage_agent::session::queue::collect_text;
use clawcage_agent::session::{
    Admission, DropPolicy, DropReason, Origin, QueueConfig, QueueMode, QueueSettings,
};
use clawcage_agent::{
    AgentConfig, AgentError, AgentLoop, JsonlTranscripts, LaneInput, PendingTurn, Provider,
    Sessions, ToolRegistry, TranscriptStore, TurnObserver,
};
use clawcage_core::{InboundMessage, ToolCall, ToolOutput};
use clawcage_tests::host_tools::HostTool;
use clawcage_tests::llm_server::{LlmServer, Reply, ReplyGate, anthropic, message_texts, openai};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agent_loop::{anthropic_provider, openai_provider};

/// Reports each tool call as it starts.
struct ToolStarts(mpsc::UnboundedSender<String>);

impl ProviderEvents for ToolStarts {}

impl TurnObserver for ToolStarts {
    fn tool_started(&self, call: &ToolCall) {
        let _ = self.0.send(call.name.clone());
    }
}

fn tool_starts() -> (Arc<ToolStarts>, mpsc::UnboundedReceiver<String>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (Arc::new(ToolStarts(sender)), receiver)
}

/// Wait until the tool `name` has started.
async fn started(starts: &mut mpsc::UnboundedReceiver<String>, name: &str) {
    within(async {
        while let Some(started) = starts.recv().await {
            if started == name {
                return;
            }
        }
        panic!("the turn ended before `{name}` started");
    })
    .await
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("the test's turns finish")
}

fn queue(mode: QueueMode) -> QueueConfig {
    QueueConfig {
        settings: QueueSettings {
            mode,
            debounce_ms: 0,
            cap: 20,
            drop: DropPolicy::Summarize,
        },
        by_channel: BTreeMap::new(),
    }
}

fn sessions_with(
    provider: Arc<dyn Provider>,
    tools: ToolRegistry,
    queue: QueueConfig,
    store: Option<Arc<dyn TranscriptStore>>,
) -> Sessions {
    Sessions::with_queue(
        AgentLoop::new(provider, tools, AgentConfig::default()),
        store,
        100,
        queue,
    )
}

/// Sessions over the Anthropic format at `server`, with no tools and no transcripts.
fn toolless_sessions(server: &LlmServer, queue: QueueConfig) -> Sessions {
    sessions_with(anthropic_provider(server), ToolRegistry::new(), queue, None)
}

/// `gate` (waits for the test) and `lookup` (must never run in these tests).
fn gate_and_lookup() -> (
    ToolRegistry,
    tokio::sync::watch::Sender<bool>,
    Arc<HostTool>,
) {
    let (gate, open) = crate::subagents::gate();
    let lookup = HostTool::new(
        "lookup",
        "Look something up.",
        json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
        |args| Ok(ToolOutput::text(format!("value of {}", args["key"]))),
    );
    let mut tools = ToolRegistry::new();
    tools.register(gate).unwrap();
    tools.register(lookup.clone()).unwrap();
    (tools, open, lookup)
}

fn answer(text: &str) -> Reply {
    anthropic::message(&[anthropic::text(text)])
}

fn submit(sessions: &Sessions, key: &str, text: &str) -> PendingTurn {
    sessions.submit(key, LaneInput::User(text.into()), Arc::new(NoEvents))
}

fn from(channel: &str, text: &str) -> LaneInput {
    LaneInput::FromChannel {
        text: text.into(),
        origin: Origin {
            channel: Some(channel.into()),
            thread: None,
        },
    }
}

async fn outcome(pending: PendingTurn) -> String {
    within(pending.wait()).await.unwrap().unwrap().text
}

async fn dropped(pending: PendingTurn) -> DropReason {
    match within(pending.wait()).await {
        Err(AgentError::Dropped(reason)) => reason,
        other => panic!("expected a dropped message, got {other:?}"),
    }
}

fn user_text(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}]})
}

fn skipped(id: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": SKIPPED_FOR_NEW_MESSAGE, "is_error": true})
}

/// `steer`: three messages arrive while the first of three tool calls runs. That call finishes;
/// the two not started are skipped, each with a result saying why; the messages follow the
/// results as the user's, before the next model call; every submitter gets that turn's answer,
/// and the transcript holds it all.
#[tokio::test]
async fn steer_takes_messages_in_at_the_next_safe_point_and_skips_the_calls_not_started() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Working."),
            anthropic::tool("g1", "gate", json!({})),
            anthropic::tool("l1", "lookup", json!({"key": "a"})),
            anthropic::tool("l2", "lookup", json!({"key": "b"})),
        ]),
        answer("Took in all three."),
    ])
    .await;
    let (tools, open, lookup) = gate_and_lookup();
    let sessions = sessions_with(
        anthropic_provider(&server),
        tools,
        QueueConfig::default(),
        Some(JsonlTranscripts::new(state.path()).shared()),
    );
    let (observer, mut starts) = tool_starts();

    let turn = sessions.submit("s", LaneInput::User("Start.".into()), observer);
    assert_eq!(turn.admission(), &Admission::Started);
    started(&mut starts, "gate").await;
    let steered: Vec<PendingTurn> = ["M1", "M2", "M3"]
        .iter()
        .map(|text| submit(&sessions, "s", text))
        .collect();
    for pending in &steered {
        assert_eq!(pending.admission(), &Admission::Steered);
    }
    open.send_replace(true);

    assert_eq!(outcome(turn).await, "Took in all three.");
    for pending in steered {
        assert_eq!(outcome(pending).await, "Took in all three.");
    }
    assert_eq!(lookup.calls(), 0, "the calls not started never ran");
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[1]["messages"],
        json!([
            user_text("Start."),
            {"role": "assistant", "content": [
                {"type": "text", "text": "Working."},
                {"type": "tool_use", "id": "g1", "name": "gate", "input": {}},
                {"type": "tool_use", "id": "l1", "name": "lookup", "input": {"key": "a"}},
                {"type": "tool_use", "id": "l2", "name": "lookup", "input": {"key": "b"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "g1", "content": "the gate is open"},
                skipped("l1"),
                skipped("l2"),
                {"type": "text", "text": "M1\n\nM2\n\nM3"},
            ]},
        ])
    );
    drop(sessions);
    let loaded = JsonlTranscripts::new(state.path()).load("s", 100).unwrap();
    assert_eq!(loaded.messages.len(), 4, "{:?}", loaded.messages);
    assert_eq!(loaded.messages[2].text(), "M1\n\nM2\n\nM3");
}

/// The same steering in the OpenAI format: every call still has its `tool` message, and the
/// steered text is a user message after them.
#[tokio::test]
async fn a_steered_history_is_valid_in_the_openai_format() {
    let server = LlmServer::start(vec![
        openai::message(
            Some("Working."),
            &[("g1", "gate", "{}"), ("l1", "lookup", r#"{"key":"a"}"#)],
        ),
        openai::message(Some("Noted."), &[]),
    ])
    .await;
    let (tools, open, lookup) = gate_and_lookup();
    let sessions = sessions_with(
        openai_provider(&server),
        tools,
        queue(QueueMode::Steer),
        None,
    );
    let (observer, mut starts) = tool_starts();

    let turn = sessions.submit("s", LaneInput::User("Start.".into()), observer);
    started(&mut starts, "gate").await;
    let steered = [
        submit(&sessions, "s", "Stop, use b."),
        submit(&sessions, "s", "And c."),
        submit(&sessions, "s", "Thanks."),
    ];
    open.send_replace(true);
    assert_eq!(outcome(turn).await, "Noted.");
    for pending in steered {
        assert_eq!(outcome(pending).await, "Noted.");
    }
    assert_eq!(lookup.calls(), 0);
    let messages = server.bodies()[1]["messages"].clone();
    assert_eq!(
        messages.as_array().unwrap()[1..],
        json!([
            {"role": "user", "content": "Start."},
            {"role": "assistant", "content": "Working.", "tool_calls": [
                {"id": "g1", "type": "function", "function": {"name": "gate", "arguments": "{}"}},
                {"id": "l1", "type": "function", "function": {"name": "lookup", "arguments": "{\"key\":\"a\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "g1", "content": "the gate is open"},
            {"role": "tool", "tool_call_id": "l1", "content": SKIPPED_FOR_NEW_MESSAGE},
            {"role": "user", "content": "Stop, use b.\n\nAnd c.\n\nThanks."},
        ])
        .as_array()
        .unwrap()[..]
    );
}

/// A message steered while the model writes its final answer cannot enter that turn: it starts
/// the next one.
#[tokio::test]
async fn a_message_steered_after_the_final_answer_starts_the_next_turn() {
    let gate = ReplyGate::new();
    let server = LlmServer::start(vec![
        gate.hold(answer("First answer.")),
        answer("Second answer."),
    ])
    .await;
    let sessions = toolless_sessions(&server, queue(QueueMode::Steer));
    let turn = submit(&sessions, "s", "First.");
    within(gate.reached(1)).await;
    let late = submit(&sessions, "s", "Second.");
    assert_eq!(late.admission(), &Admission::Steered);
    gate.open();
    assert_eq!(outcome(turn).await, "First answer.");
    assert_eq!(outcome(late).await, "Second answer.");
    assert_eq!(
        message_texts(&server.bodies()[1]),
        ["First.", "First answer.", "Second."]
    );
}

/// `followup`: four messages, four turns after the running one, in arrival order.
#[tokio::test]
async fn followup_runs_each_message_as_its_own_turn_in_arrival_order() {
    let gate = ReplyGate::new();
    let mut replies = vec![gate.hold(answer("answer 0"))];
    replies.extend((1..=4).map(|i| answer(&format!("answer {i}"))));
    let server = LlmServer::start(replies).await;
    let sessions = toolless_sessions(&server, queue(QueueMode::Followup));
    let turn = submit(&sessions, "s", "M0");
    within(gate.reached(1)).await;
    let queued: Vec<PendingTurn> = (1..=4)
        .map(|i| submit(&sessions, "s", &format!("M{i}")))
        .collect();
    for (index, pending) in queued.iter().enumerate() {
        assert_eq!(
            pending.admission(),
            &Admission::Queued {
                position: index + 1
            }
        );
    }
    gate.open();
    assert_eq!(outcome(turn).await, "answer 0");
    for (index, pending) in queued.into_iter().enumerate() {
        assert_eq!(outcome(pending).await, format!("answer {}", index + 1));
    }
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 5);
    assert_eq!(
        message_texts(&bodies[4]),
        [
            "M0", "answer 0", "M1", "answer 1", "M2", "answer 2", "M3", "answer 3", "M4"
        ]
    );
}

/// `collect`: five messages from two channels drain as one turn per channel, each listing its
/// messages in arrival order.
#[tokio::test]
async fn collect_drains_the_queued_messages_as_one_turn_per_channel() {
    let gate = ReplyGate::new();
    let server = LlmServer::start(vec![
        gate.hold(answer("answer 0")),
        answer("answer x"),
        answer("answer y"),
    ])
    .await;
    let sessions = toolless_sessions(&server, queue(QueueMode::Collect));
    let turn = sessions.submit("s", from("x", "Start."), Arc::new(NoEvents));
    within(gate.reached(1)).await;
    let queued: Vec<(&str, PendingTurn)> = [
        ("x", "x1"),
        ("y", "y1"),
        ("x", "x2"),
        ("x", "x3"),
        ("y", "y2"),
    ]
    .iter()
    .map(|(channel, text)| {
        (
            *channel,
            sessions.submit("s", from(channel, text), Arc::new(NoEvents)),
        )
    })
    .collect();
    for (index, (_, pending)) in queued.iter().enumerate() {
        assert_eq!(
            pending.admission(),
            &Admission::Queued {
                position: index + 1
            }
        );
    }
    gate.open();
    assert_eq!(outcome(turn).await, "answer 0");
    for (channel, pending) in queued {
        assert_eq!(outcome(pending).await, format!("answer {channel}"));
    }
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 3);
    let x = "[Queued messages while the agent was busy]\n\n---\nQueued #1\nx1\n\n---\nQueued #2\nx2\n\n---\nQueued #3\nx3";
    let y =
        "[Queued messages while the agent was busy]\n\n---\nQueued #1\ny1\n\n---\nQueued #2\ny2";
    assert_eq!(message_texts(&bodies[1]), ["Start.", "answer 0", x]);
    assert_eq!(
        message_texts(&bodies[2]),
        ["Start.", "answer 0", x, "answer x", y]
    );
}

/// `interrupt`: the first message stops the turn waiting in its tool (its messages are kept,
/// its call answered), the next two arrive before the lane moved on and replace the ones before
/// them, so the newest runs; a fourth stops that turn during its model call.
#[tokio::test]
async fn interrupt_stops_the_turn_keeps_its_messages_and_runs_the_newest() {
    let state = tempfile::tempdir().unwrap();
    let model_gate = ReplyGate::new();
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Opening the gate."),
            anthropic::tool("g1", "gate", json!({})),
        ]),
        model_gate.hold(answer("never seen")),
        answer("Done."),
    ])
    .await;
    let (tools, _never_opened, _) = gate_and_lookup();
    let sessions = sessions_with(
        anthropic_provider(&server),
        tools,
        queue(QueueMode::Interrupt),
        Some(JsonlTranscripts::new(state.path()).shared()),
    );
    let (observer, mut starts) = tool_starts();
    let turn = sessions.submit(
        "s",
        LaneInput::User("Go through the gate.".into()),
        observer,
    );
    started(&mut starts, "gate").await;

    let m1 = submit(&sessions, "s", "M1");
    let m2 = submit(&sessions, "s", "M2");
    let m3 = submit(&sessions, "s", "M3");
    for pending in [&m1, &m2, &m3] {
        assert_eq!(
            pending.admission(),
            &Admission::Interrupting { position: 1 }
        );
    }
    assert_eq!(
        within(turn.wait()).await.unwrap_err(),
        AgentError::Interrupted
    );
    assert_eq!(dropped(m1).await, DropReason::Superseded);
    assert_eq!(dropped(m2).await, DropReason::Superseded);

    within(model_gate.reached(1)).await;
    let kept = json!([
        user_text("Go through the gate."),
        {"role": "assistant", "content": [
            {"type": "text", "text": "Opening the gate."},
            {"type": "tool_use", "id": "g1", "name": "gate", "input": {}},
        ]},
    ]);
    let dangling = json!({"type": "tool_result", "tool_use_id": "g1", "content": "interrupted by a new message before it finished (it may have partly run)", "is_error": true});
    let mut expected = kept.as_array().unwrap().clone();
    expected.push(json!({"role": "user", "content": [dangling, {"type": "text", "text": "M3"}]}));
    assert_eq!(server.bodies()[1]["messages"], Value::Array(expected));

    let m4 = submit(&sessions, "s", "M4");
    assert_eq!(m4.admission(), &Admission::Interrupting { position: 1 });
    assert_eq!(
        within(m3.wait()).await.unwrap_err(),
        AgentError::Interrupted
    );
    assert_eq!(outcome(m4).await, "Done.");
    let mut expected = kept.as_array().unwrap().clone();
    expected.push(json!({"role": "user", "content": [
        dangling,
        {"type": "text", "text": "M3"},
        {"type": "text", "text": "M4"},
    ]}));
    assert_eq!(server.bodies()[2]["messages"], Value::Array(expected));
    model_gate.open();

    drop(sessions);
    let transcript =
        std::fs::read_to_string(JsonlTranscripts::new(state.path()).path("s")).unwrap();
    assert!(
        transcript.contains("interrupted by a new message"),
        "{transcript}"
    );
    assert!(
        !transcript.contains("\"M1\""),
        "a dropped message never ran"
    );
}

/// The cap with each drop policy: `old` evicts the oldest, `new` refuses the newcomer, and
/// `summarize` evicts the oldest but tells the agent about it in one line.
#[tokio::test]
async fn the_cap_with_each_drop_policy() {
    let long = format!("Please look at this.\n{}", "very long message ".repeat(20));
    let summary = format!(
        "{}…",
        &long.split_whitespace().collect::<Vec<_>>().join(" ")[..159]
    );
    for drop in [DropPolicy::Old, DropPolicy::New, DropPolicy::Summarize] {
        let gate = ReplyGate::new();
        let server = LlmServer::start(vec![
            gate.hold(answer("answer 0")),
            answer("answer 1"),
            answer("answer 2"),
        ])
        .await;
        let mut config = queue(QueueMode::Followup);
        config.settings.cap = 2;
        config.settings.drop = drop;
        let sessions = toolless_sessions(&server, config);
        let turn = submit(&sessions, "s", "M0");
        within(gate.reached(1)).await;
        let m1 = submit(&sessions, "s", &long);
        let m2 = submit(&sessions, "s", "M2");
        let m3 = submit(&sessions, "s", "M3");
        assert_eq!(m1.admission(), &Admission::Queued { position: 1 });
        assert_eq!(m2.admission(), &Admission::Queued { position: 2 });
        gate.open();
        assert_eq!(outcome(turn).await, "answer 0");
        let bodies = match drop {
            DropPolicy::New => {
                assert_eq!(
                    m3.admission(),
                    &Admission::Dropped {
                        reason: DropReason::QueueFull { cap: 2 }
                    }
                );
                assert_eq!(dropped(m3).await, DropReason::QueueFull { cap: 2 });
                assert_eq!(outcome(m1).await, "answer 1");
                assert_eq!(outcome(m2).await, "answer 2");
                let bodies = server.bodies();
                assert_eq!(message_texts(&bodies[1])[2], long);
                bodies
            }
            DropPolicy::Old | DropPolicy::Summarize => {
                assert_eq!(m3.admission(), &Admission::Queued { position: 2 });
                let reason = if drop == DropPolicy::Old {
                    DropReason::Evicted { cap: 2 }
                } else {
                    DropReason::Summarized { cap: 2 }
                };
                assert_eq!(dropped(m1).await, reason);
                assert_eq!(outcome(m2).await, "answer 1");
                assert_eq!(outcome(m3).await, "answer 2");
                let bodies = server.bodies();
                let expected = if drop == DropPolicy::Old {
                    "M2".to_string()
                } else {
                    format!(
                        "[Queue overflow] Dropped 1 message while the agent was busy; one line from each:\n- {summary}\n\nM2"
                    )
                };
                assert_eq!(message_texts(&bodies[1])[2], expected, "{drop}");
                assert_eq!(message_texts(&bodies[2])[4], "M3");
                bodies
            }
        };
        assert_eq!(bodies.len(), 3, "{drop}");
    }
    assert_eq!(summary.chars().count(), 160);
}

/// `collect` waits for a quiet window after the newest message: one that arrives after the
/// running turn ended, within the window, joins the batch, and the batch drains no earlier than
/// the window after it.
#[tokio::test]
async fn collect_waits_for_a_quiet_window_after_the_newest_message() {
    let gate = ReplyGate::new();
    let server = LlmServer::start(vec![gate.hold(answer("answer 0")), answer("answer 1")]).await;
    let mut config = queue(QueueMode::Collect);
    config.settings.debounce_ms = 2000;
    let sessions = toolless_sessions(&server, config);
    let turn = submit(&sessions, "s", "M0");
    within(gate.reached(1)).await;
    let m1 = submit(&sessions, "s", "M1");
    gate.open();
    assert_eq!(outcome(turn).await, "answer 0");
    // The turn has ended; the batch waits for its window.
    let m2 = submit(&sessions, "s", "M2");
    let sent = Instant::now();
    assert_eq!(m2.admission(), &Admission::Queued { position: 2 });
    assert_eq!(outcome(m1).await, "answer 1");
    assert_eq!(outcome(m2).await, "answer 1");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        message_texts(&requests[1].body)[2],
        collect_text(["M1".to_string(), "M2".to_string()])
    );
    let quiet = requests[1].at.saturating_duration_since(sent);
    assert!(
        quiet >= Duration::from_millis(1990),
        "drained {quiet:?} after the newest message"
    );
}

/// Ten senders submit to one busy session at the same time: each gets a distinct place, the
/// turns run in exactly that order, and no message is lost or doubled; in `collect` mode the
/// ten drain as one turn in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_senders_keep_arrival_order_and_lose_or_double_nothing() {
    for mode in [QueueMode::Followup, QueueMode::Collect] {
        let gate = ReplyGate::new();
        let mut replies = vec![gate.hold(answer("answer 0"))];
        replies.extend((1..=10).map(|i| answer(&format!("answer {i}"))));
        let server = LlmServer::start(replies).await;
        let sessions = toolless_sessions(&server, queue(mode));
        let turn = submit(&sessions, "s", "M0");
        within(gate.reached(1)).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(10));
        let senders: Vec<_> = (0..10)
            .map(|i| {
                let sessions = sessions.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let text = format!("sender {i}");
                    let pending = submit(&sessions, "s", &text);
                    (text, pending)
                })
            })
            .collect();
        let mut submitted = Vec::new();
        for sender in senders {
            submitted.push(sender.await.unwrap());
        }
        // Sorted by place in the queue: tickets increase the same way.
        submitted.sort_by_key(|(_, pending)| match pending.admission() {
            Admission::Queued { position } => *position,
            other => panic!("{other:?}"),
        });
        for (index, (_, pending)) in submitted.iter().enumerate() {
            assert_eq!(
                pending.admission(),
                &Admission::Queued {
                    position: index + 1
                }
            );
            if index > 0 {
                assert!(pending.ticket() > submitted[index - 1].1.ticket());
            }
        }
        gate.open();
        assert_eq!(outcome(turn).await, "answer 0");
        let order: Vec<String> = submitted.iter().map(|(text, _)| text.clone()).collect();
        for (index, (_, pending)) in submitted.into_iter().enumerate() {
            let expected = match mode {
                QueueMode::Collect => "answer 1".to_string(),
                _ => format!("answer {}", index + 1),
            };
            assert_eq!(outcome(pending).await, expected);
        }
        let bodies = server.bodies();
        match mode {
            QueueMode::Collect => {
                assert_eq!(bodies.len(), 2);
                assert_eq!(message_texts(&bodies[1])[2], collect_text(order.clone()));
            }
            _ => {
                assert_eq!(bodies.len(), 11);
                let last = message_texts(&bodies[10]);
                let asked: Vec<&String> = last.iter().skip(2).step_by(2).collect();
                assert_eq!(
                    asked,
                    order.iter().collect::<Vec<_>>(),
                    "each once, in order"
                );
            }
        }
    }
}

/// `/queue` sets a session's own settings over the channel's and the configuration's, and
/// `/queue reset` goes back to them; bad commands name the valid values.
#[tokio::test]
async fn the_queue_command_overrides_a_session_and_reset_restores_the_configuration() {
    let gate = ReplyGate::new();
    let server = LlmServer::start(vec![
        gate.hold(answer("answer 0")),
        answer("answer 1"),
        answer("answer 2"),
    ])
    .await;
    let mut config = queue(QueueMode::Followup);
    config
        .by_channel
        .insert("telegram".into(), QueueMode::Collect);
    let sessions = sessions_with(
        anthropic_provider(&server),
        ToolRegistry::new(),
        config.clone(),
        None,
    );
    let telegram = "agent:main:telegram:alice";
    // Precedence: the channel over the configuration...
    assert_eq!(sessions.queue_settings(telegram).mode, QueueMode::Collect);
    assert_eq!(
        sessions.queue_settings("cli:main").mode,
        QueueMode::Followup
    );
    // ... the session over the channel.
    let said = sessions
        .queue_command(telegram, "/queue steer debounce:2s cap:25 drop:new")
        .unwrap();
    assert_eq!(
        said,
        "queue for this session: steer, debounce 2000 ms, cap 25, drop new"
    );
    assert_eq!(
        sessions.queue_settings(telegram),
        QueueSettings {
            mode: QueueMode::Steer,
            debounce_ms: 2000,
            cap: 25,
            drop: DropPolicy::New,
        }
    );
    assert_eq!(sessions.queue_settings("cli:main"), config.settings);
    assert!(
        sessions
            .queue_command(telegram, "/queue")
            .unwrap()
            .contains("set for this session")
    );

    let turn = submit(&sessions, telegram, "M0");
    within(gate.reached(1)).await;
    let steered = submit(&sessions, telegram, "M1");
    assert_eq!(steered.admission(), &Admission::Steered);
    let said = sessions.queue_command(telegram, "/queue reset").unwrap();
    assert!(said.contains("collect"), "{said}");
    assert_eq!(sessions.queue_settings(telegram).mode, QueueMode::Collect);
    let collected = submit(&sessions, telegram, "M2");
    assert_eq!(collected.admission(), &Admission::Queued { position: 2 });

    for (line, needle) in [
        ("/queue fast", "use steer, followup, collect or interrupt"),
        (
            "/queue collect speed:2",
            "the options are debounce, cap and drop",
        ),
        ("/queue collect drop:all", "use old, new or summarize"),
    ] {
        let error = sessions.queue_command(telegram, line).unwrap_err();
        assert!(error.to_string().contains(needle), "{line}: {error}");
        assert!(error.to_string().contains("usage: /queue"), "{error}");
    }
    assert_eq!(
        sessions.queue_settings(telegram).mode,
        QueueMode::Collect,
        "a bad command changes nothing"
    );

    gate.open();
    assert_eq!(outcome(turn).await, "answer 0");
    assert_eq!(outcome(steered).await, "answer 1");
    assert_eq!(outcome(collected).await, "answer 2");
    assert_eq!(
        message_texts(&server.bodies()[2])[4],
        collect_text(["M2".to_string()])
    );

    // Without configuration every session steers.
    let plain = Sessions::new(
        AgentLoop::new(
            anthropic_provider(&server),
            ToolRegistry::new(),
            AgentConfig::default(),
        ),
        None,
        100,
    );
    assert_eq!(plain.queue_settings(telegram).mode, QueueMode::Steer);
}

/// A notification never enters a user's running turn: it queues as its own turn, and a user
/// message after it waits its turn too.
#[tokio::test]
async fn notifications_are_never_steered_into_a_running_turn() {
    let server = LlmServer::start(vec![
        anthropic::message(&[
            anthropic::text("Waiting."),
            anthropic::tool("g1", "gate", json!({})),
        ]),
        answer("answer 0"),
        answer("answer notification"),
        answer("answer M1"),
    ])
    .await;
    let (tools, open, _) = gate_and_lookup();
    let sessions = sessions_with(
        anthropic_provider(&server),
        tools,
        queue(QueueMode::Steer),
        None,
    );
    let (observer, mut starts) = tool_starts();
    let turn = sessions.submit("s", LaneInput::User("Start.".into()), observer);
    started(&mut starts, "gate").await;
    let message = InboundMessage {
        channel: "system".into(),
        sender: "cron".into(),
        session_key: "s".into(),
        content: "Time to check the build.".into(),
    };
    let notification = sessions.submit(
        "s",
        LaneInput::Notification(message.clone()),
        Arc::new(NoEvents),
    );
    assert_eq!(notification.admission(), &Admission::Queued { position: 1 });
    let user = submit(&sessions, "s", "M1");
    assert_eq!(user.admission(), &Admission::Queued { position: 2 });
    open.send_replace(true);
    assert_eq!(outcome(turn).await, "answer 0");
    assert_eq!(outcome(notification).await, "answer notification");
    assert_eq!(outcome(user).await, "answer M1");
    let bodies = server.bodies();
    assert_eq!(
        bodies[1]["messages"].as_array().unwrap()[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "g1", "content": "the gate is open"},
        ]})
    );
    assert_eq!(
        message_texts(&bodies[3])[3..],
        [
            "answer 0".to_string(),
            clawcage_agent::session::notification_text(&message),
            "answer notification".to_string(),
            "M1".to_string()
        ]
    );
}
