//! The `message` tool: the agent's outbound direction. The model calls it to send a message to
//! the user (or another channel) while it works; the host decides what sending means through a
//! callback — the REPL prints it, a gateway would post it. It runs in the host because it touches
//! nothing but that callback.

use std::sync::Arc;

use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::{Value, json};

/// The longest message accepted, in characters.
pub const MAX_MESSAGE_CHARS: usize = 20_000;

/// A message the agent sends out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundMessage {
    /// Where to: the default channel unless the model named one.
    pub channel: String,
    /// The text.
    pub content: String,
}

/// What sending means: returns an error text for the model when it fails.
pub type SendCallback =
    Arc<dyn Fn(OutboundMessage) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The tool.
pub struct MessageTool {
    spec: ToolSpec,
    default_channel: String,
    send: SendCallback,
}

impl std::fmt::Debug for MessageTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageTool")
            .field("default_channel", &self.default_channel)
            .finish_non_exhaustive()
    }
}

impl MessageTool {
    /// A `message` tool that sends through `send`, to `default_channel` unless told otherwise.
    pub fn new(default_channel: impl Into<String>, send: SendCallback) -> Self {
        let spec = ToolSpec {
            name: "message".to_string(),
            description: "Send a message to the user now, without ending your turn: progress, a \
                          result they asked to be told about, a question. Your final answer is \
                          delivered anyway; do not repeat it here."
                .to_string(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "content": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_MESSAGE_CHARS,
                        "description": "The message text."
                    },
                    "channel": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 100,
                        "description": "Where to send it; leave out for the current conversation (in a chat app, the same chat). Another destination, such as telegram:<chatId> or webhook:<name>, works only where the operator allows it."
                    }
                },
                "required": ["content"],
                "additionalProperties": false
            }),
        };
        Self {
            spec,
            default_channel: default_channel.into(),
            send,
        }
    }
}

impl Tool for MessageTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let content = args["content"]
                .as_str()
                .ok_or_else(|| ToolError::InvalidArgs("`content` must be a string".to_string()))?
                .to_string();
            let channel = args["channel"]
                .as_str()
                .unwrap_or(&self.default_channel)
                .to_string();
            (self.send)(OutboundMessage {
                channel: channel.clone(),
                content,
            })
            .await
            .map_err(|why| ToolError::Failed(format!("the message was not sent: {why}")))?;
            Ok(ToolOutput::text(format!("message sent to {channel}")))
        })
    }

    fn origin(&self) -> String {
        "host:message".to_string()
    }

    fn grants_summary(&self) -> String {
        "runs in the host; sends text through the front end, reaches nothing else".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn messages_go_through_the_callback_and_its_failure_is_reported() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let tool = MessageTool::new(
            "user",
            Arc::new(
                move |message: OutboundMessage| -> BoxFuture<'static, Result<(), String>> {
                    let log = log.clone();
                    Box::pin(async move {
                        if message.content == "fail" {
                            return Err("the front end is closed".to_string());
                        }
                        log.lock().unwrap().push(message);
                        Ok(())
                    })
                },
            ),
        );
        let output = tool.call(&json!({"content": "hello"})).await.unwrap();
        assert_eq!(output.text, "message sent to user");
        tool.call(&json!({"content": "hi", "channel": "ops"}))
            .await
            .unwrap();
        assert_eq!(
            *sent.lock().unwrap(),
            vec![
                OutboundMessage {
                    channel: "user".into(),
                    content: "hello".into()
                },
                OutboundMessage {
                    channel: "ops".into(),
                    content: "hi".into()
                },
            ]
        );
        let error = tool.call(&json!({"content": "fail"})).await.unwrap_err();
        assert_eq!(
            error,
            ToolError::Failed("the message was not sent: the front end is closed".into())
        );
    }
}
