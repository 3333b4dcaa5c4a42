//! The host side of the `scheduler` import (`wit/scheduler.wit`): a component granted the cron
//! capability adds, lists and removes jobs of the [`Scheduler`] the operator gave it
//! ([`crate::Grants::with_scheduler`]). The import is linked only with that grant; without it a
//! component that imports `scheduler` does not load. The calls run in the calling task, so the
//! scheduler can tell which session's turn is calling.

use std::sync::Arc;

use clawcage_core::{JobInfo, JobRequest, Scheduler};
use wasmtime::component::{HasSelf, Linker};

use crate::host::CallState;

use crate::bindings::cron::clawcage::tool::scheduler as wit;

/// The cron capability: the scheduler a component's `scheduler` import calls. Two grants are
/// equal when they name the same scheduler.
#[derive(Debug, Clone)]
pub(crate) struct SchedulerGrant(pub(crate) Arc<dyn Scheduler>);

impl PartialEq for SchedulerGrant {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SchedulerGrant {}

/// Adds the `scheduler` import to `linker` (only for components granted the cron capability).
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)
}

const NOT_GRANTED: &str = "this tool was not granted the cron capability";

impl wit::Host for CallState {
    async fn add(&mut self, request: wit::JobRequest) -> Result<wit::JobInfo, String> {
        let scheduler = self.scheduler.as_ref().ok_or(NOT_GRANTED)?;
        scheduler
            .add(JobRequest {
                every_seconds: request.every_seconds,
                cron: request.cron,
                timezone: request.timezone,
                message: request.message,
                name: request.name,
                session: request.session,
            })
            .map(to_wit)
    }

    async fn list(&mut self) -> Vec<wit::JobInfo> {
        match &self.scheduler {
            Some(scheduler) => scheduler.list().into_iter().map(to_wit).collect(),
            None => Vec::new(),
        }
    }

    async fn remove(&mut self, id: String) -> Result<wit::JobInfo, String> {
        let scheduler = self.scheduler.as_ref().ok_or(NOT_GRANTED)?;
        scheduler.remove(&id).map(to_wit)
    }
}

fn to_wit(job: JobInfo) -> wit::JobInfo {
    wit::JobInfo {
        id: job.id,
        name: job.name,
        schedule: job.schedule,
        timezone: job.timezone,
        message: job.message,
        session: job.session,
        next_fire: job.next_fire,
    }
}
