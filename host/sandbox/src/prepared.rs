//! Instances made before their call. A fresh instance per call costs its making (store, WASI
//! context, instantiation) and its unmaking (the store's drop, the pooled memory's reset); both
//! move off the call's path here. For each component loaded with one set of grants, a few
//! instances wait ready — built from those grants and instantiated, never called — and a call
//! takes one, calls it once and hands its store to the sandbox's background thread, which drops
//! it and prepares the next.
//!
//! The invariant is unchanged: **an instance serves exactly one call and is then destroyed.** A
//! waiting instance has run no guest export; nothing of a call survives into another. What
//! depends on the call (its deadline, the exec context with the approved commands, an operator
//! asked before writes) is set when the call starts, never when the instance was made; a call
//! that asks before writes (its guest clock and workspace mode differ) makes its own instance.
//! The grants are those the tools were loaded with, so a grant change (another workspace, a
//! read-only run, a plugin's narrowed grant) is another load with its own waiting instances; a
//! workspace directory replaced at its path since an instance was made sends the call to a new
//! one. Waiting instances are bounded ([`WAITING_PER_COMPONENT`] per loaded component, at most
//! [`WAITING_PER_PROCESS`] in the process, out of the pooling allocator's slots) and dropped after
//! [`IDLE`] unused (by default).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use wasmtime::Store;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use crate::bindings::BasicTool;
use crate::grants::Grants;
use crate::host::CallState;
use crate::sandbox::CompiledComponent;

/// Instances kept waiting for one loaded component (one set of grants): two, so a model's
/// parallel calls of one tool (two reads at once) both find one.
pub(crate) const WAITING_PER_COMPONENT: usize = 2;

/// Waiting instances in the whole process, out of the pooling allocator's
/// [`crate::sandbox::POOL_INSTANCES`] slots: each holds its slot and the memory its
/// instantiation touched (about a megabyte for a bundled tool) until it is used or trimmed.
pub(crate) const WAITING_PER_PROCESS: usize = 32;

/// Background jobs (a used store's drop and the next instance's preparation) at most running at
/// once for one loaded component. A call that finds this many running drops its store itself and
/// leaves the preparation to them: calls back to back (a loop, a flood of parallel calls) then
/// cost no more than instances made during each call, never wake a worker per call, and never
/// hold more of the pool's slots than the waiting instances and these jobs.
pub(crate) const BACKGROUND_PER_COMPONENT: usize = 2;

/// Calls of one component closer together than this are back to back: once a call finds no
/// instance ready while one is being prepared (the preparation cannot keep up), calls make their
/// own instances and drop their own stores, as without instances made ahead, which costs the
/// least CPU per call; preparing resumes once no call has come for this long.
pub(crate) const BACK_TO_BACK: Duration = Duration::from_millis(2);

/// How long the background thread looks for the next job before it parks, when jobs come this
/// close together (see [`run_background_jobs`]): long enough to span a call and the
/// preparation after it, short enough that a thread spinning for calls that do not come costs
/// little (at most this much CPU after each call that found it parked).
pub(crate) const SPIN_WHILE_EXPECTED: Duration = Duration::from_micros(200);

/// A waiting instance unused this long is dropped, so an idle session holds none (the default
/// of [`crate::SandboxOptions::idle_instances`]).
pub(crate) const IDLE: Duration = Duration::from_secs(30);

/// Work done off the calls' path: a used store's drop, the next instance's preparation.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The count of waiting instances in a sandbox, shared by every component's
/// [`WaitingInstances`], and the thread that drops used stores and prepares instances.
///
/// That work runs on a thread of its own (one per sandbox, started with the first job, ended
/// with the sandbox), not on the caller's async runtime: a job handed to a runtime's worker
/// wakes another worker per call, and the wake, the park and the worker's search for more
/// work cost more CPU than the job itself. Calls back to back hand it nothing (see
/// [`BACK_TO_BACK`]); it parks whenever there is nothing to prepare.
#[derive(Debug)]
pub(crate) struct WaitingBudget {
    waiting: AtomicUsize,
    /// How long an instance may wait unused.
    idle: Duration,
    background: OnceLock<Option<mpsc::UnboundedSender<Job>>>,
}

impl WaitingBudget {
    pub(crate) fn new(idle: Duration) -> Self {
        Self {
            waiting: AtomicUsize::new(0),
            idle,
            background: OnceLock::new(),
        }
    }

    /// Hands `job` to the background thread; gives it back when there is none.
    fn run_in_background(&self, job: Job) -> Result<(), Job> {
        match self.background.get_or_init(start_background_thread) {
            Some(jobs) => jobs.send(job).map_err(|refused| refused.0),
            None => Err(job),
        }
    }

    /// A place for one more waiting instance, if the process has room.
    fn claim(self: &Arc<Self>) -> Option<BudgetClaim> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
                (waiting < WAITING_PER_PROCESS).then_some(waiting + 1)
            })
            .ok()
            .map(|_| BudgetClaim(self.clone()))
    }

    /// How many instances wait in the process now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// Starts the thread that runs a sandbox's background jobs, on a runtime of its own (each job a
/// task, so an instance's idle timer waits there too). It ends when the sandbox drops the
/// sender. `None` (logged) when no thread or runtime can be started: calls then drop their own
/// stores.
fn start_background_thread() -> Option<mpsc::UnboundedSender<Job>> {
    let (jobs, received) = mpsc::unbounded_channel::<Job>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| tracing::warn!("no runtime for instances made ahead: {error}"))
        .ok()?;
    std::thread::Builder::new()
        .name("clawcage-instances".to_string())
        .spawn(move || {
            runtime.block_on(run_background_jobs(received));
        })
        .map_err(|error| tracing::warn!("no thread for instances made ahead: {error}"))
        .ok()?;
    Some(jobs)
}

/// The background thread's loop: each job received becomes a task on the thread's runtime.
///
/// Waking a parked thread is the largest part of a call made ahead (the `eventfd` write and,
/// on a virtual machine, the interrupt to the idle processor: about 10 µs of a 35 µs call), so
/// while calls are expected the thread does not park: after a job that came within
/// [`SPIN_WHILE_EXPECTED`] of the thread running out of work, it keeps looking for the next
/// one (yielding to its own tasks) for that long before it parks. A call then hands its store
/// over without a system call. Calls further apart (a model's turns) find it parked, pay the
/// wake and cost no spinning; when calls that came close together stop, it spins one window
/// more and parks. Calls closer together than every [`SPIN_WHILE_EXPECTED`] keep it busy: a
/// process making more than about 5,000 spaced calls a second spends up to a core on it.
async fn run_background_jobs(mut received: mpsc::UnboundedReceiver<Job>) {
    let mut expecting = false;
    loop {
        let idle_since = Instant::now();
        let job = loop {
            match received.try_recv() {
                Ok(job) => break Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => return,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if !expecting || idle_since.elapsed() >= SPIN_WHILE_EXPECTED {
                break received.recv().await;
            }
            tokio::task::yield_now().await;
        };
        let Some(job) = job else {
            return;
        };
        expecting = idle_since.elapsed() < SPIN_WHILE_EXPECTED;
        tokio::spawn(job);
    }
}

/// One place in the [`WaitingBudget`], given back when dropped.
struct BudgetClaim(Arc<WaitingBudget>);

impl Drop for BudgetClaim {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An instance ready for one call: its store (limits, WASI context with the grants' preopen and
/// environment) and the instantiated component, of which no export has been called.
pub(crate) struct ReadyInstance {
    pub(crate) store: Store<CallState>,
    pub(crate) tool: BasicTool,
    pub(crate) stderr: MemoryOutputPipe,
}

/// A ready instance while it waits.
struct Waiting {
    ready: ReadyInstance,
    /// The workspace directory as it was when the instance opened it.
    workspace: Option<DirIdentity>,
    serial: u64,
    _claim: BudgetClaim,
}

/// The instances waiting for the tools of one loaded component.
pub(crate) struct WaitingInstances {
    grants: Arc<Grants>,
    budget: Arc<WaitingBudget>,
    waiting: Mutex<Vec<Waiting>>,
    /// Preparations running now: changed only under the lock of `waiting`, so the two are
    /// counted together.
    preparing: AtomicUsize,
    /// Background jobs running now (at most [`BACKGROUND_PER_COMPONENT`]).
    background: Arc<AtomicUsize>,
    serials: AtomicU64,
    /// Whether instances are made ahead now: false while calls come back to back.
    ahead: AtomicBool,
    /// Whether a watch for the end of back-to-back calls is under way.
    watching: AtomicBool,
    /// When the last call ended, in nanoseconds since `started`.
    last_call_end: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for WaitingInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingInstances")
            .field("waiting", &self.len())
            .finish()
    }
}

impl WaitingInstances {
    pub(crate) fn new(grants: Arc<Grants>, budget: Arc<WaitingBudget>) -> Self {
        Self {
            grants,
            budget,
            waiting: Mutex::new(Vec::new()),
            preparing: AtomicUsize::new(0),
            background: Arc::new(AtomicUsize::new(0)),
            serials: AtomicU64::new(0),
            ahead: AtomicBool::new(true),
            watching: AtomicBool::new(false),
            last_call_end: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// How many instances wait now.
    pub(crate) fn len(&self) -> usize {
        self.waiting.lock().map_or(0, |waiting| waiting.len())
    }

    /// A waiting instance for a call, if one is ready and its workspace is still the directory
    /// at the granted path; it no longer counts as waiting.
    /// A call that finds none while one is being prepared marks the calls back to back.
    pub(crate) fn take(&self) -> Option<ReadyInstance> {
        let found = self.take_ready();
        if found.is_none() && self.preparing.load(Ordering::Acquire) > 0 {
            self.ahead.store(false, Ordering::Release);
        }
        found
    }

    fn take_ready(&self) -> Option<ReadyInstance> {
        loop {
            let waiting = self.waiting.lock().ok()?.pop()?;
            if waiting.workspace == self.workspace_now() {
                return Some(waiting.ready);
            }
            // The directory was replaced since: this instance sees the old one.
            drop(waiting);
        }
    }

    /// Nanoseconds since these instances' start.
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// After a call of one of these tools: the used store is dropped off the call's path (on
    /// the sandbox's background thread), and an instance is prepared for the next call if fewer
    /// than [`WAITING_PER_COMPONENT`] wait. With no idle time allowed, with
    /// [`BACKGROUND_PER_COMPONENT`] jobs already under way, or without a background thread, the
    /// store is dropped here and nothing is prepared.
    pub(crate) fn after_call(
        self: &Arc<Self>,
        component: &Arc<CompiledComponent>,
        used: Option<Store<CallState>>,
    ) {
        if self.budget.idle.is_zero() {
            return;
        }
        self.last_call_end.store(self.now(), Ordering::Release);
        if !self.ahead.load(Ordering::Acquire) {
            drop(used);
            self.watch_for_quiet(component);
            return;
        }
        let Some(job) = BackgroundJob::start(&self.background) else {
            return;
        };
        let claim = self.claim_preparation();
        if used.is_none() && claim.is_none() {
            return;
        }
        let preparing = claim.is_some();
        let pool = Arc::downgrade(self);
        let component = component.clone();
        let work: Job = Box::pin(async move {
            drop(used);
            match claim {
                Some(claim) => prepare_into(pool, component, claim, job).await,
                None => drop(job),
            }
        });
        if let Err(refused) = self.budget.run_in_background(work) {
            // No thread: dropped here, with the store and the claims it holds.
            drop(refused);
            if preparing {
                self.prepared_none();
            }
        }
    }

    /// While calls come back to back: one watch (on the background thread) waits until none
    /// has come for [`BACK_TO_BACK`], then makes instances ahead again and prepares one.
    fn watch_for_quiet(self: &Arc<Self>, component: &Arc<CompiledComponent>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::downgrade(self);
        let component = component.clone();
        let watch: Job = Box::pin(async move {
            loop {
                tokio::time::sleep(BACK_TO_BACK).await;
                let Some(instances) = pool.upgrade() else {
                    return;
                };
                let quiet = instances
                    .now()
                    .saturating_sub(instances.last_call_end.load(Ordering::Acquire));
                if quiet < u64::try_from(BACK_TO_BACK.as_nanos()).unwrap_or(u64::MAX) {
                    continue;
                }
                instances.ahead.store(true, Ordering::Release);
                // The background jobs are all busy (dropping stores): look again after the
                // next pause, or the component would wait for a call before one is made ahead.
                let Some(job) = BackgroundJob::start(&instances.background) else {
                    continue;
                };
                instances.watching.store(false, Ordering::Release);
                let Some(claim) = instances.claim_preparation() else {
                    return;
                };
                drop(instances);
                prepare_into(pool, component, claim, job).await;
                return;
            }
        });
        if self.budget.run_in_background(watch).is_err() {
            self.watching.store(false, Ordering::Release);
        }
    }

    /// Room for one more preparation: in this component (waiting and being prepared) and in the
    /// process.
    fn claim_preparation(&self) -> Option<BudgetClaim> {
        let waiting = self.waiting.lock().ok()?;
        if waiting.len() + self.preparing.load(Ordering::Acquire) >= WAITING_PER_COMPONENT {
            return None;
        }
        let claim = self.budget.claim()?;
        self.preparing.fetch_add(1, Ordering::AcqRel);
        drop(waiting);
        Some(claim)
    }

    /// A preparation ended without an instance.
    fn prepared_none(&self) {
        let _waiting = self.waiting.lock();
        self.preparing.fetch_sub(1, Ordering::AcqRel);
    }

    /// The identity of the workspace directory at its granted path now.
    fn workspace_now(&self) -> Option<DirIdentity> {
        self.grants
            .workspace
            .as_ref()
            .and_then(|workspace| DirIdentity::of(workspace.path()))
    }
}

/// One of a component's running background jobs, counted until dropped.
struct BackgroundJob(Arc<AtomicUsize>);

impl BackgroundJob {
    /// A place for one more job, if fewer than [`BACKGROUND_PER_COMPONENT`] run.
    fn start(running: &Arc<AtomicUsize>) -> Option<Self> {
        running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |jobs| {
                (jobs < BACKGROUND_PER_COMPONENT).then_some(jobs + 1)
            })
            .ok()
            .map(|_| Self(running.clone()))
    }
}

impl Drop for BackgroundJob {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Prepares one instance and puts it with the waiting ones (the background `job` ends there),
/// then drops it if it is still waiting after the budget's idle time. A preparation that fails
/// (or outlives the grants' time limit) is logged and leaves the next call to make its own
/// instance.
async fn prepare_into(
    pool: Weak<WaitingInstances>,
    component: Arc<CompiledComponent>,
    claim: BudgetClaim,
    job: BackgroundJob,
) {
    let Some(instances) = pool.upgrade() else {
        return;
    };
    let workspace = instances.workspace_now();
    let timeout = instances.grants.limits.timeout;
    let prepared = tokio::time::timeout(
        timeout,
        crate::tool::prepare_instance(&component, &instances.grants),
    )
    .await;
    let ready = match prepared {
        Ok(Ok(ready)) => ready,
        Ok(Err(error)) => {
            instances.prepared_none();
            tracing::debug!(component = %component.name, "no instance prepared ahead: {}", error.message());
            return;
        }
        Err(_elapsed) => {
            instances.prepared_none();
            tracing::debug!(component = %component.name, "no instance prepared ahead: instantiation outlived the time limit");
            return;
        }
    };
    let serial = instances.serials.fetch_add(1, Ordering::Relaxed);
    match instances.waiting.lock() {
        Ok(mut waiting) => {
            waiting.push(Waiting {
                ready,
                workspace,
                serial,
                _claim: claim,
            });
            instances.preparing.fetch_sub(1, Ordering::AcqRel);
        }
        Err(_) => return,
    }
    drop(job);
    let idle = instances.budget.idle;
    drop(instances);
    tokio::time::sleep(idle).await;
    let Some(instances) = pool.upgrade() else {
        return;
    };
    let idle = match instances.waiting.lock() {
        Ok(mut waiting) => waiting
            .iter()
            .position(|waiting| waiting.serial == serial)
            .map(|index| waiting.swap_remove(index)),
        Err(_) => None,
    };
    drop(idle);
}

/// Which directory a path names: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirIdentity {
    device: u64,
    inode: u64,
}

impl DirIdentity {
    fn of(path: &std::path::Path) -> Option<DirIdentity> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        Some(DirIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "tests fail by panicking"
    )]

    use super::*;

    /// CPU time the calling thread has used, from the kernel's scheduler statistics.
    fn this_thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        let nanos = stat.split_whitespace().next().unwrap().parse().unwrap();
        Duration::from_nanos(nanos)
    }

    /// Sends a job that reports the background thread's CPU time so far, and waits for it.
    fn background_cpu(jobs: &mpsc::UnboundedSender<Job>) -> Duration {
        let (answer, answered) = std::sync::mpsc::channel();
        let job: Job = Box::pin(async move {
            answer.send(this_thread_cpu()).unwrap();
        });
        jobs.send(job).map_err(|_| "the thread ended").unwrap();
        answered.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn the_background_thread_spins_only_while_jobs_come_close_together() {
        let jobs = start_background_thread().unwrap();
        // Jobs 50 µs apart: the thread keeps looking for the next one instead of parking.
        let before_close = background_cpu(&jobs);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(100) {
            let job: Job = Box::pin(async {});
            jobs.send(job).map_err(|_| "the thread ended").unwrap();
            std::thread::sleep(Duration::from_micros(50));
        }
        let busy = background_cpu(&jobs) - before_close;
        // Then none for 300 ms: it spins one window more and parks.
        let quiet_start = background_cpu(&jobs);
        std::thread::sleep(Duration::from_millis(300));
        let quiet = background_cpu(&jobs) - quiet_start;
        assert!(
            quiet < Duration::from_millis(30),
            "the thread used {quiet:?} of CPU in 300 ms without jobs (spinning while none came: {busy:?} in 100 ms)"
        );
        // While the jobs came it was busy (parked between jobs it uses about 4 ms here; a
        // loaded machine gives a spinning thread less than the whole 100 ms).
        assert!(
            busy > Duration::from_millis(25),
            "the thread used only {busy:?} of CPU in 100 ms of jobs 50 µs apart: it parked between them"
        );
    }
}
