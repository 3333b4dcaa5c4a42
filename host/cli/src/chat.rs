//! `clawcage chat`: the REPL. Line editing and history (rustyline, history kept in the state
//! directory), replies streamed as they arrive, each tool call shown with its verdict (and a line
//! when the history is compacted), and the commands `/help`, `/tools`, `/reset`, `/compact`,
//! `/usage`, `/queue`, `/approve`, `/exit`. Approvals of exec commands are asked inline during a
//! turn (`y` once, `a` always, `n` deny) and shown above the prompt while it waits. Notifications published on the bus's `system` channel enter the
//! session through its lane like any input: while the prompt waits they are handled at once and
//! printed above it; during a turn they queue behind it.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use clawcage_agent::approvals::{
    ApprovalBroker, ApprovalRequest, OperatorEvent, OperatorFilter, OperatorHandle, SessionPolicy,
};
use clawcage_agent::{AgentError, TurnEnd, TurnOutcome};
use clawcage_core::InboundMessage;
use clawcage_core::approval::ApprovalDecision;
use clawcage_runtime::{AgentOptions, Runtime};

use crate::Failure;
use crate::prompt::{Input, Prompt, print_tool_summary};
use crate::render::{Console, Shown, Sink, print_messages};

const HELP: &str = "Type a request and press Enter. Commands:
  /help    this text
  /tools   the tools the agent may call, with what each may reach
  /reset   forget this session's history (the transcript keeps a reset mark)
  /compact summarise the older part of the history now, to free the model's context window
  /usage   tokens used in, out and from the prompt cache, the context window and the budgets
  /queue   what a message sent while the agent works does: /queue steer|followup|collect|interrupt
           [debounce:2s] [cap:25] [drop:old|new|summarize]; /queue reset; /queue alone shows it
  /approve ID allow-once|allow-always|deny   answer an approval request shown while the prompt
           waited (during a turn the question is asked inline: y once, a always, n deny)
  /approvals what exec may run in this session without asking: /approvals exec deny|allowlist|full
           ask off|on-miss|always (either or both); /approvals reset; /approvals alone shows it
  /exit    leave (Ctrl-D works too)
Ctrl-C while the agent works stops that turn; what it did so far is kept.";

/// Run the REPL on session `key`.
pub async fn run(runtime: &Runtime, key: String) -> Result<(), Failure> {
    let state_dir = runtime.state_dir();
    let mut prompt = Prompt::new()?;
    let history_file = state_dir.join("chat_history.txt");
    prompt.load_history(&history_file);

    // While the prompt waits, output goes through the editor's printer so the prompt survives.
    let idle_sink = prompt.idle_sink(true);
    let console = Arc::new(Console::new(Sink::Stdout, true));
    // A notification turn's text is printed whole when it ends, under the sender's name.
    let idle_console = Arc::new(Console::new(idle_sink, false));
    let agent = runtime
        .agent(AgentOptions {
            send: print_messages(console.clone()),
            stream: true,
            subagents: true,
        })
        .await?;
    let sessions = agent.sessions.clone();

    let router = sessions.deliver_notifications(
        agent.bus.subscribe("system"),
        idle_console.clone(),
        Arc::new({
            let idle_console = idle_console.clone();
            move |message: &InboundMessage, outcome: Result<TurnOutcome, AgentError>| match outcome
            {
                Ok(outcome) => idle_console.line(&format!(
                    "[{} via {}] {}",
                    message.sender, message.channel, outcome.text
                )),
                Err(error) => idle_console.line(&format!(
                    "[{}] the notification could not be handled: {error}",
                    message.sender
                )),
            }
        }),
    );
    // Now that the `system` channel is routed: report runs cut off by the last exit.
    if let Some(manager) = agent.subagents.clone() {
        tokio::spawn(async move {
            manager.recover().await;
        });
    }

    outln!(
        "clawcage chat: {} · session {key} · {} tools · /help for commands",
        agent.label,
        agent.tools.names().len()
    );
    if agent.scripted {
        outln!("note: the answers come from a recorded script, not from a model");
    }
    // Say what resuming brings back: the history the model will see.
    let transcripts = clawcage_agent::JsonlTranscripts::new(state_dir.join("sessions"));
    if clawcage_agent::TranscriptStore::exists(&transcripts, &key).unwrap_or(false) {
        let limit = runtime.config().agent.history_limit().unwrap_or(200);
        match clawcage_agent::TranscriptStore::load(&transcripts, &key, limit) {
            Ok(loaded) if !loaded.messages.is_empty() => outln!(
                "resuming session {key}: {} earlier messages loaded (/reset forgets them)",
                loaded.messages.len()
            ),
            Ok(_) => {}
            Err(error) => {
                outln!("note: the history of {key} cannot be read ({error}); starting empty")
            }
        }
    }

    // Approvals for this session (and its sub-agents): asked inline during a turn; while the
    // prompt waits, shown above it and answered with /approve.
    let approvals = runtime.approvals().clone();
    let mut operator = Some(approvals.operator(OperatorFilter::Session(key.clone())));
    let in_turn = Arc::new(AtomicBool::new(false));
    let idle_approvals = operator.is_some().then(|| {
        let mut watcher = approvals.operator(OperatorFilter::Session(key.clone()));
        let in_turn = in_turn.clone();
        let idle_console = idle_console.clone();
        tokio::spawn(async move {
            while let Some(event) = watcher.next().await {
                if let OperatorEvent::Requested(request) = event
                    && !in_turn.load(Ordering::SeqCst)
                {
                    idle_console.line(&format!(
                        "approval needed [{}]: {}\n  answer with /approve {} allow-once|allow-always|deny",
                        request.id,
                        request.describe(),
                        request.id
                    ));
                }
            }
        })
    });

    loop {
        let line = match prompt.read().await? {
            Input::Line(line) => line,
            Input::Interrupted => continue,
            Input::End => break,
        };
        if line.is_empty() {
            continue;
        }
        match line.as_str() {
            "/exit" | "/quit" => break,
            "/help" => outln!("{HELP}"),
            "/tools" => {
                for tool in agent.tools.tools() {
                    let spec = tool.spec();
                    print_tool_summary(&spec.name, &spec.description, &tool.grants_summary());
                }
            }
            "/reset" => match sessions.reset(&key).await {
                Ok(()) => outln!("  history cleared"),
                Err(error) => outln!("  error: {error}"),
            },
            "/compact" => {
                // The outcome says what was compacted; the observer would say it a second time.
                match sessions
                    .compact(&key, Arc::new(clawcage_agent::provider::NoEvents))
                    .await
                {
                    Ok(said) => outln!("  {said}"),
                    Err(error) => outln!("  error: {error}"),
                }
            }
            "/usage" => {
                for line in sessions.usage_report(&key).lines() {
                    outln!("  {line}");
                }
            }
            command if command.split_whitespace().next() == Some("/queue") => {
                match sessions.queue_command(&key, command) {
                    Ok(said) => outln!("  {said}"),
                    Err(error) => outln!("  {error}"),
                }
            }
            command if command.split_whitespace().next() == Some("/approvals") => {
                let words: Vec<&str> = command.split_whitespace().skip(1).collect();
                match words.as_slice() {
                    [] => {}
                    ["reset"] => approvals.set_session_policy(&key, None),
                    words => match SessionPolicy::parse(words) {
                        Ok(policy) => approvals.set_session_policy(&key, Some(policy)),
                        Err(error) => outln!("  {error}"),
                    },
                }
                outln!("  {}", describe_policy(&approvals, &key));
            }
            command if command.split_whitespace().next() == Some("/approve") => {
                let words: Vec<&str> = command.split_whitespace().collect();
                let decision = words.get(2).and_then(|word| ApprovalDecision::parse(word));
                match (words.get(1), decision) {
                    (Some(id), Some(decision)) => match approvals.resolve(id, decision, "chat") {
                        Ok(()) => outln!("  {id}: {}", decision.as_str()),
                        Err(error) => outln!("  {error}"),
                    },
                    _ => outln!("  usage: /approve ID allow-once|allow-always|deny"),
                }
            }
            command if command.starts_with('/') => {
                outln!("  unknown command {command}; /help lists the commands")
            }
            request => {
                console.begin_turn();
                // Ctrl-C during a turn stops that turn (its messages so far are kept), not the
                // REPL.
                let turn = sessions.send_user(&key, request, Arc::new(Shown(console.clone())));
                tokio::pin!(turn);
                in_turn.store(true, Ordering::SeqCst);
                let result = loop {
                    tokio::select! {
                        result = &mut turn => break result,
                        Ok(()) = tokio::signal::ctrl_c() => sessions.interrupt(&key),
                        Some(event) = next_event(&mut operator) => {
                            if let OperatorEvent::Requested(request) = event {
                                answer_inline(&mut prompt, &approvals, &request).await?;
                            }
                        }
                    }
                };
                in_turn.store(false, Ordering::SeqCst);
                match result {
                    Ok(outcome) => {
                        if outcome.end == TurnEnd::Answered && !console.streamed() {
                            console.line(&outcome.text);
                        }
                        // No answer text is said, never left as silence.
                        if outcome.end == TurnEnd::NoAnswer {
                            console.line(&format!("  note: {}", outcome.text));
                        }
                        console.end_turn(&outcome.answered_by, outcome.usage, sessions.usage(&key));
                    }
                    Err(AgentError::Interrupted) => console.interrupted(),
                    Err(error) => console.line(&format!("  error: {error}")),
                }
            }
        }
    }
    router.abort();
    if let Some(task) = idle_approvals {
        task.abort();
    }
    prompt.save_history(&history_file);
    Ok(())
}

/// What `/approvals` shows: the modes that apply to session `key` and where they come from.
fn describe_policy(approvals: &ApprovalBroker, key: &str) -> String {
    let (exec, ask, own) = approvals.effective(Some(key));
    format!(
        "approvals for this session: exec {}, ask {} ({})",
        exec.as_str(),
        ask.as_str(),
        if own {
            "this session's own; /approvals reset goes back to the configuration's"
        } else {
            "the configuration's [approvals]"
        }
    )
}

/// The next approval event, or never when approvals are off.
async fn next_event(operator: &mut Option<OperatorHandle>) -> Option<OperatorEvent> {
    match operator {
        Some(operator) => operator.next().await,
        None => std::future::pending().await,
    }
}

/// Shows `request` and asks for a decision on the terminal: `y` once, `a` always, `n` (or
/// Ctrl-C, or the end of the input) deny.
async fn answer_inline(
    prompt: &mut Prompt,
    approvals: &ApprovalBroker,
    request: &ApprovalRequest,
) -> Result<(), Failure> {
    for (number, line) in request.describe().lines().enumerate() {
        if number == 0 {
            outln!("  approval needed: {line}");
        } else {
            outln!("    {}", line.trim_start());
        }
    }
    for reason in &request.reasons {
        outln!("    (why: {reason})");
    }
    let decision = crate::prompt::ask_decision(prompt).await?;
    match approvals.resolve(&request.id, decision, "chat") {
        Ok(()) => outln!("  {}", decision.as_str()),
        Err(error) => outln!("  {error}"),
    }
    Ok(())
}
