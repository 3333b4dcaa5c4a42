//! The bundled tools and their grants: the file tools with the workspace, `exec` with the same
//! workspace and the program catalog (found on the first exec call), the web tools with the
//! network policy (secrets read from the environment here and kept on the host), and `cron` with
//! the scheduler only. Registering them compiles nothing once the artifact cache knows them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawcage_agent::approvals::ApprovalBroker;
use clawcage_agent::{CronService, ToolRegistry};
use clawcage_sandbox::{
    BundledComponent, ExecGrant, Grants, Limits, ProgramDirs, Sandbox, components,
};

use crate::config::Config;
use crate::{Error, failed, usage};

/// The bundled components every registry starts from: (name, code, which grants).
enum Which {
    Workspace,
    Web,
    Exec,
}

const BUNDLED: [(&str, &BundledComponent, Which); 3] = [
    ("file", components::bundled::FILE, Which::Workspace),
    ("web", components::bundled::WEB, Which::Web),
    ("exec", components::bundled::EXEC, Which::Exec),
];

/// Where compiled components are cached: `<state-dir>/cache/components`.
pub fn components_cache_dir(state_dir: &Path) -> PathBuf {
    clawcage_agent::StateDir::new(state_dir).components_cache()
}

/// Where `clawcage programs install` puts programs: `<state-dir>/programs`.
pub fn installed_programs_dir(state_dir: &Path) -> PathBuf {
    clawcage_agent::StateDir::new(state_dir).programs()
}

/// The bundled tools under `grants` (the web tools under `web_grants`), exec unless
/// `[exec] enabled = false`.
pub(crate) async fn bundled_registry(
    sandbox: &Arc<Sandbox>,
    config: &Config,
    grants: Grants,
    web_grants: Grants,
    approvals: &ApprovalBroker,
    state_dir: &Path,
) -> Result<ToolRegistry, Error> {
    let exec_enabled = config.exec.enabled.unwrap_or(true);
    let to_compile = BUNDLED
        .iter()
        .filter(|(_, code, which)| {
            (exec_enabled || !matches!(which, Which::Exec)) && sandbox.needs_compile(*code)
        })
        .count();
    sandbox.progress().expect(to_compile);
    let mut registry = ToolRegistry::new();
    for (name, code, which) in BUNDLED {
        let grants = match which {
            Which::Workspace => grants.clone(),
            Which::Web => web_grants.clone(),
            Which::Exec if exec_enabled => {
                let exec = ExecGrant {
                    write_limit_bytes: config
                        .exec_write_limit()
                        .map_err(|error| usage(format!("{error:#}")))?,
                    ..ExecGrant::new(sandbox.programs_on_demand_in(ProgramDirs {
                        installed: Some(installed_programs_dir(state_dir)),
                        operator: config.exec.programs_dir.clone(),
                    }))
                };
                // Always attached: a session may set its own policy later (`/approvals`); the
                // gate is asked only while it is active for the calling session.
                let exec = exec.with_approvals(Arc::new(approvals.clone()));
                grants.clone().with_exec(exec)
            }
            Which::Exec => continue,
        };
        register(sandbox, &mut registry, name, code, grants).await?;
    }
    Ok(registry)
}

/// Loads the bundled component `name` under `grants` and registers its tools.
async fn register(
    sandbox: &Arc<Sandbox>,
    registry: &mut ToolRegistry,
    name: &str,
    code: &'static BundledComponent,
    grants: Grants,
) -> Result<(), Error> {
    let loaded = sandbox
        .load(name, &format!("bundled:{name}"), code, grants)
        .await
        .map_err(failed)?;
    for tool in loaded.into_tools() {
        registry.register(Arc::new(tool)).map_err(failed)?;
    }
    Ok(())
}

/// The web component's grants: no files, the network the config allows (nothing without
/// `[network] allow`), the secrets read from the environment here, and the search endpoint.
pub(crate) fn web_grants(
    config: &Config,
    limits: Limits,
    approvals: &ApprovalBroker,
) -> Result<Grants, Error> {
    let policy = config
        .network
        .policy(|name| std::env::var(name).ok())
        .map_err(|error| usage(format!("{error:#}")))?
        .with_approvals(Arc::new(approvals.clone()));
    let mut grants = Grants::none().with_limits(limits).with_network(policy);
    if let Some(endpoint) = config
        .web
        .search_endpoint()
        .map_err(|error| usage(format!("{error:#}")))?
    {
        grants = grants
            .with_setting("CLAWCAGE_SEARCH_ENDPOINT", &endpoint)
            .map_err(usage)?;
    }
    Ok(grants)
}

/// The web component's grants when nothing may be reached (the demo).
pub(crate) fn no_network(limits: Limits) -> Grants {
    Grants::none()
        .with_limits(limits)
        .with_network(clawcage_sandbox::NetworkPolicy::new(
            clawcage_sandbox::AllowList::empty(),
        ))
}

/// Takes the exclusive lock on `<dir>/owner.lock` that makes this process the one running the
/// jobs; `None` when another process holds it.
pub(crate) fn lock_cron(dir: &Path) -> Result<Option<std::fs::File>, Error> {
    let owner = std::fs::create_dir_all(dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("owner.lock"))
        })
        .map_err(|error| {
            usage(format!(
                "cannot use {} for cron jobs ({error}); fix --state-dir or set [cron] enabled = false",
                dir.display()
            ))
        })?;
    match owner.try_lock() {
        Ok(()) => Ok(Some(owner)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(error)) => Err(usage(format!(
            "cannot lock {} for cron jobs ({error}); fix --state-dir or set [cron] enabled = false",
            dir.join("owner.lock").display()
        ))),
    }
}

/// Registers the `cron` tool, granted only the scheduler `service`.
pub(crate) async fn register_cron(
    sandbox: &Arc<Sandbox>,
    registry: &mut ToolRegistry,
    service: Arc<CronService>,
    limits: Limits,
) -> Result<(), Error> {
    let scheduler: Arc<dyn clawcage_core::Scheduler> = service;
    register(
        sandbox,
        registry,
        "cron",
        components::bundled::CRON,
        Grants::none().with_limits(limits).with_scheduler(scheduler),
    )
    .await
}

/// Registers the `cron` tool for listing only: its scheduler refuses everything (the tool runs
/// only where the jobs are owned).
pub(crate) async fn register_cron_for_listing(
    sandbox: &Arc<Sandbox>,
    registry: &mut ToolRegistry,
    limits: Limits,
) -> Result<(), Error> {
    register(
        sandbox,
        registry,
        "cron",
        components::bundled::CRON,
        Grants::none()
            .with_limits(limits)
            .with_scheduler(Arc::new(ListingOnly)),
    )
    .await
}

/// A scheduler for a listing: every request is refused.
#[derive(Debug)]
struct ListingOnly;

impl clawcage_core::Scheduler for ListingOnly {
    fn add(&self, _request: clawcage_core::JobRequest) -> Result<clawcage_core::JobInfo, String> {
        Err("this listing only describes the cron tool; use it in an agent (run, chat, gateway, acp) or with `clawcage cron`".to_string())
    }

    fn list(&self) -> Vec<clawcage_core::JobInfo> {
        Vec::new()
    }

    fn remove(&self, _id: &str) -> Result<clawcage_core::JobInfo, String> {
        Err("this listing only describes the cron tool; use it in an agent (run, chat, gateway, acp) or with `clawcage cron`".to_string())
    }
}
