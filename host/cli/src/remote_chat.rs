//! `clawcage chat --gateway URL`: the REPL attached to a running gateway instead of an agent of
//! its own. It connects with the token (`--token`, else the one the gateway saved in the state
//! directory), prints how much history the session has and its last messages, subscribes to the
//! session's events from the history's cursor, and renders every run of the session the way
//! `chat` does (render.rs): its own turns, and the turns other clients (another terminal, the
//! web chat) start, with their user messages. Typed lines are `chat.send`s — also while a turn
//! runs, when the gateway's queue mode decides what becomes of them and the terminal says so;
//! `/reset`, `/queue`, `/tools`, `/approve`, `/last`, `/help` and `/exit` work as in `chat`, and
//! Ctrl-C during a turn sends `chat.abort`. The session's approval requests are shown while
//! they wait, wherever they came from, and answered with one key during a turn (or `/approve`
//! at the prompt); one decided elsewhere is withdrawn. When the connection is lost it connects
//! again with backoff and resumes the event stream where it stopped (`since`), saying so. It is one
//! file (over 700 lines) because the prompt loop, a turn, its approvals and the rendering of the
//! session's events all share one connection (`Link`) and one console and hand events to one
//! another.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_agent::TurnObserver as _;
use clawcage_agent::Verdict;
use clawcage_agent::provider::ProviderEvents as _;
use clawcage_core::ToolCall;
use clawcage_core::approval::ApprovalDecision;
use clawcage_core::command::{APPROVE_USAGE, Command};
use clawcage_core::sync::lock;
use clawcage_gateway::{Client, ClientError};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Failure;
use crate::keys::{Key, TurnKeys, TypedLine};
use crate::prompt::{Input, Prompt, print_tool_summary};
use crate::render::{Console, Shown, Sink, Style};

const HELP: &str = "Type a request and press Enter; it is sent to the gateway's session, and turns other clients start there are shown too. Commands:
  /help    this text
  /tools   the tools the agent may call, with what each may reach
  /queue   show or set what a message to a busy session does (/queue <steer|followup|collect|interrupt>)
  /approve ID allow-once|allow-always|deny   answer an approval request shown while the prompt
           waited (during a turn one key answers: y once, a always, n deny)
  /last    the last tool call's whole output
  /reset   forget this session's history (the transcript keeps a reset mark)
  /exit    leave (Ctrl-D works too); the gateway and the session go on
While the agent works, a line typed and sent with Enter goes to the session at once (/queue says
how); Ctrl-C stops that turn; what it did so far is kept.";

/// The longest pause between two attempts to connect again.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What the renderer tells the prompt about the lines it sent and the approvals it saw.
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
    /// An exec approval request of this session (the `exec.approval.requested` payload).
    Approval(Value),
    /// An approval request was decided (here or elsewhere) or expired.
    Resolved {
        id: String,
        decision: String,
        by: String,
    },
}

/// What the renderer knows.
#[derive(Default)]
struct Seen {
    /// The request ids of the lines sent and not yet acknowledged.
    awaiting: HashSet<String>,
    /// Runs this client started.
    ours: HashSet<String>,
    /// The arguments of the tool calls running, by call id (their end events do not repeat
    /// them).
    arguments: HashMap<String, Value>,
    /// The newest event of the session seen: where a new connection resumes.
    cursor: u64,
    /// The session's approval requests waiting now, by id.
    approvals: HashMap<String, Value>,
}

/// The connection to the gateway, replaced when it is made again.
struct Link {
    url: String,
    token: String,
    key: String,
    client_id: String,
    client: Mutex<Arc<Client>>,
}

impl Link {
    fn client(&self) -> Arc<Client> {
        lock(&self.client).clone()
    }

    /// Connects; the client and its events.
    async fn connect(&self) -> Result<(Client, mpsc::UnboundedReceiver<Value>), ClientError> {
        let (mut client, _hello) = Client::connect(
            &self.url,
            &self.token,
            &self.client_id,
            "cli",
            Some(&self.key),
        )
        .await?;
        let frames = client
            .take_events()
            .ok_or_else(|| ClientError::Closed("the gateway connection has no events".into()))?;
        Ok((client, frames))
    }

    /// Follows the session's events from `since`, every page of the replay.
    async fn subscribe(&self, client: &Client, since: u64) -> Result<(), ClientError> {
        let mut since = since;
        loop {
            let answer = client
                .request(
                    "sessions.subscribe",
                    json!({"sessionKey": self.key, "since": since}),
                )
                .await?;
            if answer["more"] != true {
                return Ok(());
            }
            since = answer["nextSince"].as_u64().unwrap_or(since);
        }
    }
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
    let frames = client
        .take_events()
        .ok_or_else(|| Failure::Tool("clawcage: the gateway connection has no events".into()))?;
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
    let messages = history["messages"].as_array().cloned().unwrap_or_default();
    if !messages.is_empty() {
        outln!(
            "resuming session {key}: {} earlier messages (/reset forgets them); the last ones:",
            messages.len()
        );
        print_recent(&busy_console, &messages);
    }
    let cursor = history["cursor"].as_u64().unwrap_or(0);
    let link = Arc::new(Link {
        url: url.to_string(),
        token: token.to_string(),
        key: key.clone(),
        client_id: client_id.clone(),
        client: Mutex::new(Arc::new(client)),
    });
    link.subscribe(&link.client(), cursor)
        .await
        .map_err(failed)?;

    let seen = Arc::new(Mutex::new(Seen {
        cursor,
        ..Seen::default()
    }));
    let busy = Arc::new(AtomicBool::new(false));
    let (outcomes, mut outcome) = mpsc::unbounded_channel();
    let renderer = tokio::spawn(follow(
        link.clone(),
        frames,
        Consoles {
            busy: busy.clone(),
            busy_console: busy_console.clone(),
            idle_console: idle_console.clone(),
        },
        seen.clone(),
        outcomes,
        format!("gateway:{client_id}"),
    ));

    // What the person typed during the last turn and did not send: the next prompt starts
    // with it.
    let mut typed_before = String::new();
    crate::keys::restore_on_termination();
    let result = loop {
        let line = match prompt.read(&std::mem::take(&mut typed_before)).await {
            Ok(Input::Line(line)) => line,
            Ok(Input::Interrupted) => continue,
            Ok(Input::End) => break Ok(()),
            Err(error) => break Err(error),
        };
        if line.is_empty() {
            continue;
        }
        let client = link.client();
        let command = match Command::parse(&line).transpose() {
            Ok(command) => command,
            Err(error) => {
                outln!("  {error}");
                continue;
            }
        };
        match command {
            Some(Command::Exit) => break Ok(()),
            Some(Command::Help) => outln!("{HELP}"),
            Some(Command::Last) => busy_console.print_last_output(),
            Some(Command::Tools) => match client.request("tools.list", json!({})).await {
                Ok(list) => {
                    for tool in list["tools"].as_array().into_iter().flatten() {
                        print_tool_summary(
                            text(tool, "name"),
                            text(tool, "description"),
                            text(tool, "grants"),
                        );
                    }
                }
                Err(error) => busy_console.error(&error.to_string()),
            },
            Some(Command::Reset) => {
                if let Err(error) = client
                    .request("sessions.reset", json!({"sessionKey": key}))
                    .await
                {
                    busy_console.error(&error.to_string());
                }
            }
            Some(Command::Approve { id, decision }) => {
                resolve(&client, &busy_console, &id, decision).await;
            }
            Some(Command::ApproveUsage) => outln!("  usage: {APPROVE_USAGE}"),
            Some(
                other
                @ (Command::Start | Command::Compact | Command::Usage | Command::Approvals(_)),
            ) => outln!("  {}", other.not_here()),
            // The gateway answers `/queue` itself (`chat.send` with the line).
            Some(Command::Queue(_)) | None => {
                let message = line.as_str();
                busy.store(true, Ordering::Relaxed);
                busy_console.activate();
                let turn = RemoteTurn {
                    link: &link,
                    key: &key,
                    seen: &seen,
                    console: &busy_console,
                };
                let sent = turn.run(message, &mut outcome, &mut prompt).await;
                busy.store(false, Ordering::Relaxed);
                match sent {
                    Ok(typed) => typed_before = typed,
                    Err(error) => break Err(error),
                }
            }
        }
    };
    renderer.abort();
    result
}

/// The last few messages of the session's history (`chat.history`'s messages).
fn print_recent(console: &Console, messages: &[Value]) {
    let shown: Vec<(bool, String)> = messages
        .iter()
        .filter_map(|message| {
            let joined: String = message["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|block| block["type"] == "text")
                .filter_map(|block| block["text"].as_str())
                .collect::<Vec<_>>()
                .join("");
            let joined = joined.trim().to_string();
            (!joined.is_empty()).then(|| (message["role"] == "user", joined))
        })
        .collect();
    for (from_user, said) in shown.iter().skip(shown.len().saturating_sub(4)) {
        let said = clawcage_agent::provider::preview(&said.replace('\n', " "), 200);
        let who = if *from_user { "you>" } else { "agent:" };
        console.styled_line(Style::Dim, &format!("  {who} {said}"));
    }
}

/// Sends a decision on approval request `id`.
async fn resolve(client: &Client, console: &Console, id: &str, decision: ApprovalDecision) {
    match client
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": decision.as_str()}),
        )
        .await
    {
        Ok(_) => {
            let style = if decision == ApprovalDecision::Deny {
                Style::Bad
            } else {
                Style::Good
            };
            console.styled_line(style, &format!("  {}", decision.as_str()));
        }
        Err(error) => console.line(&format!("  {error}")),
    }
}

/// One turn of the REPL against the gateway: the line sent, what the gateway says of it, its
/// end; meanwhile Ctrl-C, approval questions, and lines typed (sent at once; the turns they
/// start are waited for in order).
struct RemoteTurn<'a> {
    link: &'a Link,
    key: &'a str,
    seen: &'a Mutex<Seen>,
    console: &'a Arc<Console>,
}

impl RemoteTurn<'_> {
    /// Sends `message` and follows the turns it and the lines typed meanwhile start; returns
    /// what was typed and not sent.
    async fn run(
        &self,
        message: &str,
        outcome: &mut mpsc::UnboundedReceiver<Outcome>,
        prompt: &mut Prompt,
    ) -> Result<String, Failure> {
        let console = self.console;
        console.show_typed("");
        let mut keys = TurnKeys::start();
        if let Some(columns) = keys.as_ref().and_then(|keys| keys.columns) {
            console.set_columns(columns);
        }
        console.begin_turn();
        let mut typed = TypedLine::default();
        // Lines sent and not yet admitted, then the turns to wait for, the first the current.
        let mut unanswered = 1usize;
        let mut turns: VecDeque<String> = VecDeque::new();
        // Runs whose end came before their admission was read.
        let mut ended: HashSet<String> = HashSet::new();
        if !self.send(message) {
            return Ok(String::new());
        }
        // Requests already waiting (shown while the prompt waited) can be answered now.
        let mut questions: VecDeque<Value> = lock(self.seen).approvals.values().cloned().collect();
        self.ask(&mut questions, keys.is_some(), prompt).await?;
        loop {
            if unanswered == 0 && turns.is_empty() {
                drop(keys);
                console.show_typed("");
                return Ok(typed.into_text());
            }
            tokio::select! {
                said = outcome.recv() => match said {
                    Some(Outcome::Refused(why)) => {
                        unanswered = unanswered.saturating_sub(1);
                        console.styled_line(Style::Bad, &format!("  not sent: {why}"));
                    }
                    Some(Outcome::Said(text)) => {
                        unanswered = unanswered.saturating_sub(1);
                        console.line(&format!("  {text}"));
                    }
                    Some(Outcome::Admitted { turn }) => {
                        unanswered = unanswered.saturating_sub(1);
                        if !turns.contains(&turn) && !ended.remove(&turn) {
                            turns.push_back(turn);
                        }
                    }
                    Some(Outcome::Ended(run)) => {
                        if turns.contains(&run) {
                            turns.retain(|turn| *turn != run);
                        } else if unanswered > 0 {
                            ended.insert(run);
                        }
                    }
                    Some(Outcome::Approval(request)) => {
                        let id = text(&request, "id").to_string();
                        if !questions.iter().any(|known| text(known, "id") == id) {
                            questions.push_back(request);
                            if questions.len() == 1 {
                                self.ask(&mut questions, keys.is_some(), prompt).await?;
                            }
                        }
                    }
                    Some(Outcome::Resolved { id, decision, by }) => {
                        if let Some(at) = questions.iter().position(|known| text(known, "id") == id) {
                            questions.remove(at);
                            if !by.ends_with(&self.link.client_id) {
                                console.styled_line(
                                    Style::Attention,
                                    &format!("  {id} was answered elsewhere ({by}): {decision}"),
                                );
                            }
                            if at == 0 {
                                console.resume_after_approval();
                                self.ask(&mut questions, keys.is_some(), prompt).await?;
                            }
                        }
                    }
                    None => return Err(Failure::Tool("clawcage: the gateway connection ended".into())),
                },
                Ok(()) = tokio::signal::ctrl_c() => match questions.pop_front() {
                    Some(request) => {
                        self.decide(&request, ApprovalDecision::Deny).await;
                        self.ask(&mut questions, keys.is_some(), prompt).await?;
                    }
                    None => {
                        let client = self.link.client();
                        if client.closed_reason().is_some() {
                            // Nothing can be stopped while the gateway is away: stop waiting.
                            console.styled_line(
                                Style::Attention,
                                "  not connected: the prompt is back; the turn's end is shown once connected again",
                            );
                            return Ok(typed.into_text());
                        }
                        let run = turns.front().cloned();
                        let mut params = json!({"sessionKey": self.key});
                        if let Some(run) = run {
                            params["runId"] = json!(run);
                        }
                        let _ = client.request("chat.abort", params).await;
                    }
                },
                key = next_key(&mut keys) => {
                    if let Some(request) = questions.front().cloned() {
                        let decision = match key {
                            Key::Char(c) => ApprovalDecision::parse(&c.to_string()),
                            _ => None,
                        };
                        match decision {
                            Some(decision) => {
                                questions.pop_front();
                                self.decide(&request, decision).await;
                                self.ask(&mut questions, true, prompt).await?;
                            }
                            None => console.styled_line(
                                Style::Attention,
                                "  press y (allow once), a (allow always) or n (deny)",
                            ),
                        }
                    } else {
                        let sent = typed.take(key);
                        console.show_typed(typed.text());
                        if let Some(line) = sent {
                            console.styled_line(Style::Bold, &format!("you> {line}"));
                            if self.send(&line) {
                                unanswered += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Sends `message` to the session; false (said) when it cannot be sent.
    fn send(&self, message: &str) -> bool {
        let idempotency = format!(
            "cli-{}-{}-{}",
            std::process::id(),
            clawcage_agent::transcript::now_ms(),
            fastrand_suffix()
        );
        let client = self.link.client();
        // Registered before sending: the renderer reads the acknowledgement.
        let mut seen = lock(self.seen);
        match client.send(
            "chat.send",
            json!({"sessionKey": self.key, "message": message, "idempotencyKey": idempotency}),
        ) {
            Ok(id) => {
                seen.awaiting.insert(id);
                true
            }
            Err(error) => {
                self.console.styled_line(
                    Style::Bad,
                    &format!("  not sent: {error} (the terminal is connecting again; send it once more when it says so)"),
                );
                false
            }
        }
    }

    /// Shows the first waiting question, if any, answered by one key; without a terminal,
    /// asks each waiting question as a line now.
    async fn ask(
        &self,
        questions: &mut VecDeque<Value>,
        single_key: bool,
        prompt: &mut Prompt,
    ) -> Result<(), Failure> {
        if single_key {
            if let Some(request) = questions.front() {
                self.show(request);
                self.console.styled_line(
                    Style::Attention,
                    "  allow? press y (once), a (always) or n (deny)",
                );
            }
            return Ok(());
        }
        while let Some(request) = questions.pop_front() {
            self.show(&request);
            let decision = crate::prompt::ask_decision(prompt).await?;
            self.decide(&request, decision).await;
        }
        Ok(())
    }

    /// The lines that describe `request`, the running call's line paused meanwhile.
    fn show(&self, request: &Value) {
        let console = self.console;
        console.pause_for_approval();
        let description = text(request, "description");
        let mut lines = description.lines();
        console.styled_line(
            Style::Attention,
            &format!("  approval needed: {}", lines.next().unwrap_or_default()),
        );
        for line in lines {
            console.line(&format!("    {}", line.trim_start()));
        }
    }

    async fn decide(&self, request: &Value, decision: ApprovalDecision) {
        let client = self.link.client();
        resolve(&client, self.console, text(request, "id"), decision).await;
        self.console.resume_after_approval();
    }
}

/// A number that differs between two lines sent in the same millisecond.
fn fastrand_suffix() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The next key typed during a turn; never without a terminal.
async fn next_key(keys: &mut Option<TurnKeys>) -> Key {
    match keys {
        Some(keys) => keys.next().await,
        None => std::future::pending().await,
    }
}

/// Where the renderer draws: the busy console while this terminal's turn runs, else through
/// the line editor.
struct Consoles {
    busy: Arc<AtomicBool>,
    busy_console: Arc<Console>,
    idle_console: Arc<Console>,
}

impl Consoles {
    fn now(&self) -> &Arc<Console> {
        if self.busy.load(Ordering::Relaxed) {
            &self.busy_console
        } else {
            &self.idle_console
        }
    }
}

/// Renders the gateway's frames; when the connection is lost, connects again with backoff and
/// resumes the session's events after the last one seen.
async fn follow(
    link: Arc<Link>,
    mut frames: mpsc::UnboundedReceiver<Value>,
    consoles: Consoles,
    seen: Arc<Mutex<Seen>>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    ourselves: String,
) {
    loop {
        while let Some(frame) = frames.recv().await {
            render(&frame, &consoles, &link.key, &seen, &outcomes, &ourselves);
        }
        let why = link
            .client()
            .closed_reason()
            .unwrap_or_else(|| "the gateway closed the connection".to_string());
        consoles
            .now()
            .styled_line(Style::Attention, &format!("  {why}; connecting again…"));
        let mut delay = Duration::from_millis(500);
        frames = loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_BACKOFF);
            let (client, frames) = match link.connect().await {
                Ok(connected) => connected,
                Err(ClientError::Refused { message, .. }) => {
                    consoles.now().styled_line(
                        Style::Bad,
                        &format!("  the gateway refused to connect again: {message}; still trying"),
                    );
                    continue;
                }
                Err(_) => continue,
            };
            let since = lock(&seen).cursor;
            let client = Arc::new(client);
            match link.subscribe(&client, since).await {
                Ok(()) => {
                    consoles.now().styled_line(
                        Style::Good,
                        &format!("  connected again to {}; the session's events go on after event {since}", link.url),
                    );
                }
                Err(ClientError::Failed { code, .. }) if code == "INVALID_PARAMS" => {
                    // The session was reset or deleted meanwhile: follow it from now.
                    let last = match client
                        .request("chat.history", json!({"sessionKey": link.key}))
                        .await
                    {
                        Ok(history) => history["cursor"].as_u64().unwrap_or(0),
                        Err(_) => continue,
                    };
                    if link.subscribe(&client, last).await.is_err() {
                        continue;
                    }
                    lock(&seen).cursor = last;
                    consoles.now().styled_line(
                        Style::Attention,
                        "  connected again; the session was reset or deleted meanwhile, its new events follow",
                    );
                }
                Err(_) => continue,
            }
            *lock(&link.client) = client;
            break frames;
        };
    }
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

/// Renders one frame from the gateway and tells the prompt what concerns its lines.
fn render(
    frame: &Value,
    consoles: &Consoles,
    key: &str,
    seen: &Mutex<Seen>,
    outcomes: &mpsc::UnboundedSender<Outcome>,
    ourselves: &str,
) {
    let console = consoles.now();
    let busy = consoles.busy.load(Ordering::Relaxed);
    let tell = |outcome: Outcome| {
        let _ = outcomes.send(outcome);
    };
    if frame["type"] == "res" {
        let mut seen = lock(seen);
        let Some(id) = frame["id"].as_str() else {
            return;
        };
        if !seen.awaiting.remove(id) {
            return;
        }
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
                console.styled_line(
                    Style::Attention,
                    &format!(
                        "  (queued at position {}; it runs after the turn in progress)",
                        payload["position"]
                    ),
                );
                run.clone()
            }
            "steered" => {
                console.styled_line(
                    Style::Attention,
                    "  (the agent is busy: the message joins its running turn)",
                );
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
            let request = frame["payload"].clone();
            let session = text(&request, "sessionKey");
            if session != key && !session.starts_with(&format!("{key}/")) {
                return;
            }
            let id = text(&request, "id").to_string();
            let known = lock(seen)
                .approvals
                .insert(id.clone(), request.clone())
                .is_some();
            if busy {
                return tell(Outcome::Approval(request));
            }
            if !known {
                console.styled_line(
                    Style::Attention,
                    &format!(
                        "approval needed [{id}]: {}\n  answer with /approve {id} allow-once|allow-always|deny",
                        text(&request, "description")
                    ),
                );
            }
            return;
        }
        Some("exec.approval.resolved") => {
            let payload = &frame["payload"];
            let id = text(payload, "id").to_string();
            if lock(seen).approvals.remove(&id).is_none() {
                return;
            }
            let decision = text(payload, "decision").to_string();
            let by = text(payload, "by").to_string();
            if busy {
                return tell(Outcome::Resolved { id, decision, by });
            }
            if by != ourselves {
                console.line(&format!("  {id}: {decision} (by {by})"));
            }
            return;
        }
        Some("shutdown") => {
            return console.styled_line(Style::Attention, "  the gateway is shutting down");
        }
        Some("session.deleted") => return console.line("  this session was deleted"),
        _ => return,
    }
    let event = &frame["payload"];
    if text(event, "sessionKey") == key
        && let Some(seq) = frame["seq"].as_u64().or_else(|| event["seq"].as_u64())
    {
        let mut seen = lock(seen);
        seen.cursor = seen.cursor.max(seq);
    }
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
            "dropped" if ours => console.styled_line(
                Style::Attention,
                &format!("  dropped: {}", text(data, "reason")),
            ),
            _ => {}
        },
        ("lifecycle", "end") => {
            if text(data, "end") == "no_answer" {
                console.styled_line(Style::Attention, &format!("  note: {}", text(data, "text")));
            } else if !console.streamed() {
                console.line(text(data, "text"));
            }
            console.break_line();
            let usage = &data["usage"];
            console.styled_line(
                Style::Dim,
                &format!(
                    "  ({}; tokens this turn {} in / {} out)",
                    text(data, "answeredBy"),
                    usage["inputTokens"],
                    usage["outputTokens"]
                ),
            );
            tell(Outcome::Ended(run.to_string()));
        }
        ("lifecycle", "error") => {
            if data["aborted"] == true {
                console.interrupted();
            } else {
                console.error(text(data, "message"));
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
            "failover" => console.styled_line(
                Style::Attention,
                &format!(
                    "  … {} failed ({}); trying {}",
                    text(data, "from"),
                    text(data, "message"),
                    text(data, "to")
                ),
            ),
            _ => console.styled_line(
                Style::Attention,
                &format!(
                    "  … {}: {}; retrying",
                    text(data, "provider"),
                    text(data, "message")
                ),
            ),
        },
        _ => {}
    }
}
