//! Capability grants: what the operator allows one component to reach. Everything is denied by
//! default — a [`Grants::none`] component sees no directory, no network, no environment — and
//! every widening is an explicit field. Grants only narrow from parent to child
//! ([`Grants::narrowed_by`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::env::EnvGrant;
use crate::network::NetworkPolicy;
use crate::scheduler::SchedulerGrant;
use clawcage_core::Scheduler;

/// Whether a directory grant allows writing: the one type for read-only and read-write, written
/// `ro` and `rw` wherever a person writes it (configuration, manifests, tools, the audit log).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, serde::Serialize,
)]
pub enum FsMode {
    /// Files can be read and listed, not created, changed or removed.
    #[serde(rename = "ro")]
    ReadOnly,
    /// Files can be read and written.
    #[serde(rename = "rw")]
    ReadWrite,
}

impl FsMode {
    /// `ro` or `rw`, as tools and the audit log name it.
    pub fn as_str(self) -> &'static str {
        match self {
            FsMode::ReadOnly => "ro",
            FsMode::ReadWrite => "rw",
        }
    }
}

/// The workspace directory a component may reach.
///
/// Inside the sandbox the directory appears at the same absolute path it has on the host, so an
/// absolute path a client sends (MCP clients do) names the same file inside and outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceGrant {
    path: PathBuf,
    mode: FsMode,
    /// Read-only only: the gate asked before a change (`[approvals] write = "ask"`).
    write_approvals: Option<ApprovalGateRef>,
}

/// Why a grant could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The directory does not exist or cannot be resolved.
    #[error(
        "the workspace {path} cannot be used: {source}; create it or pass an existing directory with --workspace"
    )]
    Unresolvable {
        /// The path as given.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The path exists but is not a directory.
    #[error("the workspace {0} is not a directory; pass a directory with --workspace")]
    NotADirectory(PathBuf),
    /// The canonical path is not valid UTF-8, so it cannot be named inside the sandbox.
    #[error("the workspace path {0} is not valid UTF-8; use a directory whose path is")]
    NotUtf8(PathBuf),
    /// A setting's name is not one a component may be given.
    #[error(
        "the setting {0:?} cannot be given to a component: setting names start with CLAWCAGE_, use A-Z, 0-9 and _, and may not be one of the workspace variables"
    )]
    BadSettingName(String),
}

impl WorkspaceGrant {
    /// Grant `path` (resolved to its canonical absolute form, symlinks followed) with `mode`.
    pub fn new(path: impl AsRef<Path>, mode: FsMode) -> Result<Self, GrantError> {
        let given = path.as_ref();
        let canonical = given
            .canonicalize()
            .map_err(|source| GrantError::Unresolvable {
                path: given.to_path_buf(),
                source,
            })?;
        if !canonical.is_dir() {
            return Err(GrantError::NotADirectory(canonical));
        }
        if canonical.to_str().is_none() {
            return Err(GrantError::NotUtf8(canonical));
        }
        Ok(Self {
            path: canonical,
            mode,
            write_approvals: None,
        })
    }

    /// This grant, when read-only, with each change under it asked of `gate` first (the gate
    /// decides at each call whether it asks or refuses). A read-write grant is unchanged.
    pub fn with_write_approvals(
        mut self,
        gate: Arc<dyn clawcage_core::approval::ApprovalGate>,
    ) -> Self {
        if self.mode == FsMode::ReadOnly {
            self.write_approvals = Some(ApprovalGateRef(gate));
        }
        self
    }

    /// The gate asked before a change under this read-only workspace, if any.
    pub fn write_approvals(&self) -> Option<&Arc<dyn clawcage_core::approval::ApprovalGate>> {
        match self.mode {
            FsMode::ReadOnly => self.write_approvals.as_ref().map(|gate| &gate.0),
            FsMode::ReadWrite => None,
        }
    }

    /// The canonical host path of the directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path under which the guest sees the directory (the same as the host path).
    pub fn guest_path(&self) -> &str {
        // Checked to be UTF-8 in `new`.
        self.path.to_str().unwrap_or("/workspace")
    }

    /// Read-only or read-write.
    pub fn mode(&self) -> FsMode {
        self.mode
    }
}

/// Resource limits for one call. A call that passes one is stopped and reported to the model as
/// a failed call; the host goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory the component may use, in bytes.
    pub memory_bytes: u64,
    /// Wall-clock time for the whole call, including time spent in host functions.
    pub timeout: Duration,
    /// Characters of result text kept; longer results keep head and tail around a marker.
    pub max_output_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            max_output_chars: 100_000,
        }
    }
}

impl Limits {
    /// The tighter of two limit sets, field by field.
    pub fn narrowed_by(&self, other: &Limits) -> Limits {
        Limits {
            memory_bytes: self.memory_bytes.min(other.memory_bytes),
            timeout: self.timeout.min(other.timeout),
            max_output_chars: self.max_output_chars.min(other.max_output_chars),
        }
    }
}

/// The exec capability: running WASI command programs through the `process` import, each in a
/// fresh instance with the same workspace and limits as the calling tool. Never a native process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecGrant {
    /// The programs that can be run.
    pub programs: crate::programs::ProgramCatalog,
    /// Bytes all programs of one call may write to files together (redirections and the
    /// programs' own writes); past it a write fails with "no space left on device".
    pub write_limit_bytes: u64,
    /// The operator's approvals: asked with the call's plan before it runs, and every program the
    /// call starts is checked against its answer. `None` runs whatever the sandbox allows.
    pub approvals: Option<ApprovalGateRef>,
}

/// The gate an exec grant asks. Two grants are equal when they name the same gate.
#[derive(Debug, Clone)]
pub struct ApprovalGateRef(pub Arc<dyn clawcage_core::approval::ApprovalGate>);

impl PartialEq for ApprovalGateRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ApprovalGateRef {}

impl ExecGrant {
    /// `programs` with the default write limit (1 GiB per call).
    pub fn new(programs: crate::programs::ProgramCatalog) -> Self {
        Self {
            programs,
            write_limit_bytes: crate::programs::DEFAULT_WRITE_LIMIT_BYTES,
            approvals: None,
        }
    }

    /// This grant with every call decided by `gate` first.
    pub fn with_approvals(mut self, gate: Arc<dyn clawcage_core::approval::ApprovalGate>) -> Self {
        self.approvals = Some(ApprovalGateRef(gate));
        self
    }
}

/// Everything one component is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grants {
    /// The workspace, if any; no other directory is ever visible.
    pub workspace: Option<WorkspaceGrant>,
    /// Per-call limits.
    pub limits: Limits,
    /// Outbound HTTP, if any. Without it the `http` and `wasi:http` imports are not linked and a
    /// component that imports them does not load.
    pub network: Option<Arc<NetworkPolicy>>,
    /// Non-secret configuration handed to the component as environment variables (for example
    /// `CLAWCAGE_SEARCH_ENDPOINT`). Secrets never go here: they stay in the network policy.
    settings: Vec<(String, String)>,
    /// Running programs (the `process` import); `None` denies it.
    pub exec: Option<ExecGrant>,
    /// Host environment variables passed in, beyond the workspace's own (none by default).
    pub env: EnvGrant,
    /// The cron capability (the `scheduler` import); `None` denies it.
    scheduler: Option<SchedulerGrant>,
}

/// Environment names the host sets itself.
const RESERVED_SETTINGS: &[&str] = &[
    "CLAWCAGE_WORKSPACE",
    "CLAWCAGE_WORKSPACE_MODE",
    "CLAWCAGE_TIME_LIMIT_MS",
];

impl Grants {
    /// No directory, default limits.
    pub fn none() -> Self {
        Self::default()
    }

    /// The workspace in `mode`, default limits.
    pub fn workspace(grant: WorkspaceGrant) -> Self {
        Self {
            workspace: Some(grant),
            ..Self::default()
        }
    }

    /// These grants with outbound HTTP under `policy`.
    pub fn with_network(mut self, policy: NetworkPolicy) -> Self {
        self.network = Some(Arc::new(policy));
        self
    }

    /// These grants with the setting `name=value` (a non-secret environment variable whose name
    /// starts with `CLAWCAGE_`). A later value for the same name replaces the earlier one.
    pub fn with_setting(mut self, name: &str, value: &str) -> Result<Self, GrantError> {
        let valid = name.starts_with("CLAWCAGE_")
            && name.len() > "CLAWCAGE_".len()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && !RESERVED_SETTINGS.contains(&name);
        if !valid {
            return Err(GrantError::BadSettingName(name.to_string()));
        }
        self.settings.retain(|(existing, _)| existing != name);
        self.settings.push((name.to_string(), value.to_string()));
        Ok(self)
    }

    /// The settings handed to the component as environment variables.
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }

    /// These grants with `limits`.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// These grants with the exec capability.
    pub fn with_exec(mut self, exec: ExecGrant) -> Self {
        self.exec = Some(exec);
        self
    }

    /// These grants with the environment variables in `env`.
    pub fn with_env(mut self, env: EnvGrant) -> Self {
        self.env = env;
        self
    }

    /// These grants with the cron capability: the component's `scheduler` import adds, lists and
    /// removes jobs of `scheduler`.
    pub fn with_scheduler(mut self, scheduler: Arc<dyn Scheduler>) -> Self {
        self.scheduler = Some(SchedulerGrant(scheduler));
        self
    }

    /// The scheduler the `scheduler` import calls, if the cron capability is granted.
    pub fn scheduler(&self) -> Option<&Arc<dyn Scheduler>> {
        self.scheduler.as_ref().map(|grant| &grant.0)
    }

    /// The same grants with the workspace read-only (used for sub-agents).
    pub fn read_only(&self) -> Grants {
        let mut narrowed = self.clone();
        if let Some(workspace) = &mut narrowed.workspace {
            // Made read-only here: nothing under it is asked (asking stays with a workspace the
            // operator made read-only).
            if workspace.mode == FsMode::ReadWrite {
                workspace.write_approvals = None;
            }
            workspace.mode = FsMode::ReadOnly;
        }
        narrowed
    }

    /// What both `self` and `other` allow: a child's grants can only be narrower than its
    /// parent's. A workspace survives only when both name the same directory; the mode is the
    /// stricter one; limits are the tighter ones.
    pub fn narrowed_by(&self, other: &Grants) -> Grants {
        let workspace = match (&self.workspace, &other.workspace) {
            (Some(mine), Some(theirs)) if mine.path == theirs.path => Some(WorkspaceGrant {
                path: mine.path.clone(),
                mode: mine.mode.min(theirs.mode),
                // Writes are asked only when both sides ask them.
                write_approvals: match (mine.write_approvals(), theirs.write_approvals()) {
                    (Some(_), Some(_)) => mine.write_approvals.clone(),
                    _ => None,
                },
            }),
            _ => None,
        };
        let network = match (&self.network, &other.network) {
            (Some(mine), Some(theirs)) if mine == theirs => Some(mine.clone()),
            (Some(mine), Some(theirs)) => Some(Arc::new(mine.narrowed_by(theirs))),
            _ => None,
        };
        // Exec survives only when both allow it; the programs are this side's, the write limit
        // the smaller one, and an approvals gate on either side stays.
        let exec = match (&self.exec, &other.exec) {
            (Some(mine), Some(theirs)) => Some(ExecGrant {
                programs: mine.programs.clone(),
                write_limit_bytes: mine.write_limit_bytes.min(theirs.write_limit_bytes),
                approvals: mine.approvals.clone().or_else(|| theirs.approvals.clone()),
            }),
            _ => None,
        };
        Grants {
            workspace,
            limits: self.limits.narrowed_by(&other.limits),
            network,
            // Settings are configuration, not capabilities: a tool keeps its own.
            settings: self.settings.clone(),
            exec,
            env: self.env.narrowed_by(&other.env),
            // The cron capability survives only when both allow it; the scheduler is this side's.
            scheduler: match (&self.scheduler, &other.scheduler) {
                (Some(mine), Some(_)) => Some(mine.clone()),
                _ => None,
            },
        }
    }

    /// The grants as structured fields (see `clawcage_core::Tool::grants_json`).
    pub fn to_json(&self) -> serde_json::Value {
        let workspace = self.workspace.as_ref().map(|grant| {
            serde_json::json!({
                "path": grant.path,
                "mode": grant.mode.as_str(),
                "writes_asked": grant.write_approvals().is_some(),
            })
        });
        let network = self.network.as_ref().map(|policy| {
            let allow: Vec<Vec<String>> = policy
                .allow_lists()
                .iter()
                .map(|list| {
                    list.to_string()
                        .split(", ")
                        .filter(|entry| !entry.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .collect();
            let secret_hosts: Vec<String> = policy
                .secrets()
                .iter()
                .map(|secret| secret.host().to_string())
                .collect();
            serde_json::json!({"allow": allow, "secret_hosts": secret_hosts})
        });
        let exec = self.exec.as_ref().map(|exec| {
            let programs = exec.programs.is_found().then(|| exec.programs.names());
            serde_json::json!({
                "programs": programs,
                "write_limit_mib": exec.write_limit_bytes >> 20,
            })
        });
        let env: Vec<&str> = self.env.names().collect();
        serde_json::json!({
            "sandboxed": true,
            "workspace": workspace,
            "network": network,
            "memory_mib": self.limits.memory_bytes >> 20,
            "timeout_secs": self.limits.timeout.as_secs_f64(),
            "max_output_chars": self.limits.max_output_chars,
            "exec": exec,
            "env": env,
            "cron": self.scheduler.is_some(),
        })
    }

    /// A one-line description for `clawcage tools` and logs, e.g. `workspace /tmp/w (rw), memory
    /// 256 MiB, timeout 30s, no network`.
    pub fn describe(&self) -> String {
        let workspace = match &self.workspace {
            Some(grant) => format!(
                "workspace {} ({}{})",
                grant.path.display(),
                grant.mode.as_str(),
                if grant.write_approvals().is_some() {
                    ", writes asked"
                } else {
                    ""
                }
            ),
            None => "no files".to_string(),
        };
        let network = match &self.network {
            Some(policy) => policy.describe(),
            None => "no network".to_string(),
        };
        // The same words before and after the program catalog is loaded (on the first exec
        // call), so that the audit log describes one grant one way; `to_json` lists the names
        // once they are known.
        let exec = match &self.exec {
            Some(exec) => format!(
                ", exec (the bundled programs and any operator programs, write limit {} MiB)",
                exec.write_limit_bytes >> 20
            ),
            None => String::new(),
        };
        let env = if self.env.is_empty() {
            String::new()
        } else {
            format!(", {}", self.env.describe())
        };
        let cron = if self.scheduler.is_some() {
            ", cron"
        } else {
            ""
        };
        format!(
            "{workspace}, memory {} MiB, timeout {}s{exec}{cron}, {network}{env}",
            self.limits.memory_bytes >> 20,
            self.limits.timeout.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_never_widens() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let parent = Grants::workspace(WorkspaceGrant::new(dir.path(), FsMode::ReadOnly).unwrap());
        let child_asks =
            Grants::workspace(WorkspaceGrant::new(dir.path(), FsMode::ReadWrite).unwrap())
                .with_limits(Limits {
                    memory_bytes: u64::MAX,
                    timeout: Duration::from_secs(1),
                    max_output_chars: 10,
                });
        let child = parent.narrowed_by(&child_asks);
        assert_eq!(child.workspace.as_ref().unwrap().mode(), FsMode::ReadOnly);
        assert_eq!(child.limits.memory_bytes, Limits::default().memory_bytes);
        assert_eq!(child.limits.timeout, Duration::from_secs(1));

        let elsewhere =
            Grants::workspace(WorkspaceGrant::new(other.path(), FsMode::ReadWrite).unwrap());
        assert!(parent.narrowed_by(&elsewhere).workspace.is_none());
        assert!(Grants::none().narrowed_by(&parent).workspace.is_none());
    }

    #[test]
    fn network_grants_narrow_and_show() {
        use crate::network::{AllowList, NetworkPolicy};
        let parent = Grants::none().with_network(NetworkPolicy::new(
            AllowList::parse(["*.example.org"]).unwrap(),
        ));
        assert!(
            parent.describe().contains("network: *.example.org"),
            "{}",
            parent.describe()
        );
        assert!(Grants::none().describe().contains("no network"));
        assert!(parent.narrowed_by(&Grants::none()).network.is_none());
        assert!(Grants::none().narrowed_by(&parent).network.is_none());
        let child = Grants::none().with_network(NetworkPolicy::new(
            AllowList::parse(["a.example.org"]).unwrap(),
        ));
        let narrowed = parent.narrowed_by(&child);
        assert_eq!(narrowed.network.unwrap().allow_lists().len(), 2);
        let empty = Grants::none().with_network(NetworkPolicy::new(AllowList::empty()));
        assert!(
            empty.describe().contains("nothing allowed"),
            "{}",
            empty.describe()
        );
    }

    #[test]
    fn settings_are_named_clawcage_and_never_the_workspace_variables() {
        let grants = Grants::none()
            .with_setting("CLAWCAGE_SEARCH_ENDPOINT", "http://127.0.0.1:1/")
            .unwrap()
            .with_setting("CLAWCAGE_SEARCH_ENDPOINT", "http://127.0.0.1:2/")
            .unwrap();
        assert_eq!(
            grants.settings(),
            [(
                "CLAWCAGE_SEARCH_ENDPOINT".to_string(),
                "http://127.0.0.1:2/".to_string()
            )]
        );
        for bad in [
            "PATH",
            "BRAVE_API_KEY",
            "CLAWCAGE_",
            "CLAWCAGE_WORKSPACE",
            "CLAWCAGE_x",
        ] {
            assert!(Grants::none().with_setting(bad, "v").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_workspace_must_be_an_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            WorkspaceGrant::new(&file, FsMode::ReadWrite),
            Err(GrantError::NotADirectory(_))
        ));
        assert!(matches!(
            WorkspaceGrant::new(dir.path().join("missing"), FsMode::ReadWrite),
            Err(GrantError::Unresolvable { .. })
        ));
    }
}
