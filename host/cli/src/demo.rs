//! `clawcage demo`: a recorded session played by the scripted provider in a temporary workspace,
//! so anyone can see the runtime work without a model, a key or a network. The tools are the real
//! ones — the bundled components in the real sandbox — and so are their verdicts: the escape
//! attempt is refused by the sandbox, not by the script. The script (`demo_script.json`) is data;
//! a step that needs a tool this build does not register is skipped with a note.

use std::path::Path;
use std::sync::Arc;

use clawcage_agent::TurnEnd;
use clawcage_agent::provider::Script;
use clawcage_runtime::{AgentOptions, Options, Runtime};

use crate::Failure;
use crate::render::{Console, Shown, Sink, print_messages};
use clawcage_agent::approvals::{OperatorEvent, OperatorFilter};
use clawcage_core::approval::ApprovalDecision;

/// The recorded session.
pub const SCRIPT: &str = include_str!("demo_script.json");

/// Fill the demo workspace.
pub fn seed_workspace(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("notes"))?;
    std::fs::write(
        dir.join("README.md"),
        "# Demo workspace\n\nA temporary directory created by `clawcage demo`.\n",
    )?;
    std::fs::write(
        dir.join("notes/todo.txt"),
        "water the plants\nanswer the landlord\nback up the photos\n",
    )?;
    std::fs::write(dir.join("notes/draft.txt"), "an old draft nobody needs\n")?;
    Ok(())
}

/// `clawcage demo`: the bundled tools granted a fresh temporary workspace and no network,
/// whatever the config says; only the component cache of the state directory is reused.
pub async fn run(options: &Options) -> Result<(), Failure> {
    let temp = tempfile::Builder::new()
        .prefix("clawcage-demo-")
        .tempdir()
        .map_err(|error| {
            Failure::Tool(format!(
                "cannot create a temporary directory for the demo: {error}"
            ))
        })?;
    let workspace = temp.path().join("workspace");
    let state = temp.path().join("state");
    seed_workspace(&workspace)
        .map_err(|error| Failure::Tool(format!("cannot fill the demo workspace: {error}")))?;
    let script = Script::from_json(SCRIPT).map_err(|error| Failure::Tool(error.to_string()))?;
    let script_file = state.join("demo_script.json");
    std::fs::create_dir_all(&state)
        .and_then(|()| std::fs::write(&script_file, SCRIPT))
        .map_err(|error| Failure::Tool(format!("cannot prepare the demo: {error}")))?;
    let cache_state = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
    let runtime = Runtime::demo(
        &workspace,
        &state,
        &cache_state,
        script_file,
        options.progress.clone(),
    )
    .await?;
    let console = Arc::new(Console::new(Sink::Stdout, true));
    // The demo's operator: it answers approval requests from the script.
    let mut operator = runtime.approvals().operator(OperatorFilter::All);
    let runtime = runtime
        .agent(AgentOptions {
            subagents: false,
            ..AgentOptions::new(print_messages(console.clone()))
        })
        .await?;
    let workspace = runtime_workspace(&workspace);

    outln!(
        "clawcage demo — a recorded session played by the scripted provider ({}).",
        runtime.label
    );
    outln!(
        "No model, no API key, no network: the replies are scripted, the tools and the sandbox are real."
    );
    outln!("Workspace (temporary): {}", workspace.display());
    outln!("Tools: {}", runtime.tools.names().join(", "));

    let key = "demo";
    for (number, exchange) in script.exchanges.iter().enumerate() {
        outln!();
        if let Some(narration) = &exchange.narration {
            outln!("{}. {narration}", number + 1);
        }
        let missing = exchange.missing_tools(&runtime.tools.names());
        if !missing.is_empty() {
            outln!(
                "   (skipped: this step needs the `{}` tool, which this build does not register)",
                missing.join("`, `")
            );
            continue;
        }
        let Some(user) = &exchange.user else {
            continue;
        };
        outln!("you> {user}");
        console.begin_turn();
        let turn = runtime
            .sessions
            .send_user(key, user.clone(), Arc::new(Shown(console.clone())));
        tokio::pin!(turn);
        let mut answers = exchange.approvals.iter();
        let outcome = loop {
            tokio::select! {
                outcome = &mut turn => break outcome,
                Some(event) = operator.next() => {
                    if let OperatorEvent::Requested(request) = event {
                        let decision = answers
                            .next()
                            .and_then(|answer| ApprovalDecision::parse(answer))
                            .unwrap_or(ApprovalDecision::Deny);
                        console.line(&format!(
                            "   approval needed: {} → the script answers: {}",
                            request.plan.summary().replace('\n', "; "),
                            decision.as_str()
                        ));
                        let _ = operator.resolve(&request.id, decision, "demo script");
                    }
                }
            }
        }
        .map_err(|error| Failure::Tool(format!("the demo stopped: {error}")))?;
        if outcome.end == TurnEnd::Answered && !console.streamed() {
            console.line(&outcome.text);
        }
        console.break_line();
    }
    outln!();
    outln!("That was the scripted demo. With a model: export ANTHROPIC_API_KEY=… && clawcage chat");
    outln!(
        "(or --provider openai --base-url http://localhost:11434/v1 --model llama3.1 for a local server)."
    );
    outln!("The temporary workspace is removed now.");
    Ok(())
}

/// The workspace path as shown (its canonical form, as the tools see it).
fn runtime_workspace(workspace: &Path) -> std::path::PathBuf {
    workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf())
}
