//! The ReAct loop: send the history to the model; if it asks for tools, run them through the
//! [`ToolRegistry`] and send the results back; repeat until it answers in text. Three guards end a
//! turn that is going nowhere: a cap on model calls per turn, detection of the same tool called
//! with the same arguments several times in a row, and the provider's own errors. A tool's
//! failure is not a guard: it goes back to the model as an error result (`is_error: true`), and
//! the model decides what to do next. A turn run with [`Steering`] takes in messages that arrive
//! while it runs, at safe points: before each tool call (the calls of that reply not yet started
//! are skipped, each with a result saying why) and before the next model call. An agent given a
//! [`ContextPolicy`] keeps every request inside the model's context window: before each model
//! call it estimates the request, compacts the history once it passes the threshold, cuts a
//! single oversized tool result for the request, and refuses with a clear message what still
//! does not fit; a provider that refuses a request as too long gets exactly one compaction and
//! one retry. A model call refused because a token budget is spent ([`crate::budget::Metered`])
//! ends the turn with [`AgentError::Budget`]. A reply cut at the output-token limit never has
//! its tool calls run: each is answered with [`CUT_AT_OUTPUT_LIMIT`] and the model is asked again;
//! the stored message is marked [`Cut::MaxTokens`]. A last reply without answer text (the model
//! only reasoned, or said nothing) ends the turn with [`TurnEnd::NoAnswer`], never as a success. It
//! is one file (over 700 lines) because it is one loop: the guards, steering, context keeping,
//! budgets and cut replies all act at points inside the same turn, on its one history.

use std::sync::Arc;

use clawcage_core::{ChatMessage, ContentBlock, Cut, Role, ToolCall, ToolError, Usage};

use crate::ToolRegistry;
use crate::audit::{AuditLog, AuditedRegistry};
use crate::compaction::{
    Compaction, CompactionReason, Journaled, SUMMARY_SYSTEM_PROMPT, TurnJournal, apply_compaction,
    bounded_summary, find_cut, messages_tokens, summary_request,
};
use crate::context::{
    BYTES_PER_TOKEN, ContextPolicy, TokenEstimator, raw_request_tokens, trim_oversized_results,
};
use crate::provider::{ChatRequest, NoEvents, Provider, ProviderError, ProviderEvents, StopReason};
use crate::session::current_session_key;
use crate::transcript::push_message;

tokio::task_local! {
    /// The id of the model's tool call running in the current task.
    static CURRENT_TOOL_CALL: String;
}

/// The id of the model's tool call the current task runs (`toolu_…`), if any: an approval the
/// call asks for names it, so a front end can show the question on the call.
pub fn current_tool_call_id() -> Option<String> {
    CURRENT_TOOL_CALL.try_with(Clone::clone).ok()
}
use clawcage_core::redact::Redactor;

/// The system prompt used when the configuration gives none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are clawcage, a careful assistant that works on the files of one workspace through tools. \
Every tool runs in a sandbox that can reach only the workspace; a refused action is refused by design, so explain it rather than trying to get around it. \
Use tools when they help, and answer briefly when you are done.";

/// How a loop behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The system prompt.
    pub system_prompt: String,
    /// Model calls per turn at most (10 for a main agent).
    pub max_iterations: usize,
    /// The same tool with the same arguments this many times in a row ends the turn.
    pub repeat_limit: usize,
    /// Ask the provider to stream text.
    pub stream: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_string(),
            max_iterations: 10,
            repeat_limit: 3,
            stream: false,
        }
    }
}

/// What became of one tool call, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It ran and succeeded.
    Ok,
    /// The sandbox or policy refused it.
    Denied(String),
    /// It ran and failed (including traps and timeouts).
    Failed(String),
    /// Its arguments or name were wrong; it did not run.
    Invalid(String),
    /// The loop did not run it (iteration cap, repeated call).
    NotRun(String),
}

impl Verdict {
    /// `ok`, `denied`, `failed`, `invalid` or `not run`.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Denied(_) => "denied",
            Verdict::Failed(_) => "failed",
            Verdict::Invalid(_) => "invalid",
            Verdict::NotRun(_) => "not run",
        }
    }

    /// Why, for every verdict but `ok`.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::Denied(why)
            | Verdict::Failed(why)
            | Verdict::Invalid(why)
            | Verdict::NotRun(why) => Some(why),
        }
    }
}

/// What happens during a turn, for front ends. Every method has an empty default.
pub trait TurnObserver: ProviderEvents {
    /// A tool call is about to run.
    fn tool_started(&self, _call: &ToolCall) {}
    /// A tool call ended; `output` is what the model is told.
    fn tool_finished(&self, _call: &ToolCall, _verdict: &Verdict, _output: &str) {}
    /// Something the operator should know (a repaired tool call, a stop).
    fn note(&self, _text: &str) {}
    /// The history was compacted: older messages replaced by a summary. By default a note
    /// (so every front end that shows notes shows it).
    fn compacted(&self, compaction: &Compaction) {
        self.note(&compaction.describe());
    }
}

impl TurnObserver for NoEvents {}

/// Messages that arrive for a turn while it runs (the lanes' `steer` queue mode).
pub trait Steering: Send + Sync {
    /// The text of the messages that arrived since the last call, taken out so each enters the
    /// turn once; `None` when none did.
    fn take(&self) -> Option<String>;
}

/// No message ever arrives.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSteering;

impl Steering for NoSteering {
    fn take(&self) -> Option<String> {
        None
    }
}

/// The result of a tool call skipped because a message arrived.
pub const SKIPPED_FOR_NEW_MESSAGE: &str = "not run: skipped because a new message from the user arrived before this call started; the message follows these results, so decide again with it in mind";

/// The result of a tool call from a reply the model did not finish: the provider stopped it at
/// the output-token limit, so the call's arguments may be cut (a server may even re-serialise a
/// cut call into complete-looking JSON), and the call is never run.
pub const CUT_AT_OUTPUT_LIMIT: &str = "not run: your reply was cut at the output-token limit (max_tokens) before it ended, so this call's arguments may be incomplete. Call it again with shorter arguments (write a long file in parts), or ask the operator to raise [provider] max_tokens";

/// Ends a compaction summary the model stopped at its output-token limit.
pub const SUMMARY_CUT_NOTE: &str = "\n[the summary was cut at the model's output-token limit ([provider] max_tokens): it may end mid-sentence]";

/// Why a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered.
    Answered,
    /// The model was still calling tools when the iteration cap was reached.
    IterationLimit,
    /// The same call was repeated until the repeat limit.
    LoopDetected {
        /// The tool called over and over.
        tool: String,
    },
    /// The model's last reply had no answer text and no tool calls (reasoning only, or
    /// nothing at all); the outcome's text says so. Not a success: `clawcage run` exits 1.
    NoAnswer,
}

/// The result of one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The model's final text, or the explanation of why the turn was stopped.
    pub text: String,
    /// Why the turn ended.
    pub end: TurnEnd,
    /// Tokens used by this turn.
    pub usage: Usage,
    /// Model calls made.
    pub iterations: usize,
    /// `provider/model` of the last answer.
    pub answered_by: String,
}

/// Why a turn could not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The provider (and every fail-over) failed.
    #[error(transparent)]
    Provider(ProviderError),
    /// The history does not end with something the model can answer.
    #[error("{0}")]
    History(String),
    /// The session's lane stopped (the runtime is shutting down).
    #[error("the session stopped before the turn finished")]
    LaneClosed,
    /// The operator interrupted the turn; what it did so far is kept in the history.
    #[error("the turn was interrupted; what it did so far is kept")]
    Interrupted,
    /// The message never ran: the session's queue refused or dropped it (queue cap, a newer
    /// message in `interrupt` mode).
    #[error("{0}")]
    Dropped(crate::session::DropReason),
    /// The request does not fit the model's context window, even after compacting.
    #[error("{0}")]
    ContextFull(String),
    /// A token budget is spent.
    #[error("{0}")]
    Budget(String),
    /// A step of the turn could not be recorded, so the turn stopped before doing more.
    #[error(
        "a step of the turn could not be recorded ({0}); the turn stopped so that nothing runs that a restart would not know of"
    )]
    Journal(String),
    /// The transcript could not be written.
    #[error("cannot write the transcript {path}: {message}; {remedy}")]
    Transcript {
        /// The file, or the stream's subject.
        path: String,
        /// What the store said.
        message: String,
        /// What to look at.
        remedy: &'static str,
    },
}

impl From<ProviderError> for AgentError {
    /// A refusal for a spent budget ends the turn as a budget error; every other provider
    /// failure stays one.
    fn from(error: ProviderError) -> Self {
        match error {
            ProviderError::Budget(message) => AgentError::Budget(message),
            other => AgentError::Provider(other),
        }
    }
}

/// An agent: a provider, the tools it may call, and how it behaves.
#[derive(Debug, Clone)]
pub struct AgentLoop {
    provider: Arc<dyn Provider>,
    tools: ToolRegistry,
    config: AgentConfig,
    /// The same tools as every call goes through them: recorded in the audit log when one is
    /// configured, results scrubbed of the host's secrets.
    audited: AuditedRegistry,
    /// How requests are kept inside the model's window (`None`: they are sent as they are).
    context: Option<Arc<ContextState>>,
}

/// An agent's context policy and what it learned about the model's tokens.
#[derive(Debug)]
struct ContextState {
    /// The policy, its window replaced by what the model's server reports once it was asked.
    policy: std::sync::RwLock<ContextPolicy>,
    /// Set once the models' servers were asked for their windows.
    servers_asked: tokio::sync::OnceCell<()>,
    estimator: TokenEstimator,
    /// The size of the tool definitions as JSON.
    tools_bytes: usize,
}

impl ContextState {
    /// The policy as it stands.
    fn policy(&self) -> ContextPolicy {
        self.policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_policy(&self, policy: ContextPolicy) {
        *self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// Ask the models' servers for their windows, the first time only (each server is asked
    /// once per process and at most a short while; one that does not say changes nothing).
    async fn ask_servers(&self) {
        if !self.policy().asks_servers() {
            return;
        }
        self.servers_asked
            .get_or_init(|| async {
                let asked = self.policy().with_server_windows().await;
                self.set_policy(asked);
            })
            .await;
    }
}

impl AgentLoop {
    /// An agent that asks `provider` and may call `tools`.
    pub fn new(provider: Arc<dyn Provider>, tools: ToolRegistry, config: AgentConfig) -> Self {
        Self {
            audited: AuditedRegistry::new(tools.clone(), None),
            provider,
            tools,
            config,
            context: None,
        }
    }

    /// This agent keeping every request inside the window `policy` describes: compaction at
    /// its threshold, oversized tool results cut, the fit check before each model call, and
    /// one compaction and retry when the provider still finds a request too long.
    pub fn with_context(mut self, policy: ContextPolicy) -> Self {
        let tools_bytes =
            serde_json::to_string(&self.tools.anthropic_definitions()).map_or(0, |text| text.len());
        self.context = Some(Arc::new(ContextState {
            policy: std::sync::RwLock::new(policy),
            servers_asked: tokio::sync::OnceCell::new(),
            estimator: TokenEstimator::new(),
            tools_bytes,
        }));
        self
    }

    /// The context policy as it stands (its window from the model's server once a model call
    /// asked), when one is set.
    pub fn context_policy(&self) -> Option<ContextPolicy> {
        self.context.as_ref().map(|context| context.policy())
    }

    /// The estimated prompt tokens of a request on `history` (system prompt and tools
    /// included, oversized tool results counted as cut); `None` without a context policy.
    pub fn estimate(&self, history: &[ChatMessage]) -> Option<u64> {
        let context = self.context.as_ref()?;
        let view = trim_oversized_results(history, self.max_result_chars(context));
        Some(
            context
                .estimator
                .request(&self.config.system_prompt, context.tools_bytes, &view),
        )
    }

    /// The uncorrected tokens of a request on `history` as it will be sent (results cut).
    fn raw_request(&self, context: &ContextState, history: &[ChatMessage]) -> u64 {
        let view = trim_oversized_results(history, self.max_result_chars(context));
        raw_request_tokens(&self.config.system_prompt, context.tools_bytes, &view)
    }

    /// The most characters of one tool result a request carries. Not corrected by the
    /// estimator: a cut that moved with each calibration would change the history's prefix
    /// and miss the provider's prompt cache.
    fn max_result_chars(&self, context: &ContextState) -> usize {
        (context.policy().max_tool_result() * BYTES_PER_TOKEN) as usize
    }

    /// Compact `history` now (`/compact`): the older messages are summarised by the model and
    /// about the newest half, at most what a compaction at the threshold keeps, stays as it
    /// is. `Ok(None)` when there is nothing to compact; a turn's journal gets the record.
    pub async fn compact(
        &self,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        journal: &mut dyn TurnJournal,
    ) -> Result<Option<Compaction>, AgentError> {
        let Some(context) = self.context.clone() else {
            return Err(AgentError::History(
                "this agent has no context window to keep to (the scripted provider has none), so there is nothing to compact".to_string(),
            ));
        };
        context.ask_servers().await;
        let total = messages_tokens(history, &context.estimator);
        let keep = context.policy().keep_recent().min(total / 2);
        self.compact_with(
            &context,
            history,
            observer,
            journal,
            CompactionReason::Requested,
            keep,
        )
        .await
    }

    async fn compact_with(
        &self,
        context: &ContextState,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        journal: &mut dyn TurnJournal,
        reason: CompactionReason,
        keep: u64,
    ) -> Result<Option<Compaction>, AgentError> {
        let Some(cut) = find_cut(history, &context.estimator, keep) else {
            return Ok(None);
        };
        let tokens_before = self.estimate(history).unwrap_or(0);
        let policy = context.policy();
        let room = policy
            .prompt_room()
            .saturating_sub(context.estimator.correct(raw_request_tokens(
                SUMMARY_SYSTEM_PROMPT,
                0,
                &[],
            )))
            .saturating_sub(policy.max_summary());
        let older = trim_oversized_results(&history[..cut], self.max_result_chars(context));
        let request_message = summary_request(&older, &context.estimator, room);
        let no_tools = ToolRegistry::new();
        let summary_prompt = context.estimator.correct(raw_request_tokens(
            SUMMARY_SYSTEM_PROMPT,
            0,
            std::slice::from_ref(&request_message),
        ));
        let request = ChatRequest {
            system: SUMMARY_SYSTEM_PROMPT,
            messages: std::slice::from_ref(&request_message),
            tools: &no_tools,
            stream: false,
            max_tokens: Some(output_tokens(policy.reply_budget(summary_prompt))),
        };
        let response = self.provider.complete(request, &NoEvents).await?;
        let text = ChatMessage {
            role: Role::Assistant,
            cut: None,
            content: response.content,
        }
        .text();
        if text.trim().is_empty() {
            return Err(AgentError::Provider(ProviderError::Protocol {
                provider: response.answered_by,
                message: "the model answered the summary request with no text".to_string(),
            }));
        }
        let mut summary = bounded_summary(&text, &policy);
        if response.stop_reason == StopReason::MaxTokens {
            // The model did not finish it: the summary says so, to the model and the person.
            summary.push_str(SUMMARY_CUT_NOTE);
        }
        let kept = history.len() - cut;
        apply_compaction(history, cut, &summary);
        let compaction = Compaction {
            reason,
            summary,
            summarised: cut,
            kept,
            tokens_before,
            tokens_after: self.estimate(history).unwrap_or(0),
            usage: response.usage,
        };
        observer.compacted(&compaction);
        journal.record(Journaled::Used(compaction.usage));
        journal.record(Journaled::Compacted(compaction.clone()));
        Ok(Some(compaction))
    }

    /// Before a model call whose request is estimated at `estimate` tokens: compact at the
    /// threshold (unless that already proved futile this turn), then check that the request
    /// fits the window. Returns whether the history changed.
    #[allow(
        clippy::too_many_arguments,
        reason = "one model call's state, passed from the one place that calls it"
    )]
    async fn fit(
        &self,
        context: &ContextState,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        journal: &mut dyn TurnJournal,
        usage: &mut Usage,
        futile: &mut bool,
        mut estimate: u64,
    ) -> Result<bool, AgentError> {
        let policy = &context.policy();
        let mut changed = false;
        if estimate > policy.compact_at() && !*futile {
            let keep = policy.keep_recent();
            match self
                .compact_with(
                    context,
                    history,
                    observer,
                    journal,
                    CompactionReason::Threshold,
                    keep,
                )
                .await
            {
                Ok(Some(compaction)) => {
                    usage.add(compaction.usage);
                    *futile = compaction.tokens_after > policy.compact_at();
                    estimate = compaction.tokens_after;
                    changed = true;
                }
                Ok(None) => *futile = true,
                Err(error) => {
                    observer.note(&format!("the history could not be compacted: {error}"));
                    *futile = true;
                }
            }
        }
        if estimate > policy.prompt_room() {
            return Err(AgentError::ContextFull(format!(
                "the conversation needs about {estimate} tokens, more than the {} that {}'s {}-token context window ({}) leaves beside the reply; nothing older is left to compact. Send a shorter message, /reset the session, or set [models.\"MODEL\"] context_window if the model's window is larger",
                policy.prompt_room(),
                self.provider.label(),
                policy.window,
                policy.window_source.describe()
            )));
        }
        Ok(changed)
    }

    /// This agent with every tool call recorded in `log` under the session whose turn makes it
    /// (`None`: not recorded).
    pub fn with_audit(mut self, log: Option<Arc<AuditLog>>) -> Self {
        let redactor = self.audited.redactor().clone();
        self.audited = AuditedRegistry::new(self.tools.clone(), log).with_redactor(redactor);
        self
    }

    /// This agent with every tool result and error scrubbed of the values `redactor` knows (the
    /// host's secrets) before the model, the transcript or a front end sees it.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.audited = self.audited.with_redactor(redactor);
        self
    }

    /// The redactor tool results pass through.
    pub fn redactor(&self) -> &Redactor {
        self.audited.redactor()
    }

    /// The tools this agent may call.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Run one turn on `history`, whose last message is the user's. The model's messages and the
    /// tool results are appended to `history` as they happen, so a failed turn keeps what it did.
    pub async fn run_turn(
        &self,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
    ) -> Result<TurnOutcome, AgentError> {
        self.run_turn_steered(history, observer, &NoSteering).await
    }

    /// [`AgentLoop::run_turn`], taking in what `steering` has at each safe point: before a tool
    /// call starts (that call and the later ones of the same reply are skipped, each answered
    /// with [`SKIPPED_FOR_NEW_MESSAGE`]) and before the next model call; the text joins the tool
    /// results as the user's. Nothing is taken when no model call would follow (the model has
    /// answered, or the turn is stopping), so a message never goes unanswered in a turn.
    pub async fn run_turn_steered(
        &self,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        steering: &dyn Steering,
    ) -> Result<TurnOutcome, AgentError> {
        self.run_turn_journaled(history, observer, steering, &mut Vec::<Journaled>::new())
            .await
    }

    /// [`AgentLoop::run_turn_steered`], recording in `journal` every message appended and every
    /// compaction, in order (what a transcript writes).
    pub async fn run_turn_journaled(
        &self,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        steering: &dyn Steering,
        journal: &mut dyn TurnJournal,
    ) -> Result<TurnOutcome, AgentError> {
        match history.last() {
            Some(message) if message.role == Role::User => {}
            _ => {
                return Err(AgentError::History(
                    "a turn needs a user message at the end of the history".to_string(),
                ));
            }
        }
        let mut usage = Usage::default();
        let mut repeats = RepeatTracker::new(self.config.repeat_limit);
        // Calls the operator denied in this turn: at the repeat limit the turn stops, so a model
        // cannot keep asking a person the same thing in other words.
        let mut operator_denials = 0usize;
        let mut nagged = false;
        let max_iterations = self.config.max_iterations.max(1);
        let mut futile = false;
        for iteration in 1..=max_iterations {
            if let Some(why) = journal.failure() {
                return Err(AgentError::Journal(why));
            }
            let response = self
                .complete(history, observer, journal, &mut usage, &mut futile)
                .await?;
            usage.add(response.usage);
            journal.record(Journaled::Used(response.usage));
            for repair in &response.repairs {
                observer.note(&format!("repaired a tool call's arguments ({repair})"));
            }
            // A reply stopped at the output-token limit is unfinished: its tool calls are not
            // run, a text answer is said to be cut, and the stored message is marked.
            let cut = response.stop_reason == StopReason::MaxTokens;
            let assistant = ChatMessage {
                role: Role::Assistant,
                cut: cut.then_some(Cut::MaxTokens),
                content: response.content,
            };
            let calls: Vec<ToolCall> = assistant
                .tool_uses()
                .map(|(id, name, input)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: input.clone(),
                })
                .collect();
            let text = assistant.text();
            let reasoned = assistant.has_reasoning();
            // A reply with nothing in it is not kept: sent back it would be an assistant
            // message without content. Reasoning alone is kept (no provider sends it back).
            if !assistant.content.is_empty() {
                journal.record(Journaled::Message(assistant.clone()));
                history.push(assistant);
            }
            if calls.is_empty() && text.trim().is_empty() {
                return Ok(TurnOutcome {
                    text: no_answer(reasoned, cut),
                    end: TurnEnd::NoAnswer,
                    usage,
                    iterations: iteration,
                    answered_by: response.answered_by,
                });
            }
            if calls.is_empty() {
                if cut {
                    observer.note(
                        "the model's reply was cut at its output-token limit ([provider] max_tokens): it may end mid-sentence",
                    );
                }
                return Ok(TurnOutcome {
                    text,
                    end: TurnEnd::Answered,
                    usage,
                    iterations: iteration,
                    answered_by: response.answered_by,
                });
            }

            let last_iteration = iteration == max_iterations;
            let mut stop: Option<TurnEnd> = None;
            let mut arrived: Option<String> = None;
            let mut skipped = 0;
            for call in &calls {
                let malformed = response
                    .malformed
                    .iter()
                    .find(|problem| problem.tool_use_id == call.id);
                if arrived.is_none() && stop.is_none() && !last_iteration {
                    arrived = steering.take();
                }
                let verdict_and_output = if arrived.is_some() && stop.is_none() {
                    skipped += 1;
                    (
                        Verdict::NotRun(SKIPPED_FOR_NEW_MESSAGE.to_string()),
                        SKIPPED_FOR_NEW_MESSAGE.to_string(),
                    )
                } else if stop.is_some() || last_iteration {
                    let why = if last_iteration {
                        format!(
                            "not run: the turn reached its limit of {max_iterations} model calls"
                        )
                    } else {
                        "not run: the turn was stopped before this call".to_string()
                    };
                    (Verdict::NotRun(why.clone()), why)
                } else if cut {
                    (
                        Verdict::NotRun(CUT_AT_OUTPUT_LIMIT.to_string()),
                        CUT_AT_OUTPUT_LIMIT.to_string(),
                    )
                } else if let Some(problem) = malformed {
                    (
                        Verdict::Invalid(problem.message.clone()),
                        problem.message.clone(),
                    )
                } else if repeats.record(call) {
                    let why = format!(
                        "not run: `{}` was called with the same arguments {} times in a row; the turn is stopped so it does not loop. Try something different.",
                        call.name, self.config.repeat_limit
                    );
                    stop = Some(TurnEnd::LoopDetected {
                        tool: call.name.clone(),
                    });
                    (Verdict::NotRun(why.clone()), why)
                } else {
                    journal.record(Journaled::ToolStarted {
                        tool_use_id: call.id.clone(),
                    });
                    // Not run unless its start is recorded: a turn resumed after a crash must
                    // know every call that may have had an effect.
                    if let Some(why) = journal.failure() {
                        return Err(AgentError::Journal(why));
                    }
                    observer.tool_started(call);
                    let session = current_session_key().unwrap_or_else(|| "agent".into());
                    let result = CURRENT_TOOL_CALL
                        .scope(
                            call.id.clone(),
                            self.audited
                                .execute_value(&session, &call.name, &call.arguments),
                        )
                        .await;
                    match result {
                        Ok(output) => (Verdict::Ok, output.text),
                        Err(error) => {
                            if error.kind() == "denied"
                                && error.message().contains("by the operator")
                            {
                                operator_denials += 1;
                                if operator_denials >= self.config.repeat_limit && stop.is_none() {
                                    nagged = true;
                                    stop = Some(TurnEnd::LoopDetected {
                                        tool: call.name.clone(),
                                    });
                                }
                            }
                            (verdict_of(&error), error.to_string())
                        }
                    }
                };
                let (verdict, output) = verdict_and_output;
                observer.tool_finished(call, &verdict, &output);
                // Each result joins the history (and the journal) as soon as it is known, so
                // a turn stopped or killed part-way keeps the results it has.
                let result = ContentBlock::ToolResult {
                    tool_use_id: call.id.clone(),
                    content: output,
                    is_error: verdict != Verdict::Ok,
                };
                journal.record(Journaled::ToolResult(result.clone()));
                push_message(
                    history,
                    ChatMessage {
                        role: Role::User,
                        cut: None,
                        content: vec![result],
                    },
                );
            }

            let end = match stop {
                Some(end) => end,
                None if last_iteration => TurnEnd::IterationLimit,
                None => {
                    if let Some(text) = arrived.or_else(|| steering.take()) {
                        observer.note(&if skipped > 0 {
                            format!(
                                "a new message arrived: {skipped} tool call(s) skipped, the model sees it next"
                            )
                        } else {
                            "a new message arrived: the model sees it next".to_string()
                        });
                        let message = ChatMessage::user(text);
                        journal.record(Journaled::Message(message.clone()));
                        push_message(history, message);
                    }
                    continue;
                }
            };
            let explanation = match &end {
                TurnEnd::LoopDetected { tool } if nagged => format!(
                    "Stopped: the operator denied {operator_denials} `{tool}` calls in this turn, so the turn was ended instead of asking again. Say what you want done differently."
                ),
                TurnEnd::LoopDetected { tool } => format!(
                    "Stopped: the model called `{tool}` with the same arguments {} times in a row, so the turn was ended to avoid a loop. Rephrase the request or ask for a different approach.",
                    self.config.repeat_limit
                ),
                _ => format!(
                    "Stopped: the model was still calling tools after {max_iterations} model calls, the limit for one turn. Send a follow-up to continue, or raise [agent] max_iterations."
                ),
            };
            observer.note(&explanation);
            return Ok(TurnOutcome {
                text: explanation,
                end,
                usage,
                iterations: iteration,
                answered_by: response.answered_by,
            });
        }
        // The loop returns on its last iteration at the latest.
        Err(AgentError::History(
            "the turn ended without an answer".to_string(),
        ))
    }
}

impl AgentLoop {
    /// One model call on `history`: fitted to the window first when there is a context
    /// policy; a refusal as too long gets one compaction and one retry, never more.
    async fn complete(
        &self,
        history: &mut Vec<ChatMessage>,
        observer: &dyn TurnObserver,
        journal: &mut dyn TurnJournal,
        usage: &mut Usage,
        futile: &mut bool,
    ) -> Result<crate::provider::ChatResponse, AgentError> {
        let Some(context) = self.context.clone() else {
            let request = ChatRequest {
                system: &self.config.system_prompt,
                messages: history,
                tools: &self.tools,
                stream: self.config.stream,
                max_tokens: None,
            };
            return Ok(self.provider.complete(request, observer).await?);
        };
        context.ask_servers().await;
        let mut retried = false;
        loop {
            // One estimate per model call: the fit check and the calibration share it.
            let mut raw = self.raw_request(&context, history);
            let estimate = context.estimator.correct(raw);
            if self
                .fit(
                    &context, history, observer, journal, usage, futile, estimate,
                )
                .await?
            {
                raw = self.raw_request(&context, history);
            }
            let result = {
                let view = trim_oversized_results(history, self.max_result_chars(&context));
                // The reply gets what the window leaves beside this prompt, at most the
                // configured max_tokens.
                let reply_budget = context
                    .policy()
                    .reply_budget(context.estimator.correct(raw));
                let request = ChatRequest {
                    system: &self.config.system_prompt,
                    messages: &view,
                    tools: &self.tools,
                    stream: self.config.stream,
                    max_tokens: Some(output_tokens(reply_budget)),
                };
                self.provider.complete(request, observer).await
            };
            let error = match result {
                Ok(response) => {
                    context
                        .estimator
                        .calibrate(raw, response.usage.input_tokens);
                    return Ok(response);
                }
                Err(error) if error.is_context_overflow() => error,
                Err(error) => return Err(error.into()),
            };
            // A server that names its window (llama.cpp) is believed over the table.
            if let Some(window) = error.server_window() {
                context.set_policy(context.policy().with_refusal_window(window));
            }
            let still = |why: &str| {
                AgentError::ContextFull(format!(
                    "{} refused the request as too long for its context window ({error}); {why}. Send a shorter message, /reset the session, or set [models.\"MODEL\"] context_window to the model's real window so clawcage compacts in time",
                    self.provider.label()
                ))
            };
            if retried {
                return Err(still("it was compacted once and is still too long"));
            }
            retried = true;
            let keep = context.policy().keep_recent() / 2;
            // Say only what happens: with nothing older to compact, no compaction is promised.
            if find_cut(history, &context.estimator, keep).is_none() {
                return Err(still("nothing older is left to compact"));
            }
            observer.note(
                "the provider found the conversation too long for its context window: compacting it and trying once more",
            );
            match self
                .compact_with(
                    &context,
                    history,
                    observer,
                    journal,
                    CompactionReason::Overflow,
                    keep,
                )
                .await
            {
                Ok(Some(compaction)) => usage.add(compaction.usage),
                Ok(None) => return Err(still("nothing older is left to compact")),
                Err(compact_error) => {
                    return Err(still(&format!("compacting it failed: {compact_error}")));
                }
            }
            // The retry must not compact again at the threshold: it gets exactly one.
            *futile = true;
        }
    }
}

/// Why a turn whose last reply had no answer text and no tool calls ended, and what to do.
fn no_answer(reasoned: bool, cut: bool) -> String {
    match (reasoned, cut) {
        (true, true) => "the model returned no answer text (only reasoning): it spent its output-token limit reasoning; raise [provider] max_tokens (or the model's context window) so it has room to answer, or ask for something shorter".to_string(),
        (true, false) => "the model returned no answer text (only reasoning); raise [provider] max_tokens if the server stopped it early, or ask again".to_string(),
        (false, true) => "the model returned no answer text: its reply was empty when the output-token limit stopped it; raise [provider] max_tokens".to_string(),
        (false, false) => "the model returned no answer text (an empty reply without tool calls); ask again, or check the model server".to_string(),
    }
}

/// A reply budget as the wire's `max_tokens`.
fn output_tokens(budget: u64) -> u32 {
    u32::try_from(budget).unwrap_or(u32::MAX)
}

fn verdict_of(error: &ToolError) -> Verdict {
    match error {
        ToolError::InvalidArgs(why) => Verdict::Invalid(why.clone()),
        ToolError::Denied(why) => Verdict::Denied(why.clone()),
        ToolError::Failed(why) => Verdict::Failed(why.clone()),
    }
}

/// Counts identical consecutive calls.
struct RepeatTracker {
    limit: usize,
    last: Option<(String, String)>,
    count: usize,
}

impl RepeatTracker {
    fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(2),
            last: None,
            count: 0,
        }
    }

    /// Record `call`; true when it makes `limit` identical calls in a row.
    fn record(&mut self, call: &ToolCall) -> bool {
        // serde_json's map keeps keys sorted, so equal objects print equally.
        let key = (call.name.clone(), call.arguments.to_string());
        if self.last.as_ref() == Some(&key) {
            self.count += 1;
        } else {
            self.last = Some(key);
            self.count = 1;
        }
        self.count >= self.limit
    }
}
