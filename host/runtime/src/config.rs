//! The operator's configuration: a TOML file (`--config`, else `clawcage.toml` in the workspace,
//! else `clawcage/config.toml` in the user config dir) whose unknown keys are an error, merged
//! with the command-line flags that override it. The file is read once, as a regular file of
//! bounded size (a FIFO or device is refused, never waited on), and the SHA-256 of exactly the
//! bytes parsed is kept, so the trust check (`trust.rs`) judges what was used. A `clawcage.toml`
//! in the workspace is never followed through a symlink, and a parse error names the line, the
//! column and at most the offending token — never the file's content. Naming: a table of the
//! file as read is a `*Section` (`[exec]` is `ExecSection`); what a section gives once checked is
//! a `*Settings` or the consumer's own `*Config`/`*Options` type.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clawcage_sandbox::{FsMode, Limits, PluginsSection};
use serde::Deserialize;
use sha2::Digest as _;

use clawcage_core::files::{Symlinks, read_regular_text};

use crate::network_config::{NetworkSection, WebSection};

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The name of the configuration file looked for in the workspace.
pub const WORKSPACE_CONFIG_NAME: &str = "clawcage.toml";

/// Where the configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSource {
    /// The file (its directory resolved to a canonical path).
    pub path: PathBuf,
    /// Lowercase hex SHA-256 of the bytes that were parsed.
    pub sha256: String,
    /// Whether the operator named it with `--config`.
    pub explicit: bool,
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[workspace]`
    #[serde(default)]
    pub workspace: WorkspaceSection,
    /// `[limits]`
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[provider]`: the model and its fail-over chain.
    #[serde(default)]
    pub provider: crate::provider_config::ProviderSection,
    /// `[agent]`: the loop and the sessions.
    #[serde(default)]
    pub agent: crate::provider_config::AgentSection,
    /// `[network]`
    #[serde(default)]
    pub network: NetworkSection,
    /// `[web]`
    #[serde(default)]
    pub web: WebSection,
    /// `[exec]`
    #[serde(default)]
    pub exec: ExecSection,
    /// `[plugins]`: the plugins directory and the operator's grant for each plugin.
    #[serde(default)]
    pub plugins: PluginsSection,
    /// `[audit]`: the audit log of tool calls.
    #[serde(default)]
    pub audit: AuditSection,
    /// `[subagents]`: spawning, limits and what children may reach.
    #[serde(default)]
    pub subagents: crate::subagent_config::SubagentSection,
    /// `[cron]`: scheduled jobs.
    #[serde(default)]
    pub cron: crate::cron_config::CronSection,
    /// `[queue]`: what a message that reaches a busy session does.
    #[serde(default)]
    pub queue: crate::queue_config::QueueSection,
    /// `[models."NAME"]`: what clawcage knows of each model (its context window).
    #[serde(default)]
    pub models: std::collections::BTreeMap<String, crate::context_config::ModelSection>,
    /// `[context]`: when a session's history is compacted.
    #[serde(default)]
    pub context: crate::context_config::ContextSection,
    /// `[budget]`: token budgets per session and per day.
    #[serde(default)]
    pub budget: crate::context_config::BudgetSection,
    /// `[approvals]`: what exec may run and when a person is asked.
    #[serde(default)]
    pub approvals: crate::approval_config::ApprovalsSection,
    /// `[channels]`: Telegram and webhooks, served by the gateway.
    #[serde(default)]
    pub channels: crate::channel_config::ChannelsSection,
    /// `[acp]`: the workspaces editors may open over ACP, and the external ACP agents.
    #[serde(default)]
    pub acp: crate::acp_config::AcpSection,
    /// `[cluster]`: the NATS servers several gateway hosts share sessions through.
    #[serde(default)]
    pub cluster: crate::cluster_config::ClusterSection,
}

/// The file candidates are read from.
struct Candidate {
    path: PathBuf,
    explicit: bool,
    symlinks: Symlinks,
}

/// `[exec]`: the exec tool (a shell inside the sandbox that runs WASI programs).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// Offer the exec tool (default true). It runs only WebAssembly programs inside the sandbox,
    /// with the same workspace and limits as the file tools.
    pub enabled: Option<bool>,
    /// A directory of extra WASI command components, one `NAME.wasm` per program; relative to
    /// this file.
    pub programs_dir: Option<PathBuf>,
    /// MiB that the programs of one call may write to files together (default 1024).
    pub write_limit_mib: Option<u64>,
}

/// `[audit]`: where every tool call is recorded.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Record tool calls (default true).
    pub enabled: Option<bool>,
    /// The JSONL file; relative paths are relative to the config file. Default:
    /// `audit.jsonl` in the state directory.
    pub path: Option<PathBuf>,
}

/// `[workspace]`: the directory tools may reach.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSection {
    /// The directory; relative paths are relative to the config file. Default: the current
    /// directory.
    pub path: Option<PathBuf>,
    /// `"rw"` (default) or `"ro"`.
    pub mode: Option<FsMode>,
}

/// `[limits]`: per-call limits of every tool.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Memory per call, in MiB (default 256).
    pub memory_mib: Option<u64>,
    /// Wall-clock time per call, in seconds (default 30).
    pub timeout_secs: Option<f64>,
    /// Characters of tool output kept (default 100000).
    pub max_output_chars: Option<usize>,
}

impl Config {
    /// Read the config: `explicit` if given (it must exist), else the first of the default
    /// locations that exists, else the defaults. Returns the config and where it came from.
    pub fn load(
        explicit: Option<&Path>,
        workspace_hint: &Path,
    ) -> anyhow::Result<(Config, Option<ConfigSource>)> {
        let candidates: Vec<Candidate> = match explicit {
            Some(path) => {
                if std::fs::symlink_metadata(path).is_err() {
                    bail!(
                        "the config file {} does not exist; check the --config path",
                        path.display()
                    );
                }
                vec![Candidate {
                    path: path.to_path_buf(),
                    explicit: true,
                    symlinks: Symlinks::Follow,
                }]
            }
            None => {
                let mut found = vec![Candidate {
                    path: workspace_hint.join(WORKSPACE_CONFIG_NAME),
                    explicit: false,
                    // A tool may have planted a link to a host file here.
                    symlinks: Symlinks::Refuse,
                }];
                if let Some(dir) = user_config_dir() {
                    found.push(Candidate {
                        path: dir.join("config.toml"),
                        explicit: false,
                        symlinks: Symlinks::Follow,
                    });
                }
                found
            }
        };
        for candidate in candidates {
            // Anything at the path counts (a symlink or FIFO is refused below, not skipped).
            if std::fs::symlink_metadata(&candidate.path).is_err() {
                continue;
            }
            let path = canonical_location(&candidate.path);
            let text = read_regular_text(&candidate.path, MAX_CONFIG_BYTES, candidate.symlinks)
                .with_context(|| format!("cannot read the config file {}", path.display()))?;
            let sha256 = hex::encode(sha2::Sha256::digest(text.as_bytes()));
            let mut config: Config = toml::from_str(&text).map_err(|error| {
                anyhow::anyhow!(
                    "the config file {} is not valid: {}",
                    path.display(),
                    describe_parse_error(&text, &error)
                )
            })?;
            if let Some(parent) = path.parent() {
                for relative in [
                    &mut config.workspace.path,
                    &mut config.plugins.dir,
                    &mut config.audit.path,
                    &mut config.exec.programs_dir,
                ]
                .into_iter()
                .flatten()
                {
                    if relative.is_relative() {
                        *relative = parent.join(&*relative);
                    }
                }
                for key in &mut config.plugins.trusted_keys {
                    if key.is_relative() {
                        *key = parent.join(&*key);
                    }
                }
            }
            config.plugins.validate().map_err(|error| {
                anyhow::anyhow!("the config file {} is not valid: {error}", path.display())
            })?;
            config.validate().map_err(|error| {
                anyhow::anyhow!("the config file {} is not valid: {error:#}", path.display())
            })?;
            let source = ConfigSource {
                path,
                sha256,
                explicit: candidate.explicit,
            };
            return Ok((config, Some(source)));
        }
        Ok((Config::default(), None))
    }

    /// Checks every value that can be checked without the environment (keys and tokens come
    /// from it later), so every command refuses a wrong value at load, with the same message,
    /// whichever sections it goes on to use.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.workspace_mode()?;
        self.exec_write_limit()?;
        self.limits()?;
        self.agent.agent_config(false)?;
        self.agent.history_limit()?;
        self.network.limits()?;
        self.web.search_endpoint()?;
        self.subagents.config()?;
        self.subagents.children_write()?;
        self.cron.options()?;
        self.queue.config()?;
        self.budget.config()?;
        self.approvals.settings()?;
        self.cluster.settings(None)?;
        crate::context_config::context_policy(
            "",
            u64::from(
                self.provider
                    .max_tokens
                    .unwrap_or(clawcage_agent::provider::DEFAULT_MAX_TOKENS),
            ),
            &self.models,
            &self.context,
            &[],
        )?;
        Ok(())
    }

    /// The workspace mode (read-write unless the file says `"ro"`).
    pub fn workspace_mode(&self) -> anyhow::Result<FsMode> {
        Ok(self.workspace.mode.unwrap_or(FsMode::ReadWrite))
    }

    /// The exec write limit in bytes, checked.
    pub fn exec_write_limit(&self) -> anyhow::Result<u64> {
        match self.exec.write_limit_mib {
            None => Ok(clawcage_sandbox::programs::DEFAULT_WRITE_LIMIT_BYTES),
            Some(mib) if (1..=1 << 20).contains(&mib) => Ok(mib << 20),
            Some(mib) => bail!("[exec] write_limit_mib = {mib} is out of range; use 1 to 1048576"),
        }
    }

    /// The per-call limits, checked.
    pub fn limits(&self) -> anyhow::Result<Limits> {
        let defaults = Limits::default();
        let memory_bytes = match self.limits.memory_mib {
            None => defaults.memory_bytes,
            Some(mib) if (1..=4096).contains(&mib) => mib << 20,
            Some(mib) => bail!("[limits] memory_mib = {mib} is out of range; use 1 to 4096"),
        };
        let timeout = match self.limits.timeout_secs {
            None => defaults.timeout,
            Some(seconds) if seconds > 0.0 && seconds <= 3600.0 => Duration::from_secs_f64(seconds),
            Some(seconds) => bail!(
                "[limits] timeout_secs = {seconds} is out of range; use more than 0 and at most 3600"
            ),
        };
        let max_output_chars = match self.limits.max_output_chars {
            None => defaults.max_output_chars,
            Some(chars) if chars >= 100 => chars,
            Some(chars) => {
                bail!("[limits] max_output_chars = {chars} is too small; use at least 100")
            }
        };
        Ok(Limits {
            memory_bytes,
            timeout,
            max_output_chars,
        })
    }
}

/// clawcage's user configuration directory (`$XDG_CONFIG_HOME/clawcage`), whose `config.toml`
/// every run without `--config` reads when the workspace has no `clawcage.toml`.
pub fn user_config_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|dir| dir.join("clawcage"))
}

/// `path` with its directory resolved to a canonical path (the file itself is not followed).
fn canonical_location(path: &Path) -> PathBuf {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match (parent.canonicalize(), path.file_name()) {
        (Ok(parent), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    }
}

/// A TOML or schema error as `line L, column C: what was wrong (near `TOKEN`)`, with serde's
/// type names in words. Never more of the file than the offending token (at most 40
/// characters of one line), so a file that is not a configuration at all is not shown.
pub(crate) fn describe_parse_error(text: &str, error: &toml::de::Error) -> String {
    let message = plain_type_names(error.message());
    let Some(span) = error.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |tail| tail.chars().count())
        + 1;
    let token: String = text
        .get(span.clone())
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .chars()
        .take(40)
        .collect();
    let near = if token.is_empty() || message.contains(&token) {
        String::new()
    } else {
        format!(" (at `{token}`)")
    };
    format!("line {line}, column {column}: {message}{near}")
}

/// serde's type names (`u64`, `f64`, ...) in words an operator reads.
fn plain_type_names(message: &str) -> String {
    let mut message = message.trim().to_string();
    for (rust, words) in [
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected u32", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected bool", "expected true or false"),
    ] {
        message = message.replace(rust, words);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused() {
        let error = toml::from_str::<Config>("[workspace]\npaht = \"x\"\n").unwrap_err();
        assert!(
            error.to_string().contains("unknown field `paht`"),
            "{error}"
        );
        assert!(toml::from_str::<Config>("[nope]\n").is_err());
        assert!(toml::from_str::<Config>("[network]\nallowed = []\n").is_err());
        assert!(toml::from_str::<Config>("[web]\nendpoint = \"x\"\n").is_err());
        let config: Config =
            toml::from_str("[network]\nallow = [\"example.com\"]\n[web]\nsearch_endpoint = \"http://127.0.0.1:1/s\"\n")
                .unwrap();
        assert_eq!(config.network.allow, ["example.com"]);
    }

    #[test]
    fn limits_are_checked() {
        let config: Config =
            toml::from_str("[limits]\nmemory_mib = 64\ntimeout_secs = 2.5\n").unwrap();
        let limits = config.limits().unwrap();
        assert_eq!(limits.memory_bytes, 64 << 20);
        assert_eq!(limits.timeout, Duration::from_millis(2500));
        let bad: Config = toml::from_str("[limits]\nmemory_mib = 0\n").unwrap();
        assert!(bad.limits().is_err());
        let bad_mode = toml::from_str::<Config>("[workspace]\nmode = \"rwx\"\n").unwrap_err();
        assert!(
            bad_mode.to_string().contains("expected `ro` or `rw`"),
            "{bad_mode}"
        );
    }

    #[test]
    fn relative_paths_are_relative_to_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clawcage.toml");
        std::fs::write(
            &file,
            "[plugins]\ndir = \"plugins\"\n[plugins.grants.wc]\nworkspace = \"ro\"\n[audit]\npath = \"logs/audit.jsonl\"\n",
        )
        .unwrap();
        let (config, source) = Config::load(Some(&file), dir.path()).unwrap();
        let source = source.unwrap();
        assert!(source.explicit);
        assert_eq!(source.sha256.len(), 64);
        assert_eq!(config.plugins.dir, Some(dir.path().join("plugins")));
        assert_eq!(config.audit.path, Some(dir.path().join("logs/audit.jsonl")));

        std::fs::write(&file, "[plugins.grants.wc]\nenv = [\"A=B\"]\n").unwrap();
        let error = format!("{:#}", Config::load(Some(&file), dir.path()).unwrap_err());
        assert!(error.contains("[plugins.grants.wc] env"), "{error}");
    }

    #[test]
    fn a_parse_error_names_the_place_and_never_echoes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clawcage.toml");
        std::fs::write(
            &file,
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n",
        )
        .unwrap();
        let error = format!("{:#}", Config::load(Some(&file), dir.path()).unwrap_err());
        assert!(error.contains("line 1, column"), "{error}");
        assert!(!error.contains("b3BlbnNzaC1rZXkt"), "{error}");
        assert!(!error.contains("OPENSSH PRIVATE KEY"), "{error}");

        std::fs::write(&file, "[limits]\nmemory_mib = \"lots\"\n").unwrap();
        let error = format!("{:#}", Config::load(Some(&file), dir.path()).unwrap_err());
        assert!(error.contains("line 2"), "{error}");
        assert!(error.contains("a whole number"), "{error}");
        assert!(!error.contains("u64"), "{error}");
    }

    #[cfg(unix)]
    #[test]
    fn a_workspace_config_that_is_a_symlink_or_a_fifo_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let outside = dir.path().join("secret.toml");
        std::fs::write(&outside, "[network]\nallow = [\"evil.example\"]\n").unwrap();
        std::os::unix::fs::symlink(&outside, workspace.join(WORKSPACE_CONFIG_NAME)).unwrap();
        let error = format!("{:#}", Config::load(None, &workspace).unwrap_err());
        assert!(error.contains("symbolic link"), "{error}");
        assert!(!error.contains("evil.example"), "{error}");

        std::fs::remove_file(workspace.join(WORKSPACE_CONFIG_NAME)).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(workspace.join(WORKSPACE_CONFIG_NAME))
            .status()
            .unwrap();
        assert!(status.success());
        let error = format!("{:#}", Config::load(None, &workspace).unwrap_err());
        assert!(error.contains("FIFO"), "{error}");
    }
}
