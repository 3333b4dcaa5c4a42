//! The host side of the `process` import (`wit/process.wit`): a component granted exec asks the
//! host to run a pipeline of WASI command programs. Every stage is a fresh store and instance on
//! its own tokio task, with the caller's workspace preopen, no network, the environment the
//! caller passed and nothing of the host's, its own memory cap and at most the call's remaining
//! time. Stages stream into each other through bounded pipes; a closed reader makes the writer
//! see a closed pipe. Redirections are opened here, relative to the workspace directory handle
//! (cap-std), never by joining paths; writes to files are charged to the call's write budget.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::task::JoinHandle;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Store, Trap};
use wasmtime_wasi::cli::{
    AsyncStdinStream, AsyncStdoutStream, InputFile, IsTerminal, StdinStream, StdoutStream,
};
use wasmtime_wasi::p2::pipe::{ClosedInputStream, MemoryInputPipe, SinkOutputStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::asked_writes::WriteAsker;
use crate::clock::CallClock;
use crate::grants::{ExecGrant, FsMode, Grants, WorkspaceGrant};
use crate::host::CallState;
use crate::programs::{ProgramState, WriteBudget, budget_error, exit_code};

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "exec-tool",
        imports: { default: async },
        exports: { default: async },
        with: {
            "clawcage:tool/log": crate::bindings::log,
            "clawcage:tool/types": crate::bindings::clawcage::tool::types,
        },
    });
}

use generated::clawcage::tool::process::{
    self as wit, CutOutput, FileOpen, Input, OpenMode, Output, Pipeline, RunError, RunResult,
    Stage, StageEnd,
};

/// Stages one pipeline may have.
const MAX_STAGES: usize = 32;
/// Files one pipeline may name.
const MAX_FILES: usize = 64;
/// Bytes buffered in a pipe between two stages.
const PIPE_BYTES: usize = 64 << 10;
/// Most bytes of `output` kept at each end.
const MAX_OUTPUT_LIMIT: u32 = 1 << 20;
/// Most bytes of `capture` kept.
const MAX_CAPTURE_LIMIT: u32 = 16 << 20;
/// Time kept back from the call's deadline so that the shell can still report a timeout.
const DEADLINE_MARGIN: Duration = Duration::from_millis(300);

/// What a tool call granted exec carries: the programs, where they may reach, the deadline of
/// the call and the write budget all its programs share.
pub(crate) struct ExecContext {
    grant: ExecGrant,
    workspace: Option<WorkspaceGrant>,
    memory_bytes: u64,
    deadline: Instant,
    budget: Arc<WriteBudget>,
    /// What the approvals gate allowed this call to run; `None` when no gate is active.
    approved: Option<Arc<clawcage_core::approval::ApprovedExec>>,
    /// The call's clock (paused while a write is asked) and its mark when `deadline` was set.
    clock: CallClock,
    clock_mark: Duration,
    /// Asks before a write under a read-only workspace, when configured.
    writes: Option<Arc<WriteAsker>>,
}

impl ExecContext {
    /// The context of one call under `grants` (None when exec is not granted), which ends at
    /// `deadline`.
    pub(crate) fn for_call(
        grants: &Grants,
        deadline: Instant,
        clock: &CallClock,
    ) -> Option<ExecContext> {
        let grant = grants.exec.clone()?;
        let budget = Arc::new(WriteBudget::new(grant.write_limit_bytes));
        Some(ExecContext {
            grant,
            workspace: grants.workspace.clone(),
            memory_bytes: grants.limits.memory_bytes,
            deadline,
            budget,
            approved: None,
            clock: clock.clone(),
            clock_mark: clock.mark(),
            writes: None,
        })
    }

    /// This context with writes under a read-only workspace asked through `writes`.
    pub(crate) fn with_writes(mut self, writes: Option<Arc<WriteAsker>>) -> ExecContext {
        self.writes = writes;
        self
    }

    /// The call's deadline, moved by the time the call waited for an operator so far.
    fn deadline(&self) -> Instant {
        self.deadline + self.clock.moved_since(self.clock_mark)
    }

    /// This context with every program checked against `approved` before it starts.
    pub(crate) fn with_approved(
        mut self,
        approved: Option<Arc<clawcage_core::approval::ApprovedExec>>,
    ) -> ExecContext {
        self.approved = approved;
        self
    }
}

/// Adds the `process` import to `linker` (only for components granted exec).
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)
}

impl wit::Host for CallState {
    async fn programs(&mut self) -> Vec<String> {
        let Some(exec) = self.exec.as_ref() else {
            return Vec::new();
        };
        match exec.grant.programs.resolve().await {
            Ok(programs) => programs.keys().cloned().collect(),
            Err(error) => {
                tracing::warn!("the exec programs cannot be found: {error}");
                Vec::new()
            }
        }
    }

    async fn run(&mut self, pipeline: Pipeline) -> Result<RunResult, RunError> {
        let Some(exec) = self.exec.as_ref() else {
            return Err(RunError::Invalid(
                "this tool was not granted the exec capability".to_string(),
            ));
        };
        if let Some(approved) = &exec.approved {
            // Every file the pipeline would open for writing, before any is opened (an approved
            // one would otherwise be emptied before a refused one stops the pipeline).
            for file in &pipeline.files {
                if file.mode != OpenMode::Read {
                    approved
                        .check_write(&file.path, file.mode == OpenMode::Append)
                        .map_err(|refusal| RunError::Redirect(refusal.to_string()))?;
                }
            }
            // The shell's own output into a file starts no program (the host writes it).
            if shell_output(&pipeline).is_none() {
                for stage in &pipeline.stages {
                    approved
                        .check(&stage.program, &stage.args)
                        .map_err(|refusal| RunError::Invalid(refusal.to_string()))?;
                }
            }
        }
        run_pipeline(exec, pipeline).await
    }
}

/// Output kept at its head and tail; the middle is counted.
#[derive(Debug)]
struct HeadTail {
    head_limit: usize,
    tail_limit: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    omitted: u64,
}

impl HeadTail {
    fn new(head_limit: usize, tail_limit: usize) -> Self {
        Self {
            head_limit,
            tail_limit,
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.head_limit {
            let take = bytes.len().min(self.head_limit - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.tail_limit {
            self.omitted += (self.tail.len() + bytes.len() - self.tail_limit) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_limit..]);
            return;
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(self.tail_limit);
        if excess > 0 {
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }
}

/// A stream into a [`HeadTail`] shared by every stage that writes to it. Writes never block and
/// never fail, so a program writing past the limit keeps running normally.
#[derive(Clone)]
struct Collector(Arc<Mutex<HeadTail>>);

impl Collector {
    fn new(head_limit: usize, tail_limit: usize) -> Self {
        Self(Arc::new(Mutex::new(HeadTail::new(head_limit, tail_limit))))
    }

    fn push(&self, bytes: &[u8]) {
        if let Ok(mut buffer) = self.0.lock() {
            buffer.push(bytes);
        }
    }

    fn take(&self) -> HeadTail {
        match self.0.lock() {
            Ok(mut buffer) => {
                let empty = HeadTail::new(buffer.head_limit, buffer.tail_limit);
                std::mem::replace(&mut *buffer, empty)
            }
            Err(_) => HeadTail::new(0, 0),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Collector {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Collector {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl AsyncWrite for Collector {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Collector {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Collector {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// A redirection's file, shared by every stream that names it, charging the write budget.
#[derive(Clone)]
struct FileSink {
    file: Arc<Mutex<std::fs::File>>,
    budget: Arc<WriteBudget>,
}

impl FileSink {
    fn write_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        if !self.budget.charge(bytes.len()) {
            return Err(budget_error());
        }
        let mut file = self
            .file
            .lock()
            .map_err(|_| std::io::Error::other("the file is unusable after a failed write"))?;
        file.write_all(bytes)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for FileSink {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for FileSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes)
            .map_err(|error| StreamError::LastOperationFailed(error.into()))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl AsyncWrite for FileSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.write_bytes(buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for FileSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for FileSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// The writing end of a pipe, shared when a stage sends both stdout and stderr into it.
#[derive(Clone)]
struct PipeWriter(Arc<AsyncStdoutStream>);

impl IsTerminal for PipeWriter {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for PipeWriter {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(PipeEnd(self.0.p2_stream()))
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        self.0.async_stream()
    }
}

/// The writing end of a pipe as a WASI stream: once the reader is gone, writes report a closed
/// stream (the program sees a broken pipe, as `yes | head` expects) rather than an I/O error.
struct PipeEnd(Box<dyn OutputStream>);

fn closed_if_broken(error: StreamError) -> StreamError {
    match error {
        StreamError::LastOperationFailed(cause)
            if cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            StreamError::Closed
        }
        other => other,
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for PipeEnd {
    async fn ready(&mut self) {
        self.0.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for PipeEnd {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0.write(bytes).map_err(closed_if_broken)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.0.flush().map_err(closed_if_broken)
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.0.check_write().map_err(closed_if_broken)
    }
}

/// A file opened for a redirection.
enum Opened {
    Read(std::fs::File),
    Write(FileSink),
}

/// Opens `request` inside the workspace: its path must lie under the workspace's guest path; the
/// rest is opened relative to the workspace directory handle, which refuses `..` and symlinks
/// that lead out.
fn open_redirect(
    workspace: Option<&WorkspaceGrant>,
    directory: Option<&std::fs::File>,
    request: &FileOpen,
    budget: &Arc<WriteBudget>,
    approved: Option<&(std::fs::File, String)>,
) -> Result<Opened, String> {
    let shown = &request.path;
    let (Some(workspace), Some(directory)) = (workspace, directory) else {
        return Err(format!(
            "{shown}: no files are reachable (no workspace granted)"
        ));
    };
    let path = Path::new(&request.path);
    let Ok(relative) = path.strip_prefix(workspace.guest_path()) else {
        return Err(format!(
            "{shown}: outside the workspace ({}); only files inside it can be read or written",
            workspace.guest_path()
        ));
    };
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    // An approved write opens exactly the file asked about: its bound directory and name.
    let (directory, relative) = match approved {
        Some((parent, name)) => (parent, Path::new(name.as_str())),
        None => (directory, relative),
    };
    let writing = request.mode != OpenMode::Read;
    if writing && workspace.mode() == FsMode::ReadOnly && approved.is_none() {
        return Err(format!(
            "{shown}: the workspace is read-only for this tool; nothing can be written"
        ));
    }
    let mut options = cap_primitives::fs::OpenOptions::new();
    match request.mode {
        OpenMode::Read => options.read(true),
        OpenMode::Truncate => options.write(true).create(true).truncate(true),
        OpenMode::Append => options.append(true).create(true),
    };
    // Non-blocking, so that a FIFO (whose plain open waits for its other end) opens or fails at
    // once and is then refused below by its type; there is no gap between a check and the open.
    // For a regular file the flag changes nothing. (`_cap_fs_ext_nonblock` is how cap-fs-ext's
    // `nonblock` sets O_NONBLOCK; cap-primitives has no other setter and this crate no libc.)
    options._cap_fs_ext_nonblock(true);
    if approved.is_some() {
        options._cap_fs_ext_follow(cap_primitives::fs::FollowSymlinks::No);
    }
    let not_regular = |kind: &str| {
        format!("{shown}: not a regular file ({kind}); redirections work with regular files only")
    };
    let file = cap_primitives::fs::open(directory, relative, &options).map_err(|error| {
        // Opening a FIFO without a reader for writing fails (ENXIO): say what it is.
        let found =
            cap_primitives::fs::stat(directory, relative, cap_primitives::fs::FollowSymlinks::Yes);
        match found
            .ok()
            .and_then(|metadata| special_kind(&metadata.file_type()))
        {
            Some(kind) if error.kind() != std::io::ErrorKind::NotFound => not_regular(kind),
            _ => describe_open_error(shown, &error),
        }
    })?;
    let metadata = cap_primitives::fs::Metadata::from_file(&file)
        .map_err(|error| describe_open_error(shown, &error))?;
    if metadata.is_dir() {
        return Err(format!("{shown}: Is a directory"));
    }
    if let Some(kind) = special_kind(&metadata.file_type()) {
        return Err(not_regular(kind));
    }
    Ok(if writing {
        Opened::Write(FileSink {
            file: Arc::new(Mutex::new(file)),
            budget: budget.clone(),
        })
    } else {
        Opened::Read(file)
    })
}

/// For a redirection that writes under a read-only workspace whose writes are asked: the
/// operator's decision, and on a yes the file's directory (opened beneath `directory`) and
/// name, which the redirection then opens without following a last link, so what is written is
/// what was asked about. `None` when nothing needs asking (reading, a writable workspace, or no
/// asker: then `open_redirect` refuses as before).
async fn ask_to_redirect(
    exec: &ExecContext,
    directory: Option<&std::fs::File>,
    request: &FileOpen,
) -> Result<Option<(std::fs::File, String)>, String> {
    let (Some(writes), Some(workspace), Some(directory)) =
        (&exec.writes, &exec.workspace, directory)
    else {
        return Ok(None);
    };
    if request.mode == OpenMode::Read || workspace.mode() == FsMode::ReadWrite {
        return Ok(None);
    }
    let shown = &request.path;
    let Some(relative) = Path::new(shown)
        .strip_prefix(workspace.guest_path())
        .ok()
        .and_then(Path::to_str)
    else {
        return Err(format!(
            "{shown}: outside the workspace ({}); only files inside it can be written",
            workspace.guest_path()
        ));
    };
    let (parent, name, target) =
        crate::asked_writes::bind_for_change(writes.root(), directory, relative)
            .map_err(|why| format!("{shown}: {why}"))?;
    let request = clawcage_core::approval::WriteRequest {
        operation: clawcage_core::approval::WriteOperation::Write,
        paths: vec![target],
        link_target: None,
    };
    writes
        .ask(request)
        .await
        .map(|()| Some((parent, name)))
        .map_err(|reason| format!("{shown}: {reason}"))
}

/// What a file that is neither a regular file nor a directory is ("a FIFO"), or `None`.
fn special_kind(file_type: &cap_primitives::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use cap_primitives::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return Some("a FIFO");
        }
        if file_type.is_socket() {
            return Some("a socket");
        }
        if file_type.is_char_device() {
            return Some("a character device");
        }
        if file_type.is_block_device() {
            return Some("a block device");
        }
    }
    (!file_type.is_file() && !file_type.is_dir()).then_some("a special file")
}

fn describe_open_error(shown: &str, error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: No such file or directory"),
        std::io::ErrorKind::IsADirectory => format!("{shown}: Is a directory"),
        std::io::ErrorKind::PermissionDenied => format!(
            "{shown}: refused (it leads outside the workspace, e.g. through a symlink, or the file is not accessible)"
        ),
        _ => format!("{shown}: {error}"),
    }
}

/// The bytes of a pipeline that only puts given bytes into one file: the shell's way of sending
/// a builtin's or a group's output into a redirection (`echo x > f`, `: > f`, `{ ...; } > f`),
/// written as one `cat` without arguments whose input is those bytes and whose output is the
/// file. The host writes such bytes itself instead of starting `cat`, so the write is judged as
/// the write it is (against the approved writes), and no program runs that the decision did not
/// cover (an operator's own `cat.wasm` included).
fn shell_output(pipeline: &Pipeline) -> Option<&[u8]> {
    let ([stage], [file]) = (pipeline.stages.as_slice(), pipeline.files.as_slice()) else {
        return None;
    };
    match (&stage.stdin, &stage.stdout, &stage.stderr) {
        (Input::Bytes(bytes), Output::File(0), Output::Output | Output::Discard)
            if stage.program == "cat" && stage.args.is_empty() && file.mode != OpenMode::Read =>
        {
            Some(bytes.as_slice())
        }
        _ => None,
    }
}

/// Aborts the stage tasks when dropped (the caller timed out or went away).
struct Stages(Vec<Option<JoinHandle<StageEnd>>>);

impl Drop for Stages {
    fn drop(&mut self) {
        for handle in self.0.iter().flatten() {
            handle.abort();
        }
    }
}

fn validate(pipeline: &Pipeline) -> Result<(), RunError> {
    let count = pipeline.stages.len();
    if count == 0 {
        return Err(RunError::Invalid(
            "a pipeline needs at least one stage".into(),
        ));
    }
    if count > MAX_STAGES {
        return Err(RunError::Invalid(format!(
            "a pipeline may have at most {MAX_STAGES} programs, this one has {count}"
        )));
    }
    if pipeline.files.len() > MAX_FILES {
        return Err(RunError::Invalid(format!(
            "a pipeline may redirect at most {MAX_FILES} files"
        )));
    }
    let in_range = |index: u32| (index as usize) < pipeline.files.len();
    for (position, stage) in pipeline.stages.iter().enumerate() {
        let first = position == 0;
        let last = position + 1 == count;
        match &stage.stdin {
            Input::Pipe if first => {
                return Err(RunError::Invalid(
                    "the first stage cannot read a pipe".into(),
                ));
            }
            Input::File(index) if !in_range(*index) => {
                return Err(RunError::Invalid(format!("no file number {index}")));
            }
            Input::File(index) if pipeline.files[*index as usize].mode != OpenMode::Read => {
                return Err(RunError::Invalid(format!(
                    "file number {index} is opened for writing, not reading"
                )));
            }
            _ => {}
        }
        for output in [&stage.stdout, &stage.stderr] {
            match output {
                Output::Pipe if last => {
                    return Err(RunError::Invalid(
                        "the last stage cannot write a pipe".into(),
                    ));
                }
                Output::File(index) if !in_range(*index) => {
                    return Err(RunError::Invalid(format!("no file number {index}")));
                }
                Output::File(index) if pipeline.files[*index as usize].mode == OpenMode::Read => {
                    return Err(RunError::Invalid(format!(
                        "file number {index} is opened for reading, not writing"
                    )));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Runs `pipeline` to its end or its time limit.
async fn run_pipeline(exec: &ExecContext, pipeline: Pipeline) -> Result<RunResult, RunError> {
    validate(&pipeline)?;
    let catalog = exec
        .grant
        .programs
        .resolve()
        .await
        .map_err(RunError::Invalid)?;
    let mut programs = Vec::with_capacity(pipeline.stages.len());
    let stages_to_start = match shell_output(&pipeline) {
        Some(_) => &[][..],
        None => pipeline.stages.as_slice(),
    };
    for stage in stages_to_start {
        match catalog.get(&stage.program) {
            Some(program) => {
                programs.push(program.ready().await.map_err(RunError::Invalid)?.clone())
            }
            None => return Err(RunError::NotFound(stage.program.clone())),
        }
    }

    let directory = match &exec.workspace {
        Some(workspace) if !pipeline.files.is_empty() => Some(
            cap_primitives::fs::open_ambient_dir(
                workspace.path(),
                cap_primitives::ambient_authority(),
            )
            .map_err(|error| {
                RunError::Redirect(format!(
                    "the workspace {} cannot be opened: {error}",
                    workspace.guest_path()
                ))
            })?,
        ),
        _ => None,
    };
    let mut files = Vec::with_capacity(pipeline.files.len());
    for request in &pipeline.files {
        let approved = ask_to_redirect(exec, directory.as_ref(), request)
            .await
            .map_err(RunError::Redirect)?;
        files.push(
            open_redirect(
                exec.workspace.as_ref(),
                directory.as_ref(),
                request,
                &exec.budget,
                approved.as_ref(),
            )
            .map_err(RunError::Redirect)?,
        );
    }

    if let (Some(bytes), [Opened::Write(file)]) = (shell_output(&pipeline), files.as_slice()) {
        let (end, message) = match file.write_bytes(bytes) {
            Ok(()) => (StageEnd::Exited(0), Vec::new()),
            Err(error) => (
                StageEnd::Exited(1),
                format!("{}: {error}\n", pipeline.files[0].path).into_bytes(),
            ),
        };
        return Ok(RunResult {
            ends: vec![end],
            output: CutOutput {
                head: message,
                omitted: 0,
                tail: Vec::new(),
            },
            captured: Vec::new(),
            captured_truncated: false,
            timed_out: false,
            write_limit_reached: exec.budget.exceeded(),
        });
    }

    let output_limit = pipeline.output_limit.min(MAX_OUTPUT_LIMIT) as usize;
    let output = Collector::new(output_limit, output_limit);
    let capture_limit = pipeline.capture_limit.min(MAX_CAPTURE_LIMIT) as usize;
    let capture = Collector::new(capture_limit, 0);

    // One pipe between each pair of neighbours; an end nobody uses is dropped at once, so the
    // reader sees end-of-file or the writer a closed pipe.
    let count = pipeline.stages.len();
    let mut pipe_writers: Vec<Option<PipeWriter>> = vec![None; count];
    let mut pipe_readers: Vec<Option<AsyncStdinStream>> = (0..count).map(|_| None).collect();
    for position in 0..count.saturating_sub(1) {
        let (writer, reader) = tokio::io::duplex(PIPE_BYTES);
        pipe_writers[position] = Some(PipeWriter(Arc::new(AsyncStdoutStream::new(
            PIPE_BYTES, writer,
        ))));
        pipe_readers[position + 1] = Some(AsyncStdinStream::new(reader));
    }

    let now = Instant::now();
    let latest = exec
        .deadline()
        .checked_sub(DEADLINE_MARGIN)
        .unwrap_or(now)
        .max(now);
    let deadline = now
        .checked_add(Duration::from_millis(pipeline.timeout_ms))
        .unwrap_or(latest)
        .min(latest);

    let mut handles = Stages(Vec::with_capacity(count));
    for (position, (mut stage, program)) in pipeline.stages.into_iter().zip(programs).enumerate() {
        let stdin: Box<dyn StdinStream> = match std::mem::replace(&mut stage.stdin, Input::None) {
            Input::None => Box::new(ClosedInputStream),
            Input::Pipe => match pipe_readers[position].take() {
                Some(reader) => Box::new(reader),
                None => Box::new(ClosedInputStream),
            },
            Input::Bytes(bytes) => Box::new(MemoryInputPipe::new(bytes)),
            Input::File(index) => match &files[index as usize] {
                Opened::Read(file) => {
                    Box::new(InputFile::new(file.try_clone().map_err(|error| {
                        RunError::Redirect(format!("cannot share an open file: {error}"))
                    })?))
                }
                Opened::Write(_) => Box::new(ClosedInputStream),
            },
        };
        let sink = |target: &Output| -> Box<dyn StdoutStream> {
            match target {
                Output::Discard => Box::new(SinkOutputStream),
                Output::Pipe => match &pipe_writers[position] {
                    Some(writer) => Box::new(writer.clone()),
                    None => Box::new(SinkOutputStream),
                },
                Output::Output => Box::new(output.clone()),
                Output::Capture => Box::new(capture.clone()),
                Output::File(index) => match &files[*index as usize] {
                    Opened::Write(file) => Box::new(file.clone()),
                    Opened::Read(_) => Box::new(SinkOutputStream),
                },
            }
        };
        let stdout = sink(&stage.stdout);
        let stderr = sink(&stage.stderr);
        // This stage holds the only remaining handles of its pipe's writing end.
        pipe_writers[position] = None;
        let wasi = program_context(exec, &stage, stdin, stdout, stderr)?;
        let state = ProgramState::new(
            wasi,
            exec.memory_bytes,
            exec.budget.clone(),
            exec.writes.clone(),
        );
        let engine = program.engine.clone();
        let pre = program.pre.clone();
        let name = stage.program.clone();
        let memory_bytes = exec.memory_bytes;
        let budget = exec.budget.clone();
        handles.0.push(Some(tokio::spawn(async move {
            let mut store = Store::new(&engine, state);
            store.limiter(|state| &mut state.limiter);
            store.set_epoch_deadline(1);
            store.epoch_deadline_async_yield_and_update(1);
            let result = async {
                let command = pre.instantiate_async(&mut store).await?;
                command.wasi_cli_run().call_run(&mut store).await
            }
            .await;
            let memory_exceeded = store.data().limiter.exceeded;
            drop(store);
            stage_end(&name, result, memory_exceeded, memory_bytes, &budget)
        })));
    }
    drop(pipe_readers);
    drop(files);

    let mut ends: Vec<Option<StageEnd>> = (0..count).map(|_| None).collect();
    let all_ended = async {
        for (position, slot) in handles.0.iter_mut().enumerate() {
            if let Some(handle) = slot {
                let end = match handle.await {
                    Ok(end) => end,
                    Err(error) => StageEnd::Killed(format!("the program's task failed: {error}")),
                };
                *slot = None;
                ends[position] = Some(end);
            }
        }
    };
    // A program past the write limit may keep running (e.g. `tee` goes on after a failed
    // write), so the whole pipeline stops once the budget is spent.
    let budget = exec.budget.clone();
    let budget_spent = async move {
        while !budget.exceeded() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let finished = exec
        .clock
        .run(deadline, async {
            tokio::select! {
                () = all_ended => true,
                () = budget_spent => false,
            }
        })
        .await;
    drop(handles);
    let timed_out = finished.is_err();
    let reason = if timed_out {
        "stopped at the time limit of the command"
    } else {
        "stopped: the command line wrote more to files than its write limit"
    };
    let ends = ends
        .into_iter()
        .map(|end| end.unwrap_or_else(|| StageEnd::Killed(reason.to_string())))
        .collect();

    let output = output.take();
    let captured = capture.take();
    Ok(RunResult {
        ends,
        output: CutOutput {
            head: output.head,
            omitted: output.omitted,
            tail: output.tail.into_iter().collect(),
        },
        captured_truncated: captured.omitted > 0,
        captured: captured.head,
        timed_out,
        write_limit_reached: exec.budget.exceeded(),
    })
}

/// The WASI context of one stage: arguments, the given environment only, the workspace preopen,
/// its streams, no network.
fn program_context(
    exec: &ExecContext,
    stage: &Stage,
    stdin: Box<dyn StdinStream>,
    stdout: Box<dyn StdoutStream>,
    stderr: Box<dyn StdoutStream>,
) -> Result<wasmtime_wasi::WasiCtx, RunError> {
    let mut builder = crate::wasi_context::denied();
    if exec.writes.is_some() {
        builder.monotonic_clock(exec.clock.guest_clock());
    }
    let mut argv = Vec::with_capacity(stage.args.len() + 1);
    argv.push(stage.program.as_str());
    argv.extend(stage.args.iter().map(String::as_str));
    builder.args(&argv);
    builder.stdin(BoxedStdin(stdin));
    builder.stdout(BoxedStdout(stdout));
    builder.stderr(BoxedStdout(stderr));
    for (key, value) in &stage.env {
        if key != "PWD" {
            builder.env(key, value);
        }
    }
    builder.env("PWD", &stage.cwd);
    if let Some(workspace) = &exec.workspace {
        crate::wasi_context::preopen_workspace(&mut builder, workspace).map_err(|error| {
            RunError::Invalid(format!(
                "the workspace {} could not be opened for the program: {error}",
                workspace.guest_path()
            ))
        })?;
        crate::wasi_context::preopen_working_directory(&mut builder, workspace, &stage.cwd);
    }
    Ok(builder.build())
}

/// A boxed input stream as an input stream.
struct BoxedStdin(Box<dyn StdinStream>);

impl IsTerminal for BoxedStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for BoxedStdin {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::InputStream> {
        self.0.p2_stream()
    }
}

/// A boxed output stream as an output stream.
struct BoxedStdout(Box<dyn StdoutStream>);

impl IsTerminal for BoxedStdout {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoxedStdout {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        self.0.p2_stream()
    }
}

/// How a stage ended, worded for the model when the host stopped it.
fn stage_end(
    name: &str,
    result: wasmtime::Result<Result<(), ()>>,
    memory_exceeded: bool,
    memory_bytes: u64,
    budget: &WriteBudget,
) -> StageEnd {
    match result {
        Ok(Ok(())) => StageEnd::Exited(0),
        Ok(Err(())) => StageEnd::Exited(1),
        Err(error) => {
            if let Some(code) = exit_code(&error) {
                return StageEnd::Exited(u8::try_from(code).unwrap_or(1));
            }
            if memory_exceeded {
                return StageEnd::Killed(format!(
                    "{name}: stopped: it used more than its memory limit of {} MiB",
                    memory_bytes >> 20
                ));
            }
            if budget.exceeded() {
                return StageEnd::Killed(format!(
                    "{name}: stopped: the command line wrote more than its limit of {} MiB to files",
                    budget.limit() >> 20
                ));
            }
            match error.downcast_ref::<Trap>() {
                Some(Trap::UnreachableCodeReached) => {
                    StageEnd::Killed(format!("{name}: crashed (it panicked or aborted)"))
                }
                Some(Trap::StackOverflow) => {
                    StageEnd::Killed(format!("{name}: crashed: stack overflow"))
                }
                Some(trap) => StageEnd::Killed(format!("{name}: crashed: {trap}")),
                None => StageEnd::Killed(format!("{name}: failed in the sandbox: {error:#}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_and_tail_keep_the_ends_and_count_the_middle() {
        let mut kept = HeadTail::new(4, 3);
        kept.push(b"ab");
        kept.push(b"cdefg");
        kept.push(b"hij");
        assert_eq!(kept.head, b"abcd");
        assert_eq!(kept.tail.iter().copied().collect::<Vec<u8>>(), b"hij");
        assert_eq!(kept.omitted, 3);
        kept.push(&[b'x'; 100]);
        assert_eq!(kept.omitted, 3 + 3 + 97);
        assert_eq!(kept.tail.len(), 3);
        let mut capture = HeadTail::new(2, 0);
        capture.push(b"abc");
        assert_eq!((capture.head.as_slice(), capture.omitted), (&b"ab"[..], 1));
    }
}
