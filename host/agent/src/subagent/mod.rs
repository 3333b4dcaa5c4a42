//! Sub-agents: an agent hands a task to a child agent that runs in the background with its own
//! loop, no history and fewer capabilities, and hears back when the child is done. The
//! [`SubagentManager`] owns the children: it derives each child's registry from the tools the
//! host prepared for children (narrowed by the host, e.g. read-only) minus the excluded tools, so
//! a child can only ever have less than its parent; it enforces the depth, concurrency and time
//! limits; it pushes each child's result, with its stats, onto the bus's `system` channel for the
//! parent's session; and it keeps a record of every run in the state directory, so that runs cut
//! off by a restart are reported as interrupted. The `spawn` and `subagents` tools are its face
//! to the model.
//!
//! Here: the manager (over 700 lines: spawning, running, stopping, announcing and recovering all
//! work on its one state); `records` the run records and their file; `tools` `spawn` and
//! `subagents`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use clawcage_core::sync::lock;
use clawcage_core::{BoxFuture, ChatMessage, InboundMessage, Tool};
use serde_json::Value;

use crate::agent_loop::{AgentConfig, AgentLoop, TurnEnd};
use crate::audit::AuditLog;
use crate::budget::{Budget, budget_account, charged_to};
use crate::bus::MessageBus;
use crate::provider::{NoEvents, Provider};
use crate::registry::ToolRegistry;
use crate::session::{current_session_key, with_session_key};
use crate::transcript::now_ms;

mod records;
mod tools;

pub use records::{SubagentRecord, SubagentStatus};
use records::{load_records, lock_records_file, process_alive, save_records};
use tools::{SpawnTool, SubagentsTool};

/// The bus channel completions are published on.
pub const SYSTEM_CHANNEL: &str = "system";

/// Tools a child never gets unless the configuration says otherwise. `spawn` is governed by the
/// depth limit instead: a child gets it only while it may still spawn.
pub const DEFAULT_EXCLUDED: &[&str] = &["spawn", "subagents", "message", "edit_file", "cron"];

/// The longest result text kept in a run record and announced to the parent, in characters.
pub const MAX_RESULT_CHARS: usize = 20_000;

/// How sub-agents are limited.
#[derive(Debug, Clone)]
pub struct SubagentConfig {
    /// How deep spawning may go: 1 lets the main agent spawn children that cannot spawn.
    pub max_depth: u32,
    /// Children running at once, across all sessions.
    pub max_concurrent: usize,
    /// Wall-clock time a child may run.
    pub timeout: Duration,
    /// Model calls a child may make.
    pub max_iterations: usize,
    /// Tools children never get (besides `spawn`, which follows `max_depth`).
    pub excluded_tools: Vec<String>,
    /// Finished run records older than this are dropped.
    pub retention: Duration,
}

impl Default for SubagentConfig {
    fn default() -> Self {
        Self {
            max_depth: 1,
            max_concurrent: 5,
            timeout: Duration::from_secs(300),
            max_iterations: 15,
            excluded_tools: DEFAULT_EXCLUDED.iter().map(ToString::to_string).collect(),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Why a spawn was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    /// The depth limit.
    #[error(
        "depth limit: sub-agents may be nested {max} level(s) deep and this one would be at level {depth}; do the work yourself or split it differently"
    )]
    Depth {
        /// The level the child would have.
        depth: u32,
        /// The configured maximum.
        max: u32,
    },
    /// The concurrency limit.
    #[error(
        "concurrency limit: {running} sub-agents are already running (at most {max} at once); wait for one's result to be announced, or stop one with the `subagents` tool"
    )]
    Concurrency {
        /// Running now.
        running: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The runtime has not chosen a provider yet.
    #[error("sub-agents are not ready: the runtime has no model provider yet")]
    NoProvider,
    /// No session to announce the result to.
    #[error("spawn works only inside an agent session, whose lane receives the result")]
    NoSession,
}

/// What `spawn` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawned {
    /// The child's id.
    pub id: String,
    /// Children running now, this one included.
    pub running: usize,
}

#[derive(Default)]
struct State {
    records: BTreeMap<u64, SubagentRecord>,
    running: BTreeMap<String, tokio::task::AbortHandle>,
    next_number: u64,
}

/// Everything a [`SubagentManager`] works with, given whole when it is made.
pub struct SubagentSetup {
    /// The host's registry prepared for children (e.g. with the workspace read-only).
    pub child_tools: ToolRegistry,
    /// The limits.
    pub config: SubagentConfig,
    /// Where results are announced (the `system` channel).
    pub bus: MessageBus,
    /// Where run records are kept (`state_dir/subagents/runs.json`); `None`: in memory only.
    pub state_dir: Option<PathBuf>,
    /// The provider children ask (the parent's); `None` refuses every spawn (a catalog's
    /// manager, made only to describe the tools).
    pub provider: Option<Arc<dyn Provider>>,
    /// Where the children's tool calls are recorded, if anywhere.
    pub audit: Option<Arc<AuditLog>>,
    /// Scrubs children's tool results of the host's secrets, as the parent's are.
    pub redactor: clawcage_core::redact::Redactor,
    /// Keeps the children's requests inside the model's window, as the parent's are.
    pub context: Option<crate::context::ContextPolicy>,
    /// The token budgets external children's reported usage counts against (children of the
    /// default runtime are held to them by the provider they share with their parent).
    pub budget: Option<Arc<Budget>>,
    /// Where `spawn` with `runtime: "acp"` hands its task, when external agents are configured.
    pub external: Option<Arc<dyn ExternalRuntime>>,
    /// Hears what external children stream, when a front end shows it.
    pub output: Option<SubagentOutput>,
    /// Asks the person at the parent's front end what an external child asks permission for.
    pub asker: Option<PermissionAsker>,
}

impl SubagentSetup {
    /// Children with `child_tools` under `config`, announcing on `bus`, with nothing else set:
    /// no provider (every spawn is refused), no records on disk, no audit, no redaction.
    pub fn new(child_tools: ToolRegistry, config: SubagentConfig, bus: MessageBus) -> Self {
        Self {
            child_tools,
            config,
            bus,
            state_dir: None,
            provider: None,
            audit: None,
            redactor: clawcage_core::redact::Redactor::default(),
            context: None,
            budget: None,
            external: None,
            output: None,
            asker: None,
        }
    }
}

/// Owns every sub-agent of one runtime.
pub struct SubagentManager {
    /// The provider children ask; `None` refuses every spawn.
    provider: Option<Arc<dyn Provider>>,
    /// Where the children's tool calls are recorded, if anywhere.
    audit: Option<Arc<AuditLog>>,
    /// Scrubs children's tool results of the host's secrets, as the parent's are.
    redactor: clawcage_core::redact::Redactor,
    /// Keeps the children's requests inside the model's window, as the parent's are.
    context: Option<crate::context::ContextPolicy>,
    child_tools: ToolRegistry,
    config: SubagentConfig,
    bus: MessageBus,
    runs_file: Option<PathBuf>,
    /// Held while the records are written, so that concurrent saves land in order and the file
    /// always ends with the latest state.
    saving: Mutex<()>,
    state: Mutex<State>,
    this: Weak<SubagentManager>,
    /// Where `spawn` with `runtime: "acp"` hands its task, when external agents are configured.
    external: Option<Arc<dyn ExternalRuntime>>,
    /// Hears what external children stream, when a front end shows it.
    output: Option<SubagentOutput>,
    /// Asks the person at the parent's front end what an external child asks permission for.
    asker: Option<PermissionAsker>,
    /// The token budgets external children's reported usage counts against.
    budget: Option<Arc<Budget>>,
}

/// A runtime outside clawcage that `spawn` can hand a task to (`runtime: "acp"`: an external
/// agent the operator configured). Implemented by the ACP crate; the agent crate only calls it.
pub trait ExternalRuntime: Send + Sync {
    /// The agents that may be named.
    fn agents(&self) -> Vec<String>;
    /// Run `run.task` on `run.agent`; resolves to its final answer or to why it failed.
    /// Dropping the future stops the agent (its process is killed and reaped).
    fn run(&self, run: ExternalRun) -> BoxFuture<'static, Result<String, String>>;
}

/// One task for an [`ExternalRuntime`].
#[derive(Clone)]
pub struct ExternalRun {
    /// The configured agent's name.
    pub agent: String,
    /// The task.
    pub task: String,
    /// The child's id (`sub-N`).
    pub id: String,
    /// The parent's session key.
    pub parent_session: String,
    /// Hears the agent's text as it streams.
    pub output: Arc<dyn Fn(&str) + Send + Sync>,
    /// Asks the person at the parent's front end, when one can be asked.
    pub ask: Option<PermissionAsker>,
    /// The budget the agent's reported usage counts against, when one is in force.
    pub budget: Option<Arc<Budget>>,
    /// The session that budget is charged to (the one that started the chain of children).
    pub account: String,
}

impl ExternalRun {
    /// Whether the agent may be asked for more work: an error naming the spent budget when not.
    pub fn check_budget(&self) -> Result<(), String> {
        match &self.budget {
            Some(budget) => budget.check(Some(&self.account)),
            None => Ok(()),
        }
    }

    /// Count `tokens` the agent reported using against the parent session's budget and the
    /// day's.
    pub fn charge(&self, tokens: u64) {
        if let Some(budget) = &self.budget {
            budget.charge(Some(&self.account), tokens);
        }
    }
}

/// Asks a person about an external child's `session/request_permission`: (parent session, the
/// request's params) to the option id chosen, `None` when nobody chose one.
pub type PermissionAsker =
    Arc<dyn Fn(&str, Value) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// Hears an external child's streamed text: (parent session, child id, text).
pub type SubagentOutput = Arc<dyn Fn(&str, &str, &str) + Send + Sync>;

impl std::fmt::Debug for SubagentManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentManager")
            .field("config", &self.config)
            .field("runs_file", &self.runs_file)
            .finish_non_exhaustive()
    }
}

fn number_of(id: &str) -> Option<u64> {
    id.strip_prefix("sub-")?.parse().ok()
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_RESULT_CHARS) {
        None => text.to_string(),
        Some((end, _)) => format!(
            "{}\n[… cut: the result had {} characters]",
            &text[..end],
            text.chars().count()
        ),
    }
}

impl SubagentManager {
    /// A manager whose children get tools from `setup.child_tools`, keeping only names
    /// `parent_tools` also has, minus `setup.config.excluded_tools`: a child can only ever have
    /// less than its parent. Runs are recorded in `state_dir/subagents/runs.json`; results go
    /// to the bus.
    pub fn new(parent_tools: &ToolRegistry, setup: SubagentSetup) -> std::io::Result<Arc<Self>> {
        let SubagentSetup {
            child_tools,
            config,
            bus,
            state_dir,
            provider,
            audit,
            redactor,
            context,
            budget,
            external,
            output,
            asker,
        } = setup;
        let not_in_parent: Vec<String> = child_tools
            .names()
            .into_iter()
            .filter(|name| !parent_tools.contains(name))
            .map(ToString::to_string)
            .collect();
        let mut excluded: Vec<&str> = not_in_parent.iter().map(String::as_str).collect();
        excluded.extend(config.excluded_tools.iter().map(String::as_str));
        excluded.push("spawn");
        let child_tools = child_tools.exclude(&excluded);

        let runs_file = state_dir.map(|dir| crate::StateDir::new(dir).subagent_runs());
        let mut state = State::default();
        if let Some(file) = &runs_file {
            for record in load_records(file)? {
                if let Some(number) = number_of(&record.id) {
                    state.next_number = state.next_number.max(number);
                    state.records.insert(number, record);
                }
            }
        }
        Ok(Arc::new_cyclic(|this| SubagentManager {
            provider,
            audit,
            redactor,
            context,
            child_tools,
            config,
            bus,
            runs_file,
            saving: Mutex::new(()),
            state: Mutex::new(state),
            this: this.clone(),
            external,
            output,
            asker,
            budget,
        }))
    }

    /// The names of the tools a manager gives the parent ([`SubagentManager::spawn_tool`] and
    /// [`SubagentManager::subagents_tool`]), known before one exists.
    pub const TOOL_NAMES: [&'static str; 2] = ["spawn", "subagents"];

    /// Start an external agent on `task` for `parent_session`, at `depth`, under the same
    /// depth, concurrency and time limits as any child; its end is announced like any
    /// child's. Returns at once.
    pub fn spawn_external(
        &self,
        parent_session: &str,
        depth: u32,
        agent: &str,
        task: &str,
        label: Option<String>,
    ) -> Result<Spawned, String> {
        let Some(external) = self.external.clone() else {
            return Err("no external agents are available here: `clawcage run` and `clawcage acp` offer the ones the operator lists under [acp] allowed_agents, each with an [acp.agents.NAME] section; use the default runtime instead".to_string());
        };
        let agents = external.agents();
        if !agents.iter().any(|known| known == agent) {
            return Err(format!(
                "unknown external agent `{agent}`; configured: {}",
                if agents.is_empty() {
                    "none".to_string()
                } else {
                    agents.join(", ")
                }
            ));
        }
        if depth > self.config.max_depth {
            return Err(SpawnError::Depth {
                depth,
                max: self.config.max_depth,
            }
            .to_string());
        }
        self.sync_with(|state| {
            if state.running.len() >= self.config.max_concurrent {
                return Err(SpawnError::Concurrency {
                    running: state.running.len(),
                    max: self.config.max_concurrent,
                }
                .to_string());
            }
            state.next_number += 1;
            let number = state.next_number;
            let id = format!("sub-{number}");
            let record = SubagentRecord::starting(
                &id,
                parent_session,
                label.or_else(|| Some(format!("acp:{agent}"))),
                task,
                depth,
            );
            state.records.insert(number, record);
            let listener = self.output.clone();
            let (parent, child) = (parent_session.to_string(), id.clone());
            let run = ExternalRun {
                agent: agent.to_string(),
                task: task.to_string(),
                id: id.clone(),
                parent_session: parent_session.to_string(),
                output: Arc::new(move |text: &str| match &listener {
                    Some(listener) => listener(&parent, &child, text),
                    None => tracing::debug!(subagent = %child, "{text}"),
                }),
                ask: self.asker.clone(),
                budget: self.budget.clone(),
                account: budget_account().unwrap_or_else(|| parent_session.to_string()),
            };
            let manager = self.this.clone();
            let timeout = self.config.timeout;
            let session_key = format!("{parent_session}/{id}");
            let handle = tokio::spawn(async move {
                let started = Instant::now();
                // A spent budget refuses the agent before it starts; what it reports using
                // while it runs is charged by the runtime that drives it.
                let outcome = match run.check_budget() {
                    Err(spent) => Ok(Err(spent)),
                    Ok(()) => {
                        tokio::time::timeout(
                            timeout,
                            with_session_key(session_key, external.run(run)),
                        )
                        .await
                    }
                };
                let (status, result) = match outcome {
                    Ok(Ok(text)) => (SubagentStatus::Completed, text),
                    Ok(Err(error)) => (SubagentStatus::Failed, error),
                    Err(_) => (
                        SubagentStatus::TimedOut,
                        format!("stopped after its time limit of {} s", timeout.as_secs_f64()),
                    ),
                };
                if let Some(manager) = manager.upgrade() {
                    manager
                        .finish(number, status, result, 1, 0, started.elapsed())
                        .await;
                }
            });
            state.running.insert(id.clone(), handle.abort_handle());
            let running = state.running.len();
            tracing::info!(subagent = %id, parent = parent_session, agent, "external sub-agent started");
            Ok(Spawned { id, running })
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SubagentConfig {
        &self.config
    }

    /// The `spawn` tool for the main agent (depth 0), announcing to the session whose turn calls
    /// it.
    pub fn spawn_tool(&self) -> Arc<dyn Tool> {
        Arc::new(SpawnTool::new(self.this.clone(), 0, None, &self.config))
    }

    /// The `subagents` tool (list, stop).
    pub fn subagents_tool(&self) -> Arc<dyn Tool> {
        Arc::new(SubagentsTool::new(self.this.clone()))
    }

    /// A sentence for the main agent's system prompt about what it may delegate.
    pub fn prompt_note(&self) -> String {
        format!(
            "You may delegate self-contained tasks to sub-agents with the `spawn` tool (up to {} at once); each runs in the background with fewer tools than you (by default: no `{}`; the workspace read-only) and its result is announced to you in a notification, which you then summarise for the user. Do not wait or poll for it.",
            self.config.max_concurrent,
            self.config.excluded_tools.join("`, `")
        )
    }

    /// Every record, oldest first.
    pub fn records(&self) -> Vec<SubagentRecord> {
        lock(&self.state).records.values().cloned().collect()
    }

    /// Children running now.
    pub fn running(&self) -> usize {
        lock(&self.state).running.len()
    }

    /// Children running now for `session` (announcements to it still to come).
    pub fn running_for(&self, session: &str) -> usize {
        let state = lock(&self.state);
        state
            .records
            .values()
            .filter(|record| {
                record.parent_session == session && state.running.contains_key(&record.id)
            })
            .count()
    }

    /// Start a child on `task` for `parent_session`, at `depth` (1 for a child of the main
    /// agent). Returns at once.
    pub fn spawn(
        &self,
        parent_session: &str,
        depth: u32,
        task: &str,
        label: Option<String>,
    ) -> Result<Spawned, SpawnError> {
        let Some(provider) = self.provider.clone() else {
            return Err(SpawnError::NoProvider);
        };
        if depth > self.config.max_depth {
            return Err(SpawnError::Depth {
                depth,
                max: self.config.max_depth,
            });
        }
        // The number is taken while the records file is locked, so two processes sharing a
        // state directory never hand out the same id.
        self.sync_with(|state| {
            self.start_child(state, provider, parent_session, depth, task, label)
        })
    }

    fn start_child(
        &self,
        state: &mut State,
        provider: Arc<dyn Provider>,
        parent_session: &str,
        depth: u32,
        task: &str,
        label: Option<String>,
    ) -> Result<Spawned, SpawnError> {
        if state.running.len() >= self.config.max_concurrent {
            return Err(SpawnError::Concurrency {
                running: state.running.len(),
                max: self.config.max_concurrent,
            });
        }
        state.next_number += 1;
        let number = state.next_number;
        let id = format!("sub-{number}");
        let record = SubagentRecord::starting(&id, parent_session, label, task, depth);
        state.records.insert(number, record.clone());

        let agent = AgentLoop::new(
            provider,
            self.registry_for(depth, parent_session),
            AgentConfig {
                system_prompt: self.child_prompt(depth),
                max_iterations: self.config.max_iterations,
                repeat_limit: AgentConfig::default().repeat_limit,
                stream: false,
            },
        )
        .with_audit(self.audit.clone())
        .with_redactor(self.redactor.clone());
        let agent = match self.context.as_ref() {
            Some(policy) => agent.with_context(policy.clone()),
            None => agent,
        };
        let manager = self.this.clone();
        let timeout = self.config.timeout;
        // The child's work counts as `parent/sub-N` (e.g. in the audit log); its tokens count
        // against the budget of the session that started the chain.
        let session_key = format!("{parent_session}/{id}");
        let account = budget_account().unwrap_or_else(|| parent_session.to_string());
        let task_text = task.to_string();
        // The lock is held until the handle is stored, so the child cannot finish first.
        let handle = tokio::spawn(async move {
            let started = Instant::now();
            let mut history = vec![ChatMessage::user(task_text)];
            let run = agent.run_turn(&mut history, &NoEvents);
            let run = charged_to(account, with_session_key(session_key, run));
            let outcome = tokio::time::timeout(timeout, run).await;
            let tool_calls = count_tool_calls(&history);
            let (status, result, turns) = match outcome {
                Ok(Ok(outcome)) if outcome.end == TurnEnd::Answered => {
                    (SubagentStatus::Completed, outcome.text, outcome.iterations)
                }
                Ok(Ok(outcome)) => (SubagentStatus::Failed, outcome.text, outcome.iterations),
                Ok(Err(error)) => (
                    SubagentStatus::Failed,
                    error.to_string(),
                    count_turns(&history),
                ),
                Err(_) => (
                    SubagentStatus::TimedOut,
                    format!(
                        "stopped after its time limit of {} s",
                        timeout.as_secs_f64()
                    ),
                    count_turns(&history),
                ),
            };
            if let Some(manager) = manager.upgrade() {
                manager
                    .finish(number, status, result, turns, tool_calls, started.elapsed())
                    .await;
            }
        });
        state.running.insert(id.clone(), handle.abort_handle());
        let running = state.running.len();
        tracing::info!(subagent = %id, parent = parent_session, "sub-agent started");
        Ok(Spawned { id, running })
    }

    /// Stop a running child. Its result is not announced: the caller asked for the stop.
    pub fn stop(&self, id: &str) -> Result<SubagentRecord, String> {
        self.sync_with(|state| Self::stop_child(state, id))
    }

    fn stop_child(state: &mut State, id: &str) -> Result<SubagentRecord, String> {
        let Some(handle) = state.running.remove(id) else {
            let running: Vec<&str> = state.running.keys().map(String::as_str).collect();
            return Err(format!(
                "no running sub-agent `{id}`; running now: {}",
                if running.is_empty() {
                    "none".to_string()
                } else {
                    running.join(", ")
                }
            ));
        };
        let record = number_of(id).and_then(|number| state.records.get_mut(&number));
        let Some(record) = record else {
            return Err(format!("sub-agent `{id}` has no record"));
        };
        if record.status != SubagentStatus::Running {
            // It has finished and its result is on the way; let the announcement go out.
            let status = record.status.as_str();
            state.running.insert(id.to_string(), handle);
            return Err(format!(
                "sub-agent `{id}` has already {status}; its result is being announced"
            ));
        }
        handle.abort();
        record.status = SubagentStatus::Stopped;
        record.finished_ms = Some(now_ms());
        record.result = Some("stopped by its parent".to_string());
        Ok(record.clone())
    }

    /// After a restart: every run recorded as running whose process is gone was cut off. Mark
    /// it interrupted, tell its parent session, and drop records older than the retention.
    /// Runs of another clawcage process that is still alive are left alone. Returns the
    /// interrupted runs.
    pub async fn recover(&self) -> Vec<SubagentRecord> {
        let me = std::process::id();
        let interrupted: Vec<SubagentRecord> = self.sync_with(|state| {
            let live: Vec<String> = state.running.keys().cloned().collect();
            state
                .records
                .values_mut()
                .filter(|record| {
                    record.status == SubagentStatus::Running
                        && !live.contains(&record.id)
                        && (record.pid == me || !process_alive(record.pid))
                })
                .map(|record| {
                    record.status = SubagentStatus::Interrupted;
                    record.finished_ms = Some(now_ms());
                    record.result = Some("clawcage stopped while it was running".to_string());
                    // This process now speaks for the record.
                    record.pid = me;
                    record.clone()
                })
                .collect()
        });
        for record in &interrupted {
            let content = format!(
                "Sub-agent {} was interrupted: clawcage stopped while it was running, so it has no result.\nTask: {}\nStart it again if it is still needed.",
                record.name(),
                record.task
            );
            self.announce(&record.id, &record.parent_session, content)
                .await;
        }
        interrupted
    }

    async fn finish(
        &self,
        number: u64,
        status: SubagentStatus,
        result: String,
        turns: usize,
        tool_calls: usize,
        duration: Duration,
    ) {
        // A result is written to the run records and announced: an external agent's text (not
        // from the scrubbed provider) may hold a secret it was told.
        let result = self.redactor.redact(&result);
        let record = self.sync_with(|state| {
            let record = state.records.get_mut(&number)?;
            if record.status != SubagentStatus::Running {
                // Stopped meanwhile: the stop already recorded it.
                return None;
            }
            record.status = status;
            record.finished_ms = Some(now_ms());
            record.turns = turns;
            record.tool_calls = tool_calls;
            record.result = Some(cut(&result));
            Some(record.clone())
        });
        let Some(record) = record else {
            return;
        };
        tracing::info!(subagent = %record.id, status = status.as_str(), "sub-agent ended");
        let content = format!(
            "Sub-agent {} {} in {:.1} s ({} model calls, {} tool calls).\nTask: {}\n{}:\n{}",
            record.name(),
            status.as_str(),
            duration.as_secs_f64(),
            turns,
            tool_calls,
            record.task,
            if status == SubagentStatus::Completed {
                "Result"
            } else {
                "What happened"
            },
            record.result.as_deref().unwrap_or_default()
        );
        self.announce(&record.id, &record.parent_session, content)
            .await;
        // Counted as running until announced, so a front end that waits for a session's
        // children to end cannot miss the announcement.
        lock(&self.state).running.remove(&record.id);
    }

    /// Publish on the `system` channel for `session`, retrying with backoff while the channel
    /// is full (nobody is draining it yet).
    async fn announce(&self, id: &str, session: &str, content: String) {
        let message = InboundMessage {
            channel: SYSTEM_CHANNEL.to_string(),
            sender: format!("subagent:{id}"),
            session_key: session.to_string(),
            content,
        };
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=10 {
            match self.bus.publish(message.clone()) {
                Ok(_) => return,
                Err(error) => {
                    tracing::debug!(
                        subagent = id,
                        attempt,
                        "announcement not delivered yet: {error}"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::warn!(
            subagent = id,
            "the result could not be announced (the system channel stayed full); it stays in the run record"
        );
    }

    fn registry_for(&self, depth: u32, root_session: &str) -> ToolRegistry {
        let mut tools = self.child_tools.clone();
        if depth < self.config.max_depth {
            let spawn = SpawnTool::new(
                self.this.clone(),
                depth,
                Some(root_session.to_string()),
                &self.config,
            );
            // The name was excluded above, so registering cannot clash.
            let _ = tools.register(Arc::new(spawn));
        }
        tools
    }

    fn child_prompt(&self, depth: u32) -> String {
        let spawning = if depth < self.config.max_depth {
            "You may start sub-agents of your own with `spawn`; their results are announced to the agent at the top, not to you."
        } else {
            "You cannot start sub-agents: do the work yourself with your tools."
        };
        format!(
            "You are a sub-agent of clawcage, started by another agent to do one task. Work on it with your tools, then answer with the result: your final answer is handed to the agent that started you, so make it complete and self-contained. Every tool runs in a sandbox; a refused action is refused by design. {spawning}"
        )
    }

    /// Apply `change` to the state and save it. With a records file, the file is locked for
    /// the whole step (other clawcage processes may share the state directory): the records
    /// other processes wrote are merged in first (theirs win for their runs, ours for ours), the
    /// change is applied, records past the retention are dropped, and the result is written
    /// atomically. A failure to read or write is logged, never fatal: the runs go on.
    fn sync_with<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let horizon = now_ms().saturating_sub(self.config.retention.as_millis() as u64);
        let fresh = |record: &SubagentRecord| {
            record.status == SubagentStatus::Running
                || record.finished_ms.unwrap_or(record.started_ms) >= horizon
        };
        let Some(file) = &self.runs_file else {
            let mut state = lock(&self.state);
            let result = change(&mut state);
            state.records.retain(|_, record| fresh(record));
            return result;
        };
        let _saving = self
            .saving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let file_lock = lock_records_file(file)
            .inspect_err(|error| tracing::warn!("cannot lock the sub-agent records: {error}"))
            .ok();
        let on_disk = load_records(file)
            .inspect_err(|error| tracing::warn!("{error}"))
            .unwrap_or_default();
        let me = std::process::id();
        let (result, records) = {
            let mut state = lock(&self.state);
            for record in on_disk {
                let Some(number) = number_of(&record.id) else {
                    continue;
                };
                let ours = state
                    .records
                    .get(&number)
                    .is_some_and(|known| known.pid == me);
                if ours || record.pid == me || !fresh(&record) {
                    continue;
                }
                state.next_number = state.next_number.max(number);
                state.records.insert(number, record);
            }
            let result = change(&mut state);
            state.records.retain(|_, record| fresh(record));
            let records: Vec<SubagentRecord> = state.records.values().cloned().collect();
            (result, records)
        };
        if let Err(error) = save_records(file, &records) {
            tracing::warn!(
                "cannot save the sub-agent records to {}: {error}",
                file.display()
            );
        }
        drop(file_lock);
        result
    }
}

fn count_tool_calls(history: &[ChatMessage]) -> usize {
    history
        .iter()
        .map(|message| message.tool_uses().count())
        .sum()
}

fn count_turns(history: &[ChatMessage]) -> usize {
    history
        .iter()
        .filter(|message| message.role == clawcage_core::Role::Assistant)
        .count()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_an_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("subagents/runs.json");
        let record = SubagentRecord {
            id: "sub-1".into(),
            parent_session: "chat".into(),
            label: Some("count".into()),
            task: "count lines".into(),
            depth: 1,
            pid: 1,
            status: SubagentStatus::Running,
            started_ms: 1,
            finished_ms: None,
            turns: 0,
            tool_calls: 0,
            result: None,
        };
        save_records(&file, std::slice::from_ref(&record)).unwrap();
        assert_eq!(load_records(&file).unwrap(), vec![record]);
        assert_eq!(
            std::fs::read_dir(dir.path().join("subagents"))
                .unwrap()
                .count(),
            1
        );
        std::fs::write(&file, "not json").unwrap();
        let error = load_records(&file).unwrap_err().to_string();
        assert!(error.contains("move it away"), "{error}");
    }

    #[test]
    fn long_results_are_cut_with_the_total() {
        let long = "x".repeat(MAX_RESULT_CHARS + 5);
        let text = cut(&long);
        assert!(text.ends_with(&format!("had {} characters]", MAX_RESULT_CHARS + 5)));
        assert_eq!(cut("short"), "short");
    }
}
