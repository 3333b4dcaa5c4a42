//! The cron service: jobs that deliver a message to a session at set times, added, listed and
//! removed through the [`Scheduler`] trait (the sandbox's `scheduler` import calls it for the
//! `cron` tool). A job runs either every N seconds or on a cron expression of 5 or 6 fields read
//! in a named time zone; every next-fire time comes from the `croner` crate with `chrono-tz`
//! zones, exact across month ends, leap days and daylight-saving changes. An expression croner
//! refuses is an error that names the bad field.
//!
//! Jobs live in a [`RecordStore`]: by default `<dir>/jobs.json`, rewritten atomically (temporary
//! file, then rename) after every change and every firing, and reloaded by [`CronService::open`];
//! in a cluster, one record of a key-value bucket that every gateway host reads
//! ([`CronService::open_in`]), written only at the version last read, so of two hosts changing
//! the jobs at once one is told to try again. The runner
//! ([`CronService::start`]) sleeps until the earliest firing, or until `add`/`remove` wakes it,
//! and publishes each firing on the [`MessageBus`] `system` channel for the job's session, whose
//! lane then takes it as a turn.
//!
//! Missed firings: a job whose next firing passed while the process was down fires once when the
//! runner starts (however many firings were missed), then continues from that moment — a cron
//! job at its next matching time after now, an `every_seconds` job one interval after now.
//!
//! Exactly once: with a [`FiringSink`] ([`CronService::set_sink`], the gateway's sessions), a
//! firing is delivered durably — into its session's inbox, under the key `cron:<job>:<due>` —
//! *before* the job is moved on in the file; a crash between the two fires the same slot again
//! at the next start, and the key makes the inbox recognise it, so the slot is neither lost nor
//! doubled. Without a sink (a `chat` running the jobs), a firing is recorded in the file before
//! it is published on the bus, so a crash between the two loses that one firing rather than
//! delivering it twice.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clawcage_core::{InboundMessage, JobInfo, JobRequest, Scheduler};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::bus::MessageBus;
use crate::subagent::SYSTEM_CHANNEL;

mod schedule;
mod stored;
use clawcage_core::records::{FileRecord, RecordStore, RecordWriteError, StoredRecord};
pub use schedule::{CompiledSchedule, Schedule, next_fire};
use stored::{guard_of, load_jobs, parse_jobs};

/// The file the jobs are kept in, inside the cron directory.
pub const JOBS_FILE: &str = "jobs.json";

/// The largest jobs file read (100 jobs of 4,000 characters are well under it).
const MAX_JOBS_FILE: u64 = 64 << 20;

/// Jobs one service keeps by default.
pub const DEFAULT_MAX_JOBS: usize = 100;
/// The shortest `every_seconds` interval.
pub const MIN_EVERY_SECONDS: u64 = 1;
/// The longest `every_seconds` interval (366 days).
pub const MAX_EVERY_SECONDS: u64 = 366 * 24 * 3600;
/// Characters a job's message may have.
pub const MAX_MESSAGE_CHARS: usize = 4_000;
/// Characters a job's name may have.
pub const MAX_NAME_CHARS: usize = 100;
/// Characters a cron expression may have.
pub const MAX_EXPRESSION_CHARS: usize = 200;
/// Characters a time zone name or a session key may have.
const MAX_KEY_CHARS: usize = 200;
/// The longest the runner sleeps before looking at the wall clock again (it may have jumped).
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// How often the runner looks at the jobs for changes made by another process.
const POLL: Duration = Duration::from_secs(1);

/// One job as `jobs.json` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredJob {
    /// `job-N`.
    pub id: String,
    /// The name shown in listings.
    pub name: String,
    /// When it fires.
    pub schedule: Schedule,
    /// The text delivered.
    pub message: String,
    /// The session it is delivered to.
    pub session: String,
    /// Its next firing; `None` when it never fires again.
    pub next_fire: Option<DateTime<Utc>>,
    /// When it was added.
    pub created: DateTime<Utc>,
}

/// The whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct JobsFile {
    /// The number the next job's id gets.
    next_id: u64,
    jobs: Vec<StoredJob>,
}

/// Why the service could not open its directory.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    /// The directory or file could not be read or created.
    #[error("cannot use the cron directory {path}: {source}; check that it is writable")]
    Io {
        /// The path.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The jobs are not a record this version can read.
    #[error(
        "the cron jobs in {place} cannot be read: {reason}; repair that record, or move it away to start with no jobs"
    )]
    Corrupt {
        /// Where they are (a file, a bucket).
        place: String,
        /// What is wrong.
        reason: String,
    },
    /// The store could not be read.
    #[error("cannot read the cron jobs in {place}: {reason}; check that it is reachable")]
    Store {
        /// Where they are.
        place: String,
        /// Why.
        reason: String,
    },
}

/// How a [`CronService`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronOptions {
    /// The session a job goes to when it is added outside any session's turn and names none.
    pub default_session: String,
    /// Jobs kept at most; adding beyond is refused.
    pub max_jobs: usize,
}

impl Default for CronOptions {
    fn default() -> Self {
        Self {
            default_session: "main".to_string(),
            max_jobs: DEFAULT_MAX_JOBS,
        }
    }
}

struct Job {
    stored: StoredJob,
    compiled: CompiledSchedule,
}

struct State {
    next_id: u64,
    jobs: Vec<Job>,
    /// The version of the jobs as last read or written by this process, to notice a change
    /// made by another clawcage process (`clawcage cron add` beside a chat, another host).
    version: Option<String>,
}

/// The state under both locks: this process's mutex and the store's guard (a file lock), which
/// keeps the read-change-write of several clawcage processes apart.
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    _store_guard: Option<Box<dyn Send>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

/// Where a job fired at `due` goes next: on time, it keeps its cadence; late, it counts from
/// `now`.
fn next_after(
    compiled: &CompiledSchedule,
    due: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match compiled {
        CompiledSchedule::Every(_) => compiled
            .next_fire(due)
            .filter(|next| *next > now)
            .or_else(|| compiled.next_fire(now)),
        CompiledSchedule::Cron(..) => compiled.next_fire(now),
    }
}

/// The message a firing of `job` sends to its session.
fn firing_message(job: &Job) -> InboundMessage {
    InboundMessage {
        channel: SYSTEM_CHANNEL.to_string(),
        sender: format!("cron:{}", job.stored.id),
        session_key: job.stored.session.clone(),
        content: format!("[cron job {}] {}", job.stored.name, job.stored.message),
    }
}

/// Where firings go when they must arrive exactly once: into their session's inbox, durably,
/// recognising a firing delivered before by its key.
pub trait FiringSink: Send + Sync {
    /// Deliver `message` under `key` (`cron:<job id>:<due time>`), durable when the future
    /// ends `Ok`; a key delivered before is `Ok` without a second delivery. An error keeps the
    /// job due, to be tried again.
    fn deliver<'a>(
        &'a self,
        message: InboundMessage,
        key: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

    /// Whether this sink delivers into `session` (a host of a cluster serving its share of the
    /// sessions delivers only into its own; another host fires the rest). A firing it does not
    /// deliver stays due, without a warning.
    fn delivers_to(&self, _session: &str) -> bool {
        true
    }
}

/// A firing due for a [`FiringSink`]: handed over with no lock held, then its job moves on.
struct DueFiring {
    job: String,
    due: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    key: String,
    message: InboundMessage,
}

/// The cron service. Share it as an `Arc`; give it to the `cron` component with
/// `Grants::with_scheduler` and run [`CronService::start`] once.
pub struct CronService {
    store: Arc<dyn RecordStore>,
    bus: MessageBus,
    options: CronOptions,
    state: Mutex<State>,
    wake: Notify,
    sink: Mutex<Option<Arc<dyn FiringSink>>>,
}

impl fmt::Debug for CronService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronService")
            .field("store", &self.store)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl CronService {
    /// Opens the service kept in `dir` (created if missing), loading `dir/jobs.json` if present.
    /// Firings go to `bus`. Jobs whose firing passed while nothing ran fire once when the runner
    /// starts.
    pub fn open(
        dir: impl AsRef<Path>,
        bus: MessageBus,
        options: CronOptions,
    ) -> Result<Arc<Self>, CronError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| CronError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let file = FileRecord::new(dir.join(JOBS_FILE), MAX_JOBS_FILE, false);
        Self::open_in(Arc::new(file), bus, options)
    }

    /// Opens the service over the jobs `store` keeps (a cluster's bucket), loading them.
    pub fn open_in(
        store: Arc<dyn RecordStore>,
        bus: MessageBus,
        options: CronOptions,
    ) -> Result<Arc<Self>, CronError> {
        let state = {
            let _guard = guard_of(store.as_ref());
            load_jobs(store.as_ref())?
        };
        Ok(Arc::new(Self {
            store,
            bus,
            options,
            state: Mutex::new(state),
            wake: Notify::new(),
            sink: Mutex::new(None),
        }))
    }

    /// Deliver firings through `sink`, exactly once, instead of publishing them on the bus.
    pub fn set_sink(&self, sink: Arc<dyn FiringSink>) {
        *self
            .sink
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(sink);
        self.wake.notify_one();
    }

    /// Starts the runner that publishes firings; it runs until the handle is aborted. Start it
    /// once per service.
    pub fn start(self: &Arc<Self>) -> JoinHandle<()> {
        let service = Arc::clone(self);
        tokio::spawn(async move { service.run().await })
    }

    async fn run(self: Arc<Self>) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            // Register before looking, so an add between the look and the wait is not missed.
            notified.as_mut().enable();
            let now = Utc::now();
            let earliest = self.fire_due(now).await;
            // Looked at again at least every POLL, for jobs another process added.
            let sleep = earliest
                .and_then(|next| (next - Utc::now()).to_std().ok())
                .unwrap_or(if earliest.is_some() {
                    Duration::ZERO
                } else {
                    POLL
                })
                .min(MAX_SLEEP)
                .min(POLL);
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = &mut notified => {}
            }
        }
    }

    /// Fires every job due at `now` (once each, however late), moves them on, saves, publishes,
    /// and returns the earliest next firing of all jobs. With a sink, the firings are handed to
    /// it with no lock held, and each job moves on once its firing was taken. The store's reads
    /// and writes (a file, or a record on the cluster that may take seconds to answer) run on
    /// the blocking pool, never on a thread of the runtime the other tasks need.
    async fn fire_due(self: &Arc<Self>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let sink = self
            .sink
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let mut failed = false;
        if let Some(sink) = &sink {
            let due = self
                .off_the_runtime(move |service| service.due_firings(now))
                .await
                .unwrap_or_default();
            let mut taken = Vec::new();
            for firing in due {
                if !sink.delivers_to(&firing.message.session_key) {
                    // Another host fires it: looked at again in a second, when it has.
                    failed = true;
                    continue;
                }
                match sink.deliver(firing.message.clone(), &firing.key).await {
                    Ok(()) => taken.push(firing),
                    Err(error) => {
                        tracing::warn!(job = %firing.job, %error, "a cron firing could not be delivered; it is tried again in a second");
                        failed = true;
                    }
                }
            }
            if !taken.is_empty() {
                self.off_the_runtime(move |service| service.move_on(&taken))
                    .await;
            }
        }
        let with_sink = sink.is_some();
        let (earliest, firings) = self
            .off_the_runtime(move |service| service.settle(now, with_sink, failed))
            .await
            .unwrap_or((Some(now + chrono::Duration::seconds(1)), Vec::new()));
        for message in firings {
            let sender = message.sender.clone();
            if let Err(error) = self.bus.publish(message) {
                tracing::warn!(%sender, %error, "a cron firing could not be delivered");
            }
        }
        earliest
    }

    /// Runs `job` on the blocking pool (`None` when it panicked there).
    async fn off_the_runtime<T: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&Self) -> T + Send + 'static,
    ) -> Option<T> {
        let service = Arc::clone(self);
        tokio::task::spawn_blocking(move || job(&service))
            .await
            .ok()
    }

    /// Without a sink, moves the due jobs on, saves, and returns their firings to publish; with
    /// or without, the earliest next firing of all jobs (in a second at the latest when a
    /// delivery `failed`).
    fn settle(
        &self,
        now: DateTime<Utc>,
        with_sink: bool,
        failed: bool,
    ) -> (Option<DateTime<Utc>>, Vec<InboundMessage>) {
        let mut state = self.lock();
        let mut firings = Vec::new();
        if !with_sink {
            for job in &mut state.jobs {
                let Some(due) = job.stored.next_fire else {
                    continue;
                };
                if due > now {
                    continue;
                }
                job.stored.next_fire = next_after(&job.compiled, due, now);
                firings.push(firing_message(job));
            }
            if !firings.is_empty()
                && let Err(error) = self.save(&mut state)
            {
                tracing::error!(jobs = %self.store.describe(), %error, "could not save the cron jobs after a firing");
            }
        }
        let mut earliest = state
            .jobs
            .iter()
            .filter_map(|job| job.stored.next_fire)
            .filter(|next| !failed || *next > now)
            .min();
        if failed {
            // Not at once again: the sink said no.
            let retry = now + chrono::Duration::seconds(1);
            earliest = Some(earliest.map_or(retry, |next| next.min(retry)));
        }
        drop(state);
        (earliest, firings)
    }

    /// The firings due at `now`, for a sink, each with its key and where its job goes next.
    fn due_firings(&self, now: DateTime<Utc>) -> Vec<DueFiring> {
        let state = self.lock();
        let mut due_firings = Vec::new();
        for job in &state.jobs {
            let Some(due) = job.stored.next_fire else {
                continue;
            };
            if due > now {
                continue;
            }
            due_firings.push(DueFiring {
                job: job.stored.id.clone(),
                due,
                next: next_after(&job.compiled, due, now),
                // Delivered before the job moves on: a crash between the two fires this slot
                // again, and its key makes the inbox recognise it.
                key: format!(
                    "cron:{}:{}",
                    job.stored.id,
                    due.to_rfc3339_opts(SecondsFormat::Millis, true)
                ),
                message: firing_message(job),
            });
        }
        due_firings
    }

    /// Moves the jobs of `taken` firings (not none) on (a job changed or removed meanwhile is
    /// left as it is now), and saves.
    fn move_on(&self, taken: &[DueFiring]) {
        let mut state = self.lock();
        for firing in taken {
            if let Some(job) = state
                .jobs
                .iter_mut()
                .find(|job| job.stored.id == firing.job && job.stored.next_fire == Some(firing.due))
            {
                job.stored.next_fire = firing.next;
            }
        }
        if let Err(error) = self.save(&mut state) {
            // Another host moved them on meanwhile, or the store failed: the next look reads
            // them again, and a slot fired again is recognised by its key.
            tracing::warn!(jobs = %self.store.describe(), %error, "could not save the cron jobs after a firing");
        }
    }

    /// The state, after taking the store's guard and reading the jobs again if another process
    /// changed them.
    fn lock(&self) -> Locked<'_> {
        // Every update is completed before anything can panic, so the data stays consistent.
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut locked = Locked {
            state,
            _store_guard: guard_of(self.store.as_ref()),
        };
        match self.store.read(locked.version.as_deref()) {
            Ok(StoredRecord::Found { bytes, version }) => {
                match parse_jobs(&bytes, Some(version), &self.store.describe()) {
                    Ok(fresh) => *locked.state = fresh,
                    Err(error) => tracing::error!(
                        %error,
                        "the cron jobs changed and cannot be read; keeping the jobs known before"
                    ),
                }
            }
            Ok(StoredRecord::Unchanged | StoredRecord::Missing) => {}
            Err(error) => tracing::warn!(
                jobs = %self.store.describe(),
                %error,
                "cannot read the cron jobs; keeping the jobs known before"
            ),
        }
        locked
    }

    /// Writes the jobs to the store, at the version last read (see [`RecordStore::write`]).
    fn save(&self, state: &mut State) -> std::io::Result<()> {
        let file = JobsFile {
            next_id: state.next_id,
            jobs: state.jobs.iter().map(|job| job.stored.clone()).collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        match self.store.write(&bytes, state.version.as_deref()) {
            Ok(version) => {
                state.version = Some(version);
                Ok(())
            }
            Err(RecordWriteError::Changed) => {
                // Read again at the next look; this change is not made.
                state.version = None;
                Err(std::io::Error::other(
                    "the jobs were changed meanwhile by another host; try again",
                ))
            }
            Err(RecordWriteError::Failed(reason)) => Err(std::io::Error::other(reason)),
        }
    }

    fn info(job: &StoredJob) -> JobInfo {
        JobInfo {
            id: job.id.clone(),
            name: job.name.clone(),
            schedule: job.schedule.describe(),
            timezone: job.schedule.timezone().to_string(),
            message: job.message.clone(),
            session: job.session.clone(),
            next_fire: job
                .next_fire
                .map(|time| time.to_rfc3339_opts(SecondsFormat::Secs, true)),
        }
    }

    fn check_request(request: &JobRequest) -> Result<Schedule, String> {
        let message = request.message.trim();
        if message.is_empty() {
            return Err("the message is empty; say what should happen at each firing".to_string());
        }
        let message_chars = request.message.chars().count();
        if message_chars > MAX_MESSAGE_CHARS {
            return Err(format!(
                "the message has {message_chars} characters; at most {MAX_MESSAGE_CHARS} are allowed, so shorten it or point to a file"
            ));
        }
        if let Some(name) = &request.name {
            let chars = name.chars().count();
            if chars == 0 || chars > MAX_NAME_CHARS || name.chars().any(char::is_control) {
                return Err(format!(
                    "the name must have 1 to {MAX_NAME_CHARS} characters and no control characters"
                ));
            }
        }
        if let Some(session) = &request.session
            && (session.is_empty()
                || session.chars().count() > MAX_KEY_CHARS
                || session.chars().any(char::is_control))
        {
            return Err(format!(
                "the session key must have 1 to {MAX_KEY_CHARS} characters and no control characters"
            ));
        }
        match (request.every_seconds, &request.cron) {
            (Some(seconds), None) => {
                if request.timezone.is_some() {
                    return Err(
                        "a time zone applies only to cron expressions; every_seconds counts from now"
                            .to_string(),
                    );
                }
                Ok(Schedule::Every { seconds })
            }
            (None, Some(expression)) => Ok(Schedule::Cron {
                expression: expression.trim().to_string(),
                timezone: request
                    .timezone
                    .clone()
                    .unwrap_or_else(|| "UTC".to_string()),
            }),
            (Some(_), Some(_)) => {
                Err("give either every_seconds or a cron expression, not both".to_string())
            }
            (None, None) => Err(
                "give every_seconds (a number of seconds) or a cron expression such as \"0 9 * * MON-FRI\""
                    .to_string(),
            ),
        }
    }
}

impl Scheduler for CronService {
    fn add(&self, request: JobRequest) -> Result<JobInfo, String> {
        let schedule = Self::check_request(&request)?;
        let compiled = schedule.compile()?;
        let now = Utc::now();
        let next_fire = compiled.next_fire(now);
        if next_fire.is_none() {
            return Err(format!(
                "the schedule `{}` never fires again",
                schedule.describe()
            ));
        }
        let session = request
            .session
            .or_else(crate::session::current_session_key)
            .unwrap_or_else(|| self.options.default_session.clone());
        let mut state = self.lock();
        if state.jobs.len() >= self.options.max_jobs {
            return Err(format!(
                "there are already {} scheduled jobs, the most allowed; remove one first (action \"list\" shows them)",
                state.jobs.len()
            ));
        }
        state.next_id += 1;
        let id = format!("job-{}", state.next_id);
        let stored = StoredJob {
            name: request.name.unwrap_or_else(|| id.clone()),
            id,
            schedule,
            message: request.message,
            session,
            next_fire,
            created: now,
        };
        let info = Self::info(&stored);
        state.jobs.push(Job { stored, compiled });
        if let Err(error) = self.save(&mut state) {
            state.jobs.pop();
            state.next_id -= 1;
            return Err(format!(
                "the job could not be saved ({error}); it was not added"
            ));
        }
        drop(state);
        self.wake.notify_one();
        Ok(info)
    }

    fn list(&self) -> Vec<JobInfo> {
        let state = self.lock();
        let mut jobs: Vec<&StoredJob> = state.jobs.iter().map(|job| &job.stored).collect();
        // Soonest first; jobs that never fire again last.
        jobs.sort_by_key(|job| (job.next_fire.is_none(), job.next_fire));
        jobs.into_iter().map(Self::info).collect()
    }

    fn remove(&self, id: &str) -> Result<JobInfo, String> {
        let mut state = self.lock();
        let Some(index) = state.jobs.iter().position(|job| job.stored.id == id) else {
            let known: Vec<&str> = state
                .jobs
                .iter()
                .map(|job| job.stored.id.as_str())
                .collect();
            return Err(if known.is_empty() {
                format!("there is no job `{id}`; no jobs are scheduled")
            } else {
                format!("there is no job `{id}`; the jobs are {}", known.join(", "))
            });
        };
        let removed = state.jobs.remove(index);
        if let Err(error) = self.save(&mut state) {
            state.jobs.insert(index, removed);
            return Err(format!(
                "the jobs file could not be saved ({error}); the job was not removed"
            ));
        }
        drop(state);
        self.wake.notify_one();
        Ok(Self::info(&removed.stored))
    }
}

#[cfg(test)]
mod tests;
