//! The `clawcage` command: a thin clap front end that reads the configuration, starts the sandbox,
//! loads the bundled tool components (file and exec tools with the workspace, web tools with the
//! network policy) and the operator's plugins into a registry and runs one subcommand — a tool
//! call, the MCP server (in `clawcage-mcp`), or the agent (`run`, `chat`, `demo`). Tool calls
//! from `call` and `mcp` are recorded in the audit log. Exit codes: 0 ok, 1 the tool or task
//! failed (message on stderr), 2 usage or configuration error.

mod agent;
mod agent_config;
mod chat;
mod config;
mod cron_config;
mod demo;
mod network_config;
mod plugins;
mod render;
mod subagent_config;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use clawcage_agent::audit::new_session_id;
use clawcage_agent::{AuditedRegistry, CronService, MessageBus, ToolRegistry};
use clawcage_core::ToolError;
use clawcage_mcp::McpServer;
use clawcage_sandbox::{
    ArtifactCache, ExecGrant, Grants, PluginReport, Sandbox, SandboxOptions, WorkspaceGrant,
    components,
};

use crate::config::Config;

/// clawcage: an agent runtime whose every tool runs as a WebAssembly component in a capability
/// sandbox. A tool reaches only the workspace directory granted to it and the hosts on the
/// network allow-list ([network] allow in the config), within memory and time limits; nothing
/// else on the machine exists for it.
#[derive(Debug, Parser)]
#[command(name = "clawcage", version, about, long_about = None, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    provider: agent_config::ProviderArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
struct CommonArgs {
    /// Configuration file (TOML). Default: clawcage.toml in the workspace, else
    /// $XDG_CONFIG_HOME/clawcage/config.toml.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where clawcage keeps its state and the compiled-component cache. Default: the user state
    /// directory ($XDG_STATE_HOME/clawcage).
    #[arg(long, global = true, value_name = "DIR", env = "CLAWCAGE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The directory tools may reach. Default: [workspace] path in the config, else the current
    /// directory.
    #[arg(long, global = true, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Grant the workspace read-only, whatever the config says.
    #[arg(long, global = true)]
    read_only: bool,
    /// Log more (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the tools with their origin, grants and JSON Schemas.
    Tools {
        /// Print JSON: one object per tool with name, description, input_schema, origin and
        /// grants.
        #[arg(long)]
        json: bool,
    },
    /// Run one tool call and print its result on stdout.
    ///
    /// Example: clawcage call read_file '{"path": "README.md"}' --workspace .
    Call {
        /// The tool's name, as listed by `clawcage tools`.
        tool: String,
        /// The arguments: one JSON object, as the model would send it.
        #[arg(default_value = "{}")]
        args: String,
    },
    /// Run one task with the agent and print its final answer on stdout (progress and tool
    /// calls on stderr).
    ///
    /// When the agent delegates to sub-agents (`spawn`), the answer waits for their results.
    ///
    /// Example: ANTHROPIC_API_KEY=... clawcage run "summarise README.md" --workspace .
    Run {
        /// What to do.
        task: String,
        /// Continue this session (its transcript) instead of starting a fresh one.
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
    },
    /// Talk with the agent: line editing, streamed replies, each tool call with its verdict.
    ///
    /// Sub-agent results and cron firings arrive while you type and are answered in the
    /// session. Ctrl-C stops a running turn; Ctrl-D or /exit leaves.
    Chat {
        /// The session to continue; its history is kept in the state directory.
        #[arg(long, value_name = "KEY", default_value = "chat")]
        session: String,
    },
    /// A recorded session in a temporary workspace: real tools and sandbox, scripted replies,
    /// no API key or network needed.
    Demo,
    /// Serve the tools to MCP clients (Claude Code, Claude Desktop, Cursor, ...).
    ///
    /// Without --http, speaks MCP over stdin and stdout, the way clients start local servers:
    ///   claude mcp add clawcage -- clawcage mcp --workspace /path/to/project
    /// A tool error reaches the client as a tool result with isError set and the error's text.
    /// Every call is recorded in the audit log.
    Mcp {
        /// Serve streamable HTTP at http://ADDR/mcp instead of stdio, e.g. 127.0.0.1:8765
        /// (port 0 picks a free port; the address is printed on stderr). Loopback addresses
        /// only: the endpoint has no authentication.
        #[arg(long, value_name = "ADDR")]
        http: Option<SocketAddr>,
    },
}

/// An error with the exit code it maps to.
enum Failure {
    /// Exit 1: the tool or task failed.
    Tool(String),
    /// Exit 2: usage or configuration error.
    Usage(String),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure::Usage(format!("{error:#}"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.common.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("clawcage: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Tool(message)) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(message)) => {
            eprintln!("clawcage: {message}");
            ExitCode::from(2)
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Demo = cli.command {
        return run_demo(&cli.common).await;
    }
    // Cron belongs to the long-running agent front end: its jobs fire into sessions while
    // `chat` runs.
    let with_cron = matches!(cli.command, Command::Chat { .. });
    let setup = build_registry(&cli.common, with_cron).await?;
    let context = agent::AgentContext {
        config: &setup.config,
        config_file: setup.config_file.as_deref(),
        provider: &cli.provider,
        state_dir: &setup.state_dir,
        audit_path: setup.audit_path.as_deref(),
        bus: &setup.bus,
    };
    match cli.command {
        Command::Tools { json } => {
            print_tools(&setup.registry, json)?;
            if !json {
                plugins::print_report(&setup.plugins);
            }
            Ok(())
        }
        Command::Call { tool, args } => call(&setup.audited()?, &tool, &args).await,
        Command::Mcp { http } => serve_mcp(&setup, http).await,
        Command::Run { task, session } => {
            let children = setup.child_registry.clone();
            agent::run_task(context, setup.registry.clone(), children, &task, session).await
        }
        Command::Chat { session } => {
            let children = setup.child_registry.clone();
            // Jobs fire while the chat runs; firings missed meanwhile follow the documented
            // policy at the next start.
            let runner = setup.cron.as_ref().map(|cron| cron.service.start());
            let result = chat::run(context, setup.registry.clone(), children, session).await;
            if let Some(runner) = runner {
                runner.abort();
            }
            result
        }
        Command::Demo => Ok(()),
    }
}

/// `clawcage demo`: the bundled tools granted a fresh temporary workspace and no network,
/// whatever the config says; only the component cache of the state directory is reused.
async fn run_demo(common: &CommonArgs) -> Result<(), Failure> {
    let temp = tempfile::Builder::new()
        .prefix("clawcage-demo-")
        .tempdir()
        .context("cannot create a temporary directory for the demo")?;
    let workspace = temp.path().join("workspace");
    demo::seed_workspace(&workspace).context("cannot fill the demo workspace")?;
    let grant = WorkspaceGrant::new(&workspace, clawcage_sandbox::FsMode::ReadWrite)
        .map_err(|error| Failure::Tool(error.to_string()))?;
    let state_dir = state_dir(common.state_dir.as_deref())?;
    let sandbox = Sandbox::new(SandboxOptions {
        cache: ArtifactCache::in_dir(state_dir.join("cache").join("components")),
    })
    .map_err(|error| Failure::Tool(error.to_string()))?;
    // The demo reaches no network, whatever the config says.
    let no_network = Grants::none().with_network(clawcage_sandbox::NetworkPolicy::new(
        clawcage_sandbox::AllowList::empty(),
    ));
    let grants = Grants::workspace(grant);
    let mut registry = load_bundled(&sandbox, grants.clone(), no_network).await?;
    load_exec(&sandbox, &Config::default(), grants, &mut registry).await?;
    demo::run(registry, &workspace, &temp.path().join("state")).await
}

/// Everything a subcommand needs: the tools, what became of the plugins, where calls are
/// audited, and the configuration the agent reads.
struct Setup {
    registry: ToolRegistry,
    plugins: PluginReport,
    workspace: WorkspaceGrant,
    /// The audit log's path, or `None` when auditing is off.
    audit_path: Option<PathBuf>,
    config: Config,
    /// The file the config came from, if any.
    config_file: Option<PathBuf>,
    state_dir: PathBuf,
    /// The bundled tools again, with the grants of sub-agents (the workspace read-only unless
    /// `[subagents] workspace = "rw"`); `None` when sub-agents are off.
    child_registry: Option<ToolRegistry>,
    /// The inbound bus (sub-agent announcements, cron firings).
    bus: MessageBus,
    /// The cron service, when this command offers the `cron` tool.
    cron: Option<CronSetup>,
}

/// The cron service of this process and the lock that makes it the only one on the state
/// directory (held for the process's lifetime).
struct CronSetup {
    service: Arc<CronService>,
    _owner: std::fs::File,
}

impl Setup {
    /// The registry with its audit log opened.
    fn audited(&self) -> Result<AuditedRegistry, Failure> {
        let log = agent::open_audit_log(self.audit_path.as_deref())?;
        Ok(AuditedRegistry::new(self.registry.clone(), log))
    }
}

/// Read the config, start the sandbox and load the bundled components and the plugins with the
/// operator's grants.
async fn build_registry(common: &CommonArgs, with_cron: bool) -> Result<Setup, Failure> {
    let current = std::env::current_dir().context("cannot read the current directory")?;
    let hint = common.workspace.clone().unwrap_or_else(|| current.clone());
    let (config, config_file) = Config::load(common.config.as_deref(), &hint)?;
    let workspace_path = common
        .workspace
        .clone()
        .or_else(|| config.workspace.path.clone())
        .unwrap_or(current);
    let mut mode = config.workspace_mode()?;
    if common.read_only {
        mode = clawcage_sandbox::FsMode::ReadOnly;
    }
    let workspace = WorkspaceGrant::new(&workspace_path, mode)
        .map_err(|error| Failure::Usage(error.to_string()))?;
    let limits = config.limits()?;
    let grants = Grants::workspace(workspace.clone()).with_limits(limits);
    let web_grants = web_grants(&config, limits)?;

    let state_dir = state_dir(common.state_dir.as_deref())?;
    let sandbox = Sandbox::new(SandboxOptions {
        cache: ArtifactCache::in_dir(state_dir.join("cache").join("components")),
    })
    .map_err(|error| Failure::Tool(error.to_string()))?;
    let mut registry = load_bundled(&sandbox, grants.clone(), web_grants.clone()).await?;
    if config.exec.enabled.unwrap_or(true) {
        load_exec(&sandbox, &config, grants.clone(), &mut registry).await?;
    }
    let child_registry = if config.subagents.enabled() {
        // Never more than the parent: read-only unless configured, and read-only anyway when
        // the parent's workspace is.
        let child_grants = if config.subagents.children_write()? {
            grants.clone()
        } else {
            grants.read_only()
        };
        let mut children = load_bundled(&sandbox, child_grants.clone(), web_grants).await?;
        if config.exec.enabled.unwrap_or(true) {
            load_exec(&sandbox, &config, child_grants, &mut children).await?;
        }
        Some(children)
    } else {
        None
    };
    let bus = MessageBus::new();
    let cron = if with_cron && config.cron.enabled() {
        load_cron(&sandbox, &config, &state_dir, &bus, limits, &mut registry).await?
    } else {
        None
    };
    let plugins = plugins::load_into(&mut registry, &sandbox, &config.plugins, &grants).await;
    let audit_path = match config.audit.enabled {
        Some(false) => None,
        _ => Some(
            config
                .audit
                .path
                .clone()
                .unwrap_or_else(|| state_dir.join("audit.jsonl")),
        ),
    };
    Ok(Setup {
        registry,
        plugins,
        workspace,
        audit_path,
        config,
        config_file,
        state_dir,
        child_registry,
        bus,
        cron,
    })
}

/// Opens the cron service in `<state>/cron` and registers the `cron` tool, granted only the
/// scheduler. One process at a time owns a state directory's jobs: another `chat` gets no cron
/// tool and is told why.
async fn load_cron(
    sandbox: &Arc<Sandbox>,
    config: &Config,
    state_dir: &Path,
    bus: &MessageBus,
    limits: clawcage_sandbox::Limits,
    registry: &mut ToolRegistry,
) -> Result<Option<CronSetup>, Failure> {
    let dir = state_dir.join("cron");
    let owner = std::fs::create_dir_all(&dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("owner.lock"))
        })
        .map_err(|error| {
            Failure::Usage(format!(
                "cannot use {} for cron jobs ({error}); fix --state-dir or set [cron] enabled = false",
                dir.display()
            ))
        })?;
    match owner.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!(
                "note: another clawcage chat runs the cron jobs of {}; this one has no cron tool",
                dir.display()
            );
            return Ok(None);
        }
        Err(std::fs::TryLockError::Error(error)) => {
            return Err(Failure::Usage(format!(
                "cannot lock {} for cron jobs ({error}); fix --state-dir or set [cron] enabled = false",
                dir.join("owner.lock").display()
            )));
        }
    }
    let service = CronService::open(&dir, bus.clone(), config.cron.options()?)
        .map_err(|error| Failure::Usage(error.to_string()))?;
    let scheduler: Arc<dyn clawcage_core::Scheduler> = service.clone();
    load_component(
        sandbox,
        registry,
        "cron",
        components::bundled::CRON,
        Grants::none().with_limits(limits).with_scheduler(scheduler),
    )
    .await?;
    Ok(Some(CronSetup {
        service,
        _owner: owner,
    }))
}

/// Registers the exec tool with the file tools' workspace and limits plus the programs (the
/// bundled ones and `[exec] programs_dir`). Turn it off with `[exec] enabled = false`.
async fn load_exec(
    sandbox: &Arc<Sandbox>,
    config: &Config,
    grants: Grants,
    registry: &mut ToolRegistry,
) -> Result<(), Failure> {
    let programs = sandbox
        .programs(config.exec.programs_dir.as_deref())
        .await
        .map_err(|error| Failure::Tool(error.to_string()))?;
    let exec = ExecGrant {
        programs,
        write_limit_bytes: config.exec_write_limit()?,
    };
    load_component(
        sandbox,
        registry,
        "exec",
        components::bundled::EXEC,
        grants.with_exec(exec),
    )
    .await
}

/// Load the bundled component `name` under `grants` and register its tools.
async fn load_component(
    sandbox: &Arc<Sandbox>,
    registry: &mut ToolRegistry,
    name: &str,
    bytes: &[u8],
    grants: Grants,
) -> Result<(), Failure> {
    let loaded = sandbox
        .load(name, &format!("bundled:{name}"), bytes, grants)
        .await
        .map_err(|error| Failure::Tool(error.to_string()))?;
    for tool in loaded.into_tools() {
        registry
            .register(Arc::new(tool))
            .map_err(|error| Failure::Tool(error.to_string()))?;
    }
    Ok(())
}

/// The web component's grants: no files, the network the config allows (nothing without
/// `[network] allow`), the secrets read from the environment here, and the search endpoint.
fn web_grants(config: &Config, limits: clawcage_sandbox::Limits) -> Result<Grants, Failure> {
    let policy = config.network.policy(|name| std::env::var(name).ok())?;
    let mut grants = Grants::none().with_limits(limits).with_network(policy);
    if let Some(endpoint) = config.web.search_endpoint()? {
        grants = grants
            .with_setting("CLAWCAGE_SEARCH_ENDPOINT", &endpoint)
            .map_err(|error| Failure::Usage(error.to_string()))?;
    }
    Ok(grants)
}

async fn load_bundled(
    sandbox: &Arc<Sandbox>,
    grants: Grants,
    web_grants: Grants,
) -> Result<ToolRegistry, Failure> {
    let mut registry = ToolRegistry::new();
    let bundled: [(&str, &[u8], Grants); 2] = [
        ("file", components::bundled::FILE, grants),
        ("web", components::bundled::WEB, web_grants),
    ];
    for (name, bytes, grants) in bundled {
        load_component(sandbox, &mut registry, name, bytes, grants).await?;
    }
    Ok(registry)
}

fn state_dir(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map(|dir| dir.join("clawcage"))
        .ok_or_else(|| {
            Failure::Usage("cannot find a user state directory; pass --state-dir DIR".to_string())
        })
}

fn print_tools(registry: &ToolRegistry, json: bool) -> Result<(), Failure> {
    if json {
        let tools: Vec<serde_json::Value> = registry
            .tools()
            .map(|tool| {
                let spec = tool.spec();
                serde_json::json!({
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.input_schema,
                    "origin": tool.origin(),
                    "grants": tool.grants_summary(),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&tools)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    for tool in registry.tools() {
        let spec = tool.spec();
        let summary = spec.description.lines().next().unwrap_or_default();
        println!(
            "{}  ({}; {})",
            spec.name,
            tool.origin(),
            tool.grants_summary()
        );
        println!("    {summary}");
        let schema = serde_json::to_string(&spec.input_schema).unwrap_or_default();
        println!("    schema: {schema}");
    }
    Ok(())
}

async fn call(registry: &AuditedRegistry, tool: &str, args: &str) -> Result<(), Failure> {
    match registry.execute(&new_session_id("cli"), tool, args).await {
        Ok(output) => {
            println!("{}", output.text);
            Ok(())
        }
        Err(error @ ToolError::InvalidArgs(_)) => Err(Failure::Usage(error.to_string())),
        Err(error) => Err(Failure::Tool(format!("{tool}: {error}"))),
    }
}

/// `clawcage mcp`: serve the registry over stdio, or over streamable HTTP until Ctrl-C.
async fn serve_mcp(setup: &Setup, http: Option<SocketAddr>) -> Result<(), Failure> {
    let registry = setup.audited()?;
    let tool_count = registry.registry().names().len();
    let instructions = format!(
        "clawcage runs each of these tools in a WebAssembly sandbox. Files are reachable only inside the workspace {} ({}); paths may be relative to it or absolute inside it. Nothing outside it exists for the tools.",
        setup.workspace.path().display(),
        if setup.workspace.mode() == clawcage_sandbox::FsMode::ReadOnly {
            "read-only"
        } else {
            "read-write"
        }
    );
    let Some(address) = http else {
        let server = McpServer::new(registry, &instructions, "mcp-stdio");
        tracing::info!(tools = tool_count, "serving MCP over stdio");
        return server
            .serve_stdio()
            .await
            .map_err(|error| Failure::Tool(error.to_string()));
    };
    let server = McpServer::new(registry, &instructions, "mcp-http");
    if !address.ip().is_loopback() {
        return Err(Failure::Usage(
            clawcage_mcp::ServeError::NotLoopback(address).to_string(),
        ));
    }
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| Failure::Usage(format!("cannot listen on {address}: {error}")))?;
    let bound = listener
        .local_addr()
        .map_err(|error| Failure::Tool(error.to_string()))?;
    eprintln!(
        "clawcage mcp: serving {tool_count} tools over streamable HTTP at http://{bound}{} (Ctrl-C stops)",
        clawcage_mcp::HTTP_PATH
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    server
        .serve_http(listener, shutdown)
        .await
        .map_err(|error| Failure::Tool(error.to_string()))
}
