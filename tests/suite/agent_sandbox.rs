//! The agent loop driving the real sandboxed file tools: what the model asks for happens on disk
//! inside the workspace, and an escape through a symlink or `..` comes back to the model as a
//! denied error result while the turn goes on.

use clawcage_agent::provider::NoEvents;
use clawcage_agent::{AgentConfig, AgentLoop, TurnEnd};
use clawcage_core::ChatMessage;
use clawcage_sandbox::FsMode;
use clawcage_tests::file_registry;
use clawcage_tests::llm_server::{LlmServer, anthropic};
use serde_json::json;

use crate::agent_loop::anthropic_provider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_writes_reads_and_is_refused_an_escape() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "w",
            "write_file",
            json!({"path": "out/plan.md", "content": "step one\n"}),
        )]),
        anthropic::message(&[
            anthropic::tool("r", "read_file", json!({"path": "out/plan.md"})),
            anthropic::tool("s", "read_file", json!({"path": "link.txt"})),
            anthropic::tool("u", "read_file", json!({"path": "out/../../secret.txt"})),
        ]),
        anthropic::message(&[anthropic::text(
            "Wrote and read the plan; the other files are off limits.",
        )]),
    ])
    .await;
    let tools = file_registry(dir.path(), FsMode::ReadWrite).await;
    let agent = AgentLoop::new(anthropic_provider(&server), tools, AgentConfig::default());
    let mut history = vec![ChatMessage::user("Write a plan, then read it back.")];
    let outcome = agent.run_turn(&mut history, &NoEvents).await.unwrap();
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/plan.md")).unwrap(),
        "step one\n"
    );

    let results = &server.bodies()[2]["messages"][4]["content"];
    assert_eq!(results[0]["content"], "step one\n");
    assert!(results[0].get("is_error").is_none(), "{results}");
    for index in [1, 2] {
        assert_eq!(results[index]["is_error"], true, "{results}");
        let text = results[index]["content"].as_str().unwrap();
        assert!(text.starts_with("denied: "), "{text}");
        assert!(!text.contains("top secret"), "{text}");
    }
}
