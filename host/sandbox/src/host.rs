//! The per-call store state and the host side of the WIT imports: the WASI context built from the
//! grants, the memory limiter that records why a grow failed, and the `log` import that forwards
//! guest lines to tracing with a per-call cap. The `http` and `wasi:http` imports live in
//! `network/`; their per-call state (the call's network policy) is held here.

use std::sync::Arc;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::asked_writes::{AsksWrites, WriteAsker};
use crate::bindings::log;
use crate::network::NetworkPolicy;
use crate::network::wasi_http::PolicyHooks;

/// Log lines one call may write; further lines are dropped and counted.
const MAX_LOG_LINES_PER_CALL: u32 = 200;
/// Characters kept of one log line.
const MAX_LOG_LINE_CHARS: usize = 2_000;

/// Everything a store holds for one call.
pub(crate) struct CallState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    /// The component's name, for log lines.
    pub(crate) component: String,
    pub(crate) log_lines: u32,
    /// The network policy of this call; `None` refuses every request.
    pub(crate) network: Option<Arc<NetworkPolicy>>,
    /// State of the `wasi:http` implementation.
    pub(crate) http_ctx: wasmtime_wasi_http::WasiHttpCtx,
    /// The `wasi:http` sender that applies `network`.
    pub(crate) http_hooks: PolicyHooks,
    /// What the `process` import needs, when the tool was granted exec.
    pub(crate) exec: Option<crate::process::ExecContext>,
    /// The scheduler the `scheduler` import calls, when the tool was granted cron.
    pub(crate) scheduler: Option<Arc<dyn clawcage_core::Scheduler>>,
    /// Asks the operator before a write under a read-only workspace, when configured.
    pub(crate) writes: Option<Arc<WriteAsker>>,
}

impl CallState {
    pub(crate) fn new(wasi: WasiCtx, memory_bytes: u64, component: &str) -> Self {
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_bytes),
            component: component.to_string(),
            log_lines: 0,
            network: None,
            http_ctx: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_hooks: PolicyHooks::new(None, component),
            exec: None,
            scheduler: None,
            writes: None,
        }
    }

    /// This state with outbound HTTP under `network` (`None`: every request is refused).
    pub(crate) fn with_network(mut self, network: Option<Arc<NetworkPolicy>>) -> Self {
        self.http_hooks = PolicyHooks::new(network.clone(), &self.component);
        self.network = network;
        self
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl AsksWrites for CallState {
    fn write_asker(&self) -> Option<Arc<WriteAsker>> {
        self.writes.clone()
    }
}

/// Caps linear memory and remembers whether the cap was hit, so a trap caused by it is reported
/// as "memory limit" rather than as a crash.
pub(crate) struct MemoryLimiter {
    max_bytes: u64,
    pub(crate) exceeded: bool,
}

impl MemoryLimiter {
    pub(crate) fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            exceeded: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.max_bytes {
            self.exceeded = true;
            wasmtime::bail!(
                "memory limit of {} MiB reached (asked for {} MiB)",
                self.max_bytes >> 20,
                desired >> 20
            );
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million entries is far beyond any real tool.
        if desired > 1_000_000 {
            self.exceeded = true;
            wasmtime::bail!("table limit reached (asked for {desired} entries)");
        }
        Ok(true)
    }
}

impl log::Host for CallState {
    async fn log(&mut self, level: log::Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES_PER_CALL {
            if self.log_lines == MAX_LOG_LINES_PER_CALL + 1 {
                tracing::warn!(component = %self.component, "further log lines of this call are dropped");
            }
            return;
        }
        let message: String = message.chars().take(MAX_LOG_LINE_CHARS).collect();
        let component = self.component.as_str();
        match level {
            log::Level::Trace => tracing::trace!(target: "clawcage::tool", component, "{message}"),
            log::Level::Debug => tracing::debug!(target: "clawcage::tool", component, "{message}"),
            log::Level::Info => tracing::info!(target: "clawcage::tool", component, "{message}"),
            log::Level::Warn => tracing::warn!(target: "clawcage::tool", component, "{message}"),
            log::Level::Error => tracing::error!(target: "clawcage::tool", component, "{message}"),
        }
    }
}
