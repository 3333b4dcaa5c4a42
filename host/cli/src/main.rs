//! The `clawcage` command: a thin clap front end that reads the configuration, starts the sandbox,
//! loads the bundled tool components into a registry and runs one subcommand. Exit codes: 0 ok,
//! 1 the tool or task failed (message on stderr), 2 usage or configuration error.

mod config;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use clawcage_agent::ToolRegistry;
use clawcage_core::ToolError;
use clawcage_sandbox::{
    ArtifactCache, ExecGrant, Grants, Sandbox, SandboxOptions, WorkspaceGrant, components,
};

use crate::config::Config;

/// clawcage: an agent runtime whose every tool runs as a WebAssembly component in a capability
/// sandbox. A tool reaches only the workspace directory granted to it, within memory and time
/// limits; nothing else on the machine exists for it.
#[derive(Debug, Parser)]
#[command(name = "clawcage", version, about, long_about = None, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
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
    let registry = build_registry(&cli.common).await?;
    match cli.command {
        Command::Tools { json } => print_tools(&registry, json),
        Command::Call { tool, args } => call(&registry, &tool, &args).await,
    }
}

/// Read the config, start the sandbox and load the bundled components with the operator's
/// grants.
async fn build_registry(common: &CommonArgs) -> Result<ToolRegistry, Failure> {
    let current = std::env::current_dir().context("cannot read the current directory")?;
    let hint = common.workspace.clone().unwrap_or_else(|| current.clone());
    let (config, _source) = Config::load(common.config.as_deref(), &hint)?;
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
    let grants = Grants::workspace(workspace).with_limits(config.limits()?);

    let state_dir = state_dir(common.state_dir.as_deref())?;
    let sandbox = Sandbox::new(SandboxOptions {
        cache: ArtifactCache::in_dir(state_dir.join("cache").join("components")),
    })
    .map_err(|error| Failure::Tool(error.to_string()))?;
    let mut registry = load_bundled(&sandbox, grants.clone()).await?;
    if config.exec.enabled.unwrap_or(true) {
        load_exec(&sandbox, &config, grants, &mut registry).await?;
    }
    Ok(registry)
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
    let loaded = sandbox
        .load(
            "exec",
            "bundled:exec",
            components::bundled::EXEC,
            grants.with_exec(exec),
        )
        .await
        .map_err(|error| Failure::Tool(error.to_string()))?;
    for tool in loaded.into_tools() {
        registry
            .register(Arc::new(tool))
            .map_err(|error| Failure::Tool(error.to_string()))?;
    }
    Ok(())
}

async fn load_bundled(sandbox: &Arc<Sandbox>, grants: Grants) -> Result<ToolRegistry, Failure> {
    let mut registry = ToolRegistry::new();
    let bundled: [(&str, &[u8]); 1] = [("file", components::bundled::FILE)];
    for (name, bytes) in bundled {
        let loaded = sandbox
            .load(name, &format!("bundled:{name}"), bytes, grants.clone())
            .await
            .map_err(|error| Failure::Tool(error.to_string()))?;
        for tool in loaded.into_tools() {
            registry
                .register(Arc::new(tool))
                .map_err(|error| Failure::Tool(error.to_string()))?;
        }
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

async fn call(registry: &ToolRegistry, tool: &str, args: &str) -> Result<(), Failure> {
    match registry.execute(tool, args).await {
        Ok(output) => {
            println!("{}", output.text);
            Ok(())
        }
        Err(error @ ToolError::InvalidArgs(_)) => Err(Failure::Usage(error.to_string())),
        Err(error) => Err(Failure::Tool(format!("{tool}: {error}"))),
    }
}
