//! The `spawn` and `subagents` tools: the sub-agent manager's face to the model.

use std::sync::Weak;

use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::{Value, json};

use super::*;

/// The `spawn` tool.
pub(super) struct SpawnTool {
    spec: ToolSpec,
    manager: Weak<SubagentManager>,
    /// The depth of the agent holding this tool (0 for the main agent).
    depth: u32,
    /// Where results go; `None`: the session whose turn calls the tool.
    session: Option<String>,
}

impl std::fmt::Debug for SpawnTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnTool")
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl SpawnTool {
    pub(super) fn new(
        manager: Weak<SubagentManager>,
        depth: u32,
        session: Option<String>,
        config: &SubagentConfig,
    ) -> Self {
        let spec = ToolSpec {
            name: "spawn".to_string(),
            description: format!(
                "Start a sub-agent that works on `task` in the background, with its own agent loop and no history, and return at once with its id. When it finishes, its result (or failure) is announced to you in a notification: do not wait or poll. A sub-agent has fewer tools than you (by default it can read but not change the workspace, and cannot send messages or schedule jobs). At most {} run at once; each has {} s.",
                config.max_concurrent,
                config.timeout.as_secs()
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 20000,
                        "description": "Everything the sub-agent needs to know: it sees nothing of this conversation."
                    },
                    "label": {
                        "type": "string",
                        "maxLength": 80,
                        "description": "A short name for the task, shown in the announcement and in `subagents` list."
                    },
                    "runtime": {
                        "type": "string",
                        "enum": ["clawcage", "acp"],
                        "description": "`clawcage` (default): a sub-agent of your own kind. `acp`: an external coding agent the operator configured, named by `agent`; it works in the workspace only through clawcage's sandboxed tools."
                    },
                    "agent": {
                        "type": "string",
                        "maxLength": 64,
                        "description": "With runtime `acp`: the configured external agent's name."
                    }
                },
                "required": ["task"],
                "additionalProperties": false
            }),
        };
        Self {
            spec,
            manager,
            depth,
            session,
        }
    }
}

impl Tool for SpawnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let manager = self.manager.upgrade().ok_or_else(|| {
                ToolError::Failed("the runtime is shutting down; no sub-agent started".to_string())
            })?;
            let task = args["task"].as_str().unwrap_or_default();
            let label = args["label"].as_str().map(ToString::to_string);
            let session = self
                .session
                .clone()
                .or_else(current_session_key)
                .ok_or_else(|| ToolError::Denied(SpawnError::NoSession.to_string()))?;
            if args["runtime"].as_str() == Some("acp") {
                let Some(agent) = args["agent"].as_str() else {
                    return Err(ToolError::InvalidArgs(
                        "runtime `acp` needs `agent`: the configured external agent's name"
                            .to_string(),
                    ));
                };
                let spawned = manager
                    .spawn_external(&session, self.depth + 1, agent, task, label)
                    .map_err(ToolError::Denied)?;
                return Ok(ToolOutput::text(format!(
                    "Started external agent `{agent}` as sub-agent {} ({} running now). Its result will be announced to you when it finishes.",
                    spawned.id, spawned.running
                )));
            }
            let spawned = manager
                .spawn(&session, self.depth + 1, task, label)
                .map_err(|error| ToolError::Denied(error.to_string()))?;
            Ok(ToolOutput::text(format!(
                "Started sub-agent {} ({} running now). Its result will be announced to you when it finishes.",
                spawned.id, spawned.running
            )))
        })
    }

    fn grants_summary(&self) -> String {
        "starts sub-agents with fewer tools than the caller".to_string()
    }
}

/// The `subagents` tool: list and stop.
pub(super) struct SubagentsTool {
    spec: ToolSpec,
    manager: Weak<SubagentManager>,
}

impl std::fmt::Debug for SubagentsTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentsTool").finish_non_exhaustive()
    }
}

impl SubagentsTool {
    pub(super) fn new(manager: Weak<SubagentManager>) -> Self {
        let spec = ToolSpec {
            name: "subagents".to_string(),
            description: "List your sub-agents (running ones first, then recent ones with how they ended), or stop a running one by id. A stopped sub-agent announces nothing.".to_string(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["list", "stop"]},
                    "id": {"type": "string", "description": "For `stop`: the sub-agent's id, e.g. sub-3."}
                },
                "required": ["action"],
                "additionalProperties": false
            }),
        };
        Self { spec, manager }
    }
}

impl Tool for SubagentsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let manager = self
                .manager
                .upgrade()
                .ok_or_else(|| ToolError::Failed("the runtime is shutting down".to_string()))?;
            match args["action"].as_str() {
                Some("stop") => {
                    let Some(id) = args["id"].as_str() else {
                        return Err(ToolError::InvalidArgs(
                            "`stop` needs the sub-agent's `id`, e.g. {\"action\": \"stop\", \"id\": \"sub-3\"}".to_string(),
                        ));
                    };
                    let record = manager.stop(id).map_err(ToolError::Failed)?;
                    Ok(ToolOutput::text(format!(
                        "Stopped sub-agent {}.",
                        record.name()
                    )))
                }
                _ => {
                    let session = current_session_key();
                    let mut records: Vec<SubagentRecord> = manager
                        .records()
                        .into_iter()
                        .filter(|record| {
                            session
                                .as_deref()
                                .is_none_or(|key| record.parent_session == key)
                        })
                        .collect();
                    records.sort_by_key(|record| record.status != SubagentStatus::Running);
                    if records.is_empty() {
                        return Ok(ToolOutput::text("No sub-agents."));
                    }
                    let lines: Vec<String> = records
                        .iter()
                        .take(30)
                        .map(|record| {
                            format!(
                                "{} — {} — {}",
                                record.name(),
                                record.status.as_str(),
                                record.task.chars().take(100).collect::<String>()
                            )
                        })
                        .collect();
                    Ok(ToolOutput::text(lines.join("\n")))
                }
            }
        })
    }
}
