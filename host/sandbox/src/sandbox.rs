//! The engine and the loading of components: one [`Sandbox`] per process holds the wasmtime engine
//! (pooling allocator, epoch interruption driven by a ticker thread) and the artifact cache, and
//! turns component bytes into [`WasmTool`]s after checking that every import the component asks
//! for is one the host provides. It is one file (over 700 lines) because it is one path from bytes
//! to tools: the engine and its ticker, compiling through the cache, checking imports and loading
//! lazily all serve the [`Sandbox`]'s loading.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use clawcage_core::{ToolError, ToolSpec};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::bindings::{self, BasicToolPre};
use crate::bundled::{BundledComponent, ComponentCode, DamagedComponent};
use crate::cache::{ArtifactCache, CacheOutcome, sha256_hex};
use crate::grants::Grants;
use crate::host::CallState;
use crate::load_once::{LoadOnce, OnFailure};
use crate::prepared::{WaitingBudget, WaitingInstances};
use crate::tool::{Answer, Operation, WasmTool, run_in_fresh_instance};

/// How often the epoch advances: the granularity of timeouts and of yielding to other tasks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Instances that may exist at once across the process; each reserves address space only.
pub(crate) const POOL_INSTANCES: u32 = 200;

/// How a [`Sandbox`] is set up.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Where compiled components are cached.
    pub cache: ArtifactCache,
    /// Where the first start's compilation is reported (quiet by default).
    pub progress: crate::progress::CompileProgress,
    /// How long an instance made ahead of its call waits unused before it is dropped; zero
    /// makes none ahead (every call makes its own instance during the call, as a command that
    /// makes one call and exits wants).
    pub idle_instances: Duration,
    /// Whether the engine reserves a pool of instance slots at start ([`POOL_INSTANCES`], each
    /// reset cheaply and reused: what a session or a server wants) or allocates each instance on
    /// its own (no start-up cost: what a command that makes one call and exits wants).
    pub pooled: bool,
}

impl SandboxOptions {
    /// Components cached in `cache`, compilation not reported.
    pub fn new(cache: ArtifactCache) -> Self {
        Self {
            cache,
            progress: crate::progress::CompileProgress::quiet(),
            idle_instances: crate::prepared::IDLE,
            pooled: true,
        }
    }
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The engine could not be created.
    #[error("the WebAssembly engine could not start: {0}")]
    Engine(String),
    /// The bytes are not a valid component, or compilation failed.
    #[error("component `{component}` could not be compiled: {reason}")]
    Compile {
        /// The component's name.
        component: String,
        /// What wasmtime said.
        reason: String,
    },
    /// The component imports an interface the host does not grant.
    #[error("component `{component}` imports `{import}`, which is not granted to it; {hint}")]
    UngrantedImport {
        /// The component's name.
        component: String,
        /// The import's full name.
        import: String,
        /// What would allow it, if anything.
        hint: String,
    },
    /// The component does not export `clawcage:tool/tool`.
    #[error(
        "component `{component}` does not export the tool interface `clawcage:tool/tool@0.1.0` ({reason}); build it against the clawcage WIT world `basic-tool`"
    )]
    NotATool {
        /// The component's name.
        component: String,
        /// What wasmtime said.
        reason: String,
    },
    /// `specs()` failed or returned something unusable.
    #[error("component `{component}` returned unusable tool specs: {reason}")]
    BadSpecs {
        /// The component's name.
        component: String,
        /// What was wrong.
        reason: String,
    },
}

/// The thread that advances the engine's epoch every [`EPOCH_TICK`]: without it no timeout can
/// stop a guest that never returns. It runs while anything that can run a guest holds it — the
/// [`Sandbox`], every compiled component and every program — and stops when the last of them is
/// dropped, so tools that outlive the `Sandbox` value keep their time limits.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: &Engine) -> Result<Arc<EpochTicker>, LoadError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let ticking = engine.clone();
        thread::Builder::new()
            .name("clawcage-epoch".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    thread::sleep(EPOCH_TICK);
                    ticking.increment_epoch();
                }
            })
            .map_err(|error| {
                LoadError::Engine(format!("cannot start the epoch ticker: {error}"))
            })?;
        Ok(Arc::new(EpochTicker { stop }))
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Bytes of a pooled linear memory reset with `memset` rather than `madvise` when an instance
/// ends (pages beyond it are returned to the kernel as before).
const KEEP_RESIDENT_BYTES: usize = 2 << 20;

/// The engine every component runs in. Create one per process and share it.
pub struct Sandbox {
    engine: Engine,
    cache: ArtifactCache,
    ticker: Arc<EpochTicker>,
    /// Components and programs loaded in this process, by cache key, so none loads twice.
    compiled: Mutex<HashMap<String, Component>>,
    /// The engine's part of every cache key ([`crate::cache::engine_hash`]).
    engine_hash: u64,
    /// Descriptions read from the cache in this process, by cache key, so none is read twice.
    descriptions: Mutex<HashMap<String, Description>>,
    /// Tells the operator, once, that the first start compiles.
    progress: crate::progress::CompileProgress,
    /// How many instances wait, made ahead of their calls, in this process.
    waiting: Arc<WaitingBudget>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("cache", &self.cache)
            .finish()
    }
}

impl Sandbox {
    /// Start the engine and its epoch ticker.
    pub fn new(options: SandboxOptions) -> Result<Arc<Sandbox>, LoadError> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * 4)
            .total_memories(POOL_INSTANCES * 2)
            .total_tables(POOL_INSTANCES * 4)
            .total_stacks(POOL_INSTANCES)
            .max_component_instance_size(4 << 20)
            .max_core_instance_size(4 << 20)
            // A fresh instance per call reuses a pooled slot: reset the low, touched part of its
            // memory, table and stack with `memset` (still zeroed, nothing crosses from one call
            // to the next) instead of `madvise`, which costs a TLB shootdown per call and page
            // faults on the next one.
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(64 << 10)
            .async_stack_keep_resident(64 << 10)
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(if options.pooled {
                InstanceAllocationStrategy::Pooling(pool)
            } else {
                InstanceAllocationStrategy::OnDemand
            });
        let engine = Engine::new(&config).map_err(|error| LoadError::Engine(error.to_string()))?;

        let ticker = EpochTicker::start(&engine)?;
        Ok(Arc::new(Sandbox {
            engine_hash: crate::cache::engine_hash(&engine),
            engine,
            cache: options.cache,
            ticker,
            compiled: Mutex::new(HashMap::new()),
            descriptions: Mutex::new(HashMap::new()),
            progress: options.progress.clone(),
            waiting: Arc::new(WaitingBudget::new(options.idle_instances)),
        }))
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cache key of the component whose hex SHA-256 is `sha256` in this engine.
    pub(crate) fn key_for_digest(&self, sha256: &str) -> String {
        ArtifactCache::key_for_engine_hash(self.engine_hash, sha256)
    }

    /// The artifact cache.
    pub fn cache(&self) -> &ArtifactCache {
        &self.cache
    }

    /// How many instances wait in this process, made ahead of their calls
    /// (see the `prepared` module).
    pub fn waiting_instances(&self) -> usize {
        self.waiting.waiting()
    }

    /// Where compilation is reported.
    pub fn progress(&self) -> &crate::progress::CompileProgress {
        &self.progress
    }

    /// A hold on the epoch ticker, for whatever runs guests after this value is gone.
    pub(crate) fn ticker(&self) -> Arc<EpochTicker> {
        self.ticker.clone()
    }

    /// A component compiled or loaded earlier in this process, by its cache key.
    pub(crate) fn compiled(&self, key: &str) -> Option<Component> {
        self.compiled
            .lock()
            .ok()
            .and_then(|compiled| compiled.get(key).cloned())
    }

    /// Keeps a compiled component for the rest of the process, so nothing is loaded twice.
    pub(crate) fn remember(&self, key: String, component: Component) {
        if let Ok(mut compiled) = self.compiled.lock() {
            compiled.insert(key, component);
        }
    }

    /// The component `code` (whose cache key is `key`): from this process's memory, else from
    /// the artifact cache (mapped, not copied), else compiled now — with a note on stderr, since
    /// compiling a large component takes seconds.
    pub(crate) async fn compile(
        &self,
        name: &str,
        key: &str,
        code: &Code,
    ) -> Result<(Component, CacheOutcome), LoadError> {
        if let Some(component) = self.compiled(key) {
            return Ok((component, CacheOutcome::Hit));
        }
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        let owned_key = key.to_string();
        let code = code.clone();
        let load = move || {
            cache.load_keyed_with(&engine, &owned_key, || {
                code.bytes().map_err(wasmtime::Error::msg)
            })
        };
        if !self.cache.has_artifact(key) {
            self.progress.compiling(name);
        }
        // On a runtime of one thread (a one-call command) nothing else runs while the caller
        // waits, so the load is done here rather than on a thread started for it. Elsewhere a
        // compile (seconds) or an artifact's first check must not hold up a worker.
        let one_thread = tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
            runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        });
        let compiled = if one_thread {
            load()
        } else {
            tokio::task::spawn_blocking(load)
                .await
                .map_err(|error| LoadError::Compile {
                    component: name.to_string(),
                    reason: format!("the compile task stopped: {error}"),
                })?
        };
        let (component, outcome) = compiled.map_err(|error| LoadError::Compile {
            component: name.to_string(),
            reason: format!("{error:#}"),
        })?;
        tracing::debug!(component = name, ?outcome, "component ready");
        self.remember(key.to_string(), component.clone());
        Ok((component, outcome))
    }

    /// Checks the component `code` (a [`BundledComponent`] or bytes) against `grants` and
    /// returns its tools bound to them. `origin` says where it came from (e.g. `bundled:file`),
    /// for `clawcage tools` and the logs.
    ///
    /// Nothing is compiled or instantiated when the artifact cache already describes the
    /// component (its tool specs and imports were recorded the first time): the code is loaded
    /// when one of its tools is first called. A bundled component is keyed by the digest its
    /// build recorded, so it is neither decompressed nor hashed.
    pub async fn load<'a>(
        self: &Arc<Self>,
        name: &str,
        origin: &str,
        code: impl Into<ComponentCode<'a>>,
        grants: Grants,
    ) -> Result<LoadedComponent, LoadError> {
        let code = code.into();
        let sha256 = match code {
            ComponentCode::Bundled(bundled) => bundled.sha256().to_string(),
            ComponentCode::Bytes(bytes) => sha256_hex(bytes),
        };
        self.load_code(name, origin, Code::of(code), &sha256, grants)
            .await
    }

    /// [`Sandbox::load`] for code whose SHA-256 is already known (and was checked by the
    /// caller, as the plugin loader does).
    pub(crate) async fn load_code(
        self: &Arc<Self>,
        name: &str,
        origin: &str,
        code: Code,
        sha256: &str,
        grants: Grants,
    ) -> Result<LoadedComponent, LoadError> {
        let key = self.key_for_digest(sha256);
        let (description, outcome) = match self.recorded_description(&key) {
            Some(description) => (description, CacheOutcome::Hit),
            None => {
                let (component, outcome) = self.compile(name, &key, &code).await?;
                let description = self.describe(name, &component).await?;
                if let Ok(json) = serde_json::to_vec(&description) {
                    self.cache.store_record(&key, DESCRIPTION_RECORD, &json);
                }
                (description, outcome)
            }
        };
        check_imports(name, &description.imports, ImportSet::of(&grants))?;
        let lazy = Arc::new(LazyComponent {
            name: name.to_string(),
            origin: origin.to_string(),
            sandbox: self.clone(),
            code,
            key,
            imports: ImportSet::of(&grants),
            ready: LoadOnce::new(OnFailure::Retry),
            instantiations: AtomicU64::new(0),
            cache_outcome: outcome,
        });
        let grants = Arc::new(grants);
        let waiting = Arc::new(WaitingInstances::new(grants.clone(), self.waiting.clone()));
        let tools = description
            .specs
            .into_iter()
            .map(|spec| WasmTool::new(spec, lazy.clone(), grants.clone(), waiting.clone()))
            .collect();
        Ok(LoadedComponent {
            component: lazy,
            tools,
        })
    }

    /// Whether loading the component `code` would compile it (neither this process nor the
    /// artifact cache knows it), so a front end can announce how many compilations are ahead.
    pub fn needs_compile<'a>(&self, code: impl Into<ComponentCode<'a>>) -> bool {
        let key = match code.into() {
            ComponentCode::Bundled(bundled) => self.key_for_digest(bundled.sha256()),
            ComponentCode::Bytes(bytes) => self.key_for_digest(&sha256_hex(bytes)),
        };
        self.compiled(&key).is_none()
            && (self.recorded_description(&key).is_none() && !self.cache.has_artifact(&key))
    }

    /// What an earlier run recorded about the component of `key`, if it is usable: read from
    /// the cache once per process.
    fn recorded_description(&self, key: &str) -> Option<Description> {
        if let Some(known) = self
            .descriptions
            .lock()
            .ok()
            .and_then(|descriptions| descriptions.get(key).cloned())
        {
            return Some(known);
        }
        let bytes = self.cache.record(key, DESCRIPTION_RECORD)?;
        match serde_json::from_slice::<Description>(&bytes) {
            Ok(description) if !description.specs.is_empty() => {
                if let Ok(mut descriptions) = self.descriptions.lock() {
                    descriptions.insert(key.to_string(), description.clone());
                }
                Some(description)
            }
            _ => {
                tracing::warn!(
                    key,
                    "ignoring an unusable component description in the cache"
                );
                None
            }
        }
    }

    /// Learns what `component` imports and which tools it offers, by asking a fresh instance
    /// with no grants for its specs. Imports nobody can grant are refused before it runs.
    async fn describe(
        self: &Arc<Self>,
        name: &str,
        component: &Component,
    ) -> Result<Description, LoadError> {
        let component_type = component.component_type();
        let imports: Vec<RecordedImport> = component_type
            .imports(&self.engine)
            .map(|(import, item)| RecordedImport {
                name: import.to_string(),
                interface: matches!(item.ty, ComponentItem::ComponentInstance(_)),
            })
            .collect();
        let asked = ImportSet::asked(&imports);
        check_imports(name, &imports, ImportSet::ALL)?;
        let prepared = self.prepare(name, component, asked)?;
        let specs = prepared.specs().await?;
        Ok(Description { specs, imports })
    }

    /// Links `component` with the imports in `imports` and checks that it exports the tool
    /// interface.
    fn prepare(
        &self,
        name: &str,
        component: &Component,
        imports: ImportSet,
    ) -> Result<Arc<CompiledComponent>, LoadError> {
        let linker = self
            .linker(imports)
            .map_err(|error| LoadError::Engine(format!("{error:#}")))?;
        let instance_pre =
            linker
                .instantiate_pre(component)
                .map_err(|error| LoadError::UngrantedImport {
                    component: name.to_string(),
                    import: "(see below)".to_string(),
                    hint: format!("{error:#}"),
                })?;
        let pre = BasicToolPre::new(instance_pre).map_err(|error| LoadError::NotATool {
            component: name.to_string(),
            reason: format!("{error:#}"),
        })?;
        Ok(Arc::new(CompiledComponent {
            name: name.to_string(),
            pre,
            engine: self.engine.clone(),
            _ticker: self.ticker(),
        }))
    }

    /// The linker a component is instantiated with: WASI (with sockets denied by the context)
    /// and the `log` import; with the network, also the `http` import and `wasi:http`, both of
    /// which send through the call's network policy; with exec, the `process` import; with a
    /// scheduler, the `scheduler` import.
    fn linker(&self, imports: ImportSet) -> wasmtime::Result<Linker<CallState>> {
        let mut linker = Linker::new(&self.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        crate::special_files::refuse_special_files(&mut linker)?;
        crate::asked_writes::ask_before_writes(&mut linker)?;
        crate::directory_listing::list_without_stat(&mut linker)?;
        bindings::log::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)?;
        if imports.network {
            bindings::http::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| {
                state
            })?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        }
        if imports.exec {
            crate::process::add_to_linker(&mut linker)?;
        }
        if imports.scheduler {
            crate::scheduler::add_to_linker(&mut linker)?;
        }
        Ok(linker)
    }
}

/// The name of the record that describes a component beside its artifact.
const DESCRIPTION_RECORD: &str = "describe";

/// The code of a component: one built into the binary (compressed, decompressed only to compile it),
/// or a shared copy of bytes read from elsewhere.
#[derive(Clone)]
pub(crate) enum Code {
    /// Built into the binary.
    Bundled(&'static BundledComponent),
    /// Read from elsewhere (a plugin, a test fixture).
    Shared(Arc<[u8]>),
}

impl Code {
    /// The code as given to the sandbox: a shared copy of `code` unless it is bundled.
    pub(crate) fn of(code: ComponentCode<'_>) -> Self {
        match code {
            ComponentCode::Bundled(bundled) => Code::Bundled(bundled),
            ComponentCode::Bytes(bytes) => Code::Shared(Arc::from(bytes)),
        }
    }

    /// The component's bytes, decompressed when it is bundled.
    pub(crate) fn bytes(&self) -> Result<Cow<'_, [u8]>, DamagedComponent> {
        match self {
            Code::Bundled(bundled) => bundled.bytes().map(Cow::Owned),
            Code::Shared(bytes) => Ok(Cow::Borrowed(bytes)),
        }
    }

    /// The size of the component's bytes (decompressed).
    pub(crate) fn len(&self) -> usize {
        match self {
            Code::Bundled(bundled) => bundled.len(),
            Code::Shared(bytes) => bytes.len(),
        }
    }
}

/// What the host learns by loading a component once, recorded beside its artifact.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Description {
    specs: Vec<ToolSpec>,
    imports: Vec<RecordedImport>,
}

/// One import of a component.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecordedImport {
    /// Its full name, e.g. `wasi:http/outgoing-handler@0.2.6`.
    name: String,
    /// Whether it is an interface (rather than a single item).
    interface: bool,
}

/// The optional host imports linked for a component; WASI and `log` always are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImportSet {
    network: bool,
    exec: bool,
    scheduler: bool,
}

impl ImportSet {
    /// Everything the host can provide (for describing a component before any grant applies).
    const ALL: ImportSet = ImportSet {
        network: true,
        exec: true,
        scheduler: true,
    };

    /// What `grants` provide.
    fn of(grants: &Grants) -> ImportSet {
        ImportSet {
            network: grants.network.is_some(),
            exec: grants.exec.is_some(),
            scheduler: grants.scheduler().is_some(),
        }
    }

    /// What a component with `imports` asks for.
    fn asked(imports: &[RecordedImport]) -> ImportSet {
        let any = |prefixes: &[&str]| {
            imports.iter().any(|import| {
                prefixes
                    .iter()
                    .any(|prefix| import.name.starts_with(prefix))
            })
        };
        ImportSet {
            network: any(&["clawcage:tool/http@", "wasi:http/"]),
            exec: any(&["clawcage:tool/process@"]),
            scheduler: any(&["clawcage:tool/scheduler@"]),
        }
    }
}

/// Refuses a component that imports an interface `granted` does not provide, naming the import
/// and what would allow it. Outbound HTTP (`clawcage:tool/http`, `wasi:http/*`) is provided only
/// with a network grant, `clawcage:tool/process` only with exec, `clawcage:tool/scheduler` only
/// with a scheduler; nothing outside `wasi:*` and `clawcage:tool/*` ever is.
fn check_imports(
    name: &str,
    imports: &[RecordedImport],
    granted: ImportSet,
) -> Result<(), LoadError> {
    for import in imports {
        let full = import.name.as_str();
        let is_http = full.starts_with("clawcage:tool/http@") || full.starts_with("wasi:http/");
        let provided = (full.starts_with("wasi:") && !is_http)
            || full.starts_with("clawcage:tool/log@")
            || full.starts_with("clawcage:tool/types@")
            || (granted.network && is_http)
            || (granted.exec && full.starts_with("clawcage:tool/process@"))
            || (granted.scheduler && full.starts_with("clawcage:tool/scheduler@"));
        if provided {
            continue;
        }
        let interface = full.split('@').next().unwrap_or(full);
        let hint = match interface {
            _ if is_http => {
                "outbound HTTP needs a network grant: list the hosts the tool may reach in [network] allow in clawcage.toml"
            }
            "clawcage:tool/process" => {
                "running programs needs the exec capability: grant it with `Grants::with_exec` (for the CLI: keep `exec` enabled in the [exec] config section)"
            }
            "clawcage:tool/scheduler" => {
                "scheduling needs the cron capability: grant it with `Grants::with_scheduler` (for the CLI: keep `enabled` on in the [cron] config section)"
            }
            _ => {
                "it is not part of the clawcage contract; only wasi:* and clawcage:tool/* imports can be granted"
            }
        };
        let kind = if import.interface {
            "interface"
        } else {
            "item"
        };
        return Err(LoadError::UngrantedImport {
            component: name.to_string(),
            import: format!("{full} ({kind})"),
            hint: hint.to_string(),
        });
    }
    Ok(())
}

/// A component whose tools are known but whose code is loaded only when one of them is first
/// called: `clawcage tools` and a provider's tool list never pay for it.
pub(crate) struct LazyComponent {
    pub(crate) name: String,
    pub(crate) origin: String,
    sandbox: Arc<Sandbox>,
    code: Code,
    key: String,
    imports: ImportSet,
    /// Loaded on the first call of one of its tools; a failed load is tried again at the next.
    ready: LoadOnce<CompiledComponent>,
    /// Instances created for calls of its tools.
    pub(crate) instantiations: AtomicU64,
    cache_outcome: CacheOutcome,
}

impl LazyComponent {
    /// The component ready to instantiate: loaded (from memory, the cache, or compiled) on the
    /// first call, shared by every later one.
    pub(crate) async fn ready(&self) -> Result<&Arc<CompiledComponent>, ToolError> {
        self.ready
            .get(|| async {
                let (component, _) = self
                    .sandbox
                    .compile(&self.name, &self.key, &self.code)
                    .await
                    .map_err(|error| error.to_string())?;
                self.sandbox
                    .prepare(&self.name, &component, self.imports)
                    .map_err(|error| error.to_string())
            })
            .await
            .map_err(|error| {
                ToolError::Failed(format!(
                    "the component `{}` could not be loaded: {error}",
                    self.name
                ))
            })
    }
}

/// A compiled component linked for one set of imports, ready to instantiate.
pub(crate) struct CompiledComponent {
    pub(crate) name: String,
    pub(crate) pre: BasicToolPre<CallState>,
    pub(crate) engine: Engine,
    /// Keeps the epoch advancing while this component can run.
    pub(crate) _ticker: Arc<EpochTicker>,
}

impl CompiledComponent {
    /// Instantiate once with no grants and ask for the tool specs.
    async fn specs(self: &Arc<Self>) -> Result<Vec<ToolSpec>, LoadError> {
        let bad = |reason: String| LoadError::BadSpecs {
            component: self.name.clone(),
            reason,
        };
        let answer = run_in_fresh_instance(self, &Grants::none(), Operation::Specs, None)
            .await
            .map_err(|error: ToolError| bad(error.message().to_string()))?;
        let Answer::Specs(raw) = answer else {
            return Err(bad("internal error: wrong answer kind".to_string()));
        };
        if raw.is_empty() {
            return Err(bad("it offers no tools".to_string()));
        }
        let mut specs = Vec::with_capacity(raw.len());
        for spec in raw {
            let input_schema: serde_json::Value = serde_json::from_str(&spec.input_schema)
                .map_err(|error| {
                    bad(format!(
                        "the schema of `{}` is not JSON: {error}",
                        spec.name
                    ))
                })?;
            let valid_name = !spec.name.is_empty()
                && spec.name.len() <= 64
                && spec
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid_name {
                return Err(bad(format!(
                    "tool name {:?} must be 1-64 characters of a-z, A-Z, 0-9, `_` or `-`",
                    spec.name
                )));
            }
            specs.push(ToolSpec {
                name: spec.name,
                description: spec.description,
                input_schema,
            });
        }
        Ok(specs)
    }
}

/// A loaded component: its tools and counters.
pub struct LoadedComponent {
    component: Arc<LazyComponent>,
    tools: Vec<WasmTool>,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("name", &self.component.name)
            .field("tools", &self.tools)
            .finish()
    }
}

impl LoadedComponent {
    /// The component's name.
    pub fn name(&self) -> &str {
        &self.component.name
    }

    /// The tools it offers, bound to the grants given at load.
    pub fn tools(&self) -> &[WasmTool] {
        &self.tools
    }

    /// Consumes the component into its tools.
    pub fn into_tools(self) -> Vec<WasmTool> {
        self.tools
    }

    /// How many instances have been created for calls of its tools so far.
    pub fn instantiations(&self) -> u64 {
        self.component.instantiations.load(Ordering::Relaxed)
    }

    /// Whether loading it compiled anything: `Hit` when the cache described it (or held its
    /// artifact), `Compiled` when Cranelift ran.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.component.cache_outcome
    }

    /// Whether its code has been loaded yet (it is on the first call of one of its tools).
    pub fn is_loaded(&self) -> bool {
        self.component.ready.is_loaded()
    }
}
