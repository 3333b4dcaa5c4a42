//! The scripted provider: it plays a recorded [`Script`] instead of asking a model, so the demo
//! and tests run without a key or a network. It names itself `scripted/<title>` in every label,
//! so nobody mistakes its answers for a model's. A script is a list of exchanges — optionally a
//! user line and a narration for the demo, the tools the exchange needs, and the replies the
//! "model" gives in order. An exchange that needs a tool the registry lacks is left out, so one
//! script serves builds with and without optional tools.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use clawcage_core::{BoxFuture, ContentBlock, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ChatRequest, ChatResponse, Provider, ProviderError, ProviderEvents, StopReason};

/// A recorded session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// A short name, shown in the provider's label.
    #[serde(default = "default_title")]
    pub title: String,
    /// The exchanges, in order.
    pub exchanges: Vec<Exchange>,
}

fn default_title() -> String {
    "script".to_string()
}

/// One user request and the replies that answer it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    /// What the user says (used by `clawcage demo`; `clawcage run` sends its own task).
    #[serde(default)]
    pub user: Option<String>,
    /// A line the demo prints before the exchange.
    #[serde(default)]
    pub narration: Option<String>,
    /// Tools this exchange calls; without them it is skipped.
    #[serde(default)]
    pub requires_tools: Vec<String>,
    /// The operator's answers to the approval requests this exchange raises, in order
    /// (`allow-once`, `allow-always`, `deny`; used by `clawcage demo`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<String>,
    /// The model's replies, one per request.
    pub replies: Vec<ScriptedReply>,
}

/// One reply of the "model".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    /// Text of the reply.
    #[serde(default)]
    pub text: String,
    /// Tool calls of the reply.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
}

/// One tool call in a reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments.
    #[serde(default = "empty_object")]
    pub input: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl Script {
    /// Parse a script from JSON text.
    pub fn from_json(text: &str) -> Result<Script, ProviderError> {
        serde_json::from_str(text).map_err(|error| {
            ProviderError::Config(format!(
                "the script is not valid: {error}; a script is {{\"title\": ..., \"exchanges\": [{{\"user\": ..., \"replies\": [{{\"text\": ..., \"tool_calls\": [{{\"name\": ..., \"input\": {{...}}}}]}}]}}]}}"
            ))
        })
    }
}

impl Exchange {
    /// The tools this exchange needs that are not among `tools` (the names the agent offers).
    pub fn missing_tools(&self, tools: &[&str]) -> Vec<String> {
        self.requires_tools
            .iter()
            .filter(|name| !tools.contains(&name.as_str()))
            .cloned()
            .collect()
    }
}

/// A provider that answers from a script.
#[derive(Debug)]
pub struct ScriptedProvider {
    title: String,
    total: usize,
    replies: Mutex<VecDeque<ScriptedReply>>,
    next_id: AtomicU64,
}

impl ScriptedProvider {
    /// Play every exchange of `script` whose tools are all among `tools` (the names the agent
    /// offers), in order.
    pub fn new(script: &Script, tools: &[&str]) -> Self {
        let replies: VecDeque<ScriptedReply> = script
            .exchanges
            .iter()
            .filter(|exchange| exchange.missing_tools(tools).is_empty())
            .flat_map(|exchange| exchange.replies.iter().cloned())
            .collect();
        Self {
            title: script.title.clone(),
            total: replies.len(),
            replies: Mutex::new(replies),
            next_id: AtomicU64::new(1),
        }
    }

    /// Replies not yet played.
    pub fn remaining(&self) -> usize {
        self.replies.lock().map(|queue| queue.len()).unwrap_or(0)
    }
}

impl Provider for ScriptedProvider {
    fn label(&self) -> String {
        format!("scripted/{}", self.title)
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let reply = self
                .replies
                .lock()
                .map_err(|_| ProviderError::Config("the script's queue is poisoned".to_string()))?
                .pop_front()
                .ok_or(ProviderError::ScriptExhausted(self.total))?;
            let mut content = Vec::new();
            if !reply.text.is_empty() {
                if request.stream {
                    for piece in reply.text.split_inclusive(' ') {
                        events.text_delta(piece);
                    }
                }
                content.push(ContentBlock::text(reply.text));
            }
            for call in reply.tool_calls {
                let id = format!("scripted_{}", self.next_id.fetch_add(1, Ordering::Relaxed));
                content.push(ContentBlock::ToolUse {
                    id,
                    name: call.name,
                    input: call.input,
                });
            }
            let wants_tools = content
                .iter()
                .any(|block| matches!(block, ContentBlock::ToolUse { .. }));
            Ok(ChatResponse {
                content,
                stop_reason: if wants_tools {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                },
                usage: Usage::default(),
                answered_by: self.label(),
                malformed: Vec::new(),
                repairs: Vec::new(),
            })
        })
    }
}
