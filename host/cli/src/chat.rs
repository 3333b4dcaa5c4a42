//! `clawcage chat`: the REPL. Line editing and history (rustyline, history kept in the state
//! directory), replies streamed as they arrive, each tool call shown with its verdict (and a line
//! when the history is compacted), and the commands `/help`, `/tools`, `/reset`, `/compact`,
//! `/usage`, `/queue`, `/approve`, `/last`, `/exit`. Approvals of exec commands are asked
//! inline during a turn (one key: `y` once, `a` always, `n` deny; the running call's line
//! waits meanwhile) and shown above the prompt while it waits. A line typed during a turn goes
//! to the session through its queue mode at once (steered into the running turn by default),
//! and its fate is said. Notifications published on the bus's `system` channel enter the
//! session through its lane like any input: while the prompt waits they are handled at once and
//! printed above it; during a turn they queue behind it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clawcage_agent::approvals::{
    ApprovalBroker, ApprovalRequest, OperatorEvent, OperatorFilter, OperatorHandle, SessionPolicy,
};
use clawcage_agent::session::{Admission, LaneInput, Sessions};
use clawcage_agent::{AgentError, TurnEnd, TurnOutcome};
use clawcage_core::InboundMessage;
use clawcage_core::approval::ApprovalDecision;
use clawcage_core::command::{APPROVE_USAGE, Command};
use clawcage_runtime::{AgentOptions, CronStatus, Lifetime, Runtime};

use crate::Failure;
use crate::keys::{Key, TurnKeys, TypedLine};
use crate::prompt::{Input, Prompt, print_tool_summary};
use crate::render::{Console, Shown, Sink, Style, print_messages};

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
  /last    the last tool call's whole output
  /exit    leave (Ctrl-D works too)
While the agent works, a line typed and sent with Enter goes to it at once (/queue says how);
Ctrl-C stops that turn; what it did so far is kept.";

/// Run the REPL on session `key`, over the long-running host of `runtime`.
pub async fn run(mut runtime: Runtime, key: String) -> Result<(), Failure> {
    let state_dir = runtime.state_dir().clone();
    let mut prompt = Prompt::new()?;
    let history_file = state_dir.chat_history();
    prompt.load_history(&history_file);

    // While the prompt waits, output goes through the editor's printer so the prompt survives.
    let idle_sink = prompt.idle_sink(true);
    let console = Arc::new(Console::new(Sink::Stdout, true));
    // A notification turn's text is printed whole when it ends, under the sender's name.
    let idle_console = Arc::new(Console::new(idle_sink, false));
    let mut agent = runtime
        .host(
            Lifetime::LongRunning,
            AgentOptions::new(print_messages(console.clone())),
        )
        .await?;
    let sessions = agent.sessions.clone();
    say_who_fires_cron(&runtime, agent.cron_status());

    // Sub-agent results and cron firings become turns of their sessions, printed when idle.
    agent.start(
        sessions.notification_front(
            idle_console.clone(),
            Arc::new({
                let idle_console = idle_console.clone();
                move |message: &InboundMessage, outcome: Result<TurnOutcome, AgentError>| {
                    match outcome {
                        Ok(outcome) => idle_console.line(&format!(
                            "[{} via {}] {}",
                            message.sender, message.channel, outcome.text
                        )),
                        Err(error) => idle_console.line(&format!(
                            "[{}] the notification could not be handled: {error}",
                            message.sender
                        )),
                    }
                }
            }),
        ),
        None,
    );

    outln!(
        "clawcage chat: {} · session {key} · {} tools · /help for commands",
        agent.label,
        agent.tools.names().len()
    );
    if agent.scripted {
        outln!("note: the answers come from a recorded script, not from a model");
    }
    // Say what resuming brings back: the history the model will see.
    let transcripts = clawcage_agent::JsonlTranscripts::new(state_dir.sessions());
    if clawcage_agent::TranscriptStore::exists(&transcripts, &key).unwrap_or(false) {
        let limit = runtime.history_limit();
        match clawcage_agent::TranscriptStore::load(&transcripts, &key, limit) {
            Ok(loaded) if !loaded.messages.is_empty() => {
                outln!(
                    "resuming session {key}: {} earlier messages loaded (/reset forgets them); the last ones:",
                    loaded.messages.len()
                );
                print_recent(&console, &loaded.messages);
            }
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
            // The requests shown above the prompt: their decisions are shown too.
            let mut shown = std::collections::HashSet::new();
            while let Some(event) = watcher.next().await {
                match event {
                    OperatorEvent::Requested(request) if !in_turn.load(Ordering::SeqCst) => {
                        idle_console.line(&format!(
                            "approval needed [{}]: {}\n  answer with /approve {} allow-once|allow-always|deny",
                            request.id,
                            request.describe(),
                            request.id
                        ));
                        shown.insert(request.id);
                    }
                    // Forgotten in any case; said unless this terminal answered it.
                    OperatorEvent::Resolved { id, decision, by }
                        if shown.remove(&id) && by != "chat" =>
                    {
                        idle_console.line(&format!("  {id}: {} (by {by})", decision.as_str()));
                    }
                    _ => {}
                }
            }
        })
    });

    // What the person typed during the last turn and did not send: the next prompt starts
    // with it.
    let mut typed_before = String::new();
    crate::keys::restore_on_termination();
    loop {
        let line = match prompt.read(&std::mem::take(&mut typed_before)).await? {
            Input::Line(line) => line,
            Input::Interrupted => continue,
            Input::End => break,
        };
        if line.is_empty() {
            continue;
        }
        let command = match Command::parse(&line).transpose() {
            Ok(command) => command,
            Err(error) => {
                outln!("  {error}");
                continue;
            }
        };
        match command {
            Some(Command::Exit) => break,
            Some(Command::Help) => outln!("{HELP}"),
            Some(Command::Last) => console.print_last_output(),
            Some(Command::Tools) => {
                for tool in agent.tools.tools() {
                    let spec = tool.spec();
                    print_tool_summary(&spec.name, &spec.description, &tool.grants_summary());
                }
            }
            Some(Command::Reset) => match sessions.reset(&key).await {
                Ok(()) => outln!("  history cleared"),
                Err(error) => outln!("  error: {error}"),
            },
            Some(Command::Compact) => {
                // Compacting asks the model for a summary: not with the budget used up.
                if let Some(why) = sessions
                    .budget()
                    .and_then(|budget| budget.check(Some(&key)).err())
                {
                    outln!("  not compacted: a summary needs a model call, and {why}");
                    continue;
                }
                // The outcome says what was compacted; the observer would say it a second time.
                match sessions
                    .compact(&key, Arc::new(clawcage_agent::provider::NoEvents))
                    .await
                {
                    Ok(said) => outln!("  {said}"),
                    Err(error) => outln!("  error: {error}"),
                }
            }
            Some(Command::Usage) => {
                for line in sessions.usage_report(&key).lines() {
                    outln!("  {line}");
                }
            }
            Some(Command::Queue(command)) => match sessions.queue_command(&key, &command) {
                Ok(said) => outln!("  {said}"),
                Err(error) => outln!("  {error}"),
            },
            Some(Command::Approvals(words)) => {
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
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
            Some(Command::Approve { id, decision }) => {
                match approvals.resolve(&id, decision, "chat") {
                    Ok(()) => outln!("  {id}: {}", decision.as_str()),
                    Err(error) => outln!("  {error}"),
                }
            }
            Some(Command::ApproveUsage) => outln!("  usage: {APPROVE_USAGE}"),
            Some(other @ Command::Start) => outln!("  {}", other.not_here()),
            None => {
                let request = line.as_str();
                in_turn.store(true, Ordering::SeqCst);
                let turn = Turn {
                    sessions: &sessions,
                    key: &key,
                    console: &console,
                    approvals: &approvals,
                };
                let result = turn.run(request, &mut operator, &mut prompt).await;
                in_turn.store(false, Ordering::SeqCst);
                typed_before = result?;
            }
        }
    }
    agent.stop();
    if let Some(task) = idle_approvals {
        task.abort();
    }
    prompt.save_history(&history_file);
    Ok(())
}

/// Says who fires the state directory's cron jobs when it is not this chat.
fn say_who_fires_cron(runtime: &Runtime, status: &CronStatus) {
    let CronStatus::OwnedElsewhere(dir) = status else {
        return;
    };
    match clawcage_gateway::running_gateway(runtime.state_dir()) {
        Some(url) => clawcage_runtime::tell!(
            "note: the gateway running at {url} fires the cron jobs of {}; this chat's cron tool changes them there (or attach to the gateway: clawcage chat --gateway {})",
            dir.display(),
            url.replacen("http://", "ws://", 1).trim_end_matches('/')
        ),
        None => clawcage_runtime::tell!(
            "note: another clawcage process fires the cron jobs of {}; this chat's cron tool changes them there",
            dir.display()
        ),
    }
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

/// The last few messages of a resumed session, so the person sees where it stands.
fn print_recent(console: &Console, messages: &[clawcage_core::chat::ChatMessage]) {
    let shown: Vec<(bool, String)> = messages
        .iter()
        .filter_map(|message| {
            let text = message.text();
            let text = text.trim();
            (!text.is_empty()).then(|| {
                (
                    message.role == clawcage_core::chat::Role::User,
                    text.to_string(),
                )
            })
        })
        .collect();
    for (from_user, text) in shown.iter().skip(shown.len().saturating_sub(RECENT_SHOWN)) {
        let text = clawcage_agent::provider::preview(&text.replace('\n', " "), 200);
        if *from_user {
            console.styled_line(Style::Dim, &format!("  you> {text}"));
        } else {
            console.styled_line(Style::Dim, &format!("  agent: {text}"));
        }
    }
}

/// How many earlier messages a resumed chat shows.
const RECENT_SHOWN: usize = 4;

/// One turn of the REPL and what arrives while it runs: the outcome, Ctrl-C, approval requests,
/// and lines typed meanwhile (sent through the session's queue mode, their turns waited for in
/// order when they queue behind).
struct Turn<'a> {
    sessions: &'a Sessions,
    key: &'a str,
    console: &'a Arc<Console>,
    approvals: &'a ApprovalBroker,
}

impl Turn<'_> {
    /// Runs the turn on `request` and those of lines typed meanwhile; returns what was typed
    /// and not sent.
    async fn run(
        &self,
        request: &str,
        operator: &mut Option<OperatorHandle>,
        prompt: &mut Prompt,
    ) -> Result<String, Failure> {
        let console = self.console;
        console.activate();
        console.show_typed("");
        let mut keys = TurnKeys::start();
        if let Some(columns) = keys.as_ref().and_then(|keys| keys.columns) {
            console.set_columns(columns);
        }
        console.begin_turn();
        let mut typed = TypedLine::default();
        let first = self.submit(request);
        self.say_admission(first.admission());
        let mut waiting: VecDeque<clawcage_agent::session::PendingTurn> = VecDeque::new();
        let mut current = Box::pin(first.wait());
        // Approval requests, the first one asked now.
        let mut questions: VecDeque<ApprovalRequest> = VecDeque::new();
        loop {
            tokio::select! {
                result = &mut current => {
                    self.show_outcome(result);
                    match waiting.pop_front() {
                        Some(next) => {
                            console.begin_turn();
                            current = Box::pin(next.wait());
                        }
                        None => break,
                    }
                }
                Ok(()) = tokio::signal::ctrl_c() => match questions.pop_front() {
                    Some(request) => {
                        self.decide(&request, ApprovalDecision::Deny);
                        self.next_question(&questions);
                    }
                    None => self.sessions.interrupt(self.key),
                },
                Some(event) = next_event(operator) => match event {
                    OperatorEvent::Requested(request) => {
                        if keys.is_none() {
                            // No terminal to read single keys from: ask for a line.
                            answer_inline(prompt, console, self.approvals, &request).await?;
                        } else {
                            questions.push_back(request);
                            if questions.len() == 1 {
                                self.next_question(&questions);
                            }
                        }
                    }
                    OperatorEvent::Resolved { id, decision, by } => {
                        if let Some(at) = questions.iter().position(|request| request.id == id) {
                            questions.remove(at);
                            if by != "chat" {
                                console.styled_line(
                                    Style::Attention,
                                    &format!("  {id} was answered elsewhere ({by}): {}", decision.as_str()),
                                );
                            }
                            if at == 0 {
                                console.resume_after_approval();
                                self.next_question(&questions);
                            }
                        }
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
                                self.decide(&request, decision);
                                self.next_question(&questions);
                            }
                            None => console.styled_line(
                                Style::Attention,
                                "  press y (allow once), a (allow always) or n (deny)",
                            ),
                        }
                    } else {
                        let sent = typed.take(key);
                        console.show_typed(typed.text());
                        if let Some(line) = sent
                            && let Some(pending) = self.type_ahead(&line)
                        {
                            waiting.push_back(pending);
                        }
                    }
                }
            }
        }
        drop(keys);
        console.show_typed("");
        Ok(typed.into_text())
    }

    fn submit(&self, text: &str) -> clawcage_agent::session::PendingTurn {
        self.sessions.submit(
            self.key,
            LaneInput::User(text.to_string()),
            Arc::new(Shown(self.console.clone())),
        )
    }

    /// A line typed while the turn runs: shown, sent, its fate said. Returns the pending turn
    /// when it waits for a turn of its own.
    fn type_ahead(&self, line: &str) -> Option<clawcage_agent::session::PendingTurn> {
        self.console
            .styled_line(Style::Bold, &format!("you> {line}"));
        let pending = self.submit(line);
        self.say_admission(pending.admission());
        self.console.thinking();
        match pending.admission() {
            Admission::Steered | Admission::Dropped { .. } => None,
            Admission::Started | Admission::Queued { .. } | Admission::Interrupting { .. } => {
                Some(pending)
            }
        }
    }

    /// Says what became of a message sent while the session is busy.
    fn say_admission(&self, admission: &Admission) {
        let said = match admission {
            Admission::Started => return,
            Admission::Steered => {
                "  (the agent is busy: the message joins its running turn)".to_string()
            }
            Admission::Queued { position } => {
                format!("  (queued at position {position}; it runs after the turn in progress)")
            }
            Admission::Interrupting { position } => format!(
                "  (the running turn is being stopped; the message runs then, at position {position})"
            ),
            Admission::Dropped { reason } => format!("  not sent: {reason}"),
        };
        self.console.styled_line(Style::Attention, &said);
    }

    /// Shows the first waiting question, if any: the running call's line stops counting and
    /// the question stands on lines of its own until a key answers it.
    fn next_question(&self, questions: &VecDeque<ApprovalRequest>) {
        let Some(request) = questions.front() else {
            return;
        };
        let console = self.console;
        console.pause_for_approval();
        show_request(console, request);
        console.styled_line(
            Style::Attention,
            "  allow? press y (once), a (always) or n (deny)",
        );
    }

    fn decide(&self, request: &ApprovalRequest, decision: ApprovalDecision) {
        let console = self.console;
        match self.approvals.resolve(&request.id, decision, "chat") {
            Ok(()) => {
                let style = if decision == ApprovalDecision::Deny {
                    Style::Bad
                } else {
                    Style::Good
                };
                console.styled_line(style, &format!("  {}", decision.as_str()));
            }
            Err(error) => console.line(&format!("  {error}")),
        }
        console.resume_after_approval();
    }

    fn show_outcome(&self, result: Result<Option<TurnOutcome>, AgentError>) {
        let console = self.console;
        match result {
            Ok(Some(outcome)) => {
                if outcome.end == TurnEnd::Answered && !console.streamed() {
                    console.line(&outcome.text);
                }
                // No answer text is said, never left as silence.
                if outcome.end == TurnEnd::NoAnswer {
                    console.styled_line(Style::Attention, &format!("  note: {}", outcome.text));
                }
                console.end_turn(
                    &outcome.answered_by,
                    outcome.usage,
                    self.sessions.usage(self.key),
                );
            }
            Ok(None) => console.break_line(),
            Err(AgentError::Interrupted) => console.interrupted(),
            Err(AgentError::Dropped(reason)) => {
                console.styled_line(Style::Attention, &format!("  dropped: {reason}"))
            }
            Err(error) => console.error(&error.to_string()),
        }
    }
}

/// The next key typed during a turn; never without a terminal.
async fn next_key(keys: &mut Option<TurnKeys>) -> Key {
    match keys {
        Some(keys) => keys.next().await,
        None => std::future::pending().await,
    }
}

/// The lines that describe `request`: what would run, and why it asks.
fn show_request(console: &Console, request: &ApprovalRequest) {
    for (number, line) in request.describe().lines().enumerate() {
        if number == 0 {
            console.styled_line(Style::Attention, &format!("  approval needed: {line}"));
        } else {
            console.line(&format!("    {}", line.trim_start()));
        }
    }
    for reason in &request.reasons {
        console.line(&format!("    (why: {reason})"));
    }
}

/// Shows `request` and asks for a decision as a line (standard input is no terminal): `y`
/// once, `a` always, `n` (or Ctrl-C, or the end of the input) deny.
async fn answer_inline(
    prompt: &mut Prompt,
    console: &Arc<Console>,
    approvals: &ApprovalBroker,
    request: &ApprovalRequest,
) -> Result<(), Failure> {
    console.pause_for_approval();
    show_request(console, request);
    let decision = crate::prompt::ask_decision(prompt).await?;
    match approvals.resolve(&request.id, decision, "chat") {
        Ok(()) => outln!("  {}", decision.as_str()),
        Err(error) => outln!("  {error}"),
    }
    console.resume_after_approval();
    Ok(())
}
