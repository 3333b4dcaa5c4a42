//! `clawcage gateway`'s command line and what follows from it before the service starts: the
//! connection caps and timeout, sized from the open-file limit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clawcage_runtime::Error;

use crate::{DEFAULT_BIND, limits};

/// `clawcage gateway`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// `status`: whether a gateway runs on this state directory, and where.
    #[command(subcommand)]
    pub command: Option<GatewayCommand>,
    /// The address to listen on. A non-loopback address needs --token.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_BIND)]
    pub bind: SocketAddr,
    /// The token clients must present (at least 16 characters). Default: generated on the first
    /// start into <state-dir>/gateway/token.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CLAWCAGE_GATEWAY_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Another origin whose pages may connect (repeatable), e.g. https://chat.example.org. The
    /// gateway's own page always may.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// chat.send and agent requests per minute on one connection.
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub sends_per_minute: u32,
    /// Connections at once in all, authenticated or not. Default: what the open-file limit
    /// allows beside the gateway's own files, at most 8192.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Of those, connections that have not presented the token yet; when they are all taken,
    /// the oldest is closed for a new one. Default: a quarter of --max-connections (8 to 1024).
    #[arg(long, value_name = "N")]
    pub max_unauthenticated: Option<usize>,
    /// Seconds a connection without the token may take for each request's headers (and idle
    /// between requests) and for the WebSocket's connect; it lives three times this at most.
    #[arg(long, value_name = "SECONDS", default_value_t = limits::UNAUTHENTICATED_TIMEOUT.as_secs())]
    pub unauthenticated_timeout: u64,
    /// Which API to speak: anthropic, openai (any OpenAI-compatible server) or scripted (plays
    /// --script). Default: [provider] kind in the config, else anthropic.
    #[arg(long, value_name = "NAME", help_heading = "Model")]
    pub provider: Option<String>,
    /// The model. Default: [provider] model, else claude-sonnet-4-5 for anthropic.
    #[arg(long, value_name = "MODEL", help_heading = "Model")]
    pub model: Option<String>,
    /// The server. Anthropic: https://api.anthropic.com (the client appends /v1/messages);
    /// OpenAI-compatible: http://localhost:11434/v1 (the client appends /chat/completions).
    #[arg(long, value_name = "URL", help_heading = "Model")]
    pub base_url: Option<String>,
    /// The recorded script the scripted provider plays (JSON).
    #[arg(long, value_name = "FILE", help_heading = "Model")]
    pub script: Option<PathBuf>,
}

/// The connection caps and timeout for `args`, sized from the open-file limit, which is raised
/// first as far as the hard limit allows; what could not be had is logged.
pub(crate) fn connection_limits(args: &GatewayArgs) -> Result<limits::Limits, Error> {
    let open_files = match limits::raise_open_file_limit() {
        Ok((soft, hard)) => {
            tracing::info!(soft, hard, "open-file limit");
            Some(soft)
        }
        Err(why) => {
            tracing::warn!("{why}; the connection caps are sized from the limit as it is");
            limits::open_file_limit().map(|(soft, _)| soft)
        }
    };
    let sized = limits::Limits::for_open_files(open_files.unwrap_or(1024));
    let max_connections = args.max_connections.unwrap_or(sized.max_connections);
    let limits = limits::Limits {
        max_connections,
        max_unauthenticated: args
            .max_unauthenticated
            .unwrap_or_else(|| (max_connections / 4).clamp(1, sized.max_unauthenticated)),
        unauthenticated_timeout: Duration::from_secs(args.unauthenticated_timeout),
    };
    limits.check(open_files).map_err(Error::Usage)?;
    if let Some(open_files) = open_files
        && open_files < 4096
    {
        tracing::warn!(
            "the open-file limit is {open_files}, and no more could be had: the gateway holds {} connections at most ({} unauthenticated); raise it with `ulimit -Hn` (as root) or LimitNOFILE= in a systemd unit",
            limits.max_connections,
            limits.max_unauthenticated
        );
    }
    tracing::info!(
        max_connections = limits.max_connections,
        max_unauthenticated = limits.max_unauthenticated,
        timeout_s = limits.unauthenticated_timeout.as_secs(),
        "connection caps"
    );
    Ok(limits)
}

/// `clawcage gateway ...` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum GatewayCommand {
    /// Say whether a gateway runs on this state directory, and where (exit 1 when none does).
    Status,
}
