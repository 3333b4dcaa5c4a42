//! The composition root of clawcage: one place that turns the operator's configuration into a
//! running runtime — grants, the sandbox, the tool registries (whose components load on demand),
//! the plugins, the audit log, the message bus, cron, the providers with their fail-over chain,
//! the sessions and the sub-agents — so that every front end (`call`, `run`, `chat`, `mcp`, the
//! gateway, ACP) parses its own input, asks a [`Runtime`] for what it needs and renders the
//! result, and none of them builds registries, providers or grants itself. It also decides where
//! grants may come from (`trust`): nothing a tool can write is read as configuration. It is one
//! file (over 700 lines) because the [`Runtime`] is one composition: opening it builds the parts in
//! the order each needs the others, and the accessors every front end calls read what it built; the
//! parts that stand alone (each config section, the tools, the plugins, the agent) are modules of
//! their own.

/// Writes one line to standard error, as `eprintln!` does, except that a closed or failing
/// stderr is not an error: the person stopped reading (`clawcage run … 2>&1 | head -2`), so the
/// line is dropped instead of panicking.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod acp_config;
mod agent;
pub mod approval_config;
pub mod channel_config;
pub mod cluster_config;
pub mod config;
pub mod context_config;
pub mod cron_config;
mod host;
pub mod network_config;
mod plugins;
pub mod provider_config;
pub mod queue_config;
pub mod subagent_config;
mod tools;
pub use tools::{components_cache_dir, installed_programs_dir};
pub mod trust;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawcage_agent::approvals::{ApprovalBroker, ApprovalStore};
use clawcage_agent::{AuditLog, AuditedRegistry, CronService, MessageBus, StateDir, ToolRegistry};
use clawcage_core::redact::Redactor;
use clawcage_sandbox::{
    ArtifactCache, CompileProgress, FsMode, Grants, Limits, PluginReport, Sandbox, SandboxOptions,
};

pub use agent::{Agent, AgentOptions, SessionStores, print_messages_with};
/// The workspace a runtime grants, and its exact-text reads (an external ACP agent's
/// `fs/read_text_file`): handed to front ends, which never depend on the sandbox themselves.
pub use clawcage_sandbox::{LineRange, WorkspaceGrant, WorkspaceTextError};
pub use config::{Config, ConfigSource};
pub use host::{CronStatus, Host, Lifetime};
pub use provider_config::ProviderOverrides;
pub use trust::TrustStore;

/// Why the runtime could not do what was asked, with the exit code it maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The configuration or the request is wrong (exit code 2): the message says what to fix.
    Usage(String),
    /// The tool or task failed (exit code 1).
    Failed(String),
}

impl Error {
    /// The process exit code of this error: 2 for usage, 1 for a failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Failed(_) => 1,
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Error::Usage(message) | Error::Failed(message) => message,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

pub(crate) fn usage(error: impl std::fmt::Display) -> Error {
    Error::Usage(error.to_string())
}

pub(crate) fn failed(error: impl std::fmt::Display) -> Error {
    Error::Failed(error.to_string())
}

/// What a front end asks for: the command line's view of configuration and state.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config FILE`.
    pub config: Option<PathBuf>,
    /// `--state-dir DIR` (default: the user state directory).
    pub state_dir: Option<PathBuf>,
    /// `--workspace DIR` (default: `[workspace] path`, else the current directory).
    pub workspace: Option<PathBuf>,
    /// `--read-only`: the workspace read-only whatever the config says.
    pub read_only: bool,
    /// `--provider`, `--model`, `--base-url`, `--script`.
    pub provider: ProviderOverrides,
    /// Where the first start's compilation is reported.
    pub progress: CompileProgress,
    /// The process makes at most one tool call and exits (`clawcage call`, `clawcage tools`):
    /// the engine reserves no pool of instance slots and no instance is made ahead.
    pub one_call: bool,
    /// How external ACP agents are attached to the sub-agents ([`Runtime::agent`] does it for
    /// every front end); none: `spawn` offers no external agent.
    pub external_agents: Option<ExternalAgents>,
}

/// Makes the external ACP agents a runtime's configuration allows available to its sub-agents.
/// The ACP client lives above the runtime (`clawcage_acp`); the binary hands it in through
/// [`Options::external_agents`], and [`Runtime::agent`] calls it, so `run`, `chat`, the gateway
/// and `acp` all get the same external agents.
pub trait AttachExternalAgents: Send + Sync {
    /// The external agents `runtime` allows, for its sub-agent manager (`None` when it allows
    /// none).
    fn external_runtime<'a>(
        &'a self,
        runtime: &'a Runtime,
    ) -> clawcage_core::BoxFuture<
        'a,
        Result<Option<Arc<dyn clawcage_agent::subagent::ExternalRuntime>>, Error>,
    >;
}

/// The [`AttachExternalAgents`] a runtime uses.
#[derive(Clone)]
pub struct ExternalAgents(pub Arc<dyn AttachExternalAgents>);

impl std::fmt::Debug for ExternalAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExternalAgents")
    }
}

/// Where configuration and state were found, before anything is checked or started.
#[derive(Debug)]
pub struct Located {
    /// The configuration.
    pub config: Config,
    /// The file it came from, if any.
    pub source: Option<ConfigSource>,
    /// The workspace directory (canonical) and its mode.
    pub workspace: WorkspaceGrant,
    /// The state directory.
    pub state_dir: PathBuf,
}

/// Finds the configuration, the workspace and the state directory named by `options`.
pub fn locate(options: &Options) -> Result<Located, Error> {
    let current = std::env::current_dir()
        .map_err(|error| failed(format!("cannot read the current directory: {error}")))?;
    let hint = options.workspace.clone().unwrap_or_else(|| current.clone());
    let (config, source) = Config::load(options.config.as_deref(), &hint)
        .map_err(|error| Error::Usage(format!("{error:#}")))?;
    let workspace_path = options
        .workspace
        .clone()
        .or_else(|| config.workspace.path.clone())
        .unwrap_or(current);
    let mode = if options.read_only {
        FsMode::ReadOnly
    } else {
        config
            .workspace_mode()
            .map_err(|error| usage(format!("{error:#}")))?
    };
    let workspace = WorkspaceGrant::new(&workspace_path, mode).map_err(usage)?;
    let state_dir = state_dir(options.state_dir.as_deref())?;
    Ok(Located {
        config,
        source,
        workspace,
        state_dir,
    })
}

/// Checks, before any tool is loaded or compiled, that the model the options and the
/// configuration choose can be set up: its kind, model and base URL, and for a hosted API the
/// key in the environment. A missing key is said at once, not after a first start's seconds of
/// compiling. The runtime checks it all again when it builds the agent.
pub fn check_provider(options: &Options) -> Result<(), Error> {
    let located = locate(options)?;
    located.check_trust()?;
    let config_dir = located
        .source
        .as_ref()
        .and_then(|source| source.path.parent())
        .map(Path::to_path_buf);
    provider_config::choose_provider(
        &options.provider,
        &located.config.provider,
        config_dir.as_deref(),
        &[],
    )
    .map(|_| ())
    .map_err(|error| usage(format!("{error:#}")))
}

/// The state directory: `explicit`, else the user state directory's `clawcage`.
pub fn state_dir(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map(|dir| dir.join("clawcage"))
        .ok_or_else(|| usage("cannot find a user state directory; pass --state-dir DIR"))
}

/// The directories no workspace of a run over `config` and `state_dir` may contain, be or lie
/// inside ([`trust::check_workspace`]): the state directory, the compiled-component cache
/// (`cache_dir`, by default the state directory's, which may be a link elsewhere), the plugins
/// directory and clawcage's user configuration directory. A configuration file given with
/// `--config` or found in the workspace is guarded by its digest instead (`check_trust`).
pub fn protected_dirs(
    config: &Config,
    state_dir: &Path,
    cache_dir: Option<&Path>,
) -> Vec<trust::Protected> {
    let mut protected = vec![
        trust::Protected {
            name: "the state directory",
            path: state_dir.to_path_buf(),
            holds: "the compiled-code cache, the trusted configurations, the kept approvals, the channels' approved senders (pairing.json), the cron jobs, the session transcripts and the audit log",
            fix: "pass --state-dir DIR (or set CLAWCAGE_STATE_DIR) outside it",
        },
        trust::Protected {
            name: "the compiled-component cache",
            path: cache_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(|| components_cache_dir(state_dir)),
            holds: "native code compiled from the tools, sealed with the cache's own key (seal.key) and checked before it runs",
            fix: "pass --state-dir DIR whose cache lies outside it",
        },
    ];
    if let Some(dir) = &config.plugins.dir {
        protected.push(trust::Protected {
            name: "the plugins directory",
            path: dir.clone(),
            holds: "the plugins' components and manifests, which the configuration grants",
            fix: "move the plugins elsewhere and fix [plugins] dir",
        });
    }
    if let Some(dir) = config::user_config_dir() {
        protected.push(trust::Protected {
            name: "clawcage's configuration directory",
            path: dir,
            holds: "the configuration every run without --config reads, with no digest checked",
            fix: "set XDG_CONFIG_HOME to a directory outside the workspace",
        });
    }
    protected
}

/// [`trust::check_workspace`] of `workspace` against [`protected_dirs`], as a usage error.
fn check_workspace(
    workspace: &Path,
    config: &Config,
    state_dir: &Path,
    cache_dir: Option<&Path>,
) -> Result<(), Error> {
    trust::check_workspace(workspace, &protected_dirs(config, state_dir, cache_dir)).map_err(usage)
}

impl Located {
    /// Refuses a layout in which a tool could change what the next run grants: a workspace that
    /// contains, is or lies inside a protected directory ([`protected_dirs`]), or a
    /// configuration file inside it that the operator has not trusted as it is now.
    pub fn check_trust(&self) -> Result<(), Error> {
        let workspace = self.workspace.path();
        check_workspace(workspace, &self.config, &self.state_dir, None)?;
        if let Some(source) = &self.source
            && trust::is_inside(&source.path, workspace)
        {
            let store = TrustStore::in_state_dir(&self.state_dir);
            let trusted = store.is_trusted(source).map_err(|error| {
                usage(format!(
                    "cannot read the trusted configurations {}: {error}",
                    store.path().display()
                ))
            })?;
            if !trusted {
                return Err(usage(format!(
                    "the configuration {} lies inside the workspace, where tools can write, and is not trusted as it is now (sha256 {}). Review it, then run `clawcage trust{}` to use it; any later change to it needs a new `clawcage trust`",
                    source.path.display(),
                    &source.sha256[..12],
                    if source.explicit {
                        format!(" --config {}", source.path.display())
                    } else {
                        format!(" --workspace {}", workspace.display())
                    }
                )));
            }
        }
        Ok(())
    }
}

/// A scrubber of every secret value this process holds: clawcage's credential variables
/// (`clawcage_core::CREDENTIAL_ENV`) and the network policy's secrets. A value too short to
/// scrub safely is reported once.
fn secrets_redactor(web_grants: &Grants) -> Redactor {
    let credentials = Redactor::new(clawcage_core::CREDENTIAL_ENV.iter().filter_map(|name| {
        std::env::var(name)
            .ok()
            .filter(|value| !value.trim().is_empty())
            .map(|value| (*name, value))
    }));
    let redactor = match &web_grants.network {
        Some(policy) => credentials.merged(policy.redactor()),
        None => credentials,
    };
    for label in redactor.skipped() {
        tracing::warn!(
            "the value of {label} is shorter than 8 characters, so it cannot be scrubbed from tool results"
        );
    }
    redactor
}

/// The cron service of this process and the lock that makes it the only one on the state
/// directory (held while the runtime lives).
struct CronSetup {
    service: Arc<CronService>,
    /// The state directory's lock; `None` when the jobs live elsewhere (a cluster's bucket,
    /// fired by the one active gateway).
    _owner: Option<std::fs::File>,
}

/// One tool of [`Runtime::tool_catalog`] and where it is available.
pub struct CatalogEntry {
    /// The tool.
    pub tool: Arc<dyn clawcage_core::Tool>,
    /// The front ends that offer it, in words.
    pub available: String,
}

/// What became of the request for the cron capability ([`Host`] turns it into a
/// [`CronStatus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CronOwnership {
    /// This runtime runs the state directory's jobs and offers the `cron` tool.
    Owned,
    /// Another clawcage process runs them.
    OwnedElsewhere(PathBuf),
    /// `[cron] enabled = false`.
    Disabled,
}

/// A composed runtime: the configuration resolved and checked, the sandbox started, the tools
/// registered (their components load when first called), the plugins loaded.
pub struct Runtime {
    config: Config,
    source: Option<ConfigSource>,
    workspace: WorkspaceGrant,
    state_dir: StateDir,
    limits: Limits,
    provider: ProviderOverrides,
    sandbox: Arc<Sandbox>,
    grants: Grants,
    web_grants: Grants,
    tools: ToolRegistry,
    plugins: PluginReport,
    audit_path: Option<PathBuf>,
    bus: MessageBus,
    cron: Option<CronSetup>,
    /// Every secret value the host holds, scrubbed from whatever a tool returns.
    redactor: Redactor,
    /// `[channels]`, checked, with their secrets from the environment.
    channels: channel_config::Channels,
    /// The approvals broker exec asks, and operator front ends answer.
    approvals: ApprovalBroker,
    /// How external ACP agents are attached to the sub-agents.
    external_agents: Option<ExternalAgents>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("workspace", &self.workspace)
            .field("state_dir", &self.state_dir)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Composes the runtime `options` describe: finds and checks the configuration, starts the
    /// sandbox and registers the bundled tools and the plugins. No component is compiled or
    /// instantiated when the artifact cache already knows them.
    pub async fn open(options: Options) -> Result<Runtime, Error> {
        let located = locate(&options)?;
        located.check_trust()?;
        let sandbox = options.one_call.then(|| {
            Sandbox::new(SandboxOptions {
                progress: options.progress.clone(),
                idle_instances: std::time::Duration::ZERO,
                pooled: false,
                ..SandboxOptions::new(ArtifactCache::in_dir(components_cache_dir(
                    &located.state_dir,
                )))
            })
        });
        let sandbox = sandbox.transpose().map_err(failed)?;
        let mut runtime =
            Self::assemble(located, options.provider, options.progress, None, sandbox).await?;
        runtime.external_agents = options.external_agents;
        Ok(runtime)
    }

    /// The runtime of `clawcage demo`: the default configuration, the workspace `workspace`, no
    /// network whatever any configuration says, state in `state_dir`; only the compiled-component
    /// cache of `cache_state_dir` is shared.
    pub async fn demo(
        workspace: &Path,
        state_dir: &Path,
        cache_state_dir: &Path,
        script: PathBuf,
        progress: CompileProgress,
    ) -> Result<Runtime, Error> {
        // The demo shows approvals: programs beyond these ask (the demo answers from its script).
        let mut config = Config::default();
        config.approvals.exec = Some("allowlist".to_string());
        config.approvals.ask = Some("on-miss".to_string());
        config.approvals.allow = ["ls", "cat", "wc", "grep", "head", "find", "sort"]
            .iter()
            .map(|program| program.to_string())
            .collect();
        let located = Located {
            config,
            source: None,
            workspace: WorkspaceGrant::new(workspace, FsMode::ReadWrite).map_err(failed)?,
            state_dir: state_dir.to_path_buf(),
        };
        let provider = ProviderOverrides {
            provider: Some("scripted".to_string()),
            script: Some(script),
            ..ProviderOverrides::default()
        };
        let mut runtime = Self::assemble(
            located,
            provider,
            progress,
            Some(components_cache_dir(cache_state_dir)),
            None,
        )
        .await?;
        runtime.audit_path = None;
        Ok(runtime)
    }

    async fn assemble(
        located: Located,
        provider: ProviderOverrides,
        progress: CompileProgress,
        cache_dir: Option<PathBuf>,
        shared_sandbox: Option<Arc<Sandbox>>,
    ) -> Result<Runtime, Error> {
        let Located {
            config,
            source,
            workspace,
            state_dir,
        } = located;
        let state_dir = StateDir::new(state_dir);
        // Whichever front end chose it, no runtime is built over a workspace from which a tool
        // could change the state, the cache, the plugins or the configuration.
        check_workspace(workspace.path(), &config, &state_dir, cache_dir.as_deref())?;
        let demo = cache_dir.is_some();
        let limits = config
            .limits()
            .map_err(|error| usage(format!("{error:#}")))?;
        let audit_path = match config.audit.enabled {
            Some(false) => None,
            _ => Some(
                config
                    .audit
                    .path
                    .clone()
                    .unwrap_or_else(|| state_dir.audit_log()),
            ),
        };
        let approvals = approvals_broker(&config, &state_dir, audit_path.as_deref(), demo)?;
        // `[approvals] write = "ask"`: a change under a read-only workspace is asked.
        let tools_workspace = if approvals.settings().write_ask {
            workspace
                .clone()
                .with_write_approvals(Arc::new(approvals.clone()))
        } else {
            workspace.clone()
        };
        let grants = Grants::workspace(tools_workspace).with_limits(limits);
        let web_grants = if demo {
            tools::no_network(limits)
        } else {
            tools::web_grants(&config, limits, &approvals)?
        };
        let cache_dir = cache_dir.unwrap_or_else(|| components_cache_dir(&state_dir));
        // Runtimes of one process over different workspaces (ACP sessions) share one engine.
        let sandbox = match shared_sandbox {
            Some(sandbox) => sandbox,
            None => Sandbox::new(SandboxOptions {
                progress,
                ..SandboxOptions::new(ArtifactCache::in_dir(cache_dir))
            })
            .map_err(failed)?,
        };
        let tools = tools::bundled_registry(
            &sandbox,
            &config,
            grants.clone(),
            web_grants.clone(),
            &approvals,
            &state_dir,
        )
        .await?;
        let mut runtime = Runtime {
            audit_path,
            approvals,
            config,
            source,
            workspace,
            state_dir,
            limits,
            provider,
            sandbox,
            grants,
            web_grants,
            tools,
            plugins: PluginReport::default(),
            bus: MessageBus::new(),
            cron: None,
            redactor: Redactor::default(),
            channels: channel_config::Channels::default(),
            external_agents: None,
        };
        runtime.redactor = secrets_redactor(&runtime.web_grants);
        if !demo {
            runtime.channels = runtime
                .config
                .channels
                .resolve(|name| std::env::var(name).ok())
                .map_err(|error| usage(format!("{error:#}")))?;
            let channel_secrets = Redactor::new(runtime.channels.secrets());
            for label in channel_secrets.skipped() {
                tracing::warn!(
                    "the value of {label} is shorter than 8 characters, so it cannot be scrubbed from output"
                );
            }
            runtime.redactor = runtime.redactor.merged(&channel_secrets);
        }
        if !demo {
            runtime.plugins = plugins::load_into(
                &mut runtime.tools,
                &runtime.sandbox,
                &runtime.config.plugins,
                &runtime.grants,
            )
            .await;
        }
        Ok(runtime)
    }

    /// The approvals broker: operator front ends register with it to answer what exec asks.
    pub fn approvals(&self) -> &ApprovalBroker {
        &self.approvals
    }

    /// Takes the cron capability: locks the state directory's jobs for this process (or, given
    /// a `store` of their own, takes the jobs there), opens the service and registers the
    /// `cron` tool. Another process holding the state directory's jobs is not an error: it is
    /// reported, and this runtime has no `cron` tool yet.
    pub(crate) async fn enable_cron(
        &mut self,
        store: Option<Arc<dyn clawcage_core::records::RecordStore>>,
    ) -> Result<CronOwnership, Error> {
        if !self.config.cron.enabled() {
            return Ok(CronOwnership::Disabled);
        }
        if self.cron.is_some() {
            return Ok(CronOwnership::Owned);
        }
        let (service, owner) = match store {
            Some(store) => (self.open_cron_service_in(store)?, None),
            None => {
                let dir = self.state_dir.cron();
                let Some(owner) = tools::lock_cron(&dir)? else {
                    return Ok(CronOwnership::OwnedElsewhere(dir));
                };
                (self.open_cron_service()?, Some(owner))
            }
        };
        tools::register_cron(&self.sandbox, &mut self.tools, service.clone(), self.limits).await?;
        self.cron = Some(CronSetup {
            service,
            _owner: owner,
        });
        Ok(CronOwnership::Owned)
    }

    /// The cron service over the state directory's jobs, with `[cron]`'s options; firing
    /// nothing until started.
    fn open_cron_service(&self) -> Result<Arc<CronService>, Error> {
        let options = self
            .config
            .cron
            .options()
            .map_err(|error| usage(format!("{error:#}")))?;
        CronService::open(self.state_dir.cron(), self.bus.clone(), options).map_err(usage)
    }

    /// The cron service over the jobs `store` keeps, with `[cron]`'s options.
    fn open_cron_service_in(
        &self,
        store: Arc<dyn clawcage_core::records::RecordStore>,
    ) -> Result<Arc<CronService>, Error> {
        let options = self
            .config
            .cron
            .options()
            .map_err(|error| usage(format!("{error:#}")))?;
        CronService::open_in(store, self.bus.clone(), options).map_err(usage)
    }

    /// Registers the `cron` tool over the state directory's jobs without firing any (the
    /// process owning them does, and sees each change within a second), unless this runtime
    /// already has one. Returns the jobs' directory, or `None` when `[cron] enabled = false`.
    pub(crate) async fn manage_cron(&mut self) -> Result<Option<PathBuf>, Error> {
        if !self.config.cron.enabled() {
            return Ok(None);
        }
        let dir = self.state_dir.cron();
        if !self.tools.contains("cron") {
            let service = self.open_cron_service()?;
            tools::register_cron(&self.sandbox, &mut self.tools, service, self.limits).await?;
        }
        Ok(Some(dir))
    }

    /// The `cron` tool over the state directory's jobs, for managing them from outside a chat
    /// (`clawcage cron ...`): the same component, validation and file as the agent's tool. A
    /// chat running the jobs meanwhile sees each change within a second; this process runs no
    /// jobs.
    ///
    /// Given a `store` (a cluster's bucket), the tool manages the jobs kept there instead.
    pub async fn cron_tool(
        &self,
        store: Option<Arc<dyn clawcage_core::records::RecordStore>>,
    ) -> Result<AuditedRegistry, Error> {
        if !self.config.cron.enabled() {
            return Err(usage(
                "cron is turned off ([cron] enabled = false in the configuration)",
            ));
        }
        let service = match store {
            Some(store) => self.open_cron_service_in(store)?,
            None => self.open_cron_service()?,
        };
        let mut registry = ToolRegistry::new();
        tools::register_cron(&self.sandbox, &mut registry, service, self.limits).await?;
        Ok(AuditedRegistry::new(registry, self.audit_log()?).with_redactor(self.redactor.clone()))
    }

    /// Every tool a front end of this configuration can offer, with where it is available:
    /// the tools of `call`, `mcp`, `run` and `chat`, the `message` tool and the sub-agent tools
    /// of the agent commands, and the `cron` tool of the process that owns the jobs. Nothing is
    /// started to list them.
    pub async fn tool_catalog(&self) -> Result<Vec<CatalogEntry>, Error> {
        let everywhere = "call, mcp, run, chat";
        let mut entries: Vec<CatalogEntry> = self
            .tools
            .tools()
            .map(|tool| CatalogEntry {
                tool: tool.clone(),
                available: everywhere.to_string(),
            })
            .collect();
        let message =
            clawcage_agent::MessageTool::new("user", print_messages_with(Arc::new(|_| {})));
        entries.push(CatalogEntry {
            tool: Arc::new(message),
            available: "run, chat (sends a message to the person at the front end)".to_string(),
        });
        if let (Some(read), Some(write)) =
            (self.tools.get("read_file"), self.tools.get("write_file"))
        {
            entries.push(CatalogEntry {
                tool: Arc::new(clawcage_agent::memory::MemoryTool::new(
                    read.clone(),
                    write.clone(),
                )),
                available: "run, chat (appends to MEMORY.md through write_file)".to_string(),
            });
        }
        if self.config.subagents.enabled() {
            let manager = clawcage_agent::SubagentManager::new(
                &self.tools,
                clawcage_agent::SubagentSetup::new(
                    ToolRegistry::new(),
                    self.config
                        .subagents
                        .config()
                        .map_err(|error| usage(format!("{error:#}")))?,
                    MessageBus::new(),
                ),
            )
            .map_err(usage)?;
            for tool in [manager.spawn_tool(), manager.subagents_tool()] {
                entries.push(CatalogEntry {
                    tool,
                    available: "run, chat ([subagents] enabled)".to_string(),
                });
            }
        }
        if self.config.cron.enabled() {
            let mut registry = ToolRegistry::new();
            tools::register_cron_for_listing(&self.sandbox, &mut registry, self.limits).await?;
            for tool in registry.tools() {
                entries.push(CatalogEntry {
                    tool: tool.clone(),
                    available: "run, chat, gateway, acp (the long-running one that owns the state directory's jobs fires them); clawcage cron"
                        .to_string(),
                });
            }
        }
        entries.sort_by(|a, b| a.tool.spec().name.cmp(&b.tool.spec().name));
        Ok(entries)
    }

    /// The cron service, when [`Runtime::enable_cron`] took it.
    pub fn cron(&self) -> Option<&Arc<CronService>> {
        self.cron.as_ref().map(|cron| &cron.service)
    }

    /// The tools, by name.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// What became of each plugin.
    pub fn plugins(&self) -> &PluginReport {
        &self.plugins
    }

    /// The workspace the tools may reach.
    pub fn workspace(&self) -> &WorkspaceGrant {
        &self.workspace
    }

    /// How many messages of a session's transcript are loaded as its history (`[agent]
    /// history_limit`, checked when the configuration was loaded).
    pub fn history_limit(&self) -> usize {
        self.config
            .agent
            .history_limit()
            .unwrap_or(clawcage_agent::session::DEFAULT_HISTORY_LIMIT)
    }

    /// The state directory, whose methods name what lives in it.
    pub fn state_dir(&self) -> &StateDir {
        &self.state_dir
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the configuration came from, if from a file.
    pub fn config_source(&self) -> Option<&ConfigSource> {
        self.source.as_ref()
    }

    /// The inbound message bus (sub-agent announcements, cron firings).
    pub fn bus(&self) -> &MessageBus {
        &self.bus
    }

    /// The audit log, opened for appending (`None` when auditing is off).
    pub fn audit_log(&self) -> Result<Option<Arc<AuditLog>>, Error> {
        let Some(path) = &self.audit_path else {
            return Ok(None);
        };
        AuditLog::open(path).map(|log| Some(Arc::new(log))).map_err(|error| {
            usage(format!(
                "cannot open the audit log {} ({error}); fix [audit] path, pass --state-dir, or set [audit] enabled = false",
                path.display()
            ))
        })
    }

    /// The tools with every call recorded in the audit log and every result scrubbed of the
    /// host's secrets: what `call` and `mcp` call through.
    pub fn audited_tools(&self) -> Result<AuditedRegistry, Error> {
        Ok(AuditedRegistry::new(self.tools.clone(), self.audit_log()?)
            .with_redactor(self.redactor.clone()))
    }

    /// The scrubber of every secret value the host holds (the credential variables and the
    /// network secrets).
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// `[channels]`: the chat apps and webhooks, checked, secrets read from the environment.
    pub fn channels(&self) -> &channel_config::Channels {
        &self.channels
    }

    /// A POST through the host's network policy (`[network]`: the allow-list, one checked
    /// lookup, no private address unless listed), for channel replies such as a webhook's. The
    /// caller never sees the policy or the sandbox.
    pub fn http_post(&self) -> channel_config::HttpPost {
        let policy = self.web_grants.network.clone();
        Arc::new(move |url, headers, body| {
            let policy = policy.clone();
            Box::pin(async move {
                let Some(policy) = policy else {
                    return Err(format!(
                        "no outbound network is configured; add the host of {url} to [network] allow"
                    ));
                };
                let request = clawcage_sandbox::network::OutboundRequest {
                    method: "POST".to_string(),
                    url,
                    headers,
                    body: Some(body),
                };
                policy
                    .send(request)
                    .await
                    .map(|response| response.status)
                    .map_err(|error| error.to_string())
            })
        })
    }

    /// The per-call limits of every tool.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The tools prepared for sub-agents: the bundled ones again, with the workspace read-only
    /// unless `[subagents] workspace = "rw"` (never more than this runtime's own mode). Their
    /// components load on demand like the parent's, sharing the compiled code.
    pub(crate) async fn child_tools(&self) -> Result<Option<ToolRegistry>, Error> {
        if !self.config.subagents.enabled() {
            return Ok(None);
        }
        let child_grants = if self
            .config
            .subagents
            .children_write()
            .map_err(|error| usage(format!("{error:#}")))?
        {
            self.grants.clone()
        } else {
            self.grants.read_only()
        };
        tools::bundled_registry(
            &self.sandbox,
            &self.config,
            child_grants,
            self.web_grants.clone(),
            &self.approvals,
            &self.state_dir,
        )
        .await
        .map(Some)
    }
}

/// The approvals broker of `[approvals]`, keeping allow-always decisions in the state directory
/// and recording requests and decisions in the audit log. The demo keeps nothing.
fn approvals_broker(
    config: &Config,
    state_dir: &Path,
    audit_path: Option<&Path>,
    demo: bool,
) -> Result<ApprovalBroker, Error> {
    let settings = config
        .approvals
        .settings()
        .map_err(|error| usage(format!("{error:#}")))?;
    let store = (!demo).then(|| ApprovalStore::in_state_dir(state_dir));
    let broker = ApprovalBroker::new(settings, store, None);
    // Opened at the first request or decision: a process that never asks creates no log.
    Ok(match audit_path {
        Some(path) => broker.with_audit_path(path.to_path_buf()),
        None => broker,
    })
}
