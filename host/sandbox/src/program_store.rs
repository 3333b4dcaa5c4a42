//! The store and linker one exec program runs in: its own WASI context and memory limiter, the
//! calling tool's asker of writes under a read-only workspace, and a write budget shared by
//! every program of one tool call. The budget is charged by wrapping the file-writing functions
//! of `wasi:filesystem`, so a program that writes files itself (`dd`, `cp`, `tee`, `sed -i`) is
//! bounded like a shell redirection is. Every program, whatever its kind (a p1 module is adapted
//! into a component first), is instantiated with [`program_linker`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{Engine, StoreContextMut};
use wasmtime_wasi::filesystem::WasiFilesystemView as _;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, ErrorCode, Host as _, HostDescriptor as _,
};
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::asked_writes::{AsksWrites, WriteAsker};
use crate::host::MemoryLimiter;

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
    crate::directory_listing::list_without_stat(&mut linker)?;
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
