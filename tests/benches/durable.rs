//! What durable turns cost and how fast a restart takes work up, against the scripted LLM
//! server on 127.0.0.1, with the baseline measured in the same run:
//! 1. One turn through a session lane, the gateway benchmark's turn (one streamed answer of 14
//!    words, history limit 20), and one with a tool call (two model calls, one `exec`-free
//!    in-process tool), each run three ways, interleaved round by round: with the turn's lines
//!    written only when it ends (what a turn wrote before the step journal, the baseline), with
//!    every step journaled as it happens, and journaled with every input recorded in the inbox
//!    first (what the runtime does).
//! 2. A restart with 50 sessions whose turns a killed process left open: the time from building
//!    the sessions to every turn taken up (`Sessions::recover` returned), and to every resumed
//!    turn answered.
//!
//! Run: `cargo bench -p clawcage-tests --bench durable`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clawcage_agent::inbox::{InputRecord, LaneInbox};
use clawcage_agent::provider::NoEvents;
use clawcage_agent::session::queue::{Origin, QueuedJob};
use clawcage_agent::transcript::{Entry, Loaded, Position, SessionFile, now_ms};
use clawcage_agent::{
    AgentConfig, AgentLoop, FileInbox, JsonlTranscripts, Sessions, ToolRegistry, TranscriptStore,
};
use clawcage_core::{BoxFuture, ChatMessage, Tool, ToolError, ToolOutput, ToolSpec};
use clawcage_tests::bench::{report, report_against};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, last_user};
use serde_json::{Value, json};

const TURNS: usize = 300;
const WARMUP: usize = 20;
const HISTORY: usize = 20;
const OPEN_SESSIONS: usize = 50;

/// The transcript as it was written before the step journal: a turn's lines are held in memory
/// and written, with one flush to the disk, when the turn ends.
#[derive(Debug)]
struct WrittenAtTheEnd {
    files: JsonlTranscripts,
    held: Mutex<HashMap<String, Vec<Entry>>>,
}

impl TranscriptStore for WrittenAtTheEnd {
    fn append_steps(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        self.held
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .extend_from_slice(entries);
        Ok(())
    }
    fn commit(&self, key: &str, entries: &[Entry]) -> std::io::Result<()> {
        let mut lines = self.held.lock().unwrap().remove(key).unwrap_or_default();
        lines.extend_from_slice(entries);
        self.files.commit(key, &lines)
    }
    fn load(&self, key: &str, limit: usize) -> std::io::Result<Loaded> {
        self.files.load(key, limit)
    }
    fn load_until(&self, key: &str, limit: usize, until: Position) -> std::io::Result<Loaded> {
        self.files.load_until(key, limit, until)
    }
    fn committed_position(&self, key: &str) -> std::io::Result<Position> {
        self.files.committed_position(key)
    }
    fn exists(&self, key: &str) -> std::io::Result<bool> {
        self.files.exists(key)
    }
    fn remove(&self, key: &str) -> std::io::Result<()> {
        self.files.remove(key)
    }
    fn sessions(&self) -> std::io::Result<Vec<SessionFile>> {
        self.files.sessions()
    }
    fn describe(&self, key: &str) -> String {
        self.files.describe(key)
    }
}

/// A tool that answers at once (the turn's cost is the journal's, not a sandbox's).
#[derive(Debug)]
struct Lookup(ToolSpec);

impl Tool for Lookup {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn call<'a>(&'a self, _args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async { Ok(ToolOutput::text("colour = blue")) })
    }
}

fn tools() -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    registry
        .register(Arc::new(Lookup(ToolSpec {
            name: "lookup".into(),
            description: "Looks a value up.".into(),
            input_schema: json!({"type": "object", "properties": {"key": {"type": "string"}}}),
        })))
        .unwrap();
    registry
}

/// Text turns get the answer; "use the tool" asks for `lookup` first.
fn model(body: &Value) -> Reply {
    let (text, results) = last_user(body);
    if text.contains("use the tool") && !results {
        return anthropic::stream(
            &[anthropic::tool("t1", "lookup", json!({"key": "colour"}))],
            512,
        );
    }
    anthropic::stream(
        &[anthropic::text(
            "The value of colour is blue, as the lookup says; nothing else to do.",
        )],
        512,
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    WrittenAtTheEnd,
    Journaled,
    JournaledWithInbox,
}

fn sessions(llm: &str, dir: &Path, way: Way) -> Sessions {
    let agent = AgentLoop::new(
        clawcage_tests::bench::anthropic_provider(llm, "bench"),
        tools(),
        AgentConfig {
            stream: true,
            ..AgentConfig::default()
        },
    );
    let files = JsonlTranscripts::new(dir.join("sessions"));
    let store: Arc<dyn TranscriptStore> = match way {
        Way::WrittenAtTheEnd => Arc::new(WrittenAtTheEnd {
            files,
            held: Mutex::new(HashMap::new()),
        }),
        _ => files.shared(),
    };
    let sessions = Sessions::new(agent, Some(store), HISTORY);
    if way == Way::JournaledWithInbox {
        sessions.with_inbox(Arc::new(FileInbox::new(dir.join("inbox"))))
    } else {
        sessions
    }
}

async fn turns(llm: &str, task: &str, label: &str) {
    let ways = [
        Way::WrittenAtTheEnd,
        Way::Journaled,
        Way::JournaledWithInbox,
    ];
    let dirs: Vec<tempfile::TempDir> = ways.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let lanes: Vec<Sessions> = ways
        .iter()
        .zip(&dirs)
        .map(|(way, dir)| sessions(llm, dir.path(), *way))
        .collect();
    let mut samples = vec![Vec::new(); ways.len()];
    for round in 0..TURNS + WARMUP {
        // Interleaved, so the machine's load falls on the three alike.
        for (index, lane) in lanes.iter().enumerate() {
            let started = Instant::now();
            lane.send_user("agent:main:bench:durable", task, Arc::new(NoEvents))
                .await
                .unwrap();
            if round >= WARMUP {
                samples[index].push(started.elapsed());
            }
        }
    }
    let mut samples = samples.into_iter();
    let baseline = report(
        &format!("{label}: lines written at the end (baseline)"),
        samples.next().unwrap(),
    );
    report_against(
        &format!("{label}: each step journaled"),
        samples.next().unwrap(),
        Some(baseline),
    );
    report_against(
        &format!("{label}: journaled, input in the inbox"),
        samples.next().unwrap(),
        Some(baseline),
    );
}

/// 50 sessions whose turns a killed process left open, each during its model call.
fn open_turns(dir: &Path) {
    let inbox = FileInbox::new(dir.join("inbox"));
    let store = JsonlTranscripts::new(dir.join("sessions"));
    for session in 0..OPEN_SESSIONS {
        let key = format!("agent:main:bench:open{session}");
        let id = format!("run-{session}");
        inbox
            .append(
                &key,
                &InputRecord {
                    id: id.clone(),
                    at_ms: now_ms(),
                    idempotency: Some(format!("k{session}")),
                    job: QueuedJob::User {
                        text: "What is the colour?".into(),
                        origin: Origin::of_key(&key),
                    },
                    stop_requested: false,
                },
            )
            .unwrap();
        // Some history before the open turn, as a session in use has.
        let mut lines = Vec::new();
        for turn in 0..5 {
            lines.push(Entry::Start {
                at_ms: 1,
                inputs: vec![format!("old-{turn}")],
            });
            lines.push(Entry::Message {
                at_ms: 1,
                message: ChatMessage::user("an earlier question"),
            });
            lines.push(Entry::Message {
                at_ms: 1,
                message: ChatMessage::assistant("an earlier answer"),
            });
            lines.push(Entry::Turn {
                at_ms: 1,
                usage: Default::default(),
                outcome: "anthropic/bench".into(),
            });
        }
        lines.push(Entry::Start {
            at_ms: 2,
            inputs: vec![id],
        });
        lines.push(Entry::Message {
            at_ms: 2,
            message: ChatMessage::user("What is the colour?"),
        });
        store.append_steps(&key, &lines).unwrap();
    }
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let server = LlmServer::start_routed(model).await;
        println!("durable turns benchmark: history limit {HISTORY}, {TURNS} turns each way");
        turns(server.url(), "What is the colour?", "text turn").await;
        turns(
            server.url(),
            "Please use the tool to find the colour.",
            "turn with a tool call",
        )
        .await;

        let mut taken_up = Vec::new();
        let mut answered = Vec::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            open_turns(dir.path());
            let started = Instant::now();
            let lanes = sessions(server.url(), dir.path(), Way::JournaledWithInbox);
            let recovered = lanes.recover(&|_, _| Arc::new(NoEvents));
            taken_up.push(started.elapsed());
            assert_eq!(recovered.len(), OPEN_SESSIONS);
            for item in recovered {
                item.pending.wait().await.unwrap();
            }
            answered.push(started.elapsed());
        }
        report(
            &format!("restart: {OPEN_SESSIONS} open turns taken up"),
            taken_up,
        );
        report(
            &format!("restart: {OPEN_SESSIONS} open turns resumed and answered"),
            answered,
        );
    });
}
