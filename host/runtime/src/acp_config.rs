//! `[acp]` in the config and the runtimes ACP needs: which directories an editor may open as a
//! session's workspace over the Agent Client Protocol (`allowed_roots`, none by default), a
//! runtime over such a directory that shares this process's sandbox engine, and the external ACP
//! agents the operator allows as sub-agents (`[acp.agents.NAME]`, off unless also listed in
//! `allowed_agents`), with the registry their file and terminal requests are served through.
//! Only the operator's configuration grants any of this: a `clawcage.toml` inside a workspace is
//! used only when trusted (`trust.rs`), as everywhere else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;
use clawcage_agent::{AuditedRegistry, ToolRegistry};
use clawcage_sandbox::{FsMode, Sandbox, WorkspaceGrant};
use serde::Deserialize;

use crate::config::Config;
use crate::{Error, Located, Options, Runtime, failed, trust, usage};

/// `[acp]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpSection {
    /// Directories under which an editor may open a session (`session/new`'s `cwd`); relative
    /// paths are relative to the config file. None by default: every `cwd` is refused.
    pub allowed_roots: Option<Vec<PathBuf>>,
    /// The external agents `spawn` may start (each must also be configured under
    /// `[acp.agents.NAME]`). None by default.
    pub allowed_agents: Option<Vec<String>>,
    /// `[acp.agents.NAME]`: how to start each external agent.
    #[serde(default)]
    pub agents: BTreeMap<String, AcpAgentSection>,
}

/// `[acp.agents.NAME]`: an external ACP agent, started as a native process.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpAgentSection {
    /// The program (a path, or a name looked up on `PATH`).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for it, with their values. Nothing else of clawcage's
    /// environment reaches it except `PATH`, `HOME` and `LANG`, and the names in `pass_env`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host environment variables passed to it by name (e.g. its own API key).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// `"ro"` (default) or `"rw"`: what its `fs/write_text_file` requests may do in the
    /// workspace (never more than the parent's mode).
    pub workspace: Option<FsMode>,
    /// `"deny-all"` (default), `"approve-reads"` or `"ask"`: how its `session/request_permission`
    /// requests are answered.
    pub permission_mode: Option<String>,
    /// Serve its `terminal/*` requests through the sandboxed `exec` tool (default true).
    pub terminal: Option<bool>,
    /// Seconds the whole run may take (default: `[subagents] timeout_secs`).
    pub timeout_secs: Option<u64>,
}

/// How an external agent's `session/request_permission` requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionMode {
    /// Every request is rejected.
    DenyAll,
    /// Requests for reading (`kind` `read`, `search`, `fetch`, `think`) are allowed once; the
    /// rest rejected.
    ApproveReads,
    /// The person at the parent's front end decides (the editor of the parent ACP session);
    /// rejected where nobody can be asked.
    Ask,
}

impl PermissionMode {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::DenyAll => "deny-all",
            PermissionMode::ApproveReads => "approve-reads",
            PermissionMode::Ask => "ask",
        }
    }
}

/// One external agent, checked.
#[derive(Debug, Clone)]
pub struct ExternalAgent {
    /// Its name in `[acp.agents.NAME]`.
    pub name: String,
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment (the base variables, `env`, `pass_env`).
    pub env: Vec<(String, String)>,
    /// Whether its file writes may change the workspace.
    pub write: bool,
    /// How its permission requests are answered.
    pub permission_mode: PermissionMode,
    /// Whether it gets terminals (through the sandboxed exec tool).
    pub terminal: bool,
    /// Its time limit, if shorter than the sub-agents'.
    pub timeout: Option<std::time::Duration>,
}

/// Variables of clawcage's own environment every external agent gets (when set).
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG"];

impl AcpSection {
    /// The allowed roots, canonical; relative entries are read from `base` (the config file's
    /// directory). A root that does not exist is an error naming it.
    pub fn roots(&self, base: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
        let mut roots = Vec::new();
        for root in self.allowed_roots.iter().flatten() {
            let path = match base {
                Some(base) if root.is_relative() => base.join(root),
                _ => root.clone(),
            };
            match path.canonicalize() {
                Ok(canonical) => roots.push(canonical),
                Err(error) => bail!(
                    "[acp] allowed_roots names {} which cannot be used ({error}); create it or remove it from the list",
                    path.display()
                ),
            }
        }
        Ok(roots)
    }

    /// The external agents that are both configured and allowed, checked; `host_env` reads the
    /// host's variables.
    pub fn external_agents(
        &self,
        host_env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<BTreeMap<String, ExternalAgent>> {
        let mut agents = BTreeMap::new();
        for name in self.allowed_agents.iter().flatten() {
            let Some(section) = self.agents.get(name) else {
                bail!(
                    "[acp] allowed_agents lists `{name}`, which has no [acp.agents.{name}] section with its command"
                );
            };
            if section.command.trim().is_empty() {
                bail!("[acp.agents.{name}] command is empty; name the program to start");
            }
            let permission_mode = match section.permission_mode.as_deref() {
                None | Some("deny-all") => PermissionMode::DenyAll,
                Some("approve-reads") => PermissionMode::ApproveReads,
                Some("ask") => PermissionMode::Ask,
                Some(other) => bail!(
                    "[acp.agents.{name}] permission_mode = \"{other}\" is not known; use \"deny-all\", \"approve-reads\" or \"ask\""
                ),
            };
            let timeout = match section.timeout_secs {
                None => None,
                Some(n) if (1..=86_400).contains(&n) => Some(std::time::Duration::from_secs(n)),
                Some(n) => {
                    bail!("[acp.agents.{name}] timeout_secs = {n} is out of range; use 1 to 86400")
                }
            };
            let mut env: Vec<(String, String)> = BASE_ENV
                .iter()
                .filter_map(|var| host_env(var).map(|value| (var.to_string(), value)))
                .collect();
            for var in &section.pass_env {
                if let Some(value) = host_env(var) {
                    env.retain(|(known, _)| known != var);
                    env.push((var.clone(), value));
                }
            }
            for (var, value) in &section.env {
                env.retain(|(known, _)| known != var);
                env.push((var.clone(), value.clone()));
            }
            agents.insert(
                name.clone(),
                ExternalAgent {
                    name: name.clone(),
                    command: section.command.clone(),
                    args: section.args.clone(),
                    env,
                    write: section.workspace == Some(FsMode::ReadWrite),
                    permission_mode,
                    terminal: section.terminal.unwrap_or(true),
                    timeout,
                },
            );
        }
        Ok(agents)
    }
}

/// What `clawcage acp` starts from: the operator's configuration and state directory, found
/// once, and the sandbox engine shared by the runtimes of every session's workspace.
pub struct AcpHost {
    options: Options,
    config: Config,
    source: Option<crate::ConfigSource>,
    state_dir: PathBuf,
    roots: Vec<PathBuf>,
    sandbox: tokio::sync::Mutex<Option<Arc<Sandbox>>>,
}

impl std::fmt::Debug for AcpHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpHost")
            .field("state_dir", &self.state_dir)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

impl AcpHost {
    /// Finds the configuration (as every command does) and the allowed roots. A configuration
    /// inside the current directory must be trusted, as when the current directory is the
    /// workspace.
    pub fn open(options: Options) -> Result<AcpHost, Error> {
        let located = crate::locate(&options)?;
        // The current directory is no workspace until a session opens it, but a
        // `clawcage.toml` found there is a workspace's configuration: used only when trusted.
        if let Some(source) = &located.source
            && !source.explicit
            && source.path
                == located
                    .workspace
                    .path()
                    .join(crate::config::WORKSPACE_CONFIG_NAME)
        {
            let store = crate::TrustStore::in_state_dir(&located.state_dir);
            if !store.is_trusted(source).unwrap_or(false) {
                return Err(usage(format!(
                    "the configuration {} lies in the current directory, which a session may open as its workspace, and is not trusted as it is now; review it and run `clawcage trust --workspace {}`, or pass --config with a file outside any workspace",
                    source.path.display(),
                    located.workspace.path().display()
                )));
            }
        }
        let base = located
            .source
            .as_ref()
            .and_then(|source| source.path.parent());
        let roots = located
            .config
            .acp
            .roots(base)
            .map_err(|error| usage(format!("{error:#}")))?;
        located
            .config
            .acp
            .external_agents(|name| std::env::var(name).ok())
            .map_err(|error| usage(format!("{error:#}")))?;
        Ok(AcpHost {
            options,
            config: located.config,
            source: located.source,
            state_dir: located.state_dir,
            roots,
            sandbox: tokio::sync::Mutex::new(None),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The canonical allowed roots.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// `cwd`, canonical, when it lies inside an allowed root and clear of every protected
    /// directory (the state directory, the plugins directory, clawcage's configuration
    /// directory: `crate::protected_dirs`); else a refusal saying what to configure. Checked
    /// before any runtime is built, for `session/new` and `session/load` alike.
    pub fn check_cwd(&self, cwd: &Path) -> Result<PathBuf, Error> {
        if !cwd.is_absolute() {
            return Err(usage(format!(
                "the session's cwd {} is not an absolute path",
                cwd.display()
            )));
        }
        let canonical = cwd.canonicalize().map_err(|error| {
            usage(format!(
                "the session's cwd {} cannot be opened: {error}",
                cwd.display()
            ))
        })?;
        if self
            .roots
            .iter()
            .any(|root| trust::is_inside(&canonical, root))
        {
            // An allowed root such as `~` holds the state directory too: a session on its
            // `channels/` could approve a sender, one on `sessions/` forge a transcript.
            crate::check_workspace(&canonical, &self.config, &self.state_dir, None)?;
            return Ok(canonical);
        }
        Err(usage(if self.roots.is_empty() {
            format!(
                "the workspace {} is refused: no directory may be opened over ACP until the operator lists it under [acp] allowed_roots in clawcage's configuration",
                canonical.display()
            )
        } else {
            format!(
                "the workspace {} is refused: it is outside the directories in [acp] allowed_roots ({}); open a project inside one of them, or ask the operator to add it",
                canonical.display(),
                self.roots
                    .iter()
                    .map(|root| root.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }))
    }

    /// A runtime whose tools are granted `cwd` (checked against the allowed roots; the mode is
    /// the configuration's, or read-only with `--read-only`). The configuration is read again
    /// and must be the one read at the start; the usual trust checks apply to `cwd` as the
    /// workspace. Every such runtime shares one sandbox engine.
    pub async fn runtime_for(&self, cwd: &Path) -> Result<Runtime, Error> {
        let canonical = self.check_cwd(cwd)?;
        let config = match &self.source {
            Some(source) => {
                let (config, again) = Config::load(Some(&source.path), &canonical)
                    .map_err(|error| usage(format!("{error:#}")))?;
                if again.as_ref().map(|again| &again.sha256) != Some(&source.sha256) {
                    return Err(usage(format!(
                        "the configuration {} changed since `clawcage acp` started; restart it to use the new one",
                        source.path.display()
                    )));
                }
                config
            }
            None => Config::default(),
        };
        let mode = if self.options.read_only {
            FsMode::ReadOnly
        } else {
            config
                .workspace_mode()
                .map_err(|error| usage(format!("{error:#}")))?
        };
        let workspace = WorkspaceGrant::new(&canonical, mode).map_err(usage)?;
        let located = Located {
            config,
            source: self.source.clone(),
            workspace,
            state_dir: self.state_dir.clone(),
        };
        located.check_trust()?;
        let mut shared = self.sandbox.lock().await;
        let mut runtime = Runtime::assemble(
            located,
            self.options.provider.clone(),
            self.options.progress.clone(),
            None,
            shared.clone(),
        )
        .await?;
        if shared.is_none() {
            *shared = Some(runtime.sandbox.clone());
        }
        runtime.external_agents = self.options.external_agents.clone();
        Ok(runtime)
    }
}

impl Runtime {
    /// Refuses `path` as a directory tools or an external agent of this runtime work in when it
    /// contains, is or lies inside a protected directory (`crate::protected_dirs`).
    pub fn check_workspace(&self, path: &Path) -> Result<(), Error> {
        crate::check_workspace(path, self.config(), &self.state_dir, None)
    }

    /// The external ACP agents this configuration allows, checked.
    pub fn external_agents(&self) -> Result<BTreeMap<String, ExternalAgent>, Error> {
        self.config()
            .acp
            .external_agents(|name| std::env::var(name).ok())
            .map_err(|error| usage(format!("{error:#}")))
    }

    /// The tools an external agent's requests are served through: the bundled file and exec
    /// tools over this runtime's workspace, read-only unless `write` (and never more than this
    /// runtime's own mode), without network; audited and scrubbed like every other call.
    pub async fn external_agent_tools(&self, write: bool) -> Result<AuditedRegistry, Error> {
        let grants = if write {
            self.grants.clone()
        } else {
            self.grants.read_only()
        };
        let registry: ToolRegistry = crate::tools::bundled_registry(
            &self.sandbox,
            self.config(),
            grants,
            crate::tools::no_network(self.limits),
            &self.approvals,
            &self.state_dir,
        )
        .await
        .map_err(|error| failed(error.message()))?;
        let registry = registry.exclude(&["web_fetch", "web_search"]);
        Ok(AuditedRegistry::new(registry, self.audit_log()?).with_redactor(self.redactor.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> AcpSection {
        let config: Config = toml::from_str(text).unwrap();
        config.acp
    }

    fn host_env(name: &str) -> Option<String> {
        match name {
            "PATH" => Some("/usr/bin".to_string()),
            "HOME" => Some("/home/op".to_string()),
            "ANTHROPIC_API_KEY" => Some("sk-host-secret".to_string()),
            "AGENT_KEY" => Some("agent-own-key".to_string()),
            _ => None,
        }
    }

    #[test]
    fn an_agent_runs_only_when_configured_and_listed() {
        let configured_only = section("[acp.agents.x]\ncommand = \"x\"\n");
        assert!(
            configured_only
                .external_agents(host_env)
                .unwrap()
                .is_empty()
        );
        let listed_only = section("[acp]\nallowed_agents = [\"x\"]\n");
        let error = listed_only
            .external_agents(host_env)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[acp.agents.x]"), "{error}");
        let bad_mode = section(
            "[acp]\nallowed_agents = [\"x\"]\n[acp.agents.x]\ncommand = \"x\"\npermission_mode = \"yolo\"\n",
        );
        let error = bad_mode.external_agents(host_env).unwrap_err().to_string();
        assert!(error.contains("deny-all"), "{error}");
    }

    #[test]
    fn an_agent_gets_the_base_variables_and_only_the_configured_ones() {
        let agents = section(
            "[acp]\nallowed_agents = [\"x\"]\n[acp.agents.x]\ncommand = \"x\"\nenv = { MODE = \"fast\", HOME = \"/tmp/agent\" }\npass_env = [\"AGENT_KEY\", \"UNSET_VAR\"]\n",
        )
        .external_agents(host_env)
        .unwrap();
        let agent = &agents["x"];
        let mut env = agent.env.clone();
        env.sort();
        assert_eq!(
            env,
            [
                ("AGENT_KEY".to_string(), "agent-own-key".to_string()),
                ("HOME".to_string(), "/tmp/agent".to_string()),
                ("MODE".to_string(), "fast".to_string()),
                ("PATH".to_string(), "/usr/bin".to_string()),
            ]
        );
        assert!(!agent.write, "read-only by default");
        assert_eq!(agent.permission_mode, PermissionMode::DenyAll);
        assert!(agent.terminal);
    }

    #[test]
    fn a_cwd_in_or_around_the_state_directory_is_refused_inside_an_allowed_root() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(state.join("channels")).unwrap();
        std::fs::create_dir_all(dir.path().join("projects/app")).unwrap();
        std::os::unix::fs::symlink(state.join("channels"), dir.path().join("projects/link"))
            .unwrap();
        let config = dir.path().join("clawcage.toml");
        std::fs::write(&config, "[acp]\nallowed_roots = [\".\"]\n").unwrap();
        let host = AcpHost::open(Options {
            config: Some(config),
            state_dir: Some(state.clone()),
            ..Options::default()
        })
        .unwrap();
        let root = dir.path().canonicalize().unwrap();
        assert_eq!(
            host.check_cwd(&root.join("projects/app")).unwrap(),
            root.join("projects/app")
        );
        for (cwd, overlap) in [
            (state.join("channels"), "lies inside"),
            (dir.path().join("projects/link"), "lies inside"),
            (state.clone(), "is the state directory"),
            (dir.path().to_path_buf(), "contains the state directory"),
        ] {
            let error = host.check_cwd(&cwd).unwrap_err();
            assert!(
                error.message().contains(overlap) && error.message().contains("state directory"),
                "{}: {error}",
                cwd.display()
            );
        }
    }

    #[test]
    fn a_cwd_outside_the_roots_is_refused_whatever_its_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("projects");
        std::fs::create_dir_all(root.join("app")).unwrap();
        std::fs::create_dir_all(dir.path().join("projects-evil")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("escape")).unwrap();
        let config = dir.path().join("clawcage.toml");
        std::fs::write(&config, "[acp]\nallowed_roots = [\"projects\"]\n").unwrap();
        let host = AcpHost::open(Options {
            config: Some(config.clone()),
            state_dir: Some(dir.path().join("state")),
            ..Options::default()
        })
        .unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(host.roots(), std::slice::from_ref(&root));
        assert_eq!(host.check_cwd(&root.join("app")).unwrap(), root.join("app"));
        for refused in [
            dir.path().join("projects-evil"),
            root.join("escape"),
            root.join("app").join("..").join(".."),
            PathBuf::from("/"),
        ] {
            let error = host.check_cwd(&refused).unwrap_err();
            assert!(
                error.message().contains("allowed_roots"),
                "{}: {error}",
                refused.display()
            );
        }
        assert!(
            host.check_cwd(Path::new("projects/app")).is_err(),
            "relative"
        );
        std::fs::write(&config, "").unwrap();
        let nothing = AcpHost::open(Options {
            config: Some(config),
            state_dir: Some(dir.path().join("state")),
            ..Options::default()
        })
        .unwrap();
        let error = nothing.check_cwd(&root.join("app")).unwrap_err();
        assert!(
            error.message().contains("no directory may be opened"),
            "{error}"
        );
    }
}
