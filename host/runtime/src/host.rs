//! The running host every agent front end asks for ([`Runtime::host`]): the agent with its
//! sessions, plus what runs beside it while the front end lives — the state directory's cron
//! jobs (fired here when this process owns them, otherwise added, listed and removed through the
//! `cron` tool for the process that fires them) and the route that turns the bus's `system`
//! channel (sub-agent results, cron firings) into turns of the front end's sessions, with the
//! report of the sub-agent runs a stopped process left. `run`, `chat`, the gateway and `acp`
//! keep argument parsing, protocol and rendering; what is added here reaches all of them.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;

use clawcage_agent::cron::FiringSink;
use clawcage_agent::{CronService, NotificationFront, NotificationRoute};
use tokio::task::JoinHandle;

use crate::agent::{Agent, AgentOptions};
use crate::{Error, Runtime};

/// How long the front end asking for a host lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// One task and out (`run`): it manages cron jobs but fires none, and it reads the
    /// sub-agents' results itself ([`Agent::run_task`]).
    OneShot,
    /// Until it is stopped (`chat`, the gateway, `acp`): it fires the state directory's cron
    /// jobs when no other process does, and routes notifications into its sessions.
    LongRunning,
}

/// What the host does with the state directory's cron jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CronStatus {
    /// This host fires the jobs, and its `cron` tool changes them.
    Owned,
    /// Another clawcage process fires the jobs of this directory; this host's `cron` tool adds,
    /// lists and removes them, and that process sees each change within a second.
    OwnedElsewhere(PathBuf),
    /// A one-shot host: its `cron` tool adds, lists and removes the jobs of this directory,
    /// which the long-running host owning them fires (at its next start when none runs).
    Managed(PathBuf),
    /// `[cron] enabled = false`: no `cron` tool, no job fires.
    Disabled,
}

/// The running host: an [`Agent`] (reachable through `Deref`) and what runs beside it. Dropping
/// it stops the notification route and the cron runner.
pub struct Host {
    agent: Agent,
    cron: CronStatus,
    /// The cron service, when this host fires the jobs.
    firing: Option<Arc<CronService>>,
    route: Option<NotificationRoute>,
    cron_runner: Option<JoinHandle<()>>,
}

impl Runtime {
    /// The host for a front end living `lifetime`: takes the cron capability a long-running
    /// front end may have (or the managing `cron` tool), then wires the agent `options` ask for.
    /// Nothing runs in the background until [`Host::start`].
    pub async fn host(&mut self, lifetime: Lifetime, options: AgentOptions) -> Result<Host, Error> {
        let cron = match lifetime {
            Lifetime::LongRunning => match self
                .enable_cron(
                    options
                        .stores
                        .as_ref()
                        .and_then(|stores| stores.cron_jobs.clone()),
                )
                .await?
            {
                crate::CronOwnership::Owned => CronStatus::Owned,
                crate::CronOwnership::OwnedElsewhere(dir) => {
                    self.manage_cron().await?;
                    CronStatus::OwnedElsewhere(dir)
                }
                crate::CronOwnership::Disabled => CronStatus::Disabled,
            },
            Lifetime::OneShot => match self.manage_cron().await? {
                Some(dir) => CronStatus::Managed(dir),
                None => CronStatus::Disabled,
            },
        };
        let firing = match cron {
            CronStatus::Owned => self.cron().cloned(),
            _ => None,
        };
        let agent = self.agent(options).await?;
        Ok(Host {
            agent,
            cron,
            firing,
            route: None,
            cron_runner: None,
        })
    }
}

impl Host {
    /// What this host does with the state directory's cron jobs.
    pub fn cron_status(&self) -> &CronStatus {
        &self.cron
    }

    /// The cron service, when this host fires the jobs.
    pub fn cron(&self) -> Option<&Arc<CronService>> {
        self.firing.as_ref()
    }

    /// Starts what runs beside the agent: the `system` channel routed into `front` (with the
    /// report of interrupted sub-agent runs), and the cron runner when this host fires the jobs,
    /// its firings handed to `firings` (the gateway's inboxes) or else published on the bus,
    /// where the route takes them. A second call changes nothing.
    pub fn start(
        &mut self,
        front: Arc<dyn NotificationFront>,
        firings: Option<Arc<dyn FiringSink>>,
    ) {
        if self.route.is_some() {
            return;
        }
        self.route = Some(self.agent.route_notifications(front));
        if let Some(service) = &self.firing {
            if let Some(sink) = firings {
                service.set_sink(sink);
            }
            self.cron_runner = Some(service.start());
        }
    }

    /// Stops the route and the cron runner now (dropping the host does too).
    pub fn stop(&mut self) {
        if let Some(runner) = self.cron_runner.take() {
            runner.abort();
        }
        if let Some(route) = self.route.take() {
            route.stop();
        }
    }
}

impl Deref for Host {
    type Target = Agent;

    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}
