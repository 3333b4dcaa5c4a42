//! The agent's events as ACP `session/update` payloads: streamed text becomes
//! `agent_message_chunk`, the model's reasoning `agent_thought_chunk`, a tool call's start a
//! `tool_call` (kind, title, `in_progress`), its
//! end a `tool_call_update` (`completed` or `failed`, with the output or the refusal as
//! content), notes, retries and compactions `agent_thought_chunk`, and a finished turn a
//! `usage_update`. A loaded session's transcript is replayed with the same shapes. The wire
//! JSON is written here by hand, next to the event it comes from: the protocol is the schema.

use clawcage_agent::events::{AgentEvent, Stream};
use clawcage_core::{ChatMessage, ContentBlock, Role};
use serde_json::{Value, json};

/// The ACP tool kind of one of clawcage's tools.
pub fn tool_kind(name: &str) -> &'static str {
    match name {
        "read_file" | "list_dir" => "read",
        "write_file" | "edit_file" | "memory" => "edit",
        "exec" => "execute",
        "web_fetch" => "fetch",
        "web_search" => "search",
        _ => "other",
    }
}

/// A short title for a tool call: the tool and its main argument.
pub fn tool_title(name: &str, args: &Value) -> String {
    let main = ["path", "command", "url", "query", "task", "action"]
        .iter()
        .find_map(|key| args.get(*key).and_then(Value::as_str));
    match main {
        Some(value) => {
            let value: String = value.chars().take(120).collect();
            format!("{name} {value}")
        }
        None => name.to_string(),
    }
}

fn text_chunk(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

/// The `session/update` an event becomes, if any.
pub fn update_of(event: &AgentEvent) -> Option<Value> {
    let data = &event.data;
    let str_of = |key: &str| data.get(key).and_then(Value::as_str);
    match event.stream {
        Stream::Assistant => {
            if let Some(delta) = str_of("delta") {
                return Some(text_chunk("agent_message_chunk", delta));
            }
            // A `message` tool's text.
            str_of("content").map(|content| text_chunk("agent_message_chunk", content))
        }
        Stream::Reasoning => str_of("delta").map(|delta| text_chunk("agent_thought_chunk", delta)),
        Stream::Tool => {
            let id = str_of("toolCallId")?;
            let name = str_of("name").unwrap_or("tool");
            match event.phase()? {
                "start" => {
                    let args = data.get("args").cloned().unwrap_or(Value::Null);
                    Some(json!({
                        "sessionUpdate": "tool_call",
                        "toolCallId": id,
                        "title": tool_title(name, &args),
                        "kind": tool_kind(name),
                        "status": "in_progress",
                        "rawInput": args,
                    }))
                }
                "end" => {
                    let ok = str_of("verdict") == Some("ok");
                    let mut text = str_of("output").unwrap_or_default().to_string();
                    if text.is_empty()
                        && let Some(reason) = str_of("reason")
                    {
                        text = reason.to_string();
                    }
                    if data.get("truncated").and_then(Value::as_bool) == Some(true) {
                        text.push_str("\n[… cut for display; the model got all of it]");
                    }
                    Some(json!({
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": id,
                        "status": if ok { "completed" } else { "failed" },
                        "content": [{"type": "content", "content": {"type": "text", "text": text}}],
                        "rawOutput": {
                            "verdict": str_of("verdict"),
                            "label": str_of("label"),
                        },
                    }))
                }
                _ => None,
            }
        }
        Stream::Lifecycle => match event.phase()? {
            "note" => str_of("text").map(|text| text_chunk("agent_thought_chunk", text)),
            _ => None,
        },
        Stream::Compaction => Some(text_chunk(
            "agent_thought_chunk",
            &format!(
                "[the history was compacted: {} older messages summarised]",
                data.get("summarisedMessages")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            ),
        )),
        Stream::Error => str_of("message").map(|message| {
            text_chunk(
                "agent_thought_chunk",
                &format!(
                    "[provider: {}]",
                    message.chars().take(300).collect::<String>()
                ),
            )
        }),
    }
}

/// The `usage_update` after a turn: the tokens its model calls used, and the window.
pub fn usage_update(used: u64, size: u64) -> Value {
    json!({"sessionUpdate": "usage_update", "used": used, "size": size})
}

/// The updates that replay `history` (a loaded session): the user's and the agent's text as
/// chunks, each tool call with its final status and result.
pub fn replay(history: &[ChatMessage]) -> Vec<Value> {
    let mut updates = Vec::new();
    for message in history {
        for block in &message.content {
            match block {
                ContentBlock::Text { text } if !text.is_empty() => updates.push(text_chunk(
                    match message.role {
                        Role::User => "user_message_chunk",
                        _ => "agent_message_chunk",
                    },
                    text,
                )),
                ContentBlock::ToolUse { id, name, input } => updates.push(json!({
                    "sessionUpdate": "tool_call",
                    "toolCallId": id,
                    "title": tool_title(name, input),
                    "kind": tool_kind(name),
                    "status": "in_progress",
                    "rawInput": input,
                })),
                ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => updates.push(json!({
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": tool_use_id,
                    "status": if *is_error { "failed" } else { "completed" },
                    "content": [{"type": "content", "content": {"type": "text", "text": content}}],
                })),
                ContentBlock::Reasoning { text, .. } if !text.is_empty() => {
                    updates.push(text_chunk("agent_thought_chunk", text))
                }
                _ => {}
            }
        }
        if message.cut.is_some() {
            updates.push(text_chunk(
                "agent_thought_chunk",
                "[this reply was cut at the model's output-token limit]",
            ));
        }
    }
    updates
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_tool_call_becomes_a_failed_update_with_the_reason() {
        let event = AgentEvent::new(
            "k",
            "r",
            Stream::Tool,
            json!({"phase": "end", "toolCallId": "t1", "name": "read_file", "verdict": "denied", "label": "denied", "output": "", "reason": "outside the workspace"}),
        );
        let update = update_of(&event).unwrap();
        assert_eq!(update["status"], "failed");
        assert_eq!(
            update["content"][0]["content"]["text"],
            "outside the workspace"
        );
    }

    #[test]
    fn tool_kinds_and_titles() {
        assert_eq!(tool_kind("exec"), "execute");
        assert_eq!(
            tool_title("read_file", &json!({"path": "a.txt"})),
            "read_file a.txt"
        );
    }
}
