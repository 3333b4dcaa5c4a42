//! `clawcage chat --gateway URL`: the REPL attached to a running gateway instead of an agent of
//! its own. It connects with the token (`--token`, else the one the gateway saved in the state
//! directory), prints how much history the session has, subscribes to the session's events from
//! the history's cursor, and renders every run of the session the way `chat` does (render.rs):
//! its own turns, and the turns other clients (another terminal, the web chat) start, with their
//! user messages. Typed lines are `chat.send`s; `/reset`, `/queue`, `/tools`, `/help` and
//! `/exit` work as in `chat`, and Ctrl-C during a turn sends `chat.abort`.

use std::collections::HashSet;
use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clawcage_agent::TurnObserver as _;
use clawcage_agent::Verdict;
use clawcage_agent::provider::ProviderEvents as _;
use clawcage_core::ToolCall;
use clawcage_gateway::{Client, ClientError};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Failure;
use crate::prompt::{Input, Prompt, print_tool_summary};
use crate::render::{Console, Shown, Sink};

const HELP: &str = "Type a request and press Enter; it is sent to the gateway's session, and turns other clients start there are shown too. Commands:
  /help    this text
  /tools   the tools the agent may call, with what each may reach
  /queue   show or set what a message to a busy session does (/queue <steer|followup|collect|interrupt>)
  /reset   forget this session's history (the transcript keeps a reset mark)
  /exit    leave (Ctrl-D works too); the gateway and the session go on
Ctrl-C while the agent works stops that turn; what it did so far is kept.";

/// What the renderer tells the prompt about the line it sent.
#[derive(Debug)]
enum Outcome {
    /// The gateway refused the message.
    Refused(String),
    /// A command's answer.
    Said(String),
    /// Admitted; the turn that answers it is `turn` (its own run, or the one it joined).
    Admitted { turn: String },
    /// The turn ended.
    Ended(String),
    /// An exec approval request (the `exec.approval.requested` payload).
    Approval(Value),
}

/// What the renderer knows.
#[derive(Default)]
struct Seen {
    /// The request id of the line sent and not yet acknowledged.
    awaiting: Option<String>,
    /// Runs this client started.
    ours: HashSet<String>,
    /// The arguments of the tool calls running, by call id (their end events do not repeat
    /// them).
    arguments: std::collections::HashMap<String, Value>,
}

/// Attach to the gateway at `url` and run the REPL on session `key`.
pub async fn run(url: &str, token: &str, key: String) -> Result<(), Failure> {
    clawcage_gateway::check_key(&key).map_err(|error| Failure::Usage(error.message))?;
    let client_id = format!("clawcage-chat-{}", std::process::id());
    let (mut client, _hello) = Client::connect(url, token, &client_id, "cli", Some(&key))
        .await
        .map_err(|error| match error {
            ClientError::Url(why) => Failure::Usage(why),
            ClientError::Refused { code, message } if code == "UNAUTHORIZED" => Failure::Usage(
                format!("the gateway at {url} refused the token ({message}); pass the token it was started with (--token), or use its --state-dir"),
            ),
            ClientError::Refused { message, .. } => {
                Failure::Usage(format!("the gateway at {url} refused to connect: {message}"))
            }
            other => Failure::Tool(format!("clawcage: {other}")),
        })?;
    let failed = |error: ClientError| Failure::Tool(format!("clawcage: {error}"));
    let mut frames = client
        .take_events()
        .ok_or_else(|| Failure::Tool("clawcage: the gateway connection has no events".into()))?;
    let client = Arc::new(client);
    let status = client.request("status", json!({})).await.map_err(failed)?;
    let history = client
        .request("chat.history", json!({"sessionKey": key}))
        .await
        .map_err(failed)?;

    let mut prompt = Prompt::new()?;
    // While the prompt waits, output goes through the editor's printer so the prompt survives.
    let idle_sink = prompt.idle_sink(std::io::stdin().is_terminal());
    let busy_console = Arc::new(Console::new(Sink::Stdout, true));
    let idle_console = Arc::new(Console::new(idle_sink, true));

    outln!(
        "clawcage chat: {} via the gateway {url} · session {key} · /help for commands",
        status["model"].as_str().unwrap_or("?")
    );
    let earlier = history["messages"].as_array().map_or(0, Vec::len);
    if earlier > 0 {
        outln!("resuming session {key}: {earlier} earlier messages (/reset forgets them)");
    }
    let cursor = history["cursor"].as_u64().unwrap_or(0);
    client
        .request(
            "sessions.subscribe",
            json!({"sessionKey": key, "since": cursor}),
        )
        .await
        .map_err(failed)?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let busy = Arc::new(AtomicBool::new(false));
    let (outcomes, mut outcome) = mpsc::unbounded_channel();
    let renderer = {
        let (seen, busy) = (seen.clone(), busy.clone());
        let (busy_console, idle_console) = (busy_console.clone(), idle_console.clone());
        tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                let console = if busy.load(Ordering::Relaxed) {
                    &busy_console
                } else {
                    &idle_console
                };
                render(&frame, console, &seen, &outcomes);
            }
        })
    };

    let result = loop {
        let input = prompt.read().await;
        if let Some(why) = client.closed_reason() {
            break Err(Failure::Tool(format!("clawcage: {why}")));
        }
        let line = match input {
            Ok(Input::Line(line)) => line,
            Ok(Input::Interrupted) => continue,
            Ok(Input::End) => break Ok(()),
            Err(error) => break Err(error),
        };
        if line.is_empty() {
            continue;
        }
        match line.as_str() {
            "/exit" | "/quit" => break Ok(()),
            "/help" => outln!("{HELP}"),
            "/tools" => match client.request("tools.list", json!({})).await {
                Ok(list) => {
                    for tool in list["tools"].as_array().into_iter().flatten() {
                        print_tool_summary(
                            text(tool, "name"),
                            text(tool, "description"),
                            text(tool, "grants"),
                        );
                    }
                }
                Err(error) => outln!("  error: {error}"),
            },
            "/reset" => match client
                .request("sessions.reset", json!({"sessionKey": key}))
                .await
            {
                Ok(_) => {}
                Err(error) => outln!("  error: {error}"),
            },
            command
                if command.starts_with('/')
                    && command.split_whitespace().next() != Some("/queue") =>
            {
                outln!("  unknown command {command}; /help lists the commands")
            }
            message => {
                busy.store(true, Ordering::Relaxed);
                busy_console.begin_turn();
                let sent = turn(&client, &key, message, &seen, &mut outcome, &mut prompt).await;
                busy.store(false, Ordering::Relaxed);
                if let Err(error) = sent {
                    break Err(error);
                }
            }
        }
    };
    renderer.abort();
    result
}

/// Sends `message` and waits for the turn that answers it; Ctrl-C asks the gateway to stop it.
async fn turn(
    client: &Client,
    key: &str,
    message: &str,
    seen: &Mutex<Seen>,
    outcome: &mut mpsc::UnboundedReceiver<Outcome>,
    prompt: &mut Prompt,
) -> Result<(), Failure> {
    let gone = |client: &Client| {
        Failure::Tool(format!(
            "clawcage: {}",
            client
                .closed_reason()
                .unwrap_or_else(|| "the gateway closed the connection".to_string())
        ))
    };
    let idempotency = format!(
        "cli-{}-{}",
        std::process::id(),
        clawcage_agent::transcript::now_ms()
    );
    {
        // Registered before sending: the renderer reads the acknowledgement.
        let mut seen = lock(seen);
        let id = client
            .send(
                "chat.send",
                json!({"sessionKey": key, "message": message, "idempotencyKey": idempotency}),
            )
            .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
        seen.awaiting = Some(id);
    }
    let turn = loop {
        match outcome.recv().await {
            Some(Outcome::Refused(why)) => {
                outln!("  not sent: {why}");
                return Ok(());
            }
            Some(Outcome::Said(text)) => {
                outln!("  {text}");
                return Ok(());
            }
            Some(Outcome::Admitted { turn }) => break turn,
            Some(Outcome::Approval(request)) => {
                answer_approval(client, key, &request, prompt).await?
            }
            Some(Outcome::Ended(_)) => {}
            None => return Err(gone(client)),
        }
    };
    loop {
        tokio::select! {
            ended = outcome.recv() => match ended {
                Some(Outcome::Ended(run)) if run == turn => return Ok(()),
                Some(Outcome::Approval(request)) => {
                    answer_approval(client, key, &request, prompt).await?;
                }
                Some(_) => {}
                None => return Err(gone(client)),
            },
            Ok(()) = tokio::signal::ctrl_c() => {
                let _ = client
                    .request("chat.abort", json!({"sessionKey": key, "runId": turn}))
                    .await;
            }
        }
    }
}

/// Shows an approval request of this session (or of its sub-agents) and sends the answer typed
/// at the terminal: `y` once, `a` always, `n` (or Ctrl-C, or the end of the input) deny. Requests
/// of other sessions are left to their own front ends.
async fn answer_approval(
    client: &Client,
    key: &str,
    request: &Value,
    prompt: &mut Prompt,
) -> Result<(), Failure> {
    let session = text(request, "sessionKey");
    if session != key && !session.starts_with(&format!("{key}/")) {
        return Ok(());
    }
    let description = text(request, "description");
    let mut lines = description.lines();
    outln!("  approval needed: {}", lines.next().unwrap_or_default());
    for line in lines {
        outln!("  {line}");
    }
    let decision = crate::prompt::ask_decision(prompt).await?;
    match client
        .request(
            "exec.approval.resolve",
            json!({"id": text(request, "id"), "decision": decision.as_str()}),
        )
        .await
    {
        Ok(_) => outln!("  {}", decision.as_str()),
        Err(error) => outln!("  {error}"),
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn text<'a>(value: &'a Value, name: &str) -> &'a str {
    value[name].as_str().unwrap_or_default()
}

/// The verdict a `tool` end event names.
fn verdict(data: &Value) -> Verdict {
    let reason = text(data, "reason").to_string();
    match text(data, "label") {
        "ok" => Verdict::Ok,
        "denied" => Verdict::Denied(reason),
        "invalid" => Verdict::Invalid(reason),
        "not_run" => Verdict::NotRun(reason),
        _ => Verdict::Failed(reason),
    }
}

/// Renders one frame from the gateway and tells the prompt what concerns its line.
fn render(
    frame: &Value,
    console: &Arc<Console>,
    seen: &Mutex<Seen>,
    outcomes: &mpsc::UnboundedSender<Outcome>,
) {
    let tell = |outcome: Outcome| {
        let _ = outcomes.send(outcome);
    };
    if frame["type"] == "res" {
        let mut seen = lock(seen);
        if seen.awaiting.as_ref().is_none_or(|id| frame["id"] != *id) {
            return;
        }
        seen.awaiting = None;
        if frame["ok"] != true {
            return tell(Outcome::Refused(
                text(&frame["error"], "message").to_string(),
            ));
        }
        let payload = &frame["payload"];
        let run = text(payload, "runId").to_string();
        let turn = match text(payload, "status") {
            "command" => return tell(Outcome::Said(text(payload, "text").to_string())),
            "queued" | "interrupting" => {
                console.line(&format!(
                    "  (queued at position {}; it runs after the turn in progress)",
                    payload["position"]
                ));
                run.clone()
            }
            "steered" => {
                console.line("  (the agent is busy: the message joins its running turn)");
                payload["into"].as_str().map_or(run.clone(), str::to_string)
            }
            _ => run.clone(),
        };
        seen.ours.insert(run);
        return tell(Outcome::Admitted { turn });
    }
    match frame["event"].as_str() {
        Some("agent") => {}
        Some("gap") => {
            return console.line(&format!(
                "  note: events {} to {} of this session are no longer kept",
                frame["payload"]["from"], frame["payload"]["to"]
            ));
        }
        Some("exec.approval.requested") => {
            return tell(Outcome::Approval(frame["payload"].clone()));
        }
        Some("shutdown") => return console.line("  the gateway is shutting down"),
        Some("session.deleted") => return console.line("  this session was deleted"),
        _ => return,
    }
    let event = &frame["payload"];
    let data = &event["data"];
    let run = text(event, "runId");
    let ours = lock(seen).ours.contains(run);
    let shown = Shown(console.clone());
    match (text(event, "stream"), text(data, "phase")) {
        ("lifecycle", "start") => {
            console.begin_turn();
            if ours {
                return;
            }
            match text(data, "kind") {
                "notification" => console.line(&format!(
                    "[{}] {}",
                    text(data, "sender"),
                    text(data, "message")
                )),
                _ => console.line(&format!("other> {}", text(data, "message"))),
            }
        }
        ("lifecycle", "queue") => match text(data, "status") {
            "joined" if !ours => console.line(&format!("other> {}", text(data, "message"))),
            "dropped" if ours => console.line(&format!("  dropped: {}", text(data, "reason"))),
            _ => {}
        },
        ("lifecycle", "end") => {
            if text(data, "end") == "no_answer" {
                console.line(&format!("  note: {}", text(data, "text")));
            } else if !console.streamed() {
                console.line(text(data, "text"));
            }
            console.break_line();
            let usage = &data["usage"];
            console.line(&format!(
                "  ({}; tokens this turn {} in / {} out)",
                text(data, "answeredBy"),
                usage["inputTokens"],
                usage["outputTokens"]
            ));
            tell(Outcome::Ended(run.to_string()));
        }
        ("lifecycle", "error") => {
            if data["aborted"] == true {
                console.interrupted();
            } else {
                console.line(&format!("  error: {}", text(data, "message")));
            }
            tell(Outcome::Ended(run.to_string()));
        }
        ("lifecycle", "reset") => console.line("  history cleared"),
        ("lifecycle", "note") => shown.note(text(data, "text")),
        ("reasoning", _) => shown.reasoning_delta(text(data, "delta")),
        ("assistant", _) => {
            if data["kind"] == "message" {
                console.line(&format!("  message: {}", text(data, "content")));
            } else {
                shown.text_delta(text(data, "delta"));
            }
        }
        ("tool", phase) => {
            let id = text(data, "toolCallId").to_string();
            let arguments = if phase == "start" {
                lock(seen)
                    .arguments
                    .insert(id.clone(), data["args"].clone());
                data["args"].clone()
            } else {
                lock(seen).arguments.remove(&id).unwrap_or_default()
            };
            let call = ToolCall {
                id,
                name: text(data, "name").to_string(),
                arguments,
            };
            if phase == "start" {
                shown.tool_started(&call);
            } else {
                shown.tool_finished(&call, &verdict(data), text(data, "output"));
            }
        }
        ("compaction", _) => console.line(&format!(
            "  note: history compacted ({}): {} older messages summarised, {} kept; about {} -> {} tokens",
            text(data, "reason"),
            data["summarisedMessages"],
            data["keptMessages"],
            data["tokensBefore"],
            data["tokensAfter"]
        )),
        ("error", _) => match text(data, "kind") {
            "failover" => console.line(&format!(
                "  … {} failed ({}); trying {}",
                text(data, "from"),
                text(data, "message"),
                text(data, "to")
            )),
            _ => console.line(&format!(
                "  … {}: {}; retrying",
                text(data, "provider"),
                text(data, "message")
            )),
        },
        _ => {}
    }
}
