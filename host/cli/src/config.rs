//! The operator's configuration: a TOML file (`--config`, else `clawcage.toml` in the workspace,
//! else `clawcage/config.toml` in the user config dir) whose unknown keys are an error, merged
//! with the command-line flags that override it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clawcage_sandbox::{FsMode, Limits, PluginsConfig};
use serde::Deserialize;

use crate::network_config::{NetworkConfig, WebConfig};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[workspace]`
    #[serde(default)]
    pub workspace: WorkspaceConfig,
    /// `[limits]`
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[provider]`: the model and its fail-over chain.
    #[serde(default)]
    pub provider: crate::agent_config::ProviderSection,
    /// `[agent]`: the loop and the sessions.
    #[serde(default)]
    pub agent: crate::agent_config::AgentSection,
    /// `[network]`
    #[serde(default)]
    pub network: NetworkConfig,
    /// `[web]`
    #[serde(default)]
    pub web: WebConfig,
    /// `[exec]`
    #[serde(default)]
    pub exec: ExecConfig,
    /// `[plugins]`: the plugins directory and the operator's grant for each plugin.
    #[serde(default)]
    pub plugins: PluginsConfig,
    /// `[audit]`: the audit log of tool calls.
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[subagents]`: spawning, limits and what children may reach.
    #[serde(default)]
    pub subagents: crate::subagent_config::SubagentSection,
    /// `[cron]`: scheduled jobs.
    #[serde(default)]
    pub cron: crate::cron_config::CronSection,
}

/// `[exec]`: the exec tool (a shell inside the sandbox that runs WASI programs).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
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
pub struct AuditConfig {
    /// Record tool calls (default true).
    pub enabled: Option<bool>,
    /// The JSONL file; relative paths are relative to the config file. Default:
    /// `audit.jsonl` in the state directory.
    pub path: Option<PathBuf>,
}

/// `[workspace]`: the directory tools may reach.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// The directory; relative paths are relative to the config file. Default: the current
    /// directory.
    pub path: Option<PathBuf>,
    /// `"rw"` (default) or `"ro"`.
    pub mode: Option<String>,
}

/// `[limits]`: per-call limits of every tool.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Memory per call, in MiB (default 256).
    pub memory_mib: Option<u64>,
    /// Wall-clock time per call, in seconds (default 30).
    pub timeout_secs: Option<f64>,
    /// Characters of tool output kept (default 100000).
    pub max_output_chars: Option<usize>,
}

impl Config {
    /// Read the config: `explicit` if given (it must exist), else the first of the default
    /// locations that exists, else the defaults. Returns the config and the file it came from.
    pub fn load(
        explicit: Option<&Path>,
        workspace_hint: &Path,
    ) -> anyhow::Result<(Config, Option<PathBuf>)> {
        let candidates: Vec<PathBuf> = match explicit {
            Some(path) => {
                if !path.is_file() {
                    bail!(
                        "the config file {} does not exist; check the --config path",
                        path.display()
                    );
                }
                vec![path.to_path_buf()]
            }
            None => {
                let mut found = vec![workspace_hint.join("clawcage.toml")];
                if let Some(dir) = dirs::config_dir() {
                    found.push(dir.join("clawcage").join("config.toml"));
                }
                found
            }
        };
        for path in candidates {
            if path.is_file() {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read the config file {}", path.display()))?;
                let mut config: Config = toml::from_str(&text)
                    .with_context(|| format!("the config file {} is not valid", path.display()))?;
                if let Some(parent) = path.parent() {
                    for relative in [
                        &mut config.workspace.path,
                        &mut config.plugins.dir,
                        &mut config.audit.path,
                    ]
                    .into_iter()
                    .flatten()
                    {
                        if relative.is_relative() {
                            *relative = parent.join(&*relative);
                        }
                    }
                }
                if let Some(programs) = &config.exec.programs_dir
                    && programs.is_relative()
                    && let Some(parent) = path.parent()
                {
                    config.exec.programs_dir = Some(parent.join(programs));
                }
                config.plugins.validate().map_err(|error| {
                    anyhow::anyhow!("the config file {} is not valid: {error}", path.display())
                })?;
                return Ok((config, Some(path)));
            }
        }
        Ok((Config::default(), None))
    }

    /// The workspace mode, checked.
    pub fn workspace_mode(&self) -> anyhow::Result<FsMode> {
        match self.workspace.mode.as_deref() {
            None | Some("rw") => Ok(FsMode::ReadWrite),
            Some("ro") => Ok(FsMode::ReadOnly),
            Some(other) => bail!("[workspace] mode = {other:?} is not valid; use \"rw\" or \"ro\""),
        }
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
        let bad_mode: Config = toml::from_str("[workspace]\nmode = \"rwx\"\n").unwrap();
        assert!(bad_mode.workspace_mode().is_err());
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
        let (config, _) = Config::load(Some(&file), dir.path()).unwrap();
        assert_eq!(config.plugins.dir, Some(dir.path().join("plugins")));
        assert_eq!(config.audit.path, Some(dir.path().join("logs/audit.jsonl")));

        std::fs::write(&file, "[plugins.grants.wc]\nenv = [\"A=B\"]\n").unwrap();
        let error = format!("{:#}", Config::load(Some(&file), dir.path()).unwrap_err());
        assert!(error.contains("[plugins.grants.wc] env"), "{error}");
    }
}
