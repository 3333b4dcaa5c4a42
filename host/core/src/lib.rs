//! The vocabulary every clawcage crate shares: what a tool is ([`ToolSpec`], the [`Tool`] trait),
//! what a call returns ([`ToolOutput`]) and how it fails ([`ToolError`]), and the chat messages
//! providers and transcripts share ([`chat`]), the slash commands every front end reads
//! ([`command`]), and the [`Scheduler`] contract between the `cron`
//! tool and the host ([`scheduler`]). This crate holds plain
//! serde types and object-safe traits, plus the host-side file helpers every crate shares
//! ([`files`]) and the small records kept whole in a file or a cluster's bucket ([`records`]); it depends on no engine and no async runtime, so the agent's tests and any front
//! end can use it without compiling wasmtime.

pub mod approval;
pub mod chat;
pub mod command;
pub mod files;
pub mod records;
pub mod redact;
pub mod scheduler;
pub mod sync;

pub use chat::{ChatMessage, ContentBlock, Cut, InboundMessage, Role, Usage};
pub use scheduler::{JobInfo, JobRequest, Scheduler};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variables that hold clawcage's own credentials: the model providers' API keys
/// and the search key the host adds to requests. One list, used by the providers, the network
/// secrets and the plugin rule (no plugin is ever granted one of these), so a new credential
/// cannot reach a plugin by being missing from a second list.
pub const CREDENTIAL_ENV: &[&str] = &[ANTHROPIC_API_KEY_ENV, OPENAI_API_KEY_ENV, BRAVE_API_KEY_ENV];

/// The Anthropic API key's variable.
pub const ANTHROPIC_API_KEY_ENV: &str = "ANTHROPIC_API_KEY";
/// The OpenAI-compatible server's API key's variable.
pub const OPENAI_API_KEY_ENV: &str = "OPENAI_API_KEY";
/// The Brave Search API key's variable.
pub const BRAVE_API_KEY_ENV: &str = "BRAVE_API_KEY";

/// A boxed, sendable future, the return type of [`Tool::call`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One tool as a model sees it: a unique name, a description written for the model and the JSON
/// Schema its arguments must satisfy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique `snake_case` name, e.g. `read_file`.
    pub name: String,
    /// What the tool does and when to use it.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
}

/// A request from the model to run one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for this call, echoed back with the result.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments object as the model sent it.
    pub arguments: Value,
}

/// What a successful tool call returns to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The result text shown to the model.
    pub text: String,
}

impl ToolOutput {
    /// A result made of `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into() }
    }
}

/// Why a tool call did not succeed. Every variant carries a message written for the model: it
/// says what happened and, where it can, what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ToolError {
    /// The arguments do not fit the tool: unknown tool, bad JSON, wrong type, missing field.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// The sandbox or the operator's policy refused the action.
    #[error("denied: {0}")]
    Denied(String),
    /// The action was allowed but did not succeed (including traps, timeouts and memory limits).
    #[error("failed: {0}")]
    Failed(String),
}

impl ToolError {
    /// The short name of the variant, as used in logs and verdicts: `invalid_args`, `denied`,
    /// `failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::InvalidArgs(_) => "invalid_args",
            ToolError::Denied(_) => "denied",
            ToolError::Failed(_) => "failed",
        }
    }

    /// The message without the variant prefix.
    pub fn message(&self) -> &str {
        match self {
            ToolError::InvalidArgs(m) | ToolError::Denied(m) | ToolError::Failed(m) => m,
        }
    }
}

/// Something the agent can call. Implemented by sandboxed WebAssembly tools and by the few
/// host-side tools (such as the message tool) that need no sandbox.
///
/// `call` receives arguments that the registry has already validated against
/// [`Tool::spec`]'s schema.
pub trait Tool: Send + Sync + fmt::Debug {
    /// The tool's name, description and argument schema.
    fn spec(&self) -> &ToolSpec;

    /// Run the tool once.
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;

    /// Where the tool comes from, for `clawcage tools`: e.g. `bundled:file`.
    fn origin(&self) -> String {
        "host".to_string()
    }

    /// What the tool is allowed to reach, in one line, for `clawcage tools` and the audit log.
    fn grants_summary(&self) -> String {
        "runs in the host process".to_string()
    }

    /// The same as structured fields, for machines (`clawcage tools --json`): for a sandboxed
    /// tool `workspace` (`path`, `mode`), `network` (`allow`, `secret_hosts`), `memory_mib`,
    /// `timeout_secs`, `max_output_chars`, `exec` (`programs`, `write_limit_mib`), `env`,
    /// `cron`; a host-side tool says `{"sandboxed": false}`.
    fn grants_json(&self) -> Value {
        serde_json::json!({"sandboxed": false})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_error_serialises_with_kind_and_message() {
        let error = ToolError::Denied("outside the workspace".into());
        let json = serde_json::to_value(&error).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "denied", "message": "outside the workspace"})
        );
        assert_eq!(error.kind(), "denied");
        assert_eq!(error.message(), "outside the workspace");
        assert_eq!(error.to_string(), "denied: outside the workspace");
    }
}
