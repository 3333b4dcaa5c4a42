//! The WASI command programs that the exec capability can run: compiling them (through the
//! artifact cache, and once per [`Sandbox`] in memory), naming them (a multicall program such as
//! coreutils answers to many names, asked once with `--list`), and the store each run gets — its
//! own memory cap and a write budget shared by every program of one tool call. The budget is
//! charged by wrapping the file-writing functions of `wasi:filesystem`, so a program that writes
//! files itself (`dd`, `cp`, `tee`, `sed -i`) is bounded like a shell redirection is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use clawcage_core::files::{Symlinks, read_regular_file};
use wasmtime::component::{Component, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreContextMut};
use wasmtime_wasi::filesystem::WasiFilesystemView as _;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, ErrorCode, Host as _, HostDescriptor as _,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use tokio::sync::OnceCell;

pub use crate::adapter::ProgramKind;
use crate::asked_writes::{AsksWrites, WriteAsker};
use crate::components;
use crate::host::MemoryLimiter;
use crate::sandbox::{Code, LoadError, Sandbox};

/// The `wasi:filesystem/types` instance wasmtime-wasi defines; its file-writing functions are
/// replaced by budgeted ones for programs.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Default bytes all programs of one exec call may write to files together.
pub const DEFAULT_WRITE_LIMIT_BYTES: u64 = 1 << 30;

/// The store state of one running program.
pub(crate) struct ProgramState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    budget: Arc<WriteBudget>,
    /// The calling tool's asker of writes under a read-only workspace, if any.
    writes: Option<Arc<WriteAsker>>,
}

impl ProgramState {
    pub(crate) fn new(
        wasi: WasiCtx,
        memory_bytes: u64,
        budget: Arc<WriteBudget>,
        writes: Option<Arc<WriteAsker>>,
    ) -> Self {
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_bytes),
            budget,
            writes,
        }
    }
}

impl AsksWrites for ProgramState {
    fn write_asker(&self) -> Option<Arc<WriteAsker>> {
        self.writes.clone()
    }
}

impl WasiView for ProgramState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Bytes that the programs of one tool call may still write to files.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    limit: u64,
    used: AtomicU64,
    exceeded: AtomicBool,
}

impl WriteBudget {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
            exceeded: AtomicBool::new(false),
        }
    }

    /// Takes `bytes` from the budget; false (and remembered) when that would pass the limit.
    pub(crate) fn charge(&self, bytes: usize) -> bool {
        let bytes = bytes as u64;
        let before = self.used.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.limit {
            self.exceeded.store(true, Ordering::Relaxed);
            false
        } else {
            true
        }
    }

    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

/// The error a write past the budget fails with: "no space left on device", which programs
/// report in their own words; the shell adds what happened.
pub(crate) fn budget_error() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::StorageFull)
}

/// An output stream into a file that charges the write budget before each write.
struct BudgetedStream {
    inner: DynOutputStream,
    budget: Arc<WriteBudget>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for BudgetedStream {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for BudgetedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !self.budget.charge(bytes.len()) {
            return Err(StreamError::LastOperationFailed(budget_error().into()));
        }
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }
}

/// Replaces a file output stream just created in `state`'s table by a budgeted one.
fn budgeted(
    state: &mut ProgramState,
    stream: Resource<DynOutputStream>,
) -> wasmtime::Result<Resource<DynOutputStream>> {
    let budget = state.budget.clone();
    let inner = state.table.delete(stream)?;
    let wrapped: DynOutputStream = Box::new(BudgetedStream { inner, budget });
    Ok(state.table.push(wrapped)?)
}

/// The linker every program is instantiated with: WASI (sockets denied by the context) with the
/// file-writing functions replaced by ones that charge the call's write budget.
pub(crate) fn program_linker(engine: &Engine) -> wasmtime::Result<Linker<ProgramState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    crate::special_files::refuse_special_files(&mut linker)?;
    crate::asked_writes::ask_before_writes(&mut linker)?;
    // The socket functions of adapted p1 modules: every descriptor is "not a socket".
    let mut sockets = linker.instance(crate::adapter::SOCKETS_INTERFACE)?;
    const NOT_A_SOCKET: (u32,) = (crate::adapter::ENOTSOCK,);
    sockets.func_wrap("sock-accept", |_, _: (u32, u32, u32)| Ok(NOT_A_SOCKET))?;
    sockets.func_wrap("sock-recv", |_, _: (u32, u32, u32, u32, u32, u32)| {
        Ok(NOT_A_SOCKET)
    })?;
    sockets.func_wrap("sock-send", |_, _: (u32, u32, u32, u32, u32)| {
        Ok(NOT_A_SOCKET)
    })?;
    sockets.func_wrap("sock-shutdown", |_, _: (u32, u32)| Ok(NOT_A_SOCKET))?;
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.write-via-stream",
        |mut store: StoreContextMut<'_, ProgramState>,
         (fd, offset): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let state = store.data_mut();
                let mut view = state.filesystem();
                let opened = match view.write_via_stream(fd, offset) {
                    Ok(stream) => stream,
                    Err(error) => return Ok((Err(view.convert_error_code(error)?),)),
                };
                Ok((Ok::<_, ErrorCode>(budgeted(state, opened)?),))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.append-via-stream",
        |mut store: StoreContextMut<'_, ProgramState>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let state = store.data_mut();
                let mut view = state.filesystem();
                let opened = match view.append_via_stream(fd) {
                    Ok(stream) => stream,
                    Err(error) => return Ok((Err(view.convert_error_code(error)?),)),
                };
                Ok((Ok::<_, ErrorCode>(budgeted(state, opened)?),))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store: StoreContextMut<'_, ProgramState>,
         (fd, buffer, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.budget.charge(buffer.len()) {
                    return Ok((Err::<u64, _>(ErrorCode::InsufficientSpace),));
                }
                let mut view = state.filesystem();
                match view.write(fd, buffer, offset).await {
                    Ok(written) => Ok((Ok(written),)),
                    Err(error) => Ok((Err(view.convert_error_code(error)?),)),
                }
            })
        },
    )?;
    Ok(linker)
}

/// One compiled program, ready to instantiate.
pub(crate) struct Program {
    pub(crate) pre: CommandPre<ProgramState>,
    pub(crate) engine: Engine,
    /// Keeps the epoch advancing while this program can run.
    pub(crate) _ticker: Arc<crate::sandbox::EpochTicker>,
}

/// A program whose name is known but whose code is loaded when it first runs.
pub(crate) struct LazyProgram {
    name: String,
    /// Where it came from, e.g. `bundled:coreutils` or a file path.
    origin: String,
    sandbox: Arc<Sandbox>,
    /// The file's bytes as found (a p1 module is adapted only when it must be compiled).
    code: Code,
    kind: ProgramKind,
    /// The hex SHA-256 of the file as found.
    sha256: String,
    key: String,
    ready: OnceCell<Arc<Program>>,
    /// Why it cannot run, once known: remembered, so a broken file is not compiled again on
    /// every call.
    problem: OnceLock<String>,
}

impl LazyProgram {
    /// The program ready to run, loaded on its first run.
    pub(crate) async fn ready(&self) -> Result<&Arc<Program>, String> {
        if let Some(problem) = self.problem.get() {
            return Err(self.cannot_run(problem));
        }
        let loaded = self
            .ready
            .get_or_try_init(|| async { self.load().await.map(Arc::new) })
            .await;
        loaded.map_err(|problem| {
            let message = self.cannot_run(&problem);
            let _ = self.problem.set(problem);
            message
        })
    }

    fn cannot_run(&self, problem: &str) -> String {
        format!(
            "{}: cannot be loaded: {problem} ({})",
            self.name, self.origin
        )
    }

    /// Compiles (or finds compiled) and links the program; the reason in plain words if not.
    async fn load(&self) -> Result<Program, String> {
        let sandbox = &self.sandbox;
        let compiled = match self.kind {
            ProgramKind::NotWasm => return Err(not_wasm()),
            // An adapted module is keyed by its own digest and the adapter's: the artifact, when
            // there is one, needs no adapting.
            ProgramKind::P1Module
                if sandbox.compiled(&self.key).is_some()
                    || sandbox.cache().has_artifact(&self.key) =>
            {
                match sandbox.compile(&self.name, &self.key, &self.code).await {
                    Ok(compiled) => compiled,
                    // A damaged artifact is recompiled from the bytes given: the adapted ones.
                    Err(_) => sandbox
                        .compile(&self.name, &self.key, &self.adapted().await?)
                        .await
                        .map_err(reason)?,
                }
            }
            ProgramKind::P1Module => sandbox
                .compile(&self.name, &self.key, &self.adapted().await?)
                .await
                .map_err(reason)?,
            ProgramKind::P2Component | ProgramKind::Multicall => sandbox
                .compile(&self.name, &self.key, &self.code)
                .await
                .map_err(reason)?,
        };
        sandbox
            .prepare_program(&self.name, &compiled.0)
            .map_err(reason)
    }

    /// A p1 module's bytes made into a command component (on a blocking thread: large modules
    /// take a moment).
    async fn adapted(&self) -> Result<Code, String> {
        let code = self.code.clone();
        tokio::task::spawn_blocking(move || crate::adapter::adapt(code.bytes()))
            .await
            .map_err(|error| format!("the adapting task stopped: {error}"))?
            .map(|bytes| Code::Shared(Arc::from(bytes)))
    }

    /// What `clawcage programs list` shows of it, with the names it answers to.
    fn info(&self, names: Vec<String>) -> ProgramInfo {
        ProgramInfo {
            name: self.name.clone(),
            kind: self.kind,
            bytes: self.code.bytes().len() as u64,
            sha256: self.sha256.clone(),
            source: self.origin.clone(),
            names,
            problem: self.problem.get().cloned(),
        }
    }
}

/// What is said of a file in the programs directory that is not WebAssembly.
fn not_wasm() -> String {
    "it is not a WebAssembly file (no `\\0asm` header); replace it with a WASI program (a p1 module or a p2 component) or remove it".to_string()
}

/// The reason in a load error, without the program's name (the caller adds it once).
fn reason(error: LoadError) -> String {
    match error {
        LoadError::Compile { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// One program as `clawcage programs list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProgramInfo {
    /// Its name (a multicall program's own name, e.g. `coreutils`).
    pub name: String,
    /// What the file holds.
    pub kind: ProgramKind,
    /// The file's size in bytes.
    pub bytes: u64,
    /// The file's hex SHA-256.
    pub sha256: String,
    /// Where it came from: `bundled:NAME` or the file's path.
    pub source: String,
    /// The names exec runs it by (empty for a file that could not be named).
    pub names: Vec<String>,
    /// Why it cannot run, if it cannot.
    pub problem: Option<String>,
}

type ProgramMap = BTreeMap<String, Arc<LazyProgram>>;

/// The programs an exec grant can run, by name. Cheap to clone. A catalog made with
/// [`Sandbox::programs_on_demand`] finds its programs on the first exec call; every program's
/// code is loaded when it first runs.
#[derive(Clone)]
pub struct ProgramCatalog {
    inner: Arc<CatalogInner>,
}

struct CatalogInner {
    /// Where to find the programs when asked first (none: found already).
    source: Option<(Arc<Sandbox>, Option<PathBuf>)>,
    programs: OnceCell<ProgramMap>,
    /// Files of the programs directory that could not even be named.
    rejected: OnceLock<Vec<ProgramInfo>>,
    /// Set once every program has been loaded.
    loaded: OnceCell<()>,
}

impl std::fmt::Debug for ProgramCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramCatalog")
            .field("programs", &self.inner.programs.get().map(BTreeMap::len))
            .finish()
    }
}

impl PartialEq for ProgramCatalog {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for ProgramCatalog {}

impl ProgramCatalog {
    fn ready((programs, rejected): Found) -> Self {
        Self {
            inner: Arc::new(CatalogInner {
                source: None,
                programs: OnceCell::new_with(Some(programs)),
                rejected: OnceLock::from(rejected),
                loaded: OnceCell::new(),
            }),
        }
    }

    /// The programs, found now if this is the first call of an on-demand catalog.
    pub(crate) async fn resolve(&self) -> Result<&ProgramMap, String> {
        self.inner
            .programs
            .get_or_try_init(|| async {
                match &self.inner.source {
                    Some((sandbox, extra_dir)) => {
                        let (programs, rejected) = sandbox
                            .find_programs(extra_dir.as_deref())
                            .await
                            .map_err(|error| error.to_string())?;
                        let _ = self.inner.rejected.set(rejected);
                        Ok(programs)
                    }
                    None => Ok(ProgramMap::new()),
                }
            })
            .await
    }

    /// Finds the programs and loads every one of them (compiling those the artifact cache does
    /// not hold yet), once. The exec tool calls this before its time limit starts, so a call's
    /// limit is never spent on loading code. A program that cannot be loaded does not stop the
    /// others: it is logged here and running it says why it cannot run.
    pub async fn load_all(&self) -> Result<(), String> {
        self.inner
            .loaded
            .get_or_try_init(|| async {
                let programs = self.resolve().await?;
                let mut distinct: Vec<&Arc<LazyProgram>> = Vec::new();
                for program in programs.values() {
                    if !distinct.iter().any(|seen| Arc::ptr_eq(seen, program)) {
                        distinct.push(program);
                    }
                }
                if let Some(first) = distinct.first() {
                    let sandbox = &first.sandbox;
                    let to_compile = distinct
                        .iter()
                        .filter(|program| {
                            sandbox.compiled(&program.key).is_none()
                                && !sandbox.cache().has_artifact(&program.key)
                        })
                        .count();
                    sandbox.progress().expect(to_compile);
                }
                for program in distinct {
                    // Reported when it was found, and again to whoever runs it.
                    let _ = program.ready().await;
                }
                Ok::<(), String>(())
            })
            .await
            .map(|_| ())
    }

    /// Every program, bundled and the operator's, with its kind, size, digest, source and what
    /// is wrong with it if it cannot run: each one is loaded (compiled if the artifact cache
    /// does not hold it) to find out. Sorted by name.
    pub async fn describe(&self) -> Result<Vec<ProgramInfo>, String> {
        self.load_all().await?;
        let programs = self.resolve().await?;
        let mut distinct: Vec<(&Arc<LazyProgram>, Vec<String>)> = Vec::new();
        for (name, program) in programs {
            match distinct
                .iter_mut()
                .find(|(seen, _)| Arc::ptr_eq(seen, program))
            {
                Some((_, names)) => names.push(name.clone()),
                None => distinct.push((program, vec![name.clone()])),
            }
        }
        let mut infos = Vec::with_capacity(distinct.len());
        for (program, names) in distinct {
            let _ = program.ready().await;
            infos.push(program.info(names));
        }
        infos.extend(self.inner.rejected.get().cloned().unwrap_or_default());
        infos.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.source.cmp(&b.source)));
        Ok(infos)
    }

    /// Whether the programs have been found yet.
    pub fn is_found(&self) -> bool {
        self.inner.programs.initialized()
    }

    /// The names of the programs, sorted (none before they are found).
    pub fn names(&self) -> Vec<String> {
        self.inner
            .programs
            .get()
            .map(|programs| programs.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Where program `name` came from (`bundled:coreutils`, a file path), if it exists.
    pub fn origin(&self, name: &str) -> Option<&str> {
        self.inner
            .programs
            .get()?
            .get(name)
            .map(|program| program.origin.as_str())
    }

    /// How many programs there are (0 before they are found).
    pub fn len(&self) -> usize {
        self.inner.programs.get().map_or(0, BTreeMap::len)
    }

    /// Whether there are none (or they have not been found yet).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bundled programs: (name, bytes, whether it is a multicall program named by argv[0]).
fn bundled() -> [(&'static str, &'static [u8], bool); 4] {
    [
        ("coreutils", components::bundled::COREUTILS, true),
        ("grep", components::bundled::GREP, false),
        ("find", components::bundled::FIND, false),
        ("sed", components::bundled::SED, false),
    ]
}

/// The WASI preview 1 core module `module` as the p2 command component exec runs in its place
/// (the command adapter of the pinned wasmtime release, `proc_exit` kept exact through
/// `wasi:cli/exit.exit-with-code`), or why it cannot be one.
pub fn p1_as_component(module: &[u8]) -> Result<Vec<u8>, String> {
    crate::adapter::adapt(module)
}

/// Whether `name` can be a program name: letters, digits, `.`, `_`, `+`, `-`, not starting
/// with `-` or `.`.
pub(crate) fn valid_program_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))
}

/// The record beside a multicall program's artifact that lists the names it answers to.
const NAMES_RECORD: &str = "names";

/// Largest operator program read from `programs_dir`.
const MAX_PROGRAM_BYTES: u64 = 512 << 20;

impl Sandbox {
    /// The bundled programs (uutils coreutils, grep, find, sed) plus every `NAME.wasm` WASI
    /// command component in `extra_dir`, found now; each program's code is loaded when it
    /// first runs. A program of `extra_dir` replaces a bundled one of the same name.
    pub async fn programs(
        self: &Arc<Self>,
        extra_dir: Option<&Path>,
    ) -> Result<ProgramCatalog, LoadError> {
        self.find_programs(extra_dir)
            .await
            .map(ProgramCatalog::ready)
    }

    /// Like [`Sandbox::programs`], but nothing is read until the first exec call needs a
    /// program; a problem with `extra_dir` is then that call's error.
    pub fn programs_on_demand(self: &Arc<Self>, extra_dir: Option<&Path>) -> ProgramCatalog {
        ProgramCatalog {
            inner: Arc::new(CatalogInner {
                source: Some((self.clone(), extra_dir.map(Path::to_path_buf))),
                programs: OnceCell::new(),
                rejected: OnceLock::new(),
                loaded: OnceCell::new(),
            }),
        }
    }

    async fn find_programs(self: &Arc<Self>, extra_dir: Option<&Path>) -> Result<Found, LoadError> {
        let mut programs = ProgramMap::new();
        for (name, bytes, multicall) in bundled() {
            let sha256 = match components::bundled::digest_of(bytes) {
                Some(digest) => digest.to_string(),
                None => crate::cache::sha256_hex(bytes),
            };
            let program = Arc::new(LazyProgram {
                name: name.to_string(),
                origin: format!("bundled:{name}"),
                sandbox: self.clone(),
                code: Code::Static(bytes),
                kind: if multicall {
                    ProgramKind::Multicall
                } else {
                    ProgramKind::P2Component
                },
                key: crate::cache::ArtifactCache::key_for_digest(self.engine(), &sha256),
                sha256,
                ready: OnceCell::new(),
                problem: OnceLock::new(),
            });
            if multicall {
                for utility in self.multicall_names(&program).await? {
                    programs.insert(utility, program.clone());
                }
            } else {
                programs.insert(name.to_string(), program);
            }
        }
        let mut rejected = Vec::new();
        if let Some(dir) = extra_dir {
            for found in operator_programs(dir)? {
                let (name, path) = match found {
                    Ok(found) => found,
                    Err(info) => {
                        tracing::warn!(path = %info.source, "{}", info.problem.as_deref().unwrap_or_default());
                        rejected.push(info);
                        continue;
                    }
                };
                let program = Arc::new(self.operator_program(&name, &path));
                // Checked now, so a broken file is reported at once (and remembered); the
                // other programs run whatever it holds.
                if let Err(problem) = program.ready().await {
                    tracing::warn!("{problem}");
                }
                if programs.contains_key(&name) {
                    tracing::info!(program = %name, path = %path.display(), "an operator program replaces the bundled one");
                }
                programs.insert(name, program);
            }
        }
        Ok((programs, rejected))
    }

    /// The operator's program file `path` named `name`, not loaded yet; a file that cannot be
    /// read or is not WebAssembly carries its problem already.
    fn operator_program(self: &Arc<Self>, name: &str, path: &Path) -> LazyProgram {
        let problem = OnceLock::new();
        let bytes = match read_regular_file(path, MAX_PROGRAM_BYTES, Symlinks::Follow) {
            Ok(bytes) => bytes,
            Err(error) => {
                let _ = problem.set(format!("cannot read {}: {error}", path.display()));
                Vec::new()
            }
        };
        let kind = ProgramKind::of(&bytes);
        if kind == ProgramKind::NotWasm && problem.get().is_none() {
            let _ = problem.set(not_wasm());
        }
        let sha256 = crate::cache::sha256_hex(&bytes);
        let keyed = match kind {
            ProgramKind::P1Module => format!(
                "{sha256}+wasi-preview1-command-adapter:{}",
                *crate::adapter::ADAPTER_DIGEST
            ),
            _ => sha256.clone(),
        };
        LazyProgram {
            name: name.to_string(),
            origin: path.display().to_string(),
            sandbox: self.clone(),
            code: Code::Shared(Arc::from(bytes)),
            kind,
            sha256,
            key: crate::cache::ArtifactCache::key_for_digest(self.engine(), &keyed),
            ready: OnceCell::new(),
            problem,
        }
    }

    /// Links a program's component for running.
    fn prepare_program(&self, name: &str, component: &Component) -> Result<Program, LoadError> {
        let linker = program_linker(self.engine())
            .map_err(|error| LoadError::Engine(format!("{error:#}")))?;
        let instance_pre = linker
            .instantiate_pre(component)
            .map_err(|error| LoadError::Compile {
                component: name.to_string(),
                reason: format!(
                    "it is not a WASI command this host can run (it may import something beyond wasi:*): {error:#}"
                ),
            })?;
        let pre = CommandPre::new(instance_pre).map_err(|error| LoadError::Compile {
            component: name.to_string(),
            reason: format!(
                "it is not a WASI command component (no `wasi:cli/run` export; build a binary, not a library): {error:#}"
            ),
        })?;
        Ok(Program {
            pre,
            engine: self.engine().clone(),
            _ticker: self.ticker(),
        })
    }

    /// The names a multicall program answers to: recorded beside its artifact, else asked now
    /// (`PROGRAM --list`) and recorded.
    async fn multicall_names(&self, program: &LazyProgram) -> Result<Vec<String>, LoadError> {
        if let Some(bytes) = self.cache().record(&program.key, NAMES_RECORD)
            && let Ok(names) = serde_json::from_slice::<Vec<String>>(&bytes)
            && !names.is_empty()
            && names
                .iter()
                .all(|name| name == "[" || valid_program_name(name))
        {
            return Ok(names);
        }
        let name = program.name.as_str();
        let failed = |reason: String| LoadError::Compile {
            component: name.to_string(),
            reason,
        };
        let ready = program.ready().await.map_err(failed)?;
        let stdout = MemoryOutputPipe::new(1 << 20);
        let stderr = MemoryOutputPipe::new(64 << 10);
        let wasi = crate::wasi_context::denied()
            .args(&[name, "--list"])
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let budget = Arc::new(WriteBudget::new(0));
        let mut store = Store::new(
            self.engine(),
            ProgramState::new(wasi, 256 << 20, budget, None),
        );
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);
        let run = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            let command = ready.pre.instantiate_async(&mut store).await?;
            command.wasi_cli_run().call_run(&mut store).await
        })
        .await;
        match run {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(()))) => {
                return Err(failed(format!(
                    "`{name} --list` failed: {}",
                    String::from_utf8_lossy(&stderr.contents())
                )));
            }
            Ok(Err(error)) if exit_code(&error) == Some(0) => {}
            Ok(Err(error)) => return Err(failed(format!("`{name} --list` failed: {error:#}"))),
            Err(_) => return Err(failed(format!("`{name} --list` did not finish"))),
        }
        let listing = String::from_utf8_lossy(&stdout.contents()).into_owned();
        let names: Vec<String> = listing
            .lines()
            .map(str::trim)
            .filter(|line| *line == "[" || valid_program_name(line))
            .map(str::to_string)
            .collect();
        if names.is_empty() {
            return Err(failed(format!("`{name} --list` printed no names")));
        }
        if let Ok(json) = serde_json::to_vec(&names) {
            self.cache().store_record(&program.key, NAMES_RECORD, &json);
        }
        Ok(names)
    }
}

/// The exit code in a program's `exit` call, if `error` is one.
pub(crate) fn exit_code(error: &wasmtime::Error) -> Option<i32> {
    error
        .downcast_ref::<wasmtime_wasi::I32Exit>()
        .map(|exit| exit.0)
}

/// The kind of the file at `path`, by its first eight bytes.
fn kind_of_file(path: &Path) -> ProgramKind {
    use std::io::Read as _;
    let mut header = Vec::with_capacity(8);
    match std::fs::File::open(path) {
        Ok(file) => {
            let _ = file.take(8).read_to_end(&mut header);
            ProgramKind::of(&header)
        }
        Err(_) => ProgramKind::NotWasm,
    }
}

/// The programs found, and the files of the programs directory that could not be named.
type Found = (ProgramMap, Vec<ProgramInfo>);

/// A file of the programs directory: its program name and path, or why it has none.
type OperatorFile = Result<(String, PathBuf), ProgramInfo>;

/// `NAME.wasm` files of `dir`, sorted by name; a file whose name is no program name is an error
/// of its own (the others are still found).
fn operator_programs(dir: &Path) -> Result<Vec<OperatorFile>, LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|error| LoadError::Compile {
        component: dir.display().to_string(),
        reason: format!(
            "cannot read the programs directory: {error}; fix [exec] programs_dir in the config"
        ),
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|extension| extension != "wasm") || !path.is_file() {
            continue;
        }
        let stem = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !valid_program_name(&stem) {
            found.push(Err(ProgramInfo {
                name: stem,
                kind: kind_of_file(&path),
                bytes: entry.metadata().map_or(0, |metadata| metadata.len()),
                sha256: String::new(),
                source: path.display().to_string(),
                names: Vec::new(),
                problem: Some(format!(
                    "{} is not a usable program name (letters, digits, `.`, `_`, `+`, `-`); rename the file",
                    path.display()
                )),
            }));
            continue;
        }
        found.push(Ok((stem, path)));
    }
    found.sort_by(|a, b| match (a, b) {
        (Ok(a), Ok(b)) => a.cmp(b),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(a), Err(b)) => a.source.cmp(&b.source),
    });
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_budget_refuses_past_its_limit_and_remembers() {
        let budget = WriteBudget::new(10);
        assert!(budget.charge(6));
        assert!(!budget.exceeded());
        assert!(!budget.charge(5));
        assert!(budget.exceeded());
    }

    #[test]
    fn program_names_are_plain() {
        assert!(valid_program_name("rg"));
        assert!(valid_program_name("python3.12"));
        assert!(!valid_program_name("../x"));
        assert!(!valid_program_name("-rf"));
        assert!(!valid_program_name(""));
        assert!(!valid_program_name("a b"));
    }
}
