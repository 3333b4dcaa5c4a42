//! The gate the sandbox asks before an exec call, a host beyond the allow-list or a write under a
//! read-only workspace, the decision it answers with, and the [`ApprovedExec`] every program
//! and write of the call is checked against while it runs.

use super::*;

/// The operator's decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalDecision {
    /// This request only.
    AllowOnce,
    /// This request and, from now on, the same command (or host, or path).
    AllowAlways,
    /// Not this request.
    Deny,
}

impl ApprovalDecision {
    /// Reads `allow-once`, `allow-always`, `deny` (and the one-letter answers `y`, `a`, `n`).
    pub fn parse(text: &str) -> Option<ApprovalDecision> {
        match text.trim().to_ascii_lowercase().as_str() {
            "allow-once" | "once" | "y" | "yes" => Some(ApprovalDecision::AllowOnce),
            "allow-always" | "always" | "a" => Some(ApprovalDecision::AllowAlways),
            "deny" | "n" | "no" => Some(ApprovalDecision::Deny),
            _ => None,
        }
    }

    /// `allow-once`, `allow-always` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalDecision::AllowOnce => "allow-once",
            ApprovalDecision::AllowAlways => "allow-always",
            ApprovalDecision::Deny => "deny",
        }
    }
}

/// What an exec call may run, fixed before it starts: the policy and the commands the operator
/// approved. Every program the call starts is checked against it by the host.
#[derive(Debug, Clone, Default)]
pub struct ApprovedExec {
    /// The policy at the time of the decision.
    pub policy: ExecPolicy,
    /// The commands the operator approved for this call (empty when nobody was asked).
    pub approved: Vec<PlannedCommand>,
    /// The writes by redirection the operator approved for this call (empty when nobody was
    /// asked). Under `full` every write passes; otherwise only these.
    pub approved_writes: Vec<PlannedWrite>,
}

/// Why the host refused a program or a write of an exec call: it is outside the operator's
/// policy and outside the plan the operator approved. Shown to the model as a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecRefusal {
    /// A program the call was about to start.
    #[error(
        "denied by the operator's exec policy: {reason}, and `{command}` is not part of the command that was approved; a different command needs its own approval"
    )]
    Program {
        /// Why the policy does not cover it.
        reason: String,
        /// The program and its arguments, as shown.
        command: String,
    },
    /// A file the shell was about to open for writing by redirection.
    #[error(
        "denied by the operator's exec policy: {reason}, and `{redirection}` is not part of the command that was approved; a different command needs its own approval"
    )]
    Write {
        /// Why the policy does not cover it.
        reason: String,
        /// The redirection, e.g. `> /ws/notes.txt`.
        redirection: String,
    },
}

impl ApprovedExec {
    /// Checks one program about to run.
    pub fn check(&self, program: &str, args: &[String]) -> Result<(), ExecRefusal> {
        match self.policy.covers(program, args) {
            Coverage::Miss(reason) => {
                let effective = unwrap_program(program, args);
                let approved = effective.opaque.is_none()
                    && self
                        .approved
                        .iter()
                        .any(|command| command.matches(&effective.program, &effective.args));
                let approved_as_written = self
                    .approved
                    .iter()
                    .any(|command| command.matches(program, args));
                if approved || approved_as_written {
                    Ok(())
                } else {
                    Err(ExecRefusal::Program {
                        reason,
                        command: shown(program, args),
                    })
                }
            }
            _ => Ok(()),
        }
    }
}

impl ApprovedExec {
    /// Checks one file the shell is about to open for writing by redirection (`path` absolute,
    /// `append` for `>>`). Under `full` every write passes;
    /// otherwise only a write the operator approved in this call's plan, so a write the plan did
    /// not show (a script rewritten after the plan, `sh -c "$X"`) is refused before the file is
    /// opened.
    pub fn check_write(&self, path: &str, append: bool) -> Result<(), ExecRefusal> {
        if self.policy.mode == ExecMode::Full
            || self
                .approved_writes
                .iter()
                .any(|write| write.matches_path(path))
        {
            return Ok(());
        }
        let redirection = format!("{} {path}", if append { ">>" } else { ">" });
        let reason = match self.policy.mode {
            ExecMode::Deny => "exec is disabled by the operator".to_string(),
            _ => format!(
                "`{redirection}` writes a file, and writes by redirection are not on the allowlist"
            ),
        };
        Err(ExecRefusal::Write {
            reason,
            redirection,
        })
    }
}

/// How the gate answered.
#[derive(Debug, Clone)]
pub enum GateAnswer {
    /// Run, checking every program against this.
    Allowed(Arc<ApprovedExec>),
    /// Do not run; the text is the tool result for the model.
    Denied(String),
}

/// A future the gate returns.
pub type GateFuture = Pin<Box<dyn Future<Output = GateAnswer> + Send>>;

/// Decides an exec call before it runs. Implemented by the agent crate's approvals broker, which
/// may ask a person; the sandbox holds it in the exec grant.
pub trait ApprovalGate: Send + Sync + fmt::Debug {
    /// Whether the gate needs the plan at all (false when the policy is `full` without asking:
    /// then no plan is made and nothing is checked).
    fn active(&self) -> bool;
    /// Decide on the plan of one exec call. `None` when the component could not report a plan:
    /// then only what the policy covers may run.
    fn review(&self, tool: &str, plan: Option<ExecPlan>) -> GateFuture;
    /// Whether a request to a host off the network allow-list is asked instead of refused
    /// (`[approvals] network = "ask"`).
    fn asks_network(&self) -> bool {
        false
    }
    /// Decides on one request to the host `entry` names (the allow-list entry that names exactly
    /// its host, port and scheme). `Ok` allows this request; the error is the sentence for the
    /// model. Allow-always answers are kept by the gate, which then allows later requests itself.
    fn review_network(&self, entry: &str) -> RequestGateFuture {
        let entry = entry.to_string();
        Box::pin(async move { Err(format!("requests to {entry} are not allowed")) })
    }
    /// Whether a change under a read-only workspace is asked instead of refused
    /// (`[approvals] write = "ask"`): the reviewer that asks, bound to the calling session (taken
    /// when this is called, so that programs running on other tasks ask for the same session),
    /// or `None` when such writes are refused.
    fn write_reviewer(&self) -> Option<WriteReviewer> {
        None
    }
}

/// A future the gate returns for one request beyond the grants (a host, a write): `Ok` allows
/// exactly that request; the error is the sentence for the model.
pub type RequestGateFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Decides on one write under a read-only workspace, for the session it was bound to.
pub type WriteReviewer = Arc<dyn Fn(WriteRequest) -> RequestGateFuture + Send + Sync>;

/// What a write under a read-only workspace would change, as the sandbox saw it: the operation
/// and the absolute paths it touches (lexically normalised, inside the workspace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRequest {
    /// What would be done.
    pub operation: WriteOperation,
    /// The path changed; for a rename or a hard link, the source then the new name.
    pub paths: Vec<String>,
    /// For a symbolic link: the text it would point to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// The operations a write approval can allow, one per mutating `wasi:filesystem` function (and
/// the shell's output redirection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteOperation {
    /// Open a file for writing: create it, empty it or change it.
    Write,
    /// Create a directory.
    CreateDirectory,
    /// Remove an empty directory.
    RemoveDirectory,
    /// Remove a file or a symbolic link.
    Remove,
    /// Rename or move.
    Rename,
    /// Create a symbolic link.
    Symlink,
    /// Create a hard link.
    HardLink,
    /// Change a file's access or modification time.
    SetTimes,
}

impl WriteRequest {
    /// One line for the operator and the model: `create or change /ws/a.txt`,
    /// `rename /ws/a to /ws/b`.
    pub fn describe(&self) -> String {
        let first = self.paths.first().map(String::as_str).unwrap_or("?");
        let second = self.paths.get(1).map(String::as_str).unwrap_or("?");
        match self.operation {
            WriteOperation::Write => format!("create or change {first}"),
            WriteOperation::CreateDirectory => format!("create the directory {first}"),
            WriteOperation::RemoveDirectory => format!("remove the directory {first}"),
            WriteOperation::Remove => format!("remove {first}"),
            WriteOperation::Rename => format!("rename {first} to {second}"),
            WriteOperation::Symlink => format!(
                "create the symbolic link {first} -> {}",
                self.link_target.as_deref().unwrap_or("?")
            ),
            WriteOperation::HardLink => format!("create the hard link {second} to {first}"),
            WriteOperation::SetTimes => format!("change the times of {first}"),
        }
    }
}
