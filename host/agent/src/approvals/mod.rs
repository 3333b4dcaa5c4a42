//! Approvals: a person in the loop for what the agent runs. The [`ApprovalBroker`] is the
//! sandbox's [`ApprovalGate`]: before an exec call runs it gets the call's plan, decides what the
//! operator's policy covers (`[approvals] exec` = deny / allowlist / full, the allowlist, safe
//! bins, earlier allow-always decisions in `<state-dir>/approvals.json`) and, when `ask` says so,
//! sends an [`ApprovalRequest`] to every connected operator front end whose filter matches the
//! session (`chat` inline, the gateway, channels, ACP) and waits for the first decision or the
//! timeout (a denial). With no front end connected, `ask_fallback` decides. The call's other work
//! and the session's other sessions do not wait: only this tool call does. Every request and
//! decision goes to the audit log (the plan's digest, never its text).
//!
//! Here: the settings, a session's own policy, requests and operator events; `broker` the
//! broker; `store` `approvals.json`.

use std::time::Duration;

use clawcage_core::approval::{ApprovalDecision, AskMode, ExecMode, ExecPlan, ExecPolicy};
use serde::{Deserialize, Serialize};

/// The `tool` of a request about a host off the network allow-list.
pub const NETWORK_TOOL: &str = "network";
/// The `kind` of a kept allow-always decision about a command.
const EXEC_KIND: &str = "exec";
/// The `kind` of a kept allow-always decision about a host.
const NETWORK_KIND: &str = "network";
/// The `tool` of a request to change something under a read-only workspace.
pub const WRITE_TOOL: &str = "write";
/// The `kind` of a kept allow-always decision about a path (written under a read-only workspace).
const WRITE_KIND: &str = "write";

/// The default time an operator has to answer: 30 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Requests waiting at once; more are denied at once (a flood cannot queue work for a person).
const MAX_PENDING: usize = 64;
/// Bytes of `approvals.json` read.
const MAX_STORE_BYTES: u64 = 4 << 20;

/// The operator's approvals settings (`[approvals]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalSettings {
    /// The exec policy: mode, configured allowlist, safe bins.
    pub exec: ExecPolicy,
    /// When to ask a person.
    pub ask: AskMode,
    /// What decides when asking is needed but no operator front end is connected.
    pub ask_fallback: ExecMode,
    /// How long a request waits; then it is denied.
    pub timeout: Duration,
    /// Whether a web request to a host off the network allow-list is asked instead of refused.
    pub network_ask: bool,
    /// Whether a change under a read-only workspace is asked instead of refused.
    pub write_ask: bool,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        ApprovalSettings {
            exec: ExecPolicy {
                mode: ExecMode::Full,
                allow: Vec::new(),
                safe_bins: clawcage_core::approval::DEFAULT_SAFE_BINS
                    .iter()
                    .map(|bin| bin.to_string())
                    .collect(),
            },
            ask: AskMode::Off,
            ask_fallback: ExecMode::Deny,
            timeout: DEFAULT_TIMEOUT,
            network_ask: false,
            write_ask: false,
        }
    }
}

/// A session's own exec mode and ask mode, over the configuration's (`/approvals` in chat,
/// `exec.approval.policy` over the gateway). Its sub-agents (`KEY/sub-N`) follow it too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPolicy {
    /// The session's exec mode; the configuration's when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecMode>,
    /// The session's ask mode; the configuration's when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<AskMode>,
}

impl SessionPolicy {
    /// Reads `exec deny|allowlist|full` and `ask off|on-miss|always` pairs (either or both, in
    /// any order), as `/approvals` takes them.
    pub fn parse(words: &[&str]) -> Result<SessionPolicy, String> {
        let usage =
            "use: exec deny|allowlist|full, ask off|on-miss|always (either or both), or reset";
        let mut policy = SessionPolicy::default();
        let mut rest = words;
        while let [key, value, tail @ ..] = rest {
            match *key {
                "exec" => {
                    policy.exec = Some(
                        value
                            .parse()
                            .map_err(|valid| format!("exec {value:?} is not a mode; {valid}"))?,
                    )
                }
                "ask" => {
                    policy.ask = Some(
                        value
                            .parse()
                            .map_err(|valid| format!("ask {value:?} is not a mode; {valid}"))?,
                    )
                }
                other => return Err(format!("{other:?} is not a setting; {usage}")),
            }
            rest = tail;
        }
        if !rest.is_empty() || policy == SessionPolicy::default() {
            return Err(usage.to_string());
        }
        Ok(policy)
    }
}

/// One request to the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The request's id (`apr-…`), used to answer it.
    pub id: String,
    /// The session whose tool call waits, when it runs for one.
    pub session_key: Option<String>,
    /// The id of the model's tool call this request gates (`toolu_…`), when it is known: a front
    /// end shows the question on that call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool (`exec`).
    pub tool: String,
    /// What the call would run.
    pub plan: ExecPlan,
    /// Why the policy alone did not allow it, one line per command.
    pub reasons: Vec<String>,
    /// When the request is denied unanswered, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

impl ApprovalRequest {
    /// The request as lines for a terminal or a chat message.
    pub fn describe(&self) -> String {
        if self.tool == NETWORK_TOOL {
            return format!("{} wants to reach:\n  {}", self.tool, self.plan.command);
        }
        if self.tool == WRITE_TOOL {
            return format!(
                "a tool wants to write in the read-only workspace:\n  {}",
                self.plan.command
            );
        }
        let mut text = format!("{} wants to run:", self.tool);
        for command in &self.plan.commands {
            text.push_str("\n  ");
            text.push_str(&command.display());
        }
        if self.plan.commands.is_empty() {
            text.push_str("\n  ");
            text.push_str(&self.plan.command);
        }
        for write in &self.plan.writes {
            text.push_str("\n  ");
            text.push_str(&write.display());
        }
        text
    }
}

/// What an operator front end hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorEvent {
    /// A tool call waits for a decision.
    Requested(ApprovalRequest),
    /// A request was decided (by someone, or by its timeout): stop showing it.
    Resolved {
        /// The request.
        id: String,
        /// The decision.
        decision: ApprovalDecision,
        /// Who decided (`chat`, `gateway:<client>`, `timeout`).
        by: String,
    },
}

/// Which requests an operator front end wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorFilter {
    /// Every request, with or without a session.
    All,
    /// Requests of this session and of its sub-agents (`KEY/sub-N`).
    Session(String),
}

impl OperatorFilter {
    /// Whether a request of `session_key` (`None`: of no session) is one this operator wants.
    pub fn accepts(&self, session_key: Option<&str>) -> bool {
        match (self, session_key) {
            (OperatorFilter::All, _) => true,
            (OperatorFilter::Session(mine), Some(key)) => {
                key == mine
                    || key
                        .strip_prefix(mine.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            (OperatorFilter::Session(_), None) => false,
        }
    }
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No request with this id waits (it was decided, timed out or never existed).
    #[error(
        "no approval request `{0}` is waiting (it was already decided, it timed out, or the id is wrong)"
    )]
    Unknown(String),
    /// The approvals file could not be read or written.
    #[error("{0}")]
    Store(String),
}

mod broker;
mod store;
#[cfg(test)]
mod tests;

pub use broker::{ApprovalBroker, OperatorHandle};
pub use store::{ApprovalStore, StoredApproval};
