//! The scheduling contract between the `cron` tool and the host: a [`Scheduler`] adds, lists and
//! removes jobs that deliver a message to a session at set times. The tool reaches it only
//! through the sandbox's `scheduler` import, linked when the operator grants it; the agent crate
//! implements it (`CronService`). Plain types and a synchronous, object-safe trait, so this crate
//! stays free of any runtime.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a caller asks to schedule: exactly one of `every_seconds` and `cron`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    /// Fire every this many seconds, starting this many seconds from now.
    pub every_seconds: Option<u64>,
    /// A cron expression of 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds
    /// first).
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (e.g. `Europe/Berlin`); UTC when absent.
    pub timezone: Option<String>,
    /// The text delivered to the session at each firing.
    pub message: String,
    /// A short name shown in listings; the id when absent.
    pub name: Option<String>,
    /// The session that receives the firings; the calling session when absent.
    pub session: Option<String>,
}

/// A scheduled job as listings show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The job's id, used to remove it.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The schedule in words, e.g. `every 60 s` or `cron 0 9 * * MON-FRI`.
    pub schedule: String,
    /// The time zone the schedule is read in.
    pub timezone: String,
    /// The text delivered at each firing.
    pub message: String,
    /// The session that receives the firings.
    pub session: String,
    /// The next firing as an RFC 3339 time, or `None` when the schedule never fires again.
    pub next_fire: Option<String>,
}

/// Adds, lists and removes scheduled jobs. Errors are sentences for the model: they say what was
/// wrong and what to do instead.
pub trait Scheduler: Send + Sync + fmt::Debug {
    /// Schedule a new job.
    fn add(&self, request: JobRequest) -> Result<JobInfo, String>;
    /// Every job, soonest first.
    fn list(&self) -> Vec<JobInfo>;
    /// Remove the job with this id and return it.
    fn remove(&self, id: &str) -> Result<JobInfo, String>;
}
