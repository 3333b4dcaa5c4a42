//! The engine and the loading of components: one [`Sandbox`] per process holds the wasmtime engine
//! (pooling allocator, epoch interruption driven by a ticker thread) and the artifact cache, and
//! turns component bytes into [`WasmTool`]s after checking that every import the component asks
//! for is one the host provides.

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
use crate::cache::{ArtifactCache, CacheOutcome};
use crate::grants::Grants;
use crate::host::CallState;
use crate::tool::{Answer, Operation, WasmTool, run_in_fresh_instance};

/// How often the epoch advances: the granularity of timeouts and of yielding to other tasks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Instances that may exist at once across the process; each reserves address space only.
const POOL_INSTANCES: u32 = 200;

/// How a [`Sandbox`] is set up.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Where compiled components are cached.
    pub cache: ArtifactCache,
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

/// The engine every component runs in. Create one per process and share it.
pub struct Sandbox {
    engine: Engine,
    cache: ArtifactCache,
    ticker_stop: Arc<AtomicBool>,
    /// Programs compiled in this process, by cache key, so a second catalog does not load again.
    compiled_programs: Mutex<HashMap<String, Component>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("cache", &self.cache)
            .finish()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
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
            .max_core_instance_size(4 << 20);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|error| LoadError::Engine(error.to_string()))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let stop = ticker_stop.clone();
        let ticking = engine.clone();
        thread::Builder::new()
            .name("clawcage-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    thread::sleep(EPOCH_TICK);
                    ticking.increment_epoch();
                }
            })
            .map_err(|error| {
                LoadError::Engine(format!("cannot start the epoch ticker: {error}"))
            })?;

        Ok(Arc::new(Sandbox {
            engine,
            cache: options.cache,
            ticker_stop,
            compiled_programs: Mutex::new(HashMap::new()),
        }))
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The artifact cache.
    pub fn cache(&self) -> &ArtifactCache {
        &self.cache
    }

    /// A program compiled earlier in this process, by its cache key.
    pub(crate) fn compiled_program(&self, key: &str) -> Option<Component> {
        self.compiled_programs
            .lock()
            .ok()
            .and_then(|programs| programs.get(key).cloned())
    }

    /// Keeps a compiled program for the rest of the process.
    pub(crate) fn remember_program(&self, key: String, component: Component) {
        if let Ok(mut programs) = self.compiled_programs.lock() {
            programs.insert(key, component);
        }
    }

    /// Compile (or fetch from the cache) the component `bytes`, check its imports, ask it for its
    /// tool specs, and return its tools bound to `grants`. `origin` says where it came from
    /// (e.g. `bundled:file`), for `clawcage tools` and the logs.
    pub async fn load(
        self: &Arc<Self>,
        name: &str,
        origin: &str,
        bytes: &[u8],
        grants: Grants,
    ) -> Result<LoadedComponent, LoadError> {
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        let owned = bytes.to_vec();
        let compiled = tokio::task::spawn_blocking(move || cache.load(&engine, &owned))
            .await
            .map_err(|error| LoadError::Compile {
                component: name.to_string(),
                reason: format!("the compile task stopped: {error}"),
            })?;
        let (component, outcome) = compiled.map_err(|error| LoadError::Compile {
            component: name.to_string(),
            reason: format!("{error:#}"),
        })?;
        tracing::debug!(component = name, ?outcome, "component ready");

        self.check_imports(name, &component, &grants)?;
        let linker = self
            .linker(&grants)
            .map_err(|error| LoadError::Engine(format!("{error:#}")))?;
        let instance_pre =
            linker
                .instantiate_pre(&component)
                .map_err(|error| LoadError::UngrantedImport {
                    component: name.to_string(),
                    import: "(see below)".to_string(),
                    hint: format!("{error:#}"),
                })?;
        let pre = BasicToolPre::new(instance_pre).map_err(|error| LoadError::NotATool {
            component: name.to_string(),
            reason: format!("{error:#}"),
        })?;

        let shared = Arc::new(CompiledComponent {
            name: name.to_string(),
            origin: origin.to_string(),
            pre,
            engine: self.engine.clone(),
            instantiations: AtomicU64::new(0),
            cache_outcome: outcome,
        });
        let specs = shared.specs().await?;
        let grants = Arc::new(grants);
        let tools = specs
            .into_iter()
            .map(|spec| WasmTool::new(spec, shared.clone(), grants.clone()))
            .collect();
        Ok(LoadedComponent {
            component: shared,
            tools,
        })
    }

    /// The linker a component is instantiated with: WASI (with sockets denied by the context)
    /// and the `log` import; with a network grant, also the `http` import and `wasi:http`, both
    /// of which send through the call's network policy; with exec, the `process` import; with a scheduler, the `scheduler` import.
    fn linker(&self, grants: &Grants) -> wasmtime::Result<Linker<CallState>> {
        let mut linker = Linker::new(&self.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::log::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)?;
        if grants.network.is_some() {
            bindings::http::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| {
                state
            })?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        }
        if grants.exec.is_some() {
            crate::process::add_to_linker(&mut linker)?;
        }
        if grants.scheduler().is_some() {
            crate::scheduler::add_to_linker(&mut linker)?;
        }
        Ok(linker)
    }

    /// Refuses components that import interfaces these grants do not provide, naming the import
    /// and what would allow it. Outbound HTTP (`clawcage:tool/http`, `wasi:http/*`) is provided
    /// only with a network grant, `clawcage:tool/process` only with exec,
    /// `clawcage:tool/scheduler` only with a scheduler.
    fn check_imports(
        &self,
        name: &str,
        component: &Component,
        grants: &Grants,
    ) -> Result<(), LoadError> {
        let component_type = component.component_type();
        let network = grants.network.is_some();
        for (import, item) in component_type.imports(&self.engine) {
            let is_http =
                import.starts_with("clawcage:tool/http@") || import.starts_with("wasi:http/");
            let provided = (import.starts_with("wasi:") && !is_http)
                || import.starts_with("clawcage:tool/log@")
                || import.starts_with("clawcage:tool/types@")
                || (network && is_http)
                || (grants.exec.is_some() && import.starts_with("clawcage:tool/process@"))
                || (grants.scheduler().is_some() && import.starts_with("clawcage:tool/scheduler@"));
            if provided {
                continue;
            }
            let interface = import.split('@').next().unwrap_or(import);
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
            let kind = match item.ty {
                ComponentItem::ComponentInstance(_) => "interface",
                _ => "item",
            };
            return Err(LoadError::UngrantedImport {
                component: name.to_string(),
                import: format!("{import} ({kind})"),
                hint: hint.to_string(),
            });
        }
        Ok(())
    }
}

/// A compiled component shared by its tools.
pub(crate) struct CompiledComponent {
    pub(crate) name: String,
    pub(crate) origin: String,
    pub(crate) pre: BasicToolPre<CallState>,
    pub(crate) engine: Engine,
    pub(crate) instantiations: AtomicU64,
    pub(crate) cache_outcome: CacheOutcome,
}

impl CompiledComponent {
    /// Instantiate once with no grants and ask for the tool specs.
    async fn specs(self: &Arc<Self>) -> Result<Vec<ToolSpec>, LoadError> {
        let bad = |reason: String| LoadError::BadSpecs {
            component: self.name.clone(),
            reason,
        };
        let answer = run_in_fresh_instance(self, &Grants::none(), Operation::Specs)
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
    component: Arc<CompiledComponent>,
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

    /// How many instances have been created so far (the spec query at load counts as one).
    pub fn instantiations(&self) -> u64 {
        self.component.instantiations.load(Ordering::Relaxed)
    }

    /// Whether the compiled code came from the cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.component.cache_outcome
    }
}
