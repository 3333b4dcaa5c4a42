//! The host side of the `process` import (`wit/process.wit`): a component granted exec asks the
//! host to run a pipeline of WASI command programs. Every stage is a fresh store and instance on
//! its own tokio task, with the caller's workspace preopen, no network, the environment the
//! caller passed and nothing of the host's, its own memory cap and at most the call's remaining
//! time. Stages stream into each other through bounded pipes; a closed reader makes the writer
//! see a closed pipe. Redirections are opened here, relative to the workspace directory handle
//! (cap-std), never by joining paths; writes to files are charged to the call's write budget.
//! Here: the import, the checks and the pipeline's run; `streams` the streams between stages and
//! into files; `redirect` opening what a redirection names.

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

mod redirect;
mod streams;

use redirect::*;
use streams::*;

use crate::bindings::exec::clawcage::tool::process::{
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
