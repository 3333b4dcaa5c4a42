//! [`WasmTool`]: one tool of a component, run in a fresh store and instance per call so that no
//! state leaks between calls. This module builds the store from the grants (preopen, memory cap,
//! epoch deadline) — ahead of the call when it can ([`crate::prepared`]) —, bounds the call with a
//! wall-clock timeout, and turns every way a call can end — result, tool error, trap, timeout,
//! exhausted memory — into a result for the model.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use clawcage_core::approval::{ApprovedExec, ExecMode, ExecPlan, ExecPolicy, GateAnswer};
use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::Value;
use wasmtime::{Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use crate::asked_writes::WriteAsker;
use crate::bindings::{GuestToolError, exports::clawcage::tool::tool::ToolSpec as GuestToolSpec};
use crate::clock::CallClock;
use crate::grants::Grants;
use crate::host::CallState;
use crate::prepared::{ReadyInstance, WaitingInstances};
use crate::sandbox::{CompiledComponent, LazyComponent};

/// Bytes of the guest's stderr kept to explain a crash.
const STDERR_CAPACITY: usize = 64 << 10;
/// Bytes of the guest's stdout accepted; a tool answers through its return value, not stdout.
const STDOUT_CAPACITY: usize = 1 << 20;

/// One tool of a sandboxed component, bound to the grants it runs with.
#[derive(Clone)]
pub struct WasmTool {
    spec: ToolSpec,
    component: Arc<LazyComponent>,
    grants: Arc<Grants>,
    /// Instances made ahead for the calls of this component's tools under these grants.
    waiting: Arc<WaitingInstances>,
}

impl std::fmt::Debug for WasmTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmTool")
            .field("name", &self.spec.name)
            .field("component", &self.component.name)
            .field("grants", &self.grants.describe())
            .finish()
    }
}

impl WasmTool {
    pub(crate) fn new(
        spec: ToolSpec,
        component: Arc<LazyComponent>,
        grants: Arc<Grants>,
        waiting: Arc<WaitingInstances>,
    ) -> Self {
        Self {
            spec,
            component,
            grants,
            waiting,
        }
    }

    /// The grants this tool runs with.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// How many instances wait, made ahead, for the calls of this tool's component under these
    /// grants (at most two; see the sandbox's `prepared` module).
    pub fn waiting_instances(&self) -> usize {
        self.waiting.len()
    }

    /// Run the tool with arguments as JSON text (already validated by the registry). The
    /// component's code is loaded on the first call of any of its tools.
    pub async fn call_json(&self, args: &str) -> Result<ToolOutput, ToolError> {
        let name = self.spec.name.as_str();
        let compiled = self.component.ready().await?;
        if let Some(exec) = &self.grants.exec {
            exec.programs.load_all().await.map_err(|error| {
                ToolError::Failed(format!("the exec programs could not be loaded: {error}"))
            })?;
        }
        let approved = self.approve(compiled, name, args).await?;
        self.component
            .instantiations
            .fetch_add(1, Ordering::Relaxed);
        let (answer, used) = run_operation(
            compiled,
            &self.grants,
            Operation::Call { name, args },
            approved,
            Some(&self.waiting),
        )
        .await;
        self.waiting.after_call(compiled, used);
        match answer? {
            Answer::Call(Ok(text)) => Ok(ToolOutput::text(cap_output(
                text,
                self.grants.limits.max_output_chars,
            ))),
            Answer::Call(Err(GuestToolError::InvalidArgs(message))) => {
                Err(ToolError::InvalidArgs(message))
            }
            Answer::Call(Err(GuestToolError::Denied(message))) => Err(ToolError::Denied(message)),
            Answer::Call(Err(GuestToolError::Failed(message))) => Err(ToolError::Failed(message)),
            Answer::Specs(_) | Answer::Plan(_) => Err(ToolError::Failed(
                "internal error: wrong answer kind".into(),
            )),
        }
    }

    /// For a tool granted exec under an active approvals gate: the plan of this call (from the
    /// component's `planner` export, in a fresh instance that can run nothing), the gate's
    /// decision on it, and what the call may then run. `None` when no gate is active.
    async fn approve(
        &self,
        compiled: &Arc<CompiledComponent>,
        name: &str,
        args: &str,
    ) -> Result<Option<Arc<ApprovedExec>>, ToolError> {
        let Some(gate) = self
            .grants
            .exec
            .as_ref()
            .and_then(|exec| exec.approvals.as_ref())
            .filter(|gate| gate.0.active())
        else {
            return Ok(None);
        };
        // The planning instance may list programs but run none.
        let nothing = Arc::new(ApprovedExec {
            policy: ExecPolicy {
                mode: ExecMode::Deny,
                ..ExecPolicy::default()
            },
            approved: Vec::new(),
            approved_writes: Vec::new(),
        });
        let plan = match run_in_fresh_instance(
            compiled,
            &self.grants,
            Operation::Plan { name, args },
            Some(nothing),
        )
        .await?
        {
            Answer::Plan(None) => None,
            Answer::Plan(Some(Ok(json))) => {
                Some(serde_json::from_str::<ExecPlan>(&json).map_err(|error| {
                    ToolError::Failed(format!(
                        "the tool `{name}` reported a plan the host cannot read ({error}); nothing was run"
                    ))
                })?)
            }
            Answer::Plan(Some(Err(message))) => return Err(ToolError::InvalidArgs(message)),
            _ => {
                return Err(ToolError::Failed(
                    "internal error: wrong answer kind".into(),
                ));
            }
        };
        match gate.0.review(name, plan).await {
            GateAnswer::Allowed(approved) => Ok(Some(approved)),
            GateAnswer::Denied(message) => Err(ToolError::Denied(message)),
        }
    }
}

impl Tool for WasmTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move { self.call_json(&args.to_string()).await })
    }

    fn origin(&self) -> String {
        self.component.origin.clone()
    }

    fn grants_summary(&self) -> String {
        self.grants.describe()
    }

    fn grants_json(&self) -> Value {
        self.grants.to_json()
    }
}

/// What to ask a fresh instance.
#[derive(Clone, Copy)]
pub(crate) enum Operation<'a> {
    /// `specs()`.
    Specs,
    /// `call(name, args)`.
    Call { name: &'a str, args: &'a str },
    /// `planner.plan(name, args)`, when the component exports it.
    Plan { name: &'a str, args: &'a str },
}

/// What the instance answered.
pub(crate) enum Answer {
    Specs(Vec<GuestToolSpec>),
    Call(Result<String, GuestToolError>),
    /// The plan as JSON or the guest's error; `None` when the component has no planner.
    Plan(Option<Result<String, String>>),
}

/// `CLAWCAGE_WORKSPACE_MODE` of a read-only workspace whose writes are asked: a tool tries the
/// write (the host asks) instead of refusing it up front.
const ASK_MODE: &str = "ro-ask";

/// The export the planner lives in.
const PLANNER_INTERFACE: &str = "clawcage:tool/planner@0.1.0";

/// Build a store from `grants`, instantiate the component in it and run `operation`, within the
/// grants' time and memory limits. Every failure is a [`ToolError`] written for the model.
pub(crate) async fn run_in_fresh_instance(
    component: &Arc<CompiledComponent>,
    grants: &Grants,
    operation: Operation<'_>,
    approved: Option<Arc<ApprovedExec>>,
) -> Result<Answer, ToolError> {
    run_operation(component, grants, operation, approved, None)
        .await
        .0
}

/// A store built from `grants` for one instance: the WASI context (the preopen, the environment;
/// with `asking_clock`, the guest clock that stops while an operator is asked), the memory limit,
/// the network policy and the scheduler, yielding at every epoch tick. Nothing of a particular
/// call is in it yet.
fn new_store(
    component: &CompiledComponent,
    grants: &Grants,
    stderr: MemoryOutputPipe,
    asking_clock: Option<&CallClock>,
) -> Result<Store<CallState>, ToolError> {
    let wasi = wasi_context(grants, stderr, asking_clock)?;
    let mut store = Store::new(
        &component.engine,
        CallState::new(wasi, grants.limits.memory_bytes, &component.name)
            .with_network(grants.network.clone()),
    );
    store.limiter(|state| &mut state.limiter);
    store.data_mut().scheduler = grants.scheduler().cloned();
    // Yield to the executor at every epoch tick, so a timeout can stop a guest that never
    // returns, including one inside a host call.
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
    Ok(store)
}

/// An instance of `component` under `grants`, made before any call: see [`crate::prepared`].
pub(crate) async fn prepare_instance(
    component: &CompiledComponent,
    grants: &Grants,
) -> Result<ReadyInstance, ToolError> {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let mut store = new_store(component, grants, stderr.clone(), None)?;
    let tool = component
        .pre
        .instantiate_async(&mut store)
        .await
        .map_err(|error| {
            ToolError::Failed(format!(
                "component `{}` could not be instantiated: {error:#}",
                component.name
            ))
        })?;
    Ok(ReadyInstance {
        store,
        tool,
        stderr,
    })
}

/// [`run_in_fresh_instance`], taking a call's instance from `waiting` when one is ready, and
/// handing back the used store so the caller can drop it off the call's path.
async fn run_operation(
    component: &Arc<CompiledComponent>,
    grants: &Grants,
    operation: Operation<'_>,
    approved: Option<Arc<ApprovedExec>>,
    waiting: Option<&WaitingInstances>,
) -> (Result<Answer, ToolError>, Option<Store<CallState>>) {
    let clock = CallClock::default();
    // Bound here, in the caller's task, so that programs on other tasks ask for its session.
    let writes = match (&grants.workspace, operation) {
        (Some(workspace), Operation::Call { .. }) => workspace
            .write_approvals()
            .and_then(|gate| gate.write_reviewer())
            .map(|reviewer| Arc::new(WriteAsker::new(reviewer, workspace.path(), clock.clone()))),
        _ => None,
    };
    // A call that asks before writes sees another guest clock and workspace mode: it makes its
    // own instance.
    let ready = match operation {
        Operation::Call { .. } if writes.is_none() => waiting.and_then(WaitingInstances::take),
        _ => None,
    };
    let (mut store, ready_tool, stderr) = match ready {
        Some(ready) => (ready.store, Some(ready.tool), ready.stderr),
        None => {
            let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
            match new_store(
                component,
                grants,
                stderr.clone(),
                writes.is_some().then_some(&clock),
            ) {
                Ok(store) => (store, None, stderr),
                Err(error) => return (Err(error), None),
            }
        }
    };
    let timeout = grants.limits.timeout;
    let deadline = std::time::Instant::now() + timeout;
    store.data_mut().exec = crate::process::ExecContext::for_call(grants, deadline, &clock)
        .map(|context| context.with_approved(approved).with_writes(writes.clone()));
    store.data_mut().writes = writes.clone();
    store.set_epoch_deadline(1);

    let what = match operation {
        Operation::Specs => format!("component `{}`", component.name),
        Operation::Call { name, .. } => format!("the tool `{name}`"),
        Operation::Plan { name, .. } => format!("the planner of the tool `{name}`"),
    };
    let outcome = clock
        .run(
            deadline,
            clock.scope(async {
                if let Operation::Plan { name, args } = operation {
                    return plan_in(component, &mut store, name, args).await;
                }
                let tool = match ready_tool {
                    Some(tool) => tool,
                    None => component.pre.instantiate_async(&mut store).await?,
                };
                let guest = tool.clawcage_tool_tool();
                match operation {
                    Operation::Specs => guest.call_specs(&mut store).await.map(Answer::Specs),
                    Operation::Call { name, args } => guest
                        .call_call(&mut store, name, args)
                        .await
                        .map(Answer::Call),
                    Operation::Plan { .. } => Ok(Answer::Plan(None)),
                }
            }),
        )
        .await;

    let denials = writes.map(|asker| asker.denials()).unwrap_or_default();
    let answer = match outcome {
        Ok(Ok(answer)) => Ok(answer),
        Err(_elapsed) => Err(ToolError::Failed(format!(
            "{what} was stopped after its time limit of {}; it may be stuck in a loop or the task is too large for one call",
            human_duration(timeout)
        ))),
        Ok(Err(error)) => Err(describe_trap(
            &what,
            &error,
            store.data().limiter.exceeded,
            grants.limits.memory_bytes,
            &stderr.contents(),
        )),
    };
    (
        answer.map(|answer| with_write_denials(answer, &denials)),
        Some(store),
    )
}

/// A call's answer with the reasons its writes were refused, so the model knows why a write
/// failed (and an operator's "no" ends in the words the agent loop counts).
fn with_write_denials(answer: Answer, denials: &[String]) -> Answer {
    if denials.is_empty() {
        return answer;
    }
    let reasons = denials.join("\n");
    match answer {
        Answer::Call(Ok(text)) => Answer::Call(Ok(format!(
            "{text}\n[writes refused in the read-only workspace: {reasons}]"
        ))),
        Answer::Call(Err(
            GuestToolError::Denied(message)
            | GuestToolError::Failed(message)
            | GuestToolError::InvalidArgs(message),
        )) => Answer::Call(Err(GuestToolError::Denied(format!("{message}: {reasons}")))),
        other => other,
    }
}

/// Instantiates the component and calls its `planner.plan` export, if it has one.
async fn plan_in(
    component: &Arc<CompiledComponent>,
    store: &mut Store<CallState>,
    name: &str,
    args: &str,
) -> wasmtime::Result<Answer> {
    let instance = component
        .pre
        .instance_pre()
        .instantiate_async(&mut *store)
        .await?;
    let Some(interface) = instance.get_export_index(&mut *store, None, PLANNER_INTERFACE) else {
        return Ok(Answer::Plan(None));
    };
    let Some(function) = instance.get_export_index(&mut *store, Some(&interface), "plan") else {
        return Ok(Answer::Plan(None));
    };
    let plan = instance
        .get_typed_func::<(&str, &str), (Result<String, String>,)>(&mut *store, function)?;
    let (answer,) = plan.call_async(&mut *store, (name, args)).await?;
    Ok(Answer::Plan(Some(answer)))
}

/// The WASI context for one call: the workspace preopen (and its path in the environment), the
/// grants' non-secret settings and the environment variables granted by name, no sockets
/// (outbound HTTP goes through the network policy), stderr captured, nothing else inherited from
/// the host.
fn wasi_context(
    grants: &Grants,
    stderr: MemoryOutputPipe,
    asking_clock: Option<&CallClock>,
) -> Result<wasmtime_wasi::WasiCtx, ToolError> {
    let mut builder = crate::wasi_context::denied();
    if let Some(clock) = asking_clock {
        builder.monotonic_clock(clock.guest_clock());
    }
    builder
        .stdout(MemoryOutputPipe::new(STDOUT_CAPACITY))
        .stderr(stderr);
    if let Some(workspace) = &grants.workspace {
        crate::wasi_context::preopen_workspace(&mut builder, workspace).map_err(|error| {
            ToolError::Failed(format!(
                "the workspace {} could not be opened for the tool: {error}",
                workspace.path().display()
            ))
        })?;
        builder
            .env("CLAWCAGE_WORKSPACE", workspace.guest_path())
            .env(
                "CLAWCAGE_WORKSPACE_MODE",
                if asking_clock.is_some() {
                    ASK_MODE
                } else {
                    workspace.mode().as_str()
                },
            )
            .env("PWD", workspace.guest_path());
    }
    builder.env(
        "CLAWCAGE_TIME_LIMIT_MS",
        grants.limits.timeout.as_millis().to_string(),
    );
    for (name, value) in grants.settings().iter().chain(grants.env.vars()) {
        builder.env(name, value);
    }
    Ok(builder.build())
}

/// Turn a trap or host error into a message for the model.
fn describe_trap(
    what: &str,
    error: &wasmtime::Error,
    memory_exceeded: bool,
    memory_bytes: u64,
    stderr: &[u8],
) -> ToolError {
    if memory_exceeded {
        return ToolError::Failed(format!(
            "{what} used more than its memory limit of {} MiB and was stopped; work on smaller pieces (for files: read with offset and limit)",
            memory_bytes >> 20
        ));
    }
    let detail = last_lines(stderr, 6);
    let with_detail = |text: String| {
        if detail.is_empty() {
            text
        } else {
            format!("{text}. Its last output:\n{detail}")
        }
    };
    match error.downcast_ref::<Trap>() {
        Some(Trap::UnreachableCodeReached) => ToolError::Failed(with_detail(format!(
            "{what} crashed (it panicked or aborted) and was stopped; the host is unaffected"
        ))),
        Some(Trap::StackOverflow) => ToolError::Failed(format!(
            "{what} overflowed its stack (deep recursion?) and was stopped"
        )),
        Some(Trap::Interrupt) => {
            ToolError::Failed(format!("{what} was interrupted at its time limit"))
        }
        Some(trap) => ToolError::Failed(with_detail(format!(
            "{what} trapped ({trap}) and was stopped"
        ))),
        None => ToolError::Failed(with_detail(format!(
            "{what} failed inside the sandbox: {error:#}"
        ))),
    }
}

/// The last `count` non-empty lines of `bytes`, lossily decoded.
fn last_lines(bytes: &[u8], count: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Keep at most `max_chars` characters: head and tail around a marker stating the total.
pub(crate) fn cap_output(text: String, max_chars: usize) -> String {
    let total = text.chars().count();
    if total <= max_chars {
        return text;
    }
    let head_chars = max_chars * 2 / 3;
    let tail_chars = max_chars - head_chars;
    let head: String = text.chars().take(head_chars).collect();
    let tail: String = text.chars().skip(total - tail_chars).collect();
    format!(
        "{head}\n[... output cut: {} of {total} characters omitted ...]\n{tail}",
        total - head_chars - tail_chars
    )
}

fn human_duration(duration: std::time::Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds >= 1.0 {
        format!("{seconds:.0} s")
    } else {
        format!("{} ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_keeps_head_and_tail_and_states_the_total() {
        let text: String = (0..1000).map(|i| format!("{i:04}")).collect();
        let capped = cap_output(text.clone(), 300);
        assert!(capped.starts_with("00000001"));
        assert!(capped.ends_with("0999"));
        assert!(
            capped.contains("3700 of 4000 characters omitted"),
            "{capped}"
        );
        assert_eq!(cap_output("short".into(), 300), "short");
    }
}
