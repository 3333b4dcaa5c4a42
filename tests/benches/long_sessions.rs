//! Benchmarks of the long-session accounting, each beside a baseline measured in the same run:
//! the token estimate of a long history (throughput in MB/s and the time per estimate) beside
//! serialising the same history to the JSON a request sends, and a turn (2 requests + 1 tool
//! call against the scripted LLM server on 127.0.0.1) on that history with the context policy
//! (estimate, fit check and result trimming before each model call, calibration after) beside
//! the same turn without it, interleaved, and the accounting of one model call alone (the
//! difference of two noisy turn medians is an upper bound). Prints medians, p99 and ratios to
//! the baseline.
//!
//! Run: `cargo bench -p clawcage-tests --bench long_sessions`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawcage_agent::context::TokenEstimator;
use clawcage_agent::provider::NoEvents;
use clawcage_agent::{AgentConfig, AgentLoop, ContextPolicy, Provider};
use clawcage_core::{ChatMessage, ContentBlock, Role};
use clawcage_tests::bench::{lookup_tools, report, report_against};
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic};
use serde_json::json;

const ESTIMATES: usize = 2_000;
const TURNS: usize = 300;
const WARMUP: usize = 20;

fn provider_for(server: &LlmServer) -> Arc<dyn Provider> {
    clawcage_tests::bench::anthropic_provider(server.url(), "claude-bench")
}

/// A session of `exchanges` user requests, each answered after one tool call whose result is
/// about 2 KB of text: 4 messages per exchange.
fn long_history(exchanges: usize) -> Vec<ChatMessage> {
    let line = "fn main() { println!(\"the quick brown fox jumps over the lazy dog\"); }\n";
    let mut history = Vec::new();
    for n in 0..exchanges {
        history.push(ChatMessage::user(format!(
            "Please look at part {n} of the project and tell me what it does."
        )));
        history.push(ChatMessage {
            role: Role::Assistant,
            cut: None,
            content: vec![
                ContentBlock::text("Looking at it."),
                ContentBlock::ToolUse {
                    id: format!("t{n}"),
                    name: "lookup".into(),
                    input: json!({"key": format!("part-{n}"), "detail": {"depth": 2, "tags": ["a", "b"]}}),
                },
            ],
        });
        history.push(ChatMessage {
            role: Role::User,
            cut: None,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: format!("t{n}"),
                content: line.repeat(28),
                is_error: false,
            }],
        });
        history.push(ChatMessage::assistant(format!(
            "Part {n} prints a sentence about a fox; nothing else happens there."
        )));
    }
    history
}

fn turn_replies() -> Vec<Reply> {
    vec![
        anthropic::message(&[
            anthropic::text("Looking it up."),
            anthropic::tool("t-new", "lookup", json!({"key": "colour"})),
        ]),
        anthropic::message(&[anthropic::text("The colour is blue.")]),
    ]
}

fn main() {
    let history = long_history(50);
    let bytes = serde_json::to_string(&history).unwrap().len();
    let estimator = TokenEstimator::new();
    let tools_bytes = serde_json::to_string(&lookup_tools().anthropic_definitions())
        .unwrap()
        .len();
    let tokens = estimator.request("You help.", tools_bytes, &history);
    println!(
        "history: {} messages, {} KB as JSON, estimated {tokens} tokens",
        history.len(),
        bytes >> 10
    );

    // Baseline: the JSON text of the history, which every request builds anyway.
    let mut json_samples = Vec::new();
    let mut estimate_samples = Vec::new();
    for round in 0..ESTIMATES + WARMUP {
        let started = Instant::now();
        std::hint::black_box(serde_json::to_string(std::hint::black_box(&history)).unwrap());
        let json = started.elapsed();
        let started = Instant::now();
        std::hint::black_box(estimator.request(
            "You help.",
            tools_bytes,
            std::hint::black_box(&history),
        ));
        let estimate = started.elapsed();
        if round >= WARMUP {
            json_samples.push(json);
            estimate_samples.push(estimate);
        }
    }
    let json = report("history to request JSON (baseline)", json_samples);
    let estimate = report_against(
        "token estimate of the same history",
        estimate_samples,
        Some(json),
    );
    let throughput = |median: Duration| bytes as f64 / median.as_secs_f64() / 1e6;
    println!(
        "throughput: estimate {:.0} MB/s, JSON {:.0} MB/s",
        throughput(estimate),
        throughput(json)
    );

    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        // The same turn on the same history, with and without accounting, interleaved.
        let replies: Vec<Reply> = (0..2 * (TURNS + WARMUP))
            .flat_map(|_| turn_replies())
            .collect();
        let server = LlmServer::start(replies).await;
        let config = AgentConfig {
            system_prompt: "You help.".into(),
            ..AgentConfig::default()
        };
        let plain = AgentLoop::new(provider_for(&server), lookup_tools(), config.clone());
        let accounted = AgentLoop::new(provider_for(&server), lookup_tools(), config)
            .with_context(ContextPolicy::new(200_000, 8192));
        let mut plain_samples = Vec::new();
        let mut accounted_samples = Vec::new();
        for round in 0..TURNS + WARMUP {
            for (agent, samples) in [
                (&plain, &mut plain_samples),
                (&accounted, &mut accounted_samples),
            ] {
                let mut turn = history.clone();
                turn.push(ChatMessage::user("What is the colour?"));
                let started = Instant::now();
                agent.run_turn(&mut turn, &NoEvents).await.unwrap();
                if round >= WARMUP {
                    samples.push(started.elapsed());
                }
            }
        }
        let plain = report(
            "turn on the history, no accounting (baseline)",
            plain_samples,
        );
        let accounted = report_against(
            "same turn with estimate + fit check + trimming",
            accounted_samples,
            Some(plain),
        );
        println!(
            "added cost per turn (difference of the p50s): {:.1} µs",
            (accounted.as_secs_f64() - plain.as_secs_f64()) * 1e6
        );
        // The accounting alone, as each model call does it (results checked for trimming, the
        // request estimated): a turn of two model calls does it twice.
        let agent = AgentLoop::new(
            provider_for(&server),
            lookup_tools(),
            AgentConfig::default(),
        )
        .with_context(ContextPolicy::new(200_000, 8192));
        let mut turn = history.clone();
        turn.push(ChatMessage::user("What is the colour?"));
        let mut samples = Vec::new();
        for round in 0..ESTIMATES + WARMUP {
            let started = Instant::now();
            std::hint::black_box(agent.estimate(std::hint::black_box(&turn)));
            if round >= WARMUP {
                samples.push(started.elapsed());
            }
        }
        let per_call = report_against("accounting of one model call, alone", samples, Some(plain));
        println!(
            "accounting per turn of 2 model calls: {:.1} µs ({:.2}% of the turn's p50)",
            2.0 * per_call.as_secs_f64() * 1e6,
            200.0 * per_call.as_secs_f64() / plain.as_secs_f64()
        );
    });
}
