//! The cron service: jobs that deliver a message to a session at set times, added, listed and
//! removed through the [`Scheduler`] trait (the sandbox's `scheduler` import calls it for the
//! `cron` tool). A job runs either every N seconds or on a cron expression of 5 or 6 fields read
//! in a named time zone; every next-fire time comes from the `croner` crate with `chrono-tz`
//! zones, exact across month ends, leap days and daylight-saving changes. An expression croner
//! refuses is an error that names the bad field.
//!
//! Jobs live in `<dir>/jobs.json`, rewritten atomically (temporary file, then rename) after every
//! change and every firing, and reloaded by [`CronService::open`]. The runner
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
pub use schedule::{CompiledSchedule, Schedule, next_fire};

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
/// The file the jobs are kept in, inside the service's directory.
const JOBS_FILE: &str = "jobs.json";
/// How often the runner looks at the jobs file for changes made by another process.
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
    /// The file is not a jobs file this version can read.
    #[error(
        "the cron jobs file {path} cannot be read: {reason}; repair it, or move it away to start with no jobs"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
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
    /// The jobs file as last read or written by this process (modified time and length), to
    /// notice a change made by another clawcage process (`clawcage cron add` beside a chat).
    stamp: Option<FileStamp>,
}

/// The state under both locks: this process's mutex and the jobs file's lock, which keeps the
/// read-change-write of several clawcage processes apart.
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    _file_lock: Option<std::fs::File>,
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
    file: PathBuf,
    bus: MessageBus,
    options: CronOptions,
    state: Mutex<State>,
    wake: Notify,
    sink: Mutex<Option<Arc<dyn FiringSink>>>,
}

impl fmt::Debug for CronService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronService")
            .field("file", &self.file)
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
        let file = dir.join(JOBS_FILE);
        let state = load_jobs(&file)?;
        Ok(Arc::new(Self {
            file,
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

    async fn run(&self) {
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
    /// it with no lock held, and each job moves on once its firing was taken.
    async fn fire_due(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let sink = self
            .sink
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let mut failed = false;
        if let Some(sink) = &sink {
            let due = self.due_firings(now);
            let mut taken = Vec::new();
            for firing in due {
                match sink.deliver(firing.message.clone(), &firing.key).await {
                    Ok(()) => taken.push(firing),
                    Err(error) => {
                        tracing::warn!(job = %firing.job, %error, "a cron firing could not be delivered; it is tried again in a second");
                        failed = true;
                    }
                }
            }
            self.move_on(&taken);
        }
        let mut state = self.lock();
        let mut firings = Vec::new();
        if sink.is_none() {
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
                tracing::error!(file = %self.file.display(), %error, "could not save the cron jobs after a firing");
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
        for message in firings {
            let sender = message.sender.clone();
            if let Err(error) = self.bus.publish(message) {
                tracing::warn!(%sender, %error, "a cron firing could not be delivered");
            }
        }
        earliest
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

    /// Moves the jobs of `taken` firings on (a job changed or removed meanwhile is left as it
    /// is now), and saves.
    fn move_on(&self, taken: &[DueFiring]) {
        if taken.is_empty() {
            return;
        }
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
            tracing::error!(file = %self.file.display(), %error, "could not save the cron jobs after a firing");
        }
    }

    /// The state, after taking the jobs file's lock and reading the file again if another
    /// process changed it.
    fn lock(&self) -> Locked<'_> {
        // Every update is completed before anything can panic, so the data stays consistent.
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let file_lock = self.file_lock();
        let mut locked = Locked {
            state,
            _file_lock: file_lock,
        };
        let on_disk = file_stamp(&self.file);
        if on_disk.is_some() && on_disk != locked.stamp {
            match load_jobs(&self.file) {
                Ok(fresh) => *locked.state = fresh,
                Err(error) => tracing::error!(
                    file = %self.file.display(),
                    %error,
                    "the cron jobs file changed and cannot be read; keeping the jobs known before"
                ),
            }
        }
        locked
    }

    /// The lock on `jobs.lock` beside the jobs file (`None`, with a warning, if it cannot be
    /// taken: this process's own mutex still orders its own changes).
    fn file_lock(&self) -> Option<std::fs::File> {
        let path = self.file.with_extension("lock");
        let locked = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|file| file.lock().map(|()| file));
        match locked {
            Ok(file) => Some(file),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot lock the cron jobs file");
                None
            }
        }
    }

    /// Writes the jobs atomically (`clawcage_core::files::write_atomically`: a synced temporary
    /// file renamed over the old one, the directory synced).
    fn save(&self, state: &mut State) -> std::io::Result<()> {
        let file = JobsFile {
            next_id: state.next_id,
            jobs: state.jobs.iter().map(|job| job.stored.clone()).collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        clawcage_core::files::write_atomically(&self.file, &bytes, false)?;
        state.stamp = file_stamp(&self.file);
        Ok(())
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

/// What identifies one version of the jobs file: its modified time, length and (on Unix) inode,
/// which every atomic replacement changes.
type FileStamp = (std::time::SystemTime, u64, u64);

/// The jobs file's stamp, if it exists.
fn file_stamp(file: &Path) -> Option<FileStamp> {
    let metadata = std::fs::metadata(file).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    Some((metadata.modified().ok()?, metadata.len(), inode))
}

/// The jobs kept in `file` (none when it does not exist). A file that cannot be read or parsed
/// is an error naming it; it is never overwritten.
fn load_jobs(file: &Path) -> Result<State, CronError> {
    let stamp = file_stamp(file);
    let loaded = match clawcage_core::files::read_regular_file(
        file,
        64 << 20,
        clawcage_core::files::Symlinks::Refuse,
    ) {
        Ok(bytes) => {
            serde_json::from_slice::<JobsFile>(&bytes).map_err(|error| CronError::Corrupt {
                path: file.to_path_buf(),
                reason: error.to_string(),
            })?
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => JobsFile::default(),
        Err(source) => {
            return Err(CronError::Io {
                path: file.to_path_buf(),
                source,
            });
        }
    };
    let mut jobs = Vec::with_capacity(loaded.jobs.len());
    for stored in loaded.jobs {
        let compiled = stored
            .schedule
            .compile()
            .map_err(|reason| CronError::Corrupt {
                path: file.to_path_buf(),
                reason: format!("job {}: {reason}", stored.id),
            })?;
        jobs.push(Job { stored, compiled });
    }
    Ok(State {
        next_id: loaded.next_id,
        jobs,
        stamp,
    })
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
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn cron_in(expression: &str, timezone: &str) -> CompiledSchedule {
        Schedule::Cron {
            expression: expression.to_string(),
            timezone: timezone.to_string(),
        }
        .compile()
        .unwrap()
    }

    /// The next `count` firings strictly after `after`, as RFC 3339 UTC times.
    fn firings(expression: &str, timezone: &str, after: &str, count: usize) -> Vec<String> {
        let schedule = cron_in(expression, timezone);
        let mut at = utc(after);
        let mut out = Vec::new();
        for _ in 0..count {
            at = schedule.next_fire(at).unwrap();
            out.push(at.to_rfc3339_opts(SecondsFormat::Secs, true));
        }
        out
    }

    fn error_of(expression: &str) -> String {
        Schedule::Cron {
            expression: expression.to_string(),
            timezone: "UTC".to_string(),
        }
        .compile()
        .unwrap_err()
    }

    #[test]
    fn last_day_of_month_handles_short_months_and_leap_years() {
        assert_eq!(
            firings("0 0 L * *", "UTC", "2025-01-15T00:00:00Z", 3),
            [
                "2025-01-31T00:00:00Z",
                "2025-02-28T00:00:00Z",
                "2025-03-31T00:00:00Z"
            ]
        );
        assert_eq!(
            firings("0 0 L 2 *", "UTC", "2027-06-01T00:00:00Z", 2),
            ["2028-02-29T00:00:00Z", "2029-02-28T00:00:00Z"]
        );
    }

    #[test]
    fn leap_day_waits_for_the_next_leap_year() {
        assert_eq!(
            firings("0 12 29 2 *", "UTC", "2025-03-01T00:00:00Z", 2),
            ["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"]
        );
    }

    #[test]
    fn weekdays_skip_the_weekend() {
        // 2026-11-27 is a Friday.
        assert_eq!(
            firings("0 9 * * MON-FRI", "UTC", "2026-11-27T18:00:00Z", 2),
            ["2026-11-30T09:00:00Z", "2026-12-01T09:00:00Z"]
        );
    }

    #[test]
    fn nth_weekday_of_the_month() {
        // Second Mondays: 2026-12-14, 2027-01-11, 2027-02-08.
        assert_eq!(
            firings("0 9 * * 1#2", "UTC", "2026-12-01T00:00:00Z", 3),
            [
                "2026-12-14T09:00:00Z",
                "2027-01-11T09:00:00Z",
                "2027-02-08T09:00:00Z"
            ]
        );
        // Last Friday: 2026-12-25.
        assert_eq!(
            firings("0 9 * * 5#L", "UTC", "2026-12-01T00:00:00Z", 1),
            ["2026-12-25T09:00:00Z"]
        );
    }

    #[test]
    fn nearest_weekday_moves_off_weekends_within_the_month() {
        // 2026-08-15 is a Saturday -> Friday the 14th; 2026-11-15 is a Sunday -> Monday the 16th;
        // 2026-09-15 is a Tuesday -> itself.
        assert_eq!(
            firings("0 0 15W * *", "UTC", "2026-08-01T00:00:00Z", 4),
            [
                "2026-08-14T00:00:00Z",
                "2026-09-15T00:00:00Z",
                "2026-10-15T00:00:00Z",
                "2026-11-16T00:00:00Z"
            ]
        );
        // 2026-08-01 is a Saturday: 1W stays in August, on Monday the 3rd.
        assert_eq!(
            firings("0 0 1W 8 *", "UTC", "2026-07-01T00:00:00Z", 1),
            ["2026-08-03T00:00:00Z"]
        );
    }

    #[test]
    fn six_fields_have_seconds_first() {
        assert_eq!(
            firings("*/20 * * * * *", "UTC", "2026-01-01T00:00:05Z", 3),
            [
                "2026-01-01T00:00:20Z",
                "2026-01-01T00:00:40Z",
                "2026-01-01T00:01:00Z"
            ]
        );
        assert_eq!(
            firings("30 15 10 * * *", "UTC", "2026-01-01T12:00:00Z", 1),
            ["2026-01-02T10:15:30Z"]
        );
    }

    #[test]
    fn named_months_ranges_and_lists() {
        assert_eq!(
            firings("0 8 1 JAN-MAR *", "UTC", "2026-02-15T00:00:00Z", 3),
            [
                "2026-03-01T08:00:00Z",
                "2027-01-01T08:00:00Z",
                "2027-02-01T08:00:00Z"
            ]
        );
        assert_eq!(
            firings("0,30 8-9 * * SAT,sun", "UTC", "2026-11-27T00:00:00Z", 5),
            [
                "2026-11-28T08:00:00Z",
                "2026-11-28T08:30:00Z",
                "2026-11-28T09:00:00Z",
                "2026-11-28T09:30:00Z",
                "2026-11-29T08:00:00Z"
            ]
        );
    }

    #[test]
    fn named_zone_follows_standard_and_summer_time() {
        // 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
        assert_eq!(
            firings("0 9 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"]
        );
        assert_eq!(
            firings("0 9 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z"]
        );
    }

    #[test]
    fn spring_forward_runs_a_skipped_time_at_the_end_of_the_gap() {
        // On 2026-03-29 Berlin clocks jump from 02:00 CET to 03:00 CEST, so 02:30 does not exist.
        // croner runs a fixed-time job that falls into the gap at the first instant after it:
        // 03:00 CEST = 01:00 UTC. The days around it run at 02:30 local as usual.
        assert_eq!(
            firings("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 4),
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
                "2026-03-31T00:30:00Z"
            ]
        );
    }

    #[test]
    fn fall_back_runs_a_repeated_time_once() {
        // On 2026-10-25 Berlin clocks go back from 03:00 CEST to 02:00 CET, so 02:30 happens
        // twice (00:30 and 01:30 UTC). A fixed-time job runs once, at the earlier instant.
        assert_eq!(
            firings("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
        // An interval job runs on every real instant: both 02:30s happen within the hour.
        assert_eq!(
            firings("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 5),
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z"
            ]
        );
    }

    #[test]
    fn every_seconds_counts_from_the_given_time() {
        let schedule = Schedule::Every { seconds: 90 }.compile().unwrap();
        assert_eq!(
            schedule.next_fire(utc("2026-01-01T00:00:00Z")),
            Some(utc("2026-01-01T00:01:30Z"))
        );
        assert!(Schedule::Every { seconds: 0 }.compile().is_err());
        assert!(
            Schedule::Every {
                seconds: MAX_EVERY_SECONDS + 1
            }
            .compile()
            .is_err()
        );
    }

    #[test]
    fn invalid_expressions_name_the_field() {
        for (expression, field) in [
            ("61 * * * *", "the minute field `61`"),
            ("0 24 * * *", "the hour field `24`"),
            ("0 0 32 * *", "the day-of-month field `32`"),
            ("0 0 * 13 *", "the month field `13`"),
            ("0 0 * FOO *", "the month field `FOO`"),
            ("0 9 * * MOX", "the day-of-week field `MOX`"),
            ("0 9 * * 1#6", "the day-of-week field `1#6`"),
            ("60 0 9 * * *", "the second field `60`"),
            ("0 0 1 MON *", "the month field `MON`"),
            ("0 0 * * JAN", "the day-of-week field `JAN`"),
            ("0 0 LX * *", "the day-of-month field `LX`"),
        ] {
            let error = error_of(expression);
            assert!(error.contains(field), "{expression}: {error}");
        }
        assert!(error_of("0 9 * *").contains("has 4 fields"));
        assert!(error_of("0 0 9 * * * 2026").contains("has 7 fields"));
        assert!(error_of("").contains("has 0 fields"));
        assert!(error_of("0 0 30 2 *").contains("never fires"));
        assert!(error_of(&"1,".repeat(200)).contains("longer than"));
    }

    #[test]
    fn unknown_time_zones_are_refused() {
        for zone in ["Mars/Olympus", "europe/berlin", "", "../../etc/passwd"] {
            let error = Schedule::Cron {
                expression: "0 9 * * *".to_string(),
                timezone: zone.to_string(),
            }
            .compile()
            .unwrap_err();
            assert!(error.contains("unknown time zone"), "{zone}: {error}");
        }
    }

    #[test]
    fn two_processes_on_one_state_directory_see_each_others_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let chat =
            CronService::open(dir.path(), MessageBus::new(), CronOptions::default()).unwrap();
        let cli = CronService::open(dir.path(), MessageBus::new(), CronOptions::default()).unwrap();
        let request = |message: &str| JobRequest {
            every_seconds: Some(3600),
            cron: None,
            timezone: None,
            message: message.to_string(),
            name: None,
            session: Some("main".to_string()),
        };
        let first = cli.add(request("from the command line")).unwrap();
        let second = chat.add(request("from the chat")).unwrap();
        assert_ne!(first.id, second.id, "ids are taken under the file's lock");
        assert_eq!(cli.list().len(), 2);
        chat.remove(&first.id).unwrap();
        let left = cli.list();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].message, "from the chat");
    }
}
