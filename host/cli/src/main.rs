//! The `clawcage` command: a thin clap front end. It parses the command line, asks the runtime
//! (`clawcage-runtime`, the composition root) for what the subcommand needs — the tools for
//! `tools` and `call`, the audited tools for the MCP server (`clawcage-mcp`), an agent for `run`,
//! `chat` and `demo` — and renders the result. Exit codes: 0 ok, 1 the tool or task failed
//! (message on stderr), 2 usage or configuration error.

/// `println!` for the command's output: a reader that went away (`clawcage tools | head -1`)
/// ends the process quietly with status 0 instead of a panic on the broken pipe.
macro_rules! outln {
    () => {
        $crate::render::out("")
    };
    ($($arg:tt)*) => {
        $crate::render::out(&format!($($arg)*))
    };
}

mod args;
mod chat;
mod cluster;
mod demo;
mod keys;
mod log_writer;
mod plugins;
mod programs;
mod prompt;
mod remote_chat;
mod render;
mod skills;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use args::{
    ApprovalsCommand, Cli, Command, CronCommand, ProgramsCommand, ProviderArgs, state_dir_arg,
};
use clap::Parser;
use clawcage_agent::AuditedRegistry;
use clawcage_agent::audit::new_session_id;
use clawcage_core::ToolError;
use clawcage_mcp::McpServer;
use clawcage_runtime::{Options, Runtime, TrustStore};
use clawcage_sandbox::CompileProgress;

/// An error with the exit code it maps to.
enum Failure {
    /// Exit 1: the tool or task failed.
    Tool(String),
    /// Exit 2: usage or configuration error.
    Usage(String),
}

impl From<clawcage_runtime::Error> for Failure {
    fn from(error: clawcage_runtime::Error) -> Self {
        match error {
            clawcage_runtime::Error::Usage(message) => Failure::Usage(message),
            clawcage_runtime::Error::Failed(message) => {
                Failure::Tool(format!("clawcage: {message}"))
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(
        cli.common.verbose,
        matches!(cli.command, Command::Gateway(_)),
    );
    // A one-call command does one thing at a time: its runtime is the main thread alone (no
    // worker threads to start, size from the cgroup files and park again). Everything else
    // serves or streams while tools run, on a worker per core.
    let mut builder = if is_one_call(&cli.command) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            clawcage_runtime::tell!("clawcage: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli));
    // A call abandoned at its deadline may still hold a blocking thread: do not wait for it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Tool(message)) => {
            clawcage_runtime::tell!("{message}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(message)) => {
            clawcage_runtime::tell!("clawcage: {message}");
            ExitCode::from(2)
        }
    }
}

/// Whether `command` makes one tool call or listing and ends (`call`, `tools`): it needs no
/// worker threads, no instance pool and no instance made ahead.
fn is_one_call(command: &Command) -> bool {
    matches!(command, Command::Call { .. } | Command::Tools { .. })
}

/// Logs go to stderr, coloured only when stderr is a terminal. The default shows warnings;
/// `-v` shows clawcage's own events (debug) and `-vv` traces them, while the libraries below
/// (wasmtime, cranelift, hyper, rmcp) stay at warnings and info. The gateway says at info level
/// when a client connects or leaves and when a turn starts or ends. `RUST_LOG` overrides.
fn init_tracing(verbose: u8, gateway: bool) {
    use std::io::IsTerminal as _;
    let ours = [
        "clawcage",
        "clawcage_cli",
        "clawcage_core",
        "clawcage_sandbox",
        "clawcage_agent",
        "clawcage_runtime",
        "clawcage_mcp",
        "clawcage_gateway",
        "clawcage_acp",
    ];
    let default = match verbose {
        // The ACP SDK logs every error response it sends (a refused cwd, a malformed line) as a
        // warning; those are answers to the client, not the operator's concern.
        0 if gateway => "warn,clawcage_gateway=info".to_string(),
        0 => "warn,agent_client_protocol=error".to_string(),
        level => {
            let (own, others) = if level == 1 {
                ("debug", "warn")
            } else {
                ("trace", "info")
            };
            let mut filter = others.to_string();
            for target in ours {
                filter.push_str(&format!(",{target}={own}"));
            }
            filter
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(log_writer::ScrubbedStderr)
        .with_ansi(std::io::stderr().is_terminal() && render::colour_allowed())
        // A failed write to a closed stderr is dropped, not reported on stderr (which panics
        // the task that logged, e.g. a server's request handler).
        .log_internal_errors(false)
        .init();
}

/// The options every front end hands the runtime, from the command line.
fn runtime_options(cli: &Cli) -> Options {
    let provider = match &cli.command {
        Command::Run { provider, .. }
        | Command::Chat { provider, .. }
        | Command::Acp { provider } => provider.clone(),
        Command::Gateway(args) => ProviderArgs {
            provider: args.provider.clone(),
            model: args.model.clone(),
            base_url: args.base_url.clone(),
            script: args.script.clone(),
        },
        _ => ProviderArgs::default(),
    };
    Options {
        config: cli.common.config.clone(),
        state_dir: state_dir_arg(cli.common.state_dir.as_ref()),
        workspace: cli.common.workspace.clone(),
        read_only: cli.common.read_only,
        provider: provider.overrides(&cli.early_provider),
        // Written from whichever task compiles (a tool call's, in a server): a closed stderr
        // must not fail that task, so the write's error is dropped.
        // Above a chat's live line (a running call's seconds), never through it.
        progress: CompileProgress::to(|line| render::interject(&format!("clawcage: {line}"))),
        one_call: is_one_call(&cli.command),
        external_agents: Some(clawcage_acp::external_agents()),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let options = runtime_options(&cli);
    match cli.command {
        Command::Demo => demo::run(&options).await,
        Command::Trust => trust(&options),
        Command::Sessions { json } => sessions(&options, json),
        Command::Approvals(command) => approvals(&options, command).await,
        Command::Cron(command) => {
            let runtime = open(options).await?;
            cron(&runtime, command).await
        }
        Command::Programs(command) => programs::run(options, command).await,
        Command::Plugins(command) => plugins::run(options, command).await,
        Command::Cluster(command) => cluster::run(options, command).await,
        Command::Skills(command) => skills::run(options, command).await,
        Command::Tools { long, json } => {
            let runtime = open(options).await?;
            print_tools(&runtime, long, json).await
        }
        Command::Call { tool, args } => {
            let runtime = open(options).await?;
            call(&runtime.audited_tools()?, &tool, &args).await
        }
        Command::Gateway(args) => Ok(clawcage_gateway::run(options, args).await?),
        Command::Pairing(args) => {
            // With [cluster], the pairings every gateway host shares.
            let shared = cluster::shared_record_of(
                cluster::settings_of(&options)?,
                clawcage_cluster::records::PAIRING_RECORD,
            )
            .await?;
            let store = match shared {
                Some(record) => clawcage_gateway::channels::pairing::PairingStore::in_store(record),
                None => clawcage_gateway::channels::pairing::PairingStore::new(
                    &clawcage_runtime::state_dir(options.state_dir.as_deref())?,
                ),
            };
            Ok(clawcage_gateway::channels::pairing::run(&store, &args)?)
        }
        Command::Acp { .. } => Ok(clawcage_acp::run(options).await?),
        Command::Mcp { http } => {
            let runtime = open(options).await?;
            serve_mcp(&runtime, http).await
        }
        Command::Run {
            task,
            session,
            show_reasoning,
            ..
        } => {
            // A missing API key is said before the tools are loaded (a first start compiles).
            clawcage_runtime::check_provider(&options)?;
            let runtime = open(options).await?;
            run_task(runtime, &task, session, show_reasoning).await
        }
        Command::Chat {
            session,
            gateway: Some(url),
            token,
            ..
        } => {
            let token = match token {
                Some(token) => token,
                None => clawcage_gateway::saved_token(&clawcage_runtime::state_dir(
                    options.state_dir.as_deref(),
                )?)?,
            };
            let session = session.unwrap_or_else(|| "agent:main:cli:main".to_string());
            remote_chat::run(&url, &token, session).await
        }
        Command::Chat { session, .. } => {
            let session = session.unwrap_or_else(|| "chat".to_string());
            clawcage_runtime::check_provider(&options)?;
            let runtime = open(options).await?;
            chat::run(runtime, session).await
        }
    }
}

/// The runtime `options` describe, with refused plugins reported on stderr.
async fn open(options: Options) -> Result<Runtime, Failure> {
    let runtime = Runtime::open(options).await?;
    // From here the log knows every secret value the process holds.
    log_writer::scrub_with(runtime.redactor().clone());
    render::report_plugin_problems(runtime.plugins());
    Ok(runtime)
}

/// `clawcage sessions`: the transcripts of the state directory, newest first.
/// `clawcage approvals list|revoke`: the state directory's allow-always decisions, or, with
/// `[cluster]`, the ones every gateway host shares.
async fn approvals(options: &Options, command: ApprovalsCommand) -> Result<(), Failure> {
    let state_dir = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
    let store = clawcage_agent::ApprovalStore::in_state_dir(&state_dir);
    if let Some(shared) = cluster::shared_record_of(
        cluster::settings_of(options)?,
        clawcage_cluster::records::APPROVALS_RECORD,
    )
    .await?
    {
        store.share_in(shared);
    }
    let failure =
        |error: clawcage_agent::ApprovalError| Failure::Tool(format!("clawcage: {error}"));
    match command {
        ApprovalsCommand::List { json } => {
            let stored = store.list().map_err(failure)?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&stored).unwrap_or_else(|_| "[]".to_string())
                );
            } else if stored.is_empty() {
                outln!("no kept approvals in {}", store.describe());
            } else {
                for approval in stored {
                    outln!(
                        "{}  {}  {}  {}",
                        approval.id,
                        approval.kind,
                        approval.rule(),
                        approval.created
                    );
                }
            }
            Ok(())
        }
        ApprovalsCommand::Revoke { id } => {
            let removed = store.revoke(&id).map_err(failure)?;
            outln!(
                "revoked {}: {} {}",
                removed.id,
                removed.kind,
                removed.rule()
            );
            Ok(())
        }
    }
}

fn sessions(options: &Options, json: bool) -> Result<(), Failure> {
    let state_dir = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
    let store =
        clawcage_agent::JsonlTranscripts::new(clawcage_agent::StateDir::new(state_dir).sessions());
    let sessions = clawcage_agent::TranscriptStore::sessions(&store).map_err(|error| {
        Failure::Tool(format!(
            "clawcage: cannot list the sessions in {}: {error}",
            store.dir().display()
        ))
    })?;
    if json {
        let list: Vec<serde_json::Value> = sessions
            .iter()
            .map(|session| {
                serde_json::json!({
                    "key": session.key,
                    "last_active": render::rfc3339(session.modified_ms),
                    "bytes": session.bytes,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&list)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        outln!("{text}");
        return Ok(());
    }
    if sessions.is_empty() {
        outln!("No sessions in {} yet.", store.dir().display());
        return Ok(());
    }
    for session in &sessions {
        outln!(
            "{}  last active {}  {}",
            session.key,
            render::rfc3339(session.modified_ms),
            render::human_bytes(session.bytes)
        );
    }
    Ok(())
}

/// `clawcage cron ...`: one call of the `cron` tool on the state directory's jobs, or, with
/// `[cluster]`, on the jobs the cluster's gateways share.
async fn cron(runtime: &Runtime, command: CronCommand) -> Result<(), Failure> {
    let tool = runtime
        .cron_tool(cluster::shared_record(runtime, clawcage_cluster::records::CRON_RECORD).await?)
        .await?;
    let (args, session) = match command {
        CronCommand::List => (serde_json::json!({"action": "list"}), None),
        CronCommand::Remove { id } => (serde_json::json!({"action": "remove", "id": id}), None),
        CronCommand::Add {
            message,
            every,
            cron,
            timezone,
            name,
            session,
        } => {
            let mut args = serde_json::json!({"action": "add", "message": message});
            let fields = [
                ("every_seconds", every.map(serde_json::Value::from)),
                ("cron", cron.map(serde_json::Value::from)),
                ("timezone", timezone.map(serde_json::Value::from)),
                ("name", name.map(serde_json::Value::from)),
            ];
            for (field, value) in fields {
                if let Some(value) = value {
                    args[field] = value;
                }
            }
            (args, session)
        }
    };
    let session = session.unwrap_or_else(|| {
        runtime
            .config()
            .cron
            .options()
            .map(|options| options.default_session)
            .unwrap_or_else(|_| "main".to_string())
    });
    let result = clawcage_agent::session::with_session_key(
        session,
        tool.execute_value(&new_session_id("cli-cron"), "cron", &args),
    )
    .await;
    match result {
        Ok(output) => {
            outln!("{}", output.text);
            Ok(())
        }
        Err(error @ ToolError::InvalidArgs(_)) => Err(Failure::Usage(error.to_string())),
        Err(error) => Err(Failure::Tool(format!("cron: {error}"))),
    }
}

/// `clawcage trust`: records the SHA-256 of the configuration file that would be used, so a
/// file inside the workspace is accepted as it is now.
fn trust(options: &Options) -> Result<(), Failure> {
    let located = clawcage_runtime::locate(options)?;
    let Some(source) = &located.source else {
        return Err(Failure::Usage(
            "there is no configuration file to trust: none was found (--config FILE, clawcage.toml in the workspace, or the user config)".to_string(),
        ));
    };
    let store = TrustStore::in_state_dir(&located.state_dir);
    store.trust(source).map_err(|error| {
        Failure::Usage(format!(
            "cannot record the trust in {}: {error}; check --state-dir",
            store.path().display()
        ))
    })?;
    outln!(
        "trusted {} as it is now (sha256 {}); a change to it needs a new `clawcage trust`",
        source.path.display(),
        source.sha256
    );
    Ok(())
}

/// `clawcage run`: one task; the answer on stdout, progress (and with `show_reasoning` the
/// model's reasoning) on stderr. A turn that ends without answer text fails with exit status 1.
async fn run_task(
    mut runtime: Runtime,
    task: &str,
    session: Option<String>,
    show_reasoning: bool,
) -> Result<(), Failure> {
    let console =
        Arc::new(render::Console::new(render::Sink::Stderr, false).with_reasoning(show_reasoning));
    // What external ACP agents (attached by the runtime) stream is shown as it comes.
    let output = {
        let console = console.clone();
        Arc::new(move |_parent: &str, child: &str, text: &str| {
            console.line(&format!("  [{child}] {text}"));
        })
    };
    let agent = runtime
        .host(
            clawcage_runtime::Lifetime::OneShot,
            clawcage_runtime::AgentOptions {
                stream: false,
                subagent_output: Some(output),
                ..clawcage_runtime::AgentOptions::new(render::print_messages(console.clone()))
            },
        )
        .await?;
    if agent.scripted {
        console.line(&format!(
            "note: the answers come from a recorded script ({}), not from a model",
            agent.label
        ));
    }
    let key = match session {
        Some(key) => key,
        None => {
            let key = format!(
                "run-{}-{}",
                clawcage_agent::transcript::now_ms(),
                std::process::id()
            );
            console.line(&format!("session {key} (continue it with --session {key})"));
            key
        }
    };
    let notes = console.clone();
    // On a terminal, stderr says the model is working until its first word or call.
    console.activate();
    console.thinking();
    let outcome = agent
        .run_task(
            &key,
            task,
            Arc::new(render::Shown(console.clone())),
            &move |line: &str| notes.line(line),
        )
        .await
        .inspect_err(|_| console.break_line())?;
    console.end_turn(
        &outcome.answered_by,
        outcome.usage,
        agent.sessions.usage(&key),
    );
    match outcome.end {
        clawcage_agent::TurnEnd::Answered => {
            outln!("{}", outcome.text);
            Ok(())
        }
        clawcage_agent::TurnEnd::IterationLimit
        | clawcage_agent::TurnEnd::LoopDetected { .. }
        | clawcage_agent::TurnEnd::NoAnswer => {
            Err(Failure::Tool(format!("clawcage: {}", outcome.text)))
        }
    }
}

async fn print_tools(runtime: &Runtime, long: bool, json: bool) -> Result<(), Failure> {
    let catalog = runtime.tool_catalog().await?;
    if json {
        let tools: Vec<serde_json::Value> = catalog
            .iter()
            .map(|entry| {
                let tool = &entry.tool;
                let spec = tool.spec();
                serde_json::json!({
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.input_schema,
                    "origin": tool.origin(),
                    "available_in": entry.available,
                    "grants": tool.grants_summary(),
                    "grants_detail": tool.grants_json(),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&tools)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        outln!("{text}");
        return Ok(());
    }
    if !long {
        for entry in &catalog {
            let tool = &entry.tool;
            let spec = tool.spec();
            outln!(
                "{}  ({}; {})  — {}",
                spec.name,
                tool.origin(),
                tool.grants_summary(),
                first_sentence(&spec.description)
            );
        }
        outln!(
            "(clawcage tools --long: descriptions, grants and schemas in full; --json for programs)"
        );
        render::print_plugin_report(runtime.plugins());
        return Ok(());
    }
    for entry in &catalog {
        let tool = &entry.tool;
        let spec = tool.spec();
        let summary = spec.description.lines().next().unwrap_or_default();
        outln!(
            "{}  ({}; {})",
            spec.name,
            tool.origin(),
            tool.grants_summary()
        );
        outln!("    {summary}");
        outln!("    available in: {}", entry.available);
        let schema = serde_json::to_string(&spec.input_schema).unwrap_or_default();
        outln!("    schema: {schema}");
    }
    render::print_plugin_report(runtime.plugins());
    Ok(())
}

/// The first sentence of a tool's description, for a one-line listing.
fn first_sentence(description: &str) -> &str {
    let first_line = description.lines().next().unwrap_or_default();
    first_line
        .split(". ")
        .next()
        .unwrap_or(first_line)
        .trim_end_matches('.')
}

async fn call(registry: &AuditedRegistry, tool: &str, args: &str) -> Result<(), Failure> {
    match registry.execute(&new_session_id("cli"), tool, args).await {
        Ok(output) => {
            outln!("{}", output.text);
            Ok(())
        }
        Err(error @ ToolError::InvalidArgs(_)) => Err(Failure::Usage(error.to_string())),
        Err(error) => Err(Failure::Tool(format!(
            "{tool}: {}",
            render::without_repeated_label(&error.to_string())
        ))),
    }
}

/// The address `given` names (`HOST:PORT`, the host a name or an IP address): every address it
/// resolves to must be loopback, since the endpoint has no authentication.
async fn loopback_address(given: &str) -> Result<SocketAddr, Failure> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(given)
        .await
        .map_err(|error| {
            Failure::Usage(format!(
                "--http {given}: not an address to listen on ({error}); write HOST:PORT, e.g. 127.0.0.1:8765 or localhost:8765"
            ))
        })?
        .collect();
    let Some(first) = resolved.first().copied() else {
        return Err(Failure::Usage(format!(
            "--http {given}: the name resolves to no address"
        )));
    };
    if let Some(outside) = resolved.iter().find(|address| !address.ip().is_loopback()) {
        return Err(Failure::Usage(
            clawcage_mcp::ServeError::NotLoopback(*outside).to_string(),
        ));
    }
    Ok(first)
}

/// `clawcage mcp`: serve the registry over stdio, or over streamable HTTP until Ctrl-C.
async fn serve_mcp(runtime: &Runtime, http: Option<String>) -> Result<(), Failure> {
    let registry = runtime.audited_tools()?;
    let tool_count = registry.registry().names().len();
    let instructions = format!(
        "clawcage runs each of these tools in a WebAssembly sandbox. Files are reachable only inside the workspace {} ({}); paths may be relative to it or absolute inside it. Nothing outside it exists for the tools.",
        runtime.workspace().path().display(),
        if runtime.workspace().mode() == clawcage_sandbox::FsMode::ReadOnly {
            "read-only"
        } else {
            "read-write"
        }
    );
    let Some(address) = http else {
        let server = McpServer::new(registry, &instructions, "mcp-stdio")
            .with_call_time_limit(runtime.limits().timeout)
            .with_approvals(runtime.approvals().clone());
        tracing::info!(tools = tool_count, "serving MCP over stdio");
        return server
            .serve_stdio()
            .await
            .map_err(|error| Failure::Tool(error.to_string()));
    };
    let server = McpServer::new(registry, &instructions, "mcp-http")
        .with_call_time_limit(runtime.limits().timeout)
        .with_approvals(runtime.approvals().clone());
    let address = loopback_address(&address).await?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| Failure::Usage(format!("cannot listen on {address}: {error}")))?;
    let bound = listener
        .local_addr()
        .map_err(|error| Failure::Tool(error.to_string()))?;
    clawcage_runtime::tell!(
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
