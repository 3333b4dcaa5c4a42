//! `[subagents]` in the config: whether the agent may spawn sub-agents, their limits, the tools
//! they never get, and whether they may write to the workspace. Checked here, so a bad value is a
//! configuration error at start-up that names the key.

use std::time::Duration;

use anyhow::bail;
use clawcage_agent::SubagentConfig;
use serde::Deserialize;

/// `[subagents]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentSection {
    /// Offer `spawn` and `subagents` to the agent (default true).
    pub enabled: Option<bool>,
    /// How deep sub-agents may nest (default 1: children cannot spawn).
    pub max_depth: Option<u32>,
    /// Children running at once (default 5).
    pub max_concurrent: Option<usize>,
    /// Seconds a child may run (default 300).
    pub timeout_secs: Option<u64>,
    /// Model calls a child may make (default 15).
    pub max_iterations: Option<usize>,
    /// Tools children never get (default: subagents, message, edit_file, cron; `spawn` follows
    /// `max_depth`).
    pub exclude: Option<Vec<String>>,
    /// `"ro"` (default) or `"rw"`: the children's access to the workspace, never more than the
    /// parent's.
    pub workspace: Option<clawcage_sandbox::FsMode>,
}

impl SubagentSection {
    /// Whether sub-agents are offered.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// Whether children may write to the workspace (when the parent may).
    pub fn children_write(&self) -> anyhow::Result<bool> {
        Ok(self.workspace == Some(clawcage_sandbox::FsMode::ReadWrite))
    }

    /// The manager's configuration, checked.
    pub fn config(&self) -> anyhow::Result<SubagentConfig> {
        let defaults = SubagentConfig::default();
        let max_depth = match self.max_depth {
            None => defaults.max_depth,
            Some(n) if (1..=5).contains(&n) => n,
            Some(n) => bail!("[subagents] max_depth = {n} is out of range; use 1 to 5"),
        };
        let max_concurrent = match self.max_concurrent {
            None => defaults.max_concurrent,
            Some(n) if (1..=64).contains(&n) => n,
            Some(n) => bail!("[subagents] max_concurrent = {n} is out of range; use 1 to 64"),
        };
        let timeout = match self.timeout_secs {
            None => defaults.timeout,
            Some(n) if (1..=86_400).contains(&n) => Duration::from_secs(n),
            Some(n) => bail!("[subagents] timeout_secs = {n} is out of range; use 1 to 86400"),
        };
        let max_iterations = match self.max_iterations {
            None => defaults.max_iterations,
            Some(n) if (1..=1000).contains(&n) => n,
            Some(n) => bail!("[subagents] max_iterations = {n} is out of range; use 1 to 1000"),
        };
        Ok(SubagentConfig {
            max_depth,
            max_concurrent,
            timeout,
            max_iterations,
            excluded_tools: self.exclude.clone().unwrap_or(defaults.excluded_tools),
            retention: defaults.retention,
        })
    }
}
