//! Benchmarks of the agent path against the scripted LLM server on 127.0.0.1, each beside a
//! baseline measured in the same run: one model request through the Anthropic provider (the
//! baseline), a full turn with one tool call (two requests, a host tool, the loop's bookkeeping),
//! the same turn streamed (SSE reassembly), and a turn through a session lane with its transcript
//! appended and synced to disk. Prints medians, p99 and ratios to the baseline.
//!
//! Run: `cargo bench --workspace --bench agent`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use clawcage_tests::bench::{lookup_tools, report, report_against};
use std::sync::Arc;
use std::time::Instant;

use clawcage_agent::provider::{ChatRequest, NoEvents};
use clawcage_agent::{AgentConfig, AgentLoop, JsonlTranscripts, Provider, Sessions, ToolRegistry};
use clawcage_core::ChatMessage;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic};
use serde_json::json;

const TURNS: usize = 300;

fn provider_for(server: &LlmServer) -> Arc<dyn Provider> {
    clawcage_tests::bench::anthropic_provider(server.url(), "bench")
}

fn turn_replies(stream: bool) -> Vec<Reply> {
    let call = [
        anthropic::text("Looking it up."),
        anthropic::tool(
            "t1",
            "lookup",
            json!({"key": "colour", "detail": {"depth": 2, "tags": ["a", "b"]}}),
        ),
    ];
    let answer = [anthropic::text(
        "The value of colour is blue, as the lookup says; nothing else to do.",
    )];
    if stream {
        vec![
            anthropic::stream(&call, 512),
            anthropic::stream(&answer, 512),
        ]
    } else {
        vec![anthropic::message(&call), anthropic::message(&answer)]
    }
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        // Baseline: one request and its parsed response.
        let server = LlmServer::start(vec![
            anthropic::message(&[anthropic::text("hi")]);
            TURNS + 20
        ])
        .await;
        let provider = provider_for(&server);
        let empty = ToolRegistry::new();
        let messages = [ChatMessage::user("hello")];
        let mut samples = Vec::new();
        for round in 0..TURNS + 20 {
            let started = Instant::now();
            provider
                .complete(
                    ChatRequest {
                        system: "",
                        messages: &messages,
                        tools: &empty,
                        stream: false,
                        max_tokens: None,
                    },
                    &NoEvents,
                )
                .await
                .unwrap();
            if round >= 20 {
                samples.push(started.elapsed());
            }
        }
        let baseline = report("one request (baseline)", samples);

        for (label, stream) in [
            ("turn: 2 requests + 1 tool call", false),
            ("turn, streamed (SSE reassembly)", true),
        ] {
            let replies: Vec<Reply> = (0..TURNS).flat_map(|_| turn_replies(stream)).collect();
            let server = LlmServer::start(replies).await;
            let agent = AgentLoop::new(
                provider_for(&server),
                lookup_tools(),
                AgentConfig {
                    stream,
                    ..AgentConfig::default()
                },
            );
            let mut samples = Vec::new();
            for _ in 0..TURNS {
                let mut history = vec![ChatMessage::user("What is the colour?")];
                let started = Instant::now();
                agent.run_turn(&mut history, &NoEvents).await.unwrap();
                samples.push(started.elapsed());
            }
            report_against(label, samples, Some(baseline));
        }

        // Through a lane with the transcript appended and synced after every turn.
        let state = tempfile::tempdir().unwrap();
        let replies: Vec<Reply> = (0..TURNS).flat_map(|_| turn_replies(false)).collect();
        let server = LlmServer::start(replies).await;
        let agent = AgentLoop::new(
            provider_for(&server),
            lookup_tools(),
            AgentConfig::default(),
        );
        let sessions = Sessions::new(
            agent,
            Some(JsonlTranscripts::new(state.path()).shared()),
            20,
        );
        let mut samples = Vec::new();
        for _ in 0..TURNS {
            let started = Instant::now();
            sessions
                .send_user("bench", "What is the colour?", Arc::new(NoEvents))
                .await
                .unwrap();
            samples.push(started.elapsed());
        }
        report_against(
            "turn via lane + transcript (fsync)",
            samples,
            Some(baseline),
        );
    });
}
