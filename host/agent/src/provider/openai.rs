//! OpenAI-compatible chat completions: `POST {base}/chat/completions` with an optional
//! `Authorization: Bearer` key (OpenAI and OpenRouter need one; Ollama, vLLM and llama.cpp
//! servers usually do not). Our history maps onto this format as: the system prompt becomes the
//! first `system` message; an assistant message's tool calls become `tool_calls` whose
//! `arguments` are JSON text; each tool result becomes its own `tool` message, placed right after
//! the assistant message that asked. Streaming reads `data:` chunks up to `[DONE]` and joins the
//! `tool_calls` deltas by index. A reply's reasoning (`reasoning_content` of llama.cpp, vLLM and
//! DeepSeek, `reasoning` of others; streamed in the delta under the same names) is kept as a
//! reasoning block and never sent back: an assistant message carries only its text and tool
//! calls, and one left with neither is sent with `content: ""`, never `null` (which stricter
//! servers refuse without tool calls).

use std::collections::BTreeMap;

use clawcage_core::{BoxFuture, ChatMessage, ContentBlock, Role, Usage};
use serde_json::{Value, json};

use super::{
    ChatRequest, ChatResponse, EventStream, HttpSettings, Provider, ProviderError, ProviderEvents,
    StopReason, is_event_stream, read_json, report_reasoning, send, tool_input,
};

/// A client of an OpenAI-compatible server.
#[derive(Debug)]
pub struct OpenAiProvider {
    settings: HttpSettings,
    client: reqwest::Client,
}

impl OpenAiProvider {
    /// A client with `settings`; the key is optional.
    pub fn new(settings: HttpSettings) -> Result<Self, ProviderError> {
        let client = settings.client()?;
        Ok(Self { settings, client })
    }
}

/// The request body for `request`, exactly as sent.
pub fn request_body(settings: &HttpSettings, request: &ChatRequest<'_>) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for message in request.messages {
        push_message(&mut messages, message);
    }
    let mut body = json!({
        "model": settings.model,
        "max_tokens": settings.output_tokens(request),
        "messages": messages,
    });
    let tools = request.tools.openai_definitions();
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if request.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn push_message(messages: &mut Vec<Value>, message: &ChatMessage) {
    match message.role {
        Role::Assistant => {
            let text = message.text();
            let calls: Vec<Value> = message
                .tool_uses()
                .map(|(id, name, input)| {
                    json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": input.to_string()},
                    })
                })
                .collect();
            // Reasoning is left out. `null` content is only for a message with tool calls.
            let content = if text.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(text)
            };
            let mut entry = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                entry["tool_calls"] = Value::Array(calls);
            }
            messages.push(entry);
        }
        Role::User => {
            for block in &message.content {
                if let ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } = block
                {
                    messages.push(
                        json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                    );
                }
            }
            let text = message.text();
            if !text.is_empty() {
                messages.push(json!({"role": "user", "content": text}));
            }
        }
    }
}

impl Provider for OpenAiProvider {
    fn label(&self) -> String {
        format!("openai/{}", self.settings.model)
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let label = self.label();
            let url = self.settings.endpoint("/chat/completions");
            let body = request_body(&self.settings, &request);
            let mut builder = self
                .client
                .post(&url)
                .timeout(self.settings.request_timeout(request.stream))
                .header("content-type", "application/json")
                .body(body.to_string());
            if let Some(key) = &self.settings.api_key {
                builder = builder.bearer_auth(key.expose());
            }
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

/// A tool call as it arrives: id, name, argument text.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The reasoning a message or a streamed delta carries: `reasoning_content` (llama.cpp, vLLM,
/// DeepSeek) or `reasoning` (OpenRouter, newer vLLM and Ollama).
fn reasoning_of(value: &Value) -> Option<&str> {
    value["reasoning_content"]
        .as_str()
        .or_else(|| value["reasoning"].as_str())
        .filter(|text| !text.is_empty())
}

fn finish(
    label: &str,
    reasoning: String,
    text: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<&str>,
    usage: Usage,
) -> Result<ChatResponse, ProviderError> {
    let mut content = Vec::new();
    if !reasoning.is_empty() {
        content.push(ContentBlock::Reasoning {
            text: reasoning,
            signature: None,
            encrypted: None,
        });
    }
    if !text.is_empty() {
        content.push(ContentBlock::Text { text });
    }
    let mut malformed = Vec::new();
    let mut repairs = Vec::new();
    for (number, call) in calls.into_iter().enumerate() {
        if call.name.is_empty() {
            return Err(ProviderError::Protocol {
                provider: label.to_string(),
                message: "a tool call has no function name".to_string(),
            });
        }
        // Some local servers leave the id out; the id only has to pair the call with its result.
        let id = if call.id.is_empty() {
            format!("call_{number}")
        } else {
            call.id
        };
        let input = tool_input(
            label,
            &id,
            &call.name,
            &call.arguments,
            &mut malformed,
            &mut repairs,
        );
        content.push(ContentBlock::ToolUse {
            id,
            name: call.name,
            input,
        });
    }
    let has_calls = content
        .iter()
        .any(|block| matches!(block, ContentBlock::ToolUse { .. }));
    let stop_reason = match finish_reason {
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        _ if has_calls => StopReason::ToolUse,
        Some("stop") | None => StopReason::EndTurn,
        Some(other) => StopReason::Other(other.to_string()),
    };
    Ok(ChatResponse {
        content,
        stop_reason,
        usage,
        answered_by: String::new(),
        malformed,
        repairs,
    })
}

/// The usage object; `prompt_tokens_details.cached_tokens` (OpenAI, vLLM, llama.cpp and others
/// that report it) is the part of the prompt read from the cache.
fn usage_of(value: &Value) -> Usage {
    let prompt = value["prompt_tokens"].as_u64().unwrap_or(0);
    Usage {
        input_tokens: prompt,
        output_tokens: value["completion_tokens"].as_u64().unwrap_or(0),
        cache_read_tokens: value["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
            .min(prompt),
        cache_write_tokens: 0,
    }
}

/// Read a non-streaming response body.
pub fn parse_response(label: &str, body: &Value) -> Result<ChatResponse, ProviderError> {
    let choice = &body["choices"][0];
    if !choice.is_object() {
        return Err(ProviderError::Protocol {
            provider: label.to_string(),
            message: "the response has no `choices[0]`".to_string(),
        });
    }
    let message = &choice["message"];
    let text = message["content"].as_str().unwrap_or_default().to_string();
    let reasoning = reasoning_of(message).unwrap_or_default().to_string();
    let calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|call| PartialCall {
                    id: call["id"].as_str().unwrap_or_default().to_string(),
                    name: call["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    arguments: match &call["function"]["arguments"] {
                        Value::String(text) => text.clone(),
                        // Some servers send the object itself rather than its text.
                        Value::Null => String::new(),
                        other => other.to_string(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    finish(
        label,
        reasoning,
        text,
        calls,
        choice["finish_reason"].as_str(),
        usage_of(&body["usage"]),
    )
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
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls: BTreeMap<u64, PartialCall> = BTreeMap::new();
    let mut finish_reason: Option<String> = None;
    let mut usage = Usage::default();
    let mut done = false;
    while !done {
        let Some(batch) = stream.next_events().await? else {
            break;
        };
        for event in batch {
            if event.data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let data: Value = serde_json::from_str(&event.data).map_err(|error| {
                protocol(format!(
                    "a streamed chunk is not JSON ({error}): {}",
                    super::preview(&event.data, 200)
                ))
            })?;
            if let Some(message) = data["error"]["message"].as_str() {
                return Err(ProviderError::Stream {
                    provider: label.to_string(),
                    kind: data["error"]["type"]
                        .as_str()
                        .unwrap_or("error")
                        .to_string(),
                    message: message.to_string(),
                });
            }
            if data["usage"].is_object() {
                usage = usage_of(&data["usage"]);
            }
            let choice = &data["choices"][0];
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish_reason = Some(reason.to_string());
            }
            let delta = &choice["delta"];
            if let Some(piece) = reasoning_of(delta) {
                events.reasoning_delta(piece);
                reasoning.push_str(piece);
            }
            if let Some(piece) = delta["content"].as_str()
                && !piece.is_empty()
            {
                events.text_delta(piece);
                text.push_str(piece);
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().unwrap_or(0);
                let partial = calls.entry(index).or_default();
                if let Some(id) = call["id"].as_str() {
                    partial.id = id.to_string();
                }
                if let Some(name) = call["function"]["name"].as_str() {
                    partial.name.push_str(name);
                }
                if let Some(arguments) = call["function"]["arguments"].as_str() {
                    partial.arguments.push_str(arguments);
                }
            }
        }
    }
    if !done && finish_reason.is_none() {
        return Err(protocol("the stream ended before `[DONE]`".to_string()));
    }
    finish(
        label,
        reasoning,
        text,
        calls.into_values().collect(),
        finish_reason.as_deref(),
        usage,
    )
}

#[cfg(test)]
mod reasoning_tests {
    use super::*;

    fn assistant(content: Vec<ContentBlock>) -> ChatMessage {
        ChatMessage::new(Role::Assistant, content)
    }

    fn thought(text: &str) -> ContentBlock {
        ContentBlock::Reasoning {
            text: text.into(),
            signature: None,
            encrypted: None,
        }
    }

    #[test]
    fn a_reply_of_reasoning_only_is_reasoning_not_text() {
        for field in ["reasoning_content", "reasoning"] {
            let body = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "", field: "The user greets; I should"}}]});
            let response = parse_response("openai/m", &body).unwrap();
            assert_eq!(response.content, vec![thought("The user greets; I should")]);
            assert_eq!(response.stop_reason, StopReason::EndTurn);
        }
        let body = json!({"choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": "Hel", "reasoning_content": "think"}}]});
        let response = parse_response("openai/m", &body).unwrap();
        assert_eq!(
            response.content,
            vec![thought("think"), ContentBlock::text("Hel")]
        );
        assert_eq!(response.stop_reason, StopReason::MaxTokens);
    }

    #[test]
    fn reasoning_is_never_sent_back_and_content_is_never_null_without_tool_calls() {
        let mut messages = Vec::new();
        push_message(&mut messages, &assistant(vec![thought("secret plan")]));
        push_message(
            &mut messages,
            &assistant(vec![thought("plan"), ContentBlock::text("Hi")]),
        );
        push_message(
            &mut messages,
            &assistant(vec![
                thought("plan"),
                ContentBlock::ToolUse {
                    id: "c1".into(),
                    name: "read_file".into(),
                    input: json!({"path": "a"}),
                },
            ]),
        );
        assert_eq!(messages[0], json!({"role": "assistant", "content": ""}));
        assert_eq!(messages[1], json!({"role": "assistant", "content": "Hi"}));
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[2]["tool_calls"][0]["id"], "c1");
        let sent = Value::Array(messages).to_string();
        assert!(
            !sent.contains("plan") && !sent.contains("reasoning"),
            "{sent}"
        );
    }
}
