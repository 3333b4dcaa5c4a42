//! The WASI command programs that the exec capability can run: compiling them (through the
//! artifact cache, and once per [`Sandbox`] in memory), naming them (a multicall program such as
//! coreutils answers to many names, asked once with `--list`), the operator's programs of either
//! WASI kind with each one's problem kept apart, and the listing `clawcage programs list` shows.
//! The store and linker each run gets are in `program_store`. It is one file (over 700 lines)
//! because finding, compiling, naming and listing programs all fill and read the one
//! [`ProgramCatalog`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use clawcage_core::files::{Symlinks, read_regular_file};
use wasmtime::component::Component;
use wasmtime::{Engine, Store};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use tokio::sync::OnceCell;

pub use crate::adapter::ProgramKind;
use crate::bundled::BundledComponent;
use crate::components;
use crate::load_once::{LoadOnce, OnFailure};
use crate::sandbox::{Code, LoadError, Sandbox};

pub use crate::program_store::DEFAULT_WRITE_LIMIT_BYTES;
pub(crate) use crate::program_store::{ProgramState, WriteBudget, budget_error, program_linker};

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
    /// The program, loaded when it first runs; why it cannot run is remembered, so a broken
    /// file is not compiled again on every call.
    loaded: LoadOnce<Program>,
}

impl LazyProgram {
    /// The program ready to run, loaded on its first run. Loading is not the calling tool's
    /// work: the clock of the call it happens in stands still meanwhile (reading and checking
    /// a cached artifact takes milliseconds; a program whose artifact has gone is compiled).
    pub(crate) async fn ready(&self) -> Result<&Arc<Program>, String> {
        self.loaded
            .get(|| async {
                let _paused = crate::clock::pause_current_call();
                self.load().await.map(Arc::new)
            })
            .await
            .map_err(|problem| self.cannot_run(&problem))
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
        tokio::task::spawn_blocking(move || {
            let bytes = code.bytes().map_err(|error| error.to_string())?;
            crate::adapter::adapt(&bytes)
        })
        .await
        .map_err(|error| format!("the adapting task stopped: {error}"))?
        .map(|bytes| Code::Shared(Arc::from(bytes)))
    }

    /// What `clawcage programs list` shows of it, with the names it answers to.
    fn info(&self, names: Vec<String>) -> ProgramInfo {
        ProgramInfo {
            name: self.name.clone(),
            kind: self.kind,
            bytes: self.code.len() as u64,
            sha256: self.sha256.clone(),
            source: self.origin.clone(),
            names,
            problem: self.loaded.problem().cloned(),
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
    source: Option<(Arc<Sandbox>, ProgramDirs)>,
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
                    Some((sandbox, dirs)) => {
                        let (programs, rejected) = sandbox
                            .find_programs(dirs)
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

    /// Finds the programs and compiles those neither this process nor the artifact cache holds
    /// yet, once. The exec tool calls this before its time limit starts, so a call's limit is
    /// never spent on compiling. A program whose artifact is cached is loaded (read and its seal
    /// checked) when it first runs, with the calling tool's clock paused: an exec call that runs
    /// no program, or a few, reads no others. A program that cannot be loaded does not stop the
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
                let to_compile: Vec<&Arc<LazyProgram>> = distinct
                    .into_iter()
                    .filter(|program| {
                        !program.loaded.is_loaded()
                            && program.loaded.problem().is_none()
                            && program.sandbox.compiled(&program.key).is_none()
                            && !program.sandbox.cache().has_artifact(&program.key)
                    })
                    .collect();
                if let Some(first) = to_compile.first() {
                    first.sandbox.progress().expect(to_compile.len());
                }
                for program in to_compile {
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

    /// Whether program `name`'s code has been loaded in this process (it is when it first
    /// runs, or by [`ProgramCatalog::load_all`] when it had to be compiled).
    pub fn is_loaded(&self, name: &str) -> bool {
        self.inner
            .programs
            .get()
            .and_then(|programs| programs.get(name))
            .is_some_and(|program| program.loaded.is_loaded())
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

/// The names a bundled program answers to.
#[derive(Clone, Copy)]
enum BundledNames {
    /// Its own name only.
    Own,
    /// The names it prints when started as `NAME --list` (asked once, then kept beside its
    /// artifact): uutils coreutils, whose set follows its crates.
    Asked,
    /// These names, chosen by `argv[0]`, known without running it.
    Fixed(&'static [&'static str]),
}

/// The bundled programs: (name, code, the names it answers to).
fn bundled() -> [(&'static str, &'static BundledComponent, BundledNames); 8] {
    [
        (
            "coreutils",
            components::bundled::COREUTILS,
            BundledNames::Asked,
        ),
        ("grep", components::bundled::GREP, BundledNames::Own),
        ("find", components::bundled::FIND, BundledNames::Own),
        ("sed", components::bundled::SED, BundledNames::Own),
        ("awk", components::bundled::AWK, BundledNames::Own),
        ("jq", components::bundled::JQ, BundledNames::Own),
        (
            "diffutils",
            components::bundled::DIFFUTILS,
            BundledNames::Fixed(&["diff", "cmp", "patch"]),
        ),
        (
            "archive",
            components::bundled::ARCHIVE,
            BundledNames::Fixed(&["tar", "gzip", "gunzip", "zcat"]),
        ),
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

/// The names the `NAME.wasm` files of `dir` run as, by file name alone (nothing is read, loaded or
/// compiled; a missing directory has none): what exec offers from `dir`, for a listing that must
/// stay cheap, such as the programs a skill requires.
pub fn program_names_in(dir: &Path) -> Vec<String> {
    operator_programs(dir)
        .map(|found| {
            found
                .into_iter()
                .filter_map(Result::ok)
                .map(|(name, _)| name)
                .collect()
        })
        .unwrap_or_default()
}

/// The record beside a multicall program's artifact that lists the names it answers to.
const NAMES_RECORD: &str = "names";

/// Largest operator program read from `programs_dir`.
const MAX_PROGRAM_BYTES: u64 = 512 << 20;

/// The directories programs are found in besides the bundled ones.
#[derive(Debug, Clone, Default)]
pub struct ProgramDirs {
    /// Where `clawcage programs install` puts programs (`<state-dir>/programs`); it may not
    /// exist yet. Its programs replace bundled ones of the same name.
    pub installed: Option<PathBuf>,
    /// The operator's `[exec] programs_dir`, which must exist; its programs replace bundled and
    /// installed ones of the same name.
    pub operator: Option<PathBuf>,
}

impl ProgramDirs {
    /// Only the operator's directory.
    pub fn operator(dir: Option<&Path>) -> Self {
        Self {
            installed: None,
            operator: dir.map(Path::to_path_buf),
        }
    }
}

impl Sandbox {
    /// The bundled programs plus every `NAME.wasm` WASI program (a p1 module or a p2 command
    /// component) in `extra_dir`, found now; each program's code is loaded when it first runs.
    /// A program of `extra_dir` replaces a bundled one of the same name.
    pub async fn programs(
        self: &Arc<Self>,
        extra_dir: Option<&Path>,
    ) -> Result<ProgramCatalog, LoadError> {
        self.find_programs(&ProgramDirs::operator(extra_dir))
            .await
            .map(ProgramCatalog::ready)
    }

    /// Like [`Sandbox::programs`], but nothing is read until the first exec call needs a
    /// program; a problem with `extra_dir` is then that call's error.
    pub fn programs_on_demand(self: &Arc<Self>, extra_dir: Option<&Path>) -> ProgramCatalog {
        self.programs_on_demand_in(ProgramDirs::operator(extra_dir))
    }

    /// Like [`Sandbox::programs_on_demand`], with the installed programs' directory too.
    pub fn programs_on_demand_in(self: &Arc<Self>, dirs: ProgramDirs) -> ProgramCatalog {
        ProgramCatalog {
            inner: Arc::new(CatalogInner {
                source: Some((self.clone(), dirs)),
                programs: OnceCell::new(),
                rejected: OnceLock::new(),
                loaded: OnceCell::new(),
            }),
        }
    }

    async fn find_programs(self: &Arc<Self>, dirs: &ProgramDirs) -> Result<Found, LoadError> {
        let mut programs = ProgramMap::new();
        for (name, code, names) in bundled() {
            let sha256 = code.sha256().to_string();
            let program = Arc::new(LazyProgram {
                name: name.to_string(),
                origin: format!("bundled:{name}"),
                sandbox: self.clone(),
                code: Code::Bundled(code),
                kind: match names {
                    BundledNames::Own => ProgramKind::P2Component,
                    BundledNames::Asked | BundledNames::Fixed(_) => ProgramKind::Multicall,
                },
                key: self.key_for_digest(&sha256),
                sha256,
                loaded: LoadOnce::new(OnFailure::Remember),
            });
            match names {
                BundledNames::Own => {
                    programs.insert(name.to_string(), program);
                }
                BundledNames::Asked => {
                    for utility in self.multicall_names(&program).await? {
                        programs.insert(utility, program.clone());
                    }
                }
                BundledNames::Fixed(utilities) => {
                    for utility in utilities {
                        programs.insert((*utility).to_string(), program.clone());
                    }
                }
            }
        }
        let mut rejected = Vec::new();
        let installed = dirs.installed.as_deref().filter(|dir| dir.is_dir());
        for dir in installed.into_iter().chain(dirs.operator.as_deref()) {
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
        let mut problem = None;
        let bytes = match read_regular_file(path, MAX_PROGRAM_BYTES, Symlinks::Follow) {
            Ok(bytes) => bytes,
            Err(error) => {
                problem = Some(format!("cannot read {}: {error}", path.display()));
                Vec::new()
            }
        };
        let kind = ProgramKind::of(&bytes);
        if kind == ProgramKind::NotWasm && problem.is_none() {
            problem = Some(not_wasm());
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
            key: self.key_for_digest(&keyed),
            loaded: match problem {
                Some(problem) => LoadOnce::failed(problem),
                None => LoadOnce::new(OnFailure::Remember),
            },
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
