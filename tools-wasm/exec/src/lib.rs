//! The `exec` tool of clawcage: a shell interpreter compiled into this component that runs each
//! program of a command line as a WASI command component through the host's `process` import.
//! No native process is ever started; the programs see only the sandbox's workspace. The
//! interpreter (`shell`) parses with brush-parser and supports pipelines, redirections, `&&`,
//! `||`, `;`, quoting, variables, command substitution, globbing, `if`/`for`/`while`/`case`,
//! and the builtins a model reaches for (`xargs` among them: a WASI program cannot start
//! another, so the shell runs xargs's commands); what it does not support is refused with a
//! clear error before anything runs.

pub mod glob;
pub mod output;
pub mod plan;
pub mod shell;
pub mod xargs;

use std::time::Duration;

use clawcage_tool_sdk::{Spec, ToolError, Value, args, json};

#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "exec-tool",
    });
}

use bindings::clawcage::tool::process as wit;
use bindings::exports::clawcage::tool::tool as export;

/// The time a command line gets when the call does not say.
const DEFAULT_TIMEOUT_SECS: f64 = 30.0;
/// Characters of output shown to the model.
pub const OUTPUT_CHARS: usize = 10_000;

/// The host's `process` import, behind a trait so the interpreter can be tested natively.
pub trait Process {
    /// The programs the host can run, sorted.
    fn programs(&mut self) -> Vec<String>;
    /// Runs one pipeline.
    fn run(&mut self, pipeline: &wit::Pipeline) -> Result<wit::RunResult, wit::RunError>;
}

/// The real import.
struct HostProcess;

impl Process for HostProcess {
    fn programs(&mut self) -> Vec<String> {
        wit::programs()
    }

    fn run(&mut self, pipeline: &wit::Pipeline) -> Result<wit::RunResult, wit::RunError> {
        wit::run(pipeline)
    }
}

fn spec() -> Spec {
    Spec::new(
        "exec",
        "Run a shell command line inside the sandbox and return its combined stdout and stderr \
         (cut to 10,000 characters, keeping the head and the tail) and its exit status. The shell is \
         POSIX-like: pipelines, redirections (<, >, >>, 2>&1, 2>/dev/null, here-documents), &&, ||, \
         ;, quotes, $VAR, ${VAR}, $?, $(...), globs, if/for/while/case, and the builtins cd, pwd, \
         export, unset, exit, echo, read, set, env, true, false, :, sh -c, and xargs (GNU options: \
         -0, -d, -n, -L, -I, -r, -t, -a, -s; -P is accepted but commands run one at a time; \
         `xargs --help`). Programs are WebAssembly \
         builds of uutils coreutils (ls, cat, wc, sort, head, tail, cp, mv, rm, mkdir, ...), grep, \
         find and sed, plus any the operator added; there is no network, no package manager and no \
         compiler. Only the workspace directory exists; the working directory starts there. \
         Background jobs (&) and shell functions are not supported.",
        json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The command line, e.g. \"grep -rn TODO src | wc -l\"."
                },
                "timeout_secs": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 3600,
                    "description": "Time limit for the whole command line in seconds (default 30; the operator's limit caps it)."
                }
            },
            "required": ["command"],
            "additionalProperties": false
        }),
    )
}

/// Runs the tool: the command line in a fresh shell whose working directory is the workspace.
pub fn call(name: &str, arguments: Value, process: &mut dyn Process) -> Result<String, ToolError> {
    if name != "exec" {
        return Err(ToolError::unknown_tool(name));
    }
    let command = args::required_str(&arguments, "command")?;
    let timeout_secs = match arguments.get("timeout_secs") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_SECS,
        Some(value) => value
            .as_f64()
            .filter(|secs| *secs > 0.0 && *secs <= 3600.0)
            .ok_or_else(|| {
                ToolError::InvalidArgs(
                    "field `timeout_secs` must be a number of seconds above 0 and at most 3600"
                        .to_string(),
                )
            })?,
    };
    let workspace =
        clawcage_tool_sdk::workspace::root().map(|root| root.to_string_lossy().into_owned());
    // The argument may shorten the operator's limit, never lengthen it (the host enforces the
    // operator's limit whatever this says; keeping to it here makes the message right).
    let mut timeout = Duration::from_secs_f64(timeout_secs);
    if let Some(operator_limit) = operator_time_limit()
        && operator_limit < timeout
    {
        timeout = operator_limit;
    }
    let mut shell = shell::Shell::new(process, workspace, std::env::vars().collect(), timeout);
    shell.run_command_line(command)
}

/// The operator's time limit of this call, which the host passes as `CLAWCAGE_TIME_LIMIT_MS`,
/// less a margin for the shell to report what happened before the host stops the call.
fn operator_time_limit() -> Option<Duration> {
    let millis: u64 = std::env::var("CLAWCAGE_TIME_LIMIT_MS").ok()?.parse().ok()?;
    Some(Duration::from_millis(millis).saturating_sub(Duration::from_millis(200)))
}

struct ExecTool;

impl export::Guest for ExecTool {
    fn specs() -> Vec<export::ToolSpec> {
        let spec = spec();
        vec![export::ToolSpec {
            name: spec.name,
            description: spec.description,
            input_schema: spec.input_schema.to_string(),
        }]
    }

    fn call(name: String, arguments: String) -> Result<String, export::ToolError> {
        let parsed = args::parse(&arguments);
        let result = parsed.and_then(|arguments| {
            clawcage_tool_sdk::workspace::enter()?;
            call(&name, arguments, &mut HostProcess)
        });
        result.map_err(|error| match error {
            ToolError::InvalidArgs(message) => export::ToolError::InvalidArgs(message),
            ToolError::Denied(message) => export::ToolError::Denied(message),
            ToolError::Failed(message) => export::ToolError::Failed(message),
        })
    }
}

/// The plan of an `exec` call: what its command line would run (see `plan`).
pub fn plan_call(name: &str, arguments: &str) -> Result<String, String> {
    if name != "exec" {
        return Err(format!("no tool named `{name}` here"));
    }
    let arguments: Value = serde_json::from_str(arguments)
        .map_err(|error| format!("the arguments are not JSON: {error}"))?;
    let command = args::required_str(&arguments, "command").map_err(|error| error.to_string())?;
    clawcage_tool_sdk::workspace::enter().map_err(|error| error.to_string())?;
    let programs = wit::programs();
    let read_script = |path: &str| {
        let metadata = std::fs::metadata(path).ok()?;
        // A script longer than this is not read for the plan (its commands are still checked
        // one by one when they run).
        (metadata.is_file() && metadata.len() <= 1 << 20)
            .then(|| std::fs::read_to_string(path).ok())
            .flatten()
    };
    plan::plan(command, &programs, &read_script).map(|plan| plan.to_string())
}

impl bindings::exports::clawcage::tool::planner::Guest for ExecTool {
    fn plan(name: String, arguments: String) -> Result<String, String> {
        plan_call(&name, &arguments)
    }
}

/// The component's export of `clawcage:tool/tool`; the generated glue needs `unsafe`. Only a
/// WebAssembly build exports it (a native test build cannot link the export names).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod exported {
    use super::ExecTool;
    crate::bindings::export!(ExecTool with_types_in crate::bindings);
}
