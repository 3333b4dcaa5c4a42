//! Chat messages as providers and transcripts see them: a conversation is a list of
//! [`ChatMessage`]s, each a role and a list of [`ContentBlock`]s (text, the model's reasoning, a
//! tool call the model made, or the result the host sent back). The shape follows the Anthropic
//! Messages API, the richer of the two wire formats; the OpenAI-compatible provider maps it onto
//! `tool_calls` and `tool` messages. Reasoning is kept as its own kind of block so it can be
//! shown apart and is never taken for the answer; each provider decides whether it may be sent
//! back. A message the model did not finish (stopped at its output-token limit) carries a
//! [`Cut`] mark. [`Usage`] counts tokens; [`InboundMessage`] is what subsystems publish to an
//! agent.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message. The system prompt is not a message: it travels beside the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user, and the host when it returns tool results or delivers notifications.
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning before its answer (`reasoning_content` of llama.cpp, vLLM and
    /// DeepSeek; Anthropic's `thinking` and `redacted_thinking` blocks). Never part of
    /// [`ChatMessage::text`]; whether it goes back to the model is each provider's rule.
    Reasoning {
        /// The reasoning text (empty when the provider sent it encrypted only).
        text: String,
        /// The provider's signature over the text (Anthropic), needed to send it back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// Reasoning the provider sent encrypted (Anthropic `redacted_thinking` data), kept only
        /// to be sent back as it came.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted: Option<String>,
    },
    /// A tool call the model made.
    ToolUse {
        /// The provider's id for the call, echoed back in the result.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments object.
        input: Value,
    },
    /// The host's answer to one tool call.
    ToolResult {
        /// The id of the [`ContentBlock::ToolUse`] this answers.
        tool_use_id: String,
        /// The result text, or the error text when `is_error`.
        content: String,
        /// Whether the call failed (sent to Anthropic as `is_error: true`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }
}

/// Why a message is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// The model was stopped at its output-token limit (`finish_reason: "length"`,
    /// `stop_reason: "max_tokens"`): the text may end mid-sentence.
    MaxTokens,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says, in order.
    pub content: Vec<ContentBlock>,
    /// Set when the model did not finish this message (stored as `"cut": "max_tokens"`; a
    /// message without the field, as every transcript before it was written, is whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
}

impl ChatMessage {
    /// A user message made of one text block.
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            cut: None,
        }
    }

    /// An assistant message made of one text block.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: vec![ContentBlock::text(text)],
            cut: None,
        }
    }

    /// A message of `role` made of `content`, whole (not cut).
    pub fn new(role: Role, content: Vec<ContentBlock>) -> Self {
        Self {
            role,
            content,
            cut: None,
        }
    }

    /// The text blocks joined, without reasoning, tool calls or results.
    pub fn text(&self) -> String {
        let mut joined = String::new();
        for block in &self.content {
            if let ContentBlock::Text { text } = block {
                joined.push_str(text);
            }
        }
        joined
    }

    /// The reasoning blocks' text joined (empty when there is none).
    pub fn reasoning(&self) -> String {
        let mut joined = String::new();
        for block in &self.content {
            if let ContentBlock::Reasoning { text, .. } = block {
                joined.push_str(text);
            }
        }
        joined
    }

    /// Whether this message holds reasoning.
    pub fn has_reasoning(&self) -> bool {
        self.content
            .iter()
            .any(|block| matches!(block, ContentBlock::Reasoning { .. }))
    }

    /// The tool calls in this message, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|block| match block {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }

    /// Whether this message carries tool results (and so must follow the call that asked).
    pub fn has_tool_results(&self) -> bool {
        self.content
            .iter()
            .any(|block| matches!(block, ContentBlock::ToolResult { .. }))
    }
}

/// Tokens a provider counted for one or more requests. `input_tokens` is the whole prompt,
/// whether the provider read it from its prompt cache or not, the same for every provider: the
/// parts `cache_read_tokens` (read from the cache) and `cache_write_tokens` (written to it) are
/// counted inside it. (Anthropic reports the three apart and they are added up; an
/// OpenAI-compatible server's `prompt_tokens` already includes its `cached_tokens`.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (the prompt, history and tool definitions), cached or not.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Of the prompt tokens, those read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of the prompt tokens, those written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Usage {
    /// Add `other` to this count.
    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }

    /// Prompt and output tokens together (what budgets count).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The share of prompt tokens read from the cache, 0 to 1 (0 without any prompt).
    pub fn cache_hit_ratio(&self) -> f64 {
        match self.input_tokens {
            0 => 0.0,
            prompt => self.cache_read_tokens as f64 / prompt as f64,
        }
    }
}

/// A message a subsystem (a sub-agent, the cron service, an outside channel) publishes for an
/// agent session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundMessage {
    /// The bus channel, e.g. `system`.
    pub channel: String,
    /// Who sent it, e.g. `cron` or `subagent:3`.
    pub sender: String,
    /// The session the message is for.
    pub session_key: String,
    /// The text.
    pub content: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_serialise_in_the_messages_api_shape() {
        let message = ChatMessage {
            role: Role::User,
            cut: None,
            content: vec![
                ContentBlock::ToolResult {
                    tool_use_id: "t1".into(),
                    content: "ok".into(),
                    is_error: false,
                },
                ContentBlock::ToolResult {
                    tool_use_id: "t2".into(),
                    content: "denied: no".into(),
                    is_error: true,
                },
            ],
        };
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(
            json,
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "denied: no", "is_error": true},
            ]})
        );
        let back: ChatMessage = serde_json::from_value(json).unwrap();
        assert_eq!(back, message);
        assert!(back.has_tool_results());
    }

    #[test]
    fn a_message_written_before_reasoning_and_cut_marks_still_loads() {
        let old = r#"{"role":"assistant","content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t","name":"read_file","input":{"path":"a"}}]}"#;
        let message: ChatMessage = serde_json::from_str(old).unwrap();
        assert_eq!(message.cut, None);
        assert_eq!(message.text(), "hi");
        assert!(!message.has_reasoning());
        // Written back, it has the same shape: no new field appears for a whole message.
        assert_eq!(
            serde_json::to_value(&message).unwrap(),
            serde_json::from_str::<Value>(old).unwrap()
        );
    }

    #[test]
    fn reasoning_and_the_cut_mark_round_trip_and_stay_out_of_the_text() {
        let message = ChatMessage {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Reasoning {
                    text: "think".into(),
                    signature: Some("sig".into()),
                    encrypted: None,
                },
                ContentBlock::Reasoning {
                    text: String::new(),
                    signature: None,
                    encrypted: Some("opaque".into()),
                },
                ContentBlock::text("answer"),
            ],
            cut: Some(Cut::MaxTokens),
        };
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(
            json,
            json!({"role": "assistant", "content": [
                {"type": "reasoning", "text": "think", "signature": "sig"},
                {"type": "reasoning", "text": "", "encrypted": "opaque"},
                {"type": "text", "text": "answer"},
            ], "cut": "max_tokens"})
        );
        let back: ChatMessage = serde_json::from_value(json).unwrap();
        assert_eq!(back, message);
        assert_eq!(back.text(), "answer");
        assert_eq!(back.reasoning(), "think");
        assert!(back.has_reasoning());
    }
}
