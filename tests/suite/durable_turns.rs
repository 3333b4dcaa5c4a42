//! Durable turns at the sessions' level: a turn whose process stopped is taken up again by the
//! next one on the same state directory. A first runtime is dropped in the middle of a real
//! `exec` call (what a killed process leaves), or the journal is left as a process stopped at a
//! chosen step would leave it; a new [`Sessions`] with the inbox then resumes: the model is asked
//! again only for what had not completed, a started call is answered "may have partly run" and
//! never run twice, a call that never started is said not to have run, an answer that only lacked
//! its commit is committed without a model call, a committed turn whose input was not marked done
//! is answered at once, and the inputs still waiting run after it in their order. A session a
//! process lets go of (its partition handed to another host) stops where it stands and is taken
//! up again the same way by whoever serves it next, this process included. A call whose start
//! the transcript refuses is never run.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::inbox::{InputRecord, InputStatus, LaneInbox};
use clawcage_agent::provider::NoEvents;
use clawcage_agent::session::queue::{Origin, QueuedJob};
use clawcage_agent::session::{InputMeta, RecoveredFate};
use clawcage_agent::transcript::{Entry, now_ms};
use clawcage_agent::{
    AgentConfig, AgentLoop, FileInbox, JsonlTranscripts, LaneInput, Sessions, ToolRegistry,
    TranscriptStore,
};
use clawcage_core::{ChatMessage, ContentBlock, Role, Usage};
use clawcage_sandbox::FsMode;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user, tool_result_of};
use serde_json::{Value, json};

use crate::agent_loop::anthropic_provider;

const KEY: &str = "agent:main:cli:durable";

fn sessions_over(server: &LlmServer, state: &Path, tools: ToolRegistry) -> Sessions {
    let agent = AgentLoop::new(anthropic_provider(server), tools, AgentConfig::default());
    Sessions::new(
        agent,
        Some(JsonlTranscripts::new(state.join("sessions")).shared()),
        100,
    )
    .with_inbox(Arc::new(FileInbox::new(state.join("inbox"))))
}

fn transcript(state: &Path) -> JsonlTranscripts {
    JsonlTranscripts::new(state.join("sessions"))
}

fn user_input(id: &str, text: &str) -> InputRecord {
    InputRecord {
        id: id.to_string(),
        at_ms: now_ms(),
        idempotency: None,
        job: QueuedJob::User {
            text: text.to_string(),
            origin: Origin::of_key(KEY),
        },
        stop_requested: false,
    }
}

fn tool_use(id: &str, command: &str) -> ContentBlock {
    ContentBlock::ToolUse {
        id: id.to_string(),
        name: "exec".to_string(),
        input: json!({"command": command}),
    }
}

/// The journal of a process that stopped during a turn on `text` (input `id`), after `steps`.
fn stopped_turn(state: &Path, id: &str, text: &str, steps: &[Entry]) {
    let inbox = FileInbox::new(state.join("inbox"));
    inbox.append(KEY, &user_input(id, text)).unwrap();
    let mut lines = vec![
        Entry::Start {
            at_ms: 1,
            inputs: vec![id.to_string()],
        },
        Entry::Message {
            at_ms: 1,
            message: ChatMessage::user(text),
        },
    ];
    lines.extend_from_slice(steps);
    transcript(state).append_steps(KEY, &lines).unwrap();
}

/// The tool results of the last user message of a request, by call id.
fn results_of(body: &Value) -> Vec<(String, String)> {
    let last = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    last["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|block| block["type"] == "tool_result")
        .map(|block| {
            let text = tool_result_of(&json!({"content": [block]})).unwrap_or_default();
            (block["tool_use_id"].as_str().unwrap().to_string(), text)
        })
        .collect()
}

/// The reply to the first recovered input.
async fn first_reply(
    recovered: Vec<clawcage_agent::session::Recovered>,
) -> Result<Option<clawcage_agent::TurnOutcome>, clawcage_agent::AgentError> {
    recovered.into_iter().next().unwrap().pending.wait().await
}

fn kinds(state: &Path) -> Vec<String> {
    std::fs::read_to_string(transcript(state).path(KEY))
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// A model whose first answer runs a long `exec` call that notes it ran in `effects.log`, and
/// whose second says `then`.
async fn running_a_long_call_then_saying(then: &str) -> LlmServer {
    LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "t1",
            "exec",
            json!({"command": "echo ran >> effects.log && sleep 30"}),
        )]),
        anthropic::message(&[anthropic::text(then)]),
    ])
    .await
}

/// Waits until the long call noted in `workspace`'s `effects.log` that it ran; the file.
async fn until_the_call_ran(workspace: &Path) -> std::path::PathBuf {
    let effects = workspace.join("effects.log");
    tokio::time::timeout(Duration::from_secs(60), async {
        while !std::fs::read_to_string(&effects).is_ok_and(|text| text.contains("ran")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the call ran");
    effects
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_dropped_during_a_real_exec_call_resumes_without_running_it_again() {
    let state = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let server = running_a_long_call_then_saying("It may have run; I checked: done.").await;
    // The first process: its turn is in the middle of the call when it goes away.
    {
        let tools = clawcage_tests::exec_registry(workspace.path(), FsMode::ReadWrite).await;
        let first = sessions_over(&server, state.path(), tools);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let submitted = {
            let first = first.clone();
            runtime.spawn(async move {
                let pending = first.submit_input(
                    KEY,
                    LaneInput::User("note that it ran".into()),
                    Arc::new(NoEvents),
                    InputMeta {
                        id: Some("run-1".into()),
                        idempotency: Some("k1".into()),
                    },
                );
                let _ = pending.wait().await;
            })
        };
        until_the_call_ran(workspace.path()).await;
        drop(submitted);
        drop(first);
        // Its tasks are dropped where they stand, as a killed process leaves them.
        tokio::task::spawn_blocking(move || runtime.shutdown_timeout(Duration::from_secs(5)))
            .await
            .unwrap();
    }
    assert!(
        !kinds(state.path()).contains(&"turn".to_string()),
        "the turn is open"
    );

    let tools = clawcage_tests::exec_registry(workspace.path(), FsMode::ReadWrite).await;
    let second = sessions_over(&server, state.path(), tools);
    let recovered = second.recover(&|_, _| Arc::new(NoEvents));
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].record.id, "run-1");
    assert_eq!(recovered[0].fate, RecoveredFate::Resumed);
    let outcome = first_reply(recovered).await.unwrap().unwrap();
    assert_eq!(outcome.text, "It may have run; I checked: done.");
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2, "the model is asked once more, not twice");
    let results = results_of(&bodies[1]);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "t1");
    assert!(results[0].1.contains("may have partly run"), "{results:?}");
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("effects.log")).unwrap(),
        "ran\n",
        "the call is never run twice"
    );
    assert_eq!(kinds(state.path()).last().map(String::as_str), Some("turn"));
    let inbox = FileInbox::new(state.path().join("inbox"));
    assert!(inbox.pending(KEY).unwrap().is_empty(), "the input is done");
    // Nothing is taken up twice in one process.
    assert!(second.recover(&|_, _| Arc::new(NoEvents)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_call_keeps_its_result_and_the_started_one_may_have_partly_run() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "two calls",
        &[
            Entry::Message {
                at_ms: 2,
                message: ChatMessage {
                    role: Role::Assistant,
                    cut: None,
                    content: vec![tool_use("t1", "echo one"), tool_use("t2", "echo two")],
                },
            },
            Entry::ToolStarted {
                at_ms: 3,
                tool_use_id: "t1".into(),
            },
            Entry::ToolResult {
                at_ms: 4,
                result: ContentBlock::ToolResult {
                    tool_use_id: "t1".into(),
                    content: "one".into(),
                    is_error: false,
                },
            },
            Entry::ToolStarted {
                at_ms: 5,
                tool_use_id: "t2".into(),
            },
        ],
    );
    let server = LlmServer::start(vec![anthropic::message(&[anthropic::text("ok")])]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    let outcome = first_reply(recovered).await.unwrap().unwrap();
    assert_eq!(outcome.text, "ok");
    let results = results_of(&server.bodies()[0]);
    assert_eq!(results[0], ("t1".to_string(), "one".to_string()));
    assert_eq!(results[1].0, "t2");
    assert!(results[1].1.contains("may have partly run"), "{results:?}");
    assert_eq!(results.len(), 2, "each call answered once");
    // The session goes on from the committed turn.
    let loaded = transcript(state.path()).load(KEY, 100).unwrap();
    assert!(loaded.open.is_none());
    assert_eq!(loaded.answered["run-1"].text, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_started_is_said_not_to_have_run() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "one call",
        &[Entry::Message {
            at_ms: 2,
            message: ChatMessage {
                role: Role::Assistant,
                cut: None,
                content: vec![tool_use("t1", "rm -r build")],
            },
        }],
    );
    let server = LlmServer::start(vec![anthropic::message(&[anthropic::text("ok")])]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    first_reply(recovered).await.unwrap();
    let results = results_of(&server.bodies()[0]);
    assert_eq!(results.len(), 1);
    assert!(
        results[0]
            .1
            .starts_with("not run: the process stopped before this call started"),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_lacked_only_its_commit_is_committed_without_a_model_call() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "hello",
        &[
            Entry::Used {
                at_ms: 2,
                usage: Usage {
                    input_tokens: 7,
                    output_tokens: 3,
                    ..Usage::default()
                },
            },
            Entry::Message {
                at_ms: 3,
                message: ChatMessage::assistant("hello to you"),
            },
        ],
    );
    let server = LlmServer::start(vec![]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    let outcome = first_reply(recovered).await.unwrap().unwrap();
    assert_eq!(outcome.text, "hello to you");
    assert!(server.requests().is_empty(), "no model call");
    let loaded = transcript(state.path()).load(KEY, 100).unwrap();
    assert!(loaded.open.is_none());
    assert_eq!(
        loaded.usage.input_tokens, 7,
        "what the steps used is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_turn_whose_input_was_not_marked_done_is_answered_at_once() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "hello",
        &[
            Entry::Message {
                at_ms: 3,
                message: ChatMessage::assistant("answered before the stop"),
            },
            Entry::Turn {
                at_ms: 4,
                usage: Usage::default(),
                outcome: "anthropic/claude-test".into(),
            },
        ],
    );
    let server = LlmServer::start(vec![]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    assert_eq!(recovered[0].fate, RecoveredFate::Answered);
    let outcome = first_reply(recovered).await.unwrap().unwrap();
    assert_eq!(outcome.text, "answered before the stop");
    assert!(server.requests().is_empty());
    let inbox = FileInbox::new(state.path().join("inbox"));
    assert!(inbox.pending(KEY).unwrap().is_empty());
    assert_eq!(
        kinds(state.path()).iter().filter(|k| *k == "turn").count(),
        1
    );
}

/// A turn a newer message interrupted, committed just before the stop with its input not yet
/// marked done: at the next start it ends interrupted again (its input `aborted`, as it would
/// have been), not as a failure; nothing is asked of the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_turn_that_was_interrupted_ends_interrupted_at_the_next_start() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "hello",
        &[Entry::Turn {
            at_ms: 4,
            usage: Usage::default(),
            outcome: format!("error: {}", clawcage_agent::AgentError::Interrupted),
        }],
    );
    let server = LlmServer::start(vec![]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    assert_eq!(recovered[0].fate, RecoveredFate::Answered);
    let reply = first_reply(recovered).await;
    assert!(
        matches!(reply, Err(clawcage_agent::AgentError::Interrupted)),
        "{reply:?}"
    );
    assert!(server.requests().is_empty());
    let inbox = FileInbox::new(state.path().join("inbox"));
    let finished = inbox.finished(KEY).unwrap();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0].status, InputStatus::Aborted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_still_waiting_run_after_the_resumed_turn_in_their_order() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(state.path(), "run-1", "first", &[]);
    let inbox = FileInbox::new(state.path().join("inbox"));
    inbox.append(KEY, &user_input("run-2", "second")).unwrap();
    inbox.append(KEY, &user_input("run-3", "third")).unwrap();
    drop(inbox);
    let server = LlmServer::start_routed(|body| {
        let (text, _) = last_user(body);
        anthropic::message(&[anthropic::text(&format!("answer to {text}"))])
    })
    .await;
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        ToolRegistry::new(),
        AgentConfig::default(),
    );
    // `followup`: each waiting input is its own turn.
    let sessions = Sessions::with_queue(
        agent,
        Some(JsonlTranscripts::new(state.path().join("sessions")).shared()),
        100,
        clawcage_agent::session::QueueConfig {
            settings: clawcage_agent::session::QueueSettings {
                mode: clawcage_agent::session::QueueMode::Followup,
                ..clawcage_agent::session::QueueSettings::default()
            },
            ..clawcage_agent::session::QueueConfig::default()
        },
    )
    .with_inbox(Arc::new(FileInbox::new(state.path().join("inbox"))));
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    let fates: Vec<(String, RecoveredFate)> = recovered
        .iter()
        .map(|r| (r.record.id.clone(), r.fate))
        .collect();
    assert_eq!(
        fates,
        [
            ("run-1".to_string(), RecoveredFate::Resumed),
            ("run-2".to_string(), RecoveredFate::Queued),
            ("run-3".to_string(), RecoveredFate::Queued),
        ]
    );
    let mut texts = Vec::new();
    for item in recovered {
        texts.push(item.pending.wait().await.unwrap().unwrap().text);
    }
    assert_eq!(
        texts,
        ["answer to first", "answer to second", "answer to third"]
    );
    let asked: Vec<String> = server.bodies().iter().map(|b| last_user(b).0).collect();
    assert_eq!(
        asked,
        ["first", "second", "third"],
        "in their order, once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_another_live_process_owns_is_left_to_it() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(state.path(), "run-1", "first", &[]);
    let owner = FileInbox::new(state.path().join("inbox"));
    assert!(owner.claim(KEY).unwrap());
    let server = LlmServer::start(vec![Reply::Hang]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    assert!(sessions.recover(&|_, _| Arc::new(NoEvents)).is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(server.requests().is_empty(), "its turn is not run here");
    assert_eq!(
        FileInbox::new(state.path().join("inbox"))
            .pending(KEY)
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_asked_to_stop_before_the_stop_ends_stopped_without_a_model_call() {
    let state = tempfile::tempdir().unwrap();
    stopped_turn(
        state.path(),
        "run-1",
        "long job",
        &[
            Entry::Message {
                at_ms: 2,
                message: ChatMessage {
                    role: Role::Assistant,
                    cut: None,
                    content: vec![tool_use("t1", "sleep 100")],
                },
            },
            Entry::ToolStarted {
                at_ms: 3,
                tool_use_id: "t1".into(),
            },
        ],
    );
    FileInbox::new(state.path().join("inbox"))
        .request_stop(KEY, "run-1")
        .unwrap();
    let server = LlmServer::start(vec![]).await;
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    let recovered = sessions.recover(&|_, _| Arc::new(NoEvents));
    let error = first_reply(recovered).await.unwrap_err();
    assert!(
        matches!(error, clawcage_agent::AgentError::Interrupted),
        "{error:?}"
    );
    assert!(server.requests().is_empty(), "no model call");
    let text = std::fs::read_to_string(transcript(state.path()).path(KEY)).unwrap();
    assert!(text.contains("interrupted by the user"), "{text}");
    assert_eq!(kinds(state.path()).last().map(String::as_str), Some("turn"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_queue_settings_survive_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![]).await;
    {
        let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
        let said = sessions
            .queue_command(KEY, "/queue collect debounce:2s")
            .unwrap();
        assert!(said.contains("collect"), "{said}");
    }
    let sessions = sessions_over(&server, state.path(), ToolRegistry::new());
    sessions.recover(&|_, _| Arc::new(NoEvents));
    let settings = sessions.queue_settings(KEY);
    assert_eq!(
        settings.mode,
        clawcage_agent::session::QueueMode::Collect,
        "{settings}"
    );
    assert_eq!(settings.debounce_ms, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_let_go_mid_call_is_taken_up_again_without_running_the_call_twice() {
    let state = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let server = running_a_long_call_then_saying("Taken up again: done.").await;
    let tools = clawcage_tests::exec_registry(workspace.path(), FsMode::ReadWrite).await;
    let sessions = sessions_over(&server, state.path(), tools);
    let pending = sessions.submit_input(
        KEY,
        LaneInput::User("note that it ran".into()),
        Arc::new(NoEvents),
        InputMeta {
            id: Some("run-1".into()),
            idempotency: Some("k1".into()),
        },
    );
    let effects = until_the_call_ran(workspace.path()).await;

    // Let go in the middle of the call: its submitter hears at once that the lane closed, and
    // the turn stays open with its input pending.
    sessions.let_go(KEY);
    let heard = tokio::time::timeout(Duration::from_secs(5), pending.wait())
        .await
        .expect("the submitter hears at once");
    assert!(
        matches!(heard, Err(clawcage_agent::AgentError::LaneClosed)),
        "{heard:?}"
    );
    assert!(!kinds(state.path()).contains(&"turn".to_string()));
    let inbox = FileInbox::new(state.path().join("inbox"));
    assert_eq!(
        inbox.pending(KEY).unwrap().len(),
        1,
        "the input stays pending"
    );

    // Served here again (the partition came back): taken up from the inbox and the journal.
    let recovered = sessions.recover_session(KEY, &|_, _| Arc::new(NoEvents));
    assert_eq!(recovered.len(), 1, "the session is taken up once more");
    assert_eq!(recovered[0].fate, RecoveredFate::Resumed);
    let outcome = first_reply(recovered).await.unwrap().unwrap();
    assert_eq!(outcome.text, "Taken up again: done.");
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    let results = results_of(&bodies[1]);
    assert!(results[0].1.contains("may have partly run"), "{results:?}");
    assert_eq!(
        std::fs::read_to_string(&effects).unwrap(),
        "ran\n",
        "the call is never run twice"
    );
    let inbox = FileInbox::new(state.path().join("inbox"));
    assert!(inbox.pending(KEY).unwrap().is_empty(), "the input is done");
}

/// The session transcripts on disk, except that the disk refuses every line saying a tool call
/// started (what a full disk does to one write, or a host's lapsed lease to its appends).
#[derive(Debug)]
struct RefusingCallStarts(JsonlTranscripts);

impl TranscriptStore for RefusingCallStarts {
    fn append_steps(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        if entries
            .iter()
            .any(|entry| matches!(entry, Entry::ToolStarted { .. }))
        {
            return Err(std::io::Error::other("no space left on device"));
        }
        self.0.append_steps(key, entries)
    }
    fn commit(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.0.commit(key, entries)
    }
    fn load(&self, key: &str, limit: usize) -> std::io::Result<clawcage_agent::transcript::Loaded> {
        self.0.load(key, limit)
    }
    fn load_until(
        &self,
        key: &str,
        limit: usize,
        until: clawcage_agent::transcript::Position,
    ) -> std::io::Result<clawcage_agent::transcript::Loaded> {
        self.0.load_until(key, limit, until)
    }
    fn committed_position(
        &self,
        key: &str,
    ) -> std::io::Result<clawcage_agent::transcript::Position> {
        self.0.committed_position(key)
    }
    fn exists(&self, key: &str) -> std::io::Result<bool> {
        self.0.exists(key)
    }
    fn remove(&self, key: &str) -> std::io::Result<()> {
        self.0.remove(key)
    }
    fn sessions(&self) -> std::io::Result<Vec<clawcage_agent::transcript::SessionFile>> {
        self.0.sessions()
    }
    fn describe(&self, key: &str) -> String {
        self.0.describe(key)
    }
}

/// A call whose start cannot be journaled is not run (a turn resumed after a crash could not
/// know it may have had an effect): the turn stops with the transcript's error, the model is
/// not asked again in it, and the session's next turn sends a history a provider accepts (the
/// call answered as not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_start_cannot_be_journaled_is_not_run() {
    let state = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "t1",
            "exec",
            json!({"command": "echo ran >> effects.log"}),
        )]),
        anthropic::message(&[anthropic::text("Second turn.")]),
    ])
    .await;
    let tools = clawcage_tests::exec_registry(workspace.path(), FsMode::ReadWrite).await;
    let agent = AgentLoop::new(anthropic_provider(&server), tools, AgentConfig::default());
    let store = RefusingCallStarts(transcript(state.path()));
    let sessions = Sessions::new(agent, Some(Arc::new(store)), 100)
        .with_inbox(Arc::new(FileInbox::new(state.path().join("inbox"))));
    let ask = |text: &str, id: &str| {
        sessions.submit_input(
            KEY,
            LaneInput::User(text.into()),
            Arc::new(NoEvents),
            InputMeta {
                id: Some(id.into()),
                idempotency: None,
            },
        )
    };
    let first = ask("note that it ran", "run-1").wait().await;
    let Err(clawcage_agent::AgentError::Transcript { message, .. }) = &first else {
        panic!("the turn stops with the transcript's error: {first:?}");
    };
    assert!(message.contains("no space left on device"), "{message}");
    assert!(
        !workspace.path().join("effects.log").exists(),
        "the call was not run"
    );
    assert_eq!(server.bodies().len(), 1, "the model was not asked again");

    let second = ask("and now?", "run-2").wait().await.unwrap().unwrap();
    assert_eq!(second.text, "Second turn.");
    let said = server.bodies()[1].to_string();
    assert!(
        said.contains("not run: the turn stopped because its steps could not be recorded"),
        "{said}"
    );
    assert!(!workspace.path().join("effects.log").exists());
}
