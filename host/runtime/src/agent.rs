//! The agent a runtime composes: its registry plus the `message` tool, the provider chosen by
//! the flags and `[provider]` (with retries and the fail-over chain), the loop, the sessions with
//! transcripts in the state directory, and the sub-agents with their narrower tools — and
//! [`Agent::run_task`], one task whose answer waits for the sub-agents it started. For long
//! sessions it adds the context policy of the chosen model (`[models]`, `[context]`), the
//! budgets (`[budget]`), `MEMORY.md` in the system prompt and the `memory` tool, and the skills
//! of the workspace and the user skills directory in the system prompt ([`Runtime::skills`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::memory::{MEMORY_FILE, MemoryTool, memory_prompt};
use clawcage_agent::provider::Redacting;
use clawcage_agent::skills::{AvailablePrograms, SkillDirs, Skills, read_skills};
use clawcage_agent::subagent::{PermissionAsker, SYSTEM_CHANNEL, SubagentOutput};
use clawcage_agent::{
    AgentError, AgentLoop, Budget, FileInbox, JsonlTranscripts, LaneInput, MessageBus, MessageTool,
    Metered, NotificationFront, NotificationRoute, OutboundMessage, SendCallback, Sessions,
    SubagentManager, SubagentSetup, ToolRegistry, TurnObserver, TurnOutcome,
};
use clawcage_core::BoxFuture;

use crate::provider_config::choose_provider;
use crate::{Error, Runtime, failed, usage};

/// How the agent is wired for one front end.
#[derive(Clone)]
pub struct AgentOptions {
    /// Where the `message` tool sends.
    pub send: SendCallback,
    /// Ask the provider to stream text.
    pub stream: bool,
    /// Offer `spawn` and `subagents` (when `[subagents]` allows them).
    pub subagents: bool,
    /// Hears what external sub-agents stream (parent session, child id, text), when the front
    /// end shows it.
    pub subagent_output: Option<SubagentOutput>,
    /// Asks the person at the front end what an external sub-agent asks permission for, when
    /// one can be asked.
    pub permission_asker: Option<PermissionAsker>,
    /// Where the sessions keep their transcripts and inboxes; `None`: the state directory's
    /// files (`sessions/`, `inbox/`).
    pub stores: Option<SessionStores>,
}

/// Where sessions keep their transcripts and inboxes, and the cron service its jobs, when not in
/// the state directory (the gateway of a cluster keeps them on NATS JetStream). The transcripts
/// must scrub what they write with the runtime's redactor.
#[derive(Clone)]
pub struct SessionStores {
    /// The transcripts and turn journals.
    pub transcripts: Arc<dyn clawcage_agent::TranscriptStore>,
    /// The lane inboxes.
    pub inbox: Arc<dyn clawcage_agent::LaneInbox>,
    /// The cron jobs; `None`: the state directory's `cron/jobs.json`.
    pub cron_jobs: Option<Arc<dyn clawcage_core::records::RecordStore>>,
    /// The day's token count; `None`: the state directory's `usage/daily.json`.
    pub budget: Option<Arc<dyn clawcage_core::records::RecordStore>>,
}

impl AgentOptions {
    /// The `message` tool sending through `send`, streaming, with sub-agents, and no front-end
    /// hooks for external sub-agents.
    pub fn new(send: SendCallback) -> Self {
        Self {
            send,
            stream: true,
            subagents: true,
            subagent_output: None,
            permission_asker: None,
            stores: None,
        }
    }
}

/// A running agent.
pub struct Agent {
    /// The sessions (one lane each).
    pub sessions: Sessions,
    /// The tools the agent may call, the `message` tool included.
    pub tools: ToolRegistry,
    /// Whether the scripted provider answers.
    pub scripted: bool,
    /// `provider/model`, or the chain.
    pub label: String,
    /// The inbound bus: subsystems (sub-agents, cron) publish here; front ends subscribe to the
    /// `system` channel and route notifications into the sessions' lanes.
    pub bus: MessageBus,
    /// The sub-agents, when `[subagents]` is enabled.
    pub subagents: Option<Arc<SubagentManager>>,
}

/// A `message` tool callback that hands each message, as one line, to `print`.
pub fn print_messages_with(print: Arc<dyn Fn(String) + Send + Sync>) -> SendCallback {
    Arc::new(
        move |message: OutboundMessage| -> BoxFuture<'static, Result<(), String>> {
            let print = print.clone();
            Box::pin(async move {
                print(format!(
                    "  [message to {}] {}",
                    message.channel, message.content
                ));
                Ok(())
            })
        },
    )
}

impl Runtime {
    /// Wires an agent over this runtime's tools (plus the `message` tool sending through
    /// `options.send`, and `spawn` and `subagents` when sub-agents are on). The provider is
    /// chosen first, over the names of every tool the agent will offer; the sub-agent manager
    /// is then made whole, with the provider, budget, redactor, audit log, context policy and
    /// external agents it works with.
    pub async fn agent(&self, options: AgentOptions) -> Result<Agent, Error> {
        let config = self.config();
        let mut tools = self.tools().clone();
        tools
            .register(Arc::new(MessageTool::new("user", options.send)))
            .map_err(failed)?;
        if let (Some(read), Some(write)) = (tools.get("read_file"), tools.get("write_file")) {
            let memory = MemoryTool::new(read.clone(), write.clone());
            tools.register(Arc::new(memory)).map_err(failed)?;
        }
        let audit = self.audit_log()?;
        let bus = self.bus().clone();
        let mut agent_config = config
            .agent
            .agent_config(options.stream)
            .map_err(|error| usage(format!("{error:#}")))?;
        let child_tools = if options.subagents {
            self.child_tools().await?
        } else {
            None
        };
        let mut offered = tools.names();
        if child_tools.is_some() {
            offered.extend(SubagentManager::TOOL_NAMES);
        }
        let mut chosen = choose_provider(
            &self.provider,
            &config.provider,
            self.config_source()
                .and_then(|source| source.path.parent())
                .map(Path::to_path_buf)
                .as_deref(),
            &offered,
        )
        .map_err(|error| usage(format!("{error:#}")))?;
        // Every consumer of the model's output (the loop, events, transcripts, channels,
        // compaction, sub-agents) sees it scrubbed: the whole chain is wrapped once, here.
        chosen.provider = Redacting::wrap(chosen.provider, self.redactor());
        let label = chosen.provider.label();
        let budget = config
            .budget
            .config()
            .map_err(|error| usage(format!("{error:#}")))?;
        // One budget, held by the provider every model call goes through (turns, compaction,
        // sub-agents), by the sessions (their counts and notices) and by the sub-agent manager
        // (external agents' reported usage).
        let budget = (budget.session_tokens.is_some() || budget.daily_tokens.is_some()).then(
            || match options
                .stores
                .as_ref()
                .and_then(|stores| stores.budget.clone())
            {
                Some(shared) => Arc::new(Budget::in_store(budget, Some(shared))),
                None => Arc::new(Budget::new(budget, Some(self.state_dir().daily_usage()))),
            },
        );
        let provider: Arc<dyn clawcage_agent::Provider> = match &budget {
            Some(budget) => Arc::new(Metered::new(chosen.provider, budget.clone())),
            None => chosen.provider,
        };
        let context = crate::context_config::context_policy(
            &label,
            u64::from(
                config
                    .provider
                    .max_tokens
                    .unwrap_or(clawcage_agent::provider::DEFAULT_MAX_TOKENS),
            ),
            &config.models,
            &config.context,
            &chosen.windows,
        )
        .map_err(|error| usage(format!("{error:#}")))?;
        let subagents = match child_tools {
            Some(child_tools) => {
                // External ACP agents as sub-agents, when the configuration allows any.
                let external = match &self.external_agents {
                    Some(external) => external.0.external_runtime(self).await?,
                    None => None,
                };
                let setup = SubagentSetup {
                    state_dir: Some(self.state_dir().to_path_buf()),
                    provider: Some(provider.clone()),
                    audit: audit.clone(),
                    redactor: self.redactor().clone(),
                    context: context.clone(),
                    budget: budget.clone(),
                    external,
                    output: options.subagent_output,
                    asker: options.permission_asker,
                    ..SubagentSetup::new(
                        child_tools,
                        config
                            .subagents
                            .config()
                            .map_err(|error| usage(format!("{error:#}")))?,
                        bus.clone(),
                    )
                };
                let manager = SubagentManager::new(&tools, setup).map_err(usage)?;
                for tool in [manager.spawn_tool(), manager.subagents_tool()] {
                    tools.register(tool).map_err(failed)?;
                }
                agent_config.system_prompt.push_str("\n\n");
                agent_config.system_prompt.push_str(&manager.prompt_note());
                Some(manager)
            }
            None => None,
        };
        if let Some(section) = self.memory_section() {
            agent_config.system_prompt.push_str("\n\n");
            agent_config.system_prompt.push_str(&section);
        }
        if let Some(section) = self.skills().await.prompt() {
            agent_config.system_prompt.push_str("\n\n");
            agent_config.system_prompt.push_str(&section);
        }
        let mut agent = AgentLoop::new(provider, tools.clone(), agent_config)
            .with_audit(audit)
            .with_redactor(self.redactor().clone());
        if let Some(policy) = context {
            agent = agent.with_context(policy);
        }
        let (transcripts, inbox): (
            Arc<dyn clawcage_agent::TranscriptStore>,
            Arc<dyn clawcage_agent::LaneInbox>,
        ) = match options.stores {
            Some(stores) => (stores.transcripts, stores.inbox),
            None => (
                JsonlTranscripts::new(self.state_dir().sessions())
                    .with_redactor(self.redactor().clone())
                    .shared(),
                Arc::new(FileInbox::new(self.state_dir().inbox())),
            ),
        };
        let sessions = Sessions::with_queue(
            agent,
            Some(transcripts),
            config
                .agent
                .history_limit()
                .map_err(|error| usage(format!("{error:#}")))?,
            config
                .queue
                .config()
                .map_err(|error| usage(format!("{error:#}")))?,
        )
        // Every input is recorded before it is taken; what a stopped process left is resumed.
        .with_inbox(inbox);
        if let Some(budget) = budget {
            sessions.set_budget(budget);
        }
        Ok(Agent {
            sessions,
            tools,
            scripted: chosen.scripted,
            label,
            bus,
            subagents,
        })
    }
}

impl Runtime {
    /// The system prompt's long-term memory, from this runtime's workspace.
    fn memory_section(&self) -> Option<String> {
        memory_section(self.workspace().path())
    }

    /// The skills of the workspace's `skills/` folder and of the user skills directory
    /// (`$XDG_CONFIG_HOME/clawcage/skills`), each usable or skipped with its reason; the
    /// programs they require are checked against the programs exec runs, which are listed
    /// only when a skill requires one.
    pub async fn skills(&self) -> Skills {
        let dirs = SkillDirs::new(
            self.workspace().path(),
            crate::config::user_config_dir().as_deref(),
        );
        let mut skills = read_skills(&dirs);
        let programs = if skills.needs_programs() {
            self.program_names().await
        } else {
            AvailablePrograms::names(Vec::<String>::new())
        };
        skills.finish(&programs);
        for skill in skills.skills.iter().filter(|skill| !skill.is_usable()) {
            tracing::debug!(
                "skill {} at {} is not offered: {}",
                skill.name,
                skill.path.display(),
                skill.reason.as_deref().unwrap_or_default()
            );
        }
        skills
    }

    /// The names exec runs programs by, for skills' requirements: the bundled programs' (the
    /// multicall names kept beside their compiled code after the first listing) and each
    /// `NAME.wasm` of the installed programs' directory and of `[exec] programs_dir`, by file
    /// name: no program is loaded to answer. Also what `clawcage programs install` installs,
    /// for the reason a skill is skipped.
    async fn program_names(&self) -> AvailablePrograms {
        let config = self.config();
        if !config.exec.enabled.unwrap_or(true) {
            return AvailablePrograms::ExecDisabled;
        }
        let mut names: BTreeSet<String> = match self.sandbox.programs(None).await {
            Ok(bundled) => bundled.names().into_iter().collect(),
            Err(error) => return AvailablePrograms::Unknown(error.to_string()),
        };
        let installed = crate::installed_programs_dir(self.state_dir());
        for dir in [
            Some(installed.as_path()),
            config.exec.programs_dir.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            names.extend(clawcage_sandbox::programs::program_names_in(dir));
        }
        AvailablePrograms::names(names)
            .with_installable(clawcage_sandbox::install::installable_names())
    }
}

/// The system prompt's long-term memory: `MEMORY.md` of `workspace`, bounded. A file that
/// cannot be read (a symlink, which a tool could have planted, a FIFO, more than 1 MiB) is left
/// out with a warning.
fn memory_section(workspace: &Path) -> Option<String> {
    let path = workspace.join(MEMORY_FILE);
    if std::fs::symlink_metadata(&path).is_err() {
        return None;
    }
    match clawcage_core::files::read_regular_text(
        &path,
        1 << 20,
        clawcage_core::files::Symlinks::Refuse,
    ) {
        Ok(text) => memory_prompt(&text),
        Err(error) => {
            tracing::warn!("{MEMORY_FILE} is not read into the system prompt: {error}");
            None
        }
    }
}

impl Agent {
    /// Route the bus's `system` channel (sub-agent results, cron firings on the bus) into
    /// `front`, then report the sub-agent runs the last process left running. Every
    /// long-running front end (chat, the gateway, ACP) starts one; it stops when dropped.
    pub fn route_notifications(&self, front: Arc<dyn NotificationFront>) -> NotificationRoute {
        NotificationRoute::start(&self.bus, self.subagents.as_ref(), front)
    }

    /// Runs `task` in session `key` and returns the final outcome. When the task started
    /// sub-agents, waits for each one's announcement, lets the agent take it in (a turn each),
    /// and returns the last turn's outcome. `note` hears progress lines (waiting, each
    /// announcement).
    pub async fn run_task(
        &self,
        key: &str,
        task: &str,
        observer: Arc<dyn TurnObserver>,
        note: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<TurnOutcome, Error> {
        if task.trim().is_empty() {
            return Err(usage(
                "the task is empty; pass what to do, e.g. clawcage run \"summarise README.md\"",
            ));
        }
        let task_failed = |error: AgentError| failed(format!("the task failed: {error}"));
        // Subscribed before the turn, so no sub-agent's announcement can be missed.
        let mut announcements = self.bus.subscribe(SYSTEM_CHANNEL);
        let mut outcome = self
            .sessions
            .send_user(key, task, observer.clone())
            .await
            .map_err(task_failed)?;
        let Some(manager) = &self.subagents else {
            return Ok(outcome);
        };
        let children = manager.running_for(key);
        if children > 0 {
            note(&format!(
                "waiting for {children} sub-agent(s) to report (each has at most {} s)",
                manager.config().timeout.as_secs()
            ));
        }
        loop {
            let waiting = manager.running_for(key) > 0;
            let wait = if waiting {
                Duration::from_millis(200)
            } else {
                Duration::ZERO
            };
            let message = match tokio::time::timeout(wait, announcements.recv()).await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(_) if waiting => continue,
                Err(_) => break,
            };
            note(&format!(
                "[{}] {}",
                message.sender,
                message.content.lines().next().unwrap_or_default()
            ));
            outcome = self
                .sessions
                .submit(key, LaneInput::Notification(message), observer.clone())
                .wait()
                .await
                .and_then(|outcome| {
                    outcome.ok_or_else(|| AgentError::History("no outcome".to_string()))
                })
                .map_err(task_failed)?;
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_bounded_and_a_planted_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(memory_section(dir.path()), None);
        std::fs::write(dir.path().join(MEMORY_FILE), "- likes tea\n").unwrap();
        let section = memory_section(dir.path()).unwrap();
        assert!(section.ends_with("- likes tea"), "{section}");
        assert!(section.contains("at most 16384 bytes"), "{section}");
        #[cfg(unix)]
        {
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("secret"), "- the root password\n").unwrap();
            std::fs::remove_file(dir.path().join(MEMORY_FILE)).unwrap();
            std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join(MEMORY_FILE))
                .unwrap();
            assert_eq!(memory_section(dir.path()), None);
        }
    }
}
