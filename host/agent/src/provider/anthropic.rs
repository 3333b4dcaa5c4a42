//! The Anthropic Messages API: `POST {base}/v1/messages` with `x-api-key` and
//! `anthropic-version`. Our [`ChatMessage`] has this API's shape, so the history is sent as it
//! is stored; tools are the registry's `anthropic_definitions`. With `stream: true` the reply comes
//! as server-sent events (`message_start`, `content_block_start`, `content_block_delta` carrying
//! `text_delta` or `input_json_delta`, `content_block_stop`, `message_delta`, `message_stop`),
//! which are reassembled here into the same [`ChatResponse`] a plain request returns.
//!
//! Extended thinking (`thinking` blocks with a `signature`, `redacted_thinking` blocks with
//! encrypted `data`) is kept as reasoning blocks. The API wants them back unchanged only inside a
//! tool-use turn (the assistant message whose tool calls the next request answers) and checks
//! their signature, so the rule here is the simplest correct one: a reasoning block is sent back
//! only with its signature (or its encrypted data) and only when a `tool_use` block follows it in
//! the same assistant message; every other reasoning block is left out, and an assistant message
//! left empty by that is left out too (the API joins the user turns around it).

use std::collections::BTreeMap;

use clawcage_core::{BoxFuture, ChatMessage, ContentBlock, Usage};
use serde_json::{Value, json};

use super::{
    ChatRequest, ChatResponse, EventStream, HttpSettings, MalformedToolCall, Provider,
    ProviderError, ProviderEvents, StopReason, is_event_stream, read_json, report_reasoning, send,
    tool_input,
};

/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// A client of the Messages API.
#[derive(Debug)]
pub struct AnthropicProvider {
    settings: HttpSettings,
    client: reqwest::Client,
}

impl AnthropicProvider {
    /// A client with `settings`; the key is required.
    pub fn new(settings: HttpSettings) -> Result<Self, ProviderError> {
        if settings.api_key.is_none() {
            return Err(ProviderError::Config(
                "the anthropic provider needs an API key: set ANTHROPIC_API_KEY (or try `clawcage demo`, which needs none)"
                    .to_string(),
            ));
        }
        let client = settings.client()?;
        Ok(Self { settings, client })
    }
}

/// The request body for `request`, exactly as sent. With [`HttpSettings::prompt_cache`] the
/// stable prefix is marked for the prompt cache with `cache_control` breakpoints (at most 4 are
/// allowed; this uses 3): the system prompt, which also covers the tool definitions before it,
/// the last block of the last message, which covers the whole request and is what the next
/// request of the session starts with, and the last block of the user message before it, where
/// the previous request put its breakpoint, so that prefix is read from the cache even when
/// the reply and the tool results since add more blocks than the API looks back over (20).
pub fn request_body(settings: &HttpSettings, request: &ChatRequest<'_>) -> Value {
    let mut messages: Vec<Value> = request.messages.iter().filter_map(message_json).collect();
    let mut body = json!({
        "model": settings.model,
        "max_tokens": settings.output_tokens(request),
    });
    if settings.prompt_cache {
        mark_history(&mut messages);
    }
    body["messages"] = Value::Array(messages);
    if !request.system.is_empty() {
        body["system"] = if settings.prompt_cache {
            json!([{"type": "text", "text": request.system, "cache_control": EPHEMERAL.clone()}])
        } else {
            json!(request.system)
        };
    }
    let tools = request.tools.anthropic_definitions();
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if request.stream {
        body["stream"] = json!(true);
    }
    body
}

/// The breakpoint marker: a cache entry that lives five minutes, renewed by each hit.
static EPHEMERAL: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| json!({"type": "ephemeral"}));

/// Put a breakpoint on the last block of the last message and of the user message before it.
fn mark_history(messages: &mut [Value]) {
    let Some(last) = messages.len().checked_sub(1) else {
        return;
    };
    let mut marks = vec![last];
    if let Some(previous) = (0..last.saturating_sub(1))
        .rev()
        .find(|&index| messages[index]["role"] == "user")
    {
        marks.push(previous);
    }
    for index in marks {
        if let Some(block) = messages[index]["content"]
            .as_array_mut()
            .and_then(|blocks| blocks.last_mut())
        {
            block["cache_control"] = EPHEMERAL.clone();
        }
    }
}

/// A message as the API wants it, or `None` when nothing of it may be sent (an assistant
/// message of reasoning only).
fn message_json(message: &ChatMessage) -> Option<Value> {
    let mut content = Vec::with_capacity(message.content.len());
    for (index, block) in message.content.iter().enumerate() {
        match block {
            // Empty text blocks are refused by the API; they carry nothing anyway.
            ContentBlock::Text { text } if text.is_empty() => {}
            ContentBlock::Reasoning {
                text,
                signature,
                encrypted,
            } => {
                // Sent back only within its tool-use turn, and only as the API signed it.
                let tool_use_follows = message.content[index + 1..]
                    .iter()
                    .any(|later| matches!(later, ContentBlock::ToolUse { .. }));
                if !tool_use_follows {
                    continue;
                }
                if let Some(data) = encrypted {
                    content.push(json!({"type": "redacted_thinking", "data": data}));
                } else if let Some(signature) = signature {
                    content.push(
                        json!({"type": "thinking", "thinking": text, "signature": signature}),
                    );
                }
            }
            other => content.push(serde_json::to_value(other).unwrap_or(Value::Null)),
        }
    }
    if content.is_empty() && message.role == clawcage_core::Role::Assistant {
        return None;
    }
    Some(json!({"role": message.role, "content": content}))
}

/// The usage object of a response (or of a stream's `message_start`): the API counts the
/// prompt tokens read without the cache (`input_tokens`), read from it and written to it apart;
/// [`Usage::input_tokens`] is their sum.
fn usage_of(value: &Value) -> Usage {
    let count = |name: &str| value[name].as_u64().unwrap_or(0);
    let read = count("cache_read_input_tokens");
    let written = count("cache_creation_input_tokens");
    Usage {
        input_tokens: count("input_tokens")
            .saturating_add(read)
            .saturating_add(written),
        output_tokens: count("output_tokens"),
        cache_read_tokens: read,
        cache_write_tokens: written,
    }
}

impl Provider for AnthropicProvider {
    fn label(&self) -> String {
        format!("anthropic/{}", self.settings.model)
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let label = self.label();
            let url = self.settings.endpoint("/v1/messages");
            let key = self
                .settings
                .api_key
                .as_ref()
                .map(|key| key.expose())
                .unwrap_or_default();
            let body = request_body(&self.settings, &request);
            let builder = self
                .client
                .post(&url)
                .timeout(self.settings.request_timeout(request.stream))
                .header("x-api-key", key)
                .header("anthropic-version", API_VERSION)
                .header("content-type", "application/json")
                .body(body.to_string());
            let response = send(&label, &url, &self.settings, builder).await?;
            let mut response = if is_event_stream(&response) {
                read_stream(&label, &url, &self.settings, response, events).await?
            } else {
                let response = parse_response(
                    &label,
                    &read_json(&label, &url, &self.settings, response).await?,
                )?;
                report_reasoning(&response, events);
                response
            };
            response.answered_by = label;
            Ok(response)
        })
    }
}

/// Read a non-streaming response body.
pub fn parse_response(label: &str, body: &Value) -> Result<ChatResponse, ProviderError> {
    let blocks = body["content"]
        .as_array()
        .ok_or_else(|| ProviderError::Protocol {
            provider: label.to_string(),
            message: "the response has no `content` array".to_string(),
        })?;
    let mut content = Vec::new();
    let mut malformed = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => {
                let text = block["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    content.push(ContentBlock::text(text));
                }
            }
            Some("tool_use") => {
                let id = block["id"].as_str().unwrap_or_default().to_string();
                let name = block["name"].as_str().unwrap_or_default().to_string();
                let input = match &block["input"] {
                    Value::Object(_) => block["input"].clone(),
                    other => {
                        malformed.push(MalformedToolCall {
                            tool_use_id: id.clone(),
                            message: format!(
                                "the input of this `{name}` call is not a JSON object (got {other}); nothing was run"
                            ),
                        });
                        json!({})
                    }
                };
                content.push(ContentBlock::ToolUse { id, name, input });
            }
            Some("thinking") => content.push(ContentBlock::Reasoning {
                text: block["thinking"].as_str().unwrap_or_default().to_string(),
                signature: block["signature"]
                    .as_str()
                    .filter(|signature| !signature.is_empty())
                    .map(str::to_string),
                encrypted: None,
            }),
            Some("redacted_thinking") => content.push(ContentBlock::Reasoning {
                text: String::new(),
                signature: None,
                encrypted: block["data"].as_str().map(str::to_string),
            }),
            // Block kinds added later are not part of the history we keep.
            _ => {}
        }
    }
    check_tool_ids(label, &content)?;
    Ok(ChatResponse {
        content,
        stop_reason: stop_reason(body["stop_reason"].as_str()),
        usage: usage_of(&body["usage"]),
        answered_by: String::new(),
        malformed,
        repairs: Vec::new(),
    })
}

/// A tool call without an id cannot be answered; the response is unusable.
fn check_tool_ids(label: &str, content: &[ContentBlock]) -> Result<(), ProviderError> {
    for block in content {
        if let ContentBlock::ToolUse { id, name, .. } = block
            && (id.is_empty() || name.is_empty())
        {
            return Err(ProviderError::Protocol {
                provider: label.to_string(),
                message: "a tool_use block has no id or no name".to_string(),
            });
        }
    }
    Ok(())
}

fn stop_reason(reason: Option<&str>) -> StopReason {
    match reason {
        Some("end_turn") | Some("stop_sequence") | None => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
    }
}

/// A content block while its deltas arrive.
enum PartialBlock {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
    },
    /// Thinking: its text and signature as they arrive.
    Thinking {
        text: String,
        signature: String,
    },
    /// Redacted thinking: its encrypted data (it has no deltas).
    Redacted(String),
    /// A kind we do not keep; its deltas are read and dropped.
    Other,
}

async fn read_stream(
    label: &str,
    url: &str,
    settings: &HttpSettings,
    response: reqwest::Response,
    events: &dyn ProviderEvents,
) -> Result<ChatResponse, ProviderError> {
    let protocol = |message: String| ProviderError::Protocol {
        provider: label.to_string(),
        message,
    };
    let mut stream = EventStream::new(label, url, settings, response);
    let mut blocks: BTreeMap<u64, PartialBlock> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut reason = None;
    let mut finished = false;
    while !finished {
        let Some(batch) = stream.next_events().await? else {
            break;
        };
        for event in batch {
            let data: Value = serde_json::from_str(&event.data).map_err(|error| {
                protocol(format!(
                    "a streamed event is not JSON ({error}): {}",
                    super::preview(&event.data, 200)
                ))
            })?;
            let index = data["index"].as_u64().unwrap_or(0);
            match data["type"].as_str().unwrap_or(event.event.as_str()) {
                "message_start" => {
                    usage = usage_of(&data["message"]["usage"]);
                }
                "content_block_start" => {
                    let block = &data["content_block"];
                    let partial = match block["type"].as_str() {
                        Some("text") => {
                            let text = block["text"].as_str().unwrap_or_default().to_string();
                            if !text.is_empty() {
                                events.text_delta(&text);
                            }
                            PartialBlock::Text(text)
                        }
                        Some("tool_use") => PartialBlock::Tool {
                            id: block["id"].as_str().unwrap_or_default().to_string(),
                            name: block["name"].as_str().unwrap_or_default().to_string(),
                            json: String::new(),
                        },
                        Some("thinking") => {
                            let text = block["thinking"].as_str().unwrap_or_default().to_string();
                            if !text.is_empty() {
                                events.reasoning_delta(&text);
                            }
                            PartialBlock::Thinking {
                                text,
                                signature: block["signature"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string(),
                            }
                        }
                        Some("redacted_thinking") => PartialBlock::Redacted(
                            block["data"].as_str().unwrap_or_default().to_string(),
                        ),
                        _ => PartialBlock::Other,
                    };
                    blocks.insert(index, partial);
                }
                "content_block_delta" => {
                    let delta = &data["delta"];
                    match (blocks.get_mut(&index), delta["type"].as_str()) {
                        (Some(PartialBlock::Text(text)), Some("text_delta")) => {
                            let piece = delta["text"].as_str().unwrap_or_default();
                            events.text_delta(piece);
                            text.push_str(piece);
                        }
                        (Some(PartialBlock::Tool { json, .. }), Some("input_json_delta")) => {
                            json.push_str(delta["partial_json"].as_str().unwrap_or_default());
                        }
                        (Some(PartialBlock::Thinking { text, .. }), Some("thinking_delta")) => {
                            let piece = delta["thinking"].as_str().unwrap_or_default();
                            events.reasoning_delta(piece);
                            text.push_str(piece);
                        }
                        (
                            Some(PartialBlock::Thinking { signature, .. }),
                            Some("signature_delta"),
                        ) => {
                            signature.push_str(delta["signature"].as_str().unwrap_or_default());
                        }
                        (None, _) => {
                            return Err(protocol(format!(
                                "a content_block_delta for block {index}, which was never started"
                            )));
                        }
                        // Deltas of kinds we do not keep.
                        _ => {}
                    }
                }
                "message_delta" => {
                    if let Some(stop) = data["delta"]["stop_reason"].as_str() {
                        reason = Some(stop.to_string());
                    }
                    if let Some(output) = data["usage"]["output_tokens"].as_u64() {
                        usage.output_tokens = output;
                    }
                    // A final count, when the stream gives one, replaces the first.
                    let delta = &data["usage"];
                    if delta["input_tokens"].is_u64()
                        || delta["cache_read_input_tokens"].is_u64()
                        || delta["cache_creation_input_tokens"].is_u64()
                    {
                        let output = usage.output_tokens;
                        usage = usage_of(delta);
                        usage.output_tokens = output;
                    }
                }
                "message_stop" => finished = true,
                "error" => {
                    return Err(ProviderError::Stream {
                        provider: label.to_string(),
                        kind: data["error"]["type"]
                            .as_str()
                            .unwrap_or("error")
                            .to_string(),
                        message: data["error"]["message"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    });
                }
                // `ping`, `content_block_stop` and event types added later.
                _ => {}
            }
        }
    }
    if !finished {
        return Err(protocol(
            "the stream ended before `message_stop`".to_string(),
        ));
    }
    let mut content = Vec::new();
    let mut malformed = Vec::new();
    let mut repairs = Vec::new();
    for block in blocks.into_values() {
        match block {
            PartialBlock::Text(text) if text.is_empty() => {}
            PartialBlock::Text(text) => content.push(ContentBlock::Text { text }),
            PartialBlock::Tool { id, name, json } => {
                let input = tool_input(label, &id, &name, &json, &mut malformed, &mut repairs);
                content.push(ContentBlock::ToolUse { id, name, input });
            }
            PartialBlock::Thinking { text, signature } => content.push(ContentBlock::Reasoning {
                text,
                signature: (!signature.is_empty()).then_some(signature),
                encrypted: None,
            }),
            PartialBlock::Redacted(data) => content.push(ContentBlock::Reasoning {
                text: String::new(),
                signature: None,
                encrypted: Some(data),
            }),
            PartialBlock::Other => {}
        }
    }
    check_tool_ids(label, &content)?;
    Ok(ChatResponse {
        content,
        stop_reason: stop_reason(reason.as_deref()),
        usage,
        answered_by: String::new(),
        malformed,
        repairs,
    })
}

#[cfg(test)]
mod reasoning_tests {
    use super::*;
    use clawcage_core::Role;

    fn thinking(text: &str, signature: Option<&str>) -> ContentBlock {
        ContentBlock::Reasoning {
            text: text.into(),
            signature: signature.map(str::to_string),
            encrypted: None,
        }
    }

    fn call() -> ContentBlock {
        ContentBlock::ToolUse {
            id: "toolu_1".into(),
            name: "read_file".into(),
            input: json!({"path": "a"}),
        }
    }

    #[test]
    fn thinking_goes_back_signed_and_only_before_a_tool_use() {
        let redacted = ContentBlock::Reasoning {
            text: String::new(),
            signature: None,
            encrypted: Some("EncryptedData".into()),
        };
        let tool_turn = ChatMessage::new(
            Role::Assistant,
            vec![thinking("let me look", Some("sig1")), redacted, call()],
        );
        assert_eq!(
            message_json(&tool_turn),
            Some(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "let me look", "signature": "sig1"},
                {"type": "redacted_thinking", "data": "EncryptedData"},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
            ]}))
        );
        // Without a signature, or with no tool call after it, it stays home.
        let unsigned = ChatMessage::new(Role::Assistant, vec![thinking("hmm", None), call()]);
        assert_eq!(
            message_json(&unsigned).unwrap()["content"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
        let answer = ChatMessage::new(
            Role::Assistant,
            vec![thinking("hmm", Some("sig")), ContentBlock::text("Hi")],
        );
        assert_eq!(
            message_json(&answer),
            Some(json!({"role": "assistant", "content": [{"type": "text", "text": "Hi"}]}))
        );
        // A message of reasoning only is not sent at all.
        let only = ChatMessage::new(Role::Assistant, vec![thinking("hmm", Some("sig"))]);
        assert_eq!(message_json(&only), None);
    }

    #[test]
    fn thinking_blocks_are_read_as_reasoning() {
        let body = json!({"content": [
            {"type": "thinking", "thinking": "step", "signature": "s"},
            {"type": "redacted_thinking", "data": "D"},
            {"type": "text", "text": "Hi"},
        ], "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}});
        let response = parse_response("anthropic/m", &body).unwrap();
        assert_eq!(
            response.content,
            vec![
                thinking("step", Some("s")),
                ContentBlock::Reasoning {
                    text: String::new(),
                    signature: None,
                    encrypted: Some("D".into()),
                },
                ContentBlock::text("Hi"),
            ]
        );
    }
}
