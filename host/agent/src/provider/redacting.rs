//! The one place model output is scrubbed. [`Redacting`] wraps the whole provider chain (retries
//! and fail-over included) with the runtime's [`Redactor`], so everything downstream of a model
//! call — the agent loop, streamed events, transcripts, the gateway, channels, compaction
//! summaries — only ever sees text with every secret value the process holds replaced by
//! `[redacted: LABEL]`.
//!
//! Both directions pass through it. A request whose system prompt or messages hold a value (a
//! user pasted it) is sent with the value replaced, so the model is never given one. A reply is
//! scrubbed in every text it carries: text and reasoning blocks, every string inside a tool
//! call's input (and its id and name), the notes on malformed or repaired tool calls, and the
//! errors and retry/fail-over reasons a provider reports. Reasoning whose text a value was taken
//! out of loses its signature: the provider would refuse the changed text with it, so it is
//! never sent back. Streamed text and streamed reasoning each go through a
//! [`StreamRedactor`](clawcage_core::redact::StreamRedactor), which holds back a tail so that a
//! value split across two deltas is still found; the tail is released when the completion ends,
//! and when an attempt breaks off before a retry or a fail-over (replacing a value cut off at
//! the break), since the next attempt's deltas start again. The deltas of one successful attempt
//! concatenated equal its scrubbed text.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use clawcage_core::redact::{Redactor, StreamRedactor};
use clawcage_core::{BoxFuture, ChatMessage, ContentBlock};
use serde_json::Value;

use super::{
    ChatRequest, ChatResponse, MalformedToolCall, Provider, ProviderError, ProviderEvents,
    StopReason,
};

/// A provider whose requests and replies are scrubbed of every value a [`Redactor`] knows.
#[derive(Debug)]
pub struct Redacting {
    inner: Arc<dyn Provider>,
    redactor: Redactor,
}

impl Redacting {
    /// Wrap `inner` (the whole chain, so a retry or fail-over is seen here too).
    pub fn new(inner: Arc<dyn Provider>, redactor: Redactor) -> Self {
        Self { inner, redactor }
    }

    /// `inner` wrapped, or `inner` itself when `redactor` scrubs nothing.
    pub fn wrap(inner: Arc<dyn Provider>, redactor: &Redactor) -> Arc<dyn Provider> {
        if redactor.is_empty() {
            inner
        } else {
            Arc::new(Self::new(inner, redactor.clone()))
        }
    }

    /// The redactor applied.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

impl Provider for Redacting {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let redactor = &self.redactor;
            let scrubbed_system;
            let system: &str = if redactor.contains(request.system.as_bytes()) {
                scrubbed_system = redactor.redact(request.system);
                &scrubbed_system
            } else {
                request.system
            };
            let scrubbed_messages: Vec<ChatMessage>;
            let messages: &[ChatMessage] = if request
                .messages
                .iter()
                .any(|message| message_contains(redactor, message))
            {
                scrubbed_messages = request
                    .messages
                    .iter()
                    .map(|message| redact_message(redactor, message))
                    .collect();
                &scrubbed_messages
            } else {
                request.messages
            };
            let request = ChatRequest {
                system,
                messages,
                tools: request.tools,
                stream: request.stream,
                max_tokens: request.max_tokens,
            };
            let scrubbing = ScrubbingEvents::new(events, redactor);
            let result = self.inner.complete(request, &scrubbing).await;
            match result {
                Ok(response) => {
                    scrubbing.release(false);
                    Ok(redact_response(redactor, response))
                }
                Err(error) => {
                    scrubbing.release(true);
                    Err(redact_error(redactor, error))
                }
            }
        })
    }
}

/// Streamed text scrubbed piece by piece: a value cut across two pieces is still found, and no
/// piece ends inside a character. Each piece released is handed to a sink while the scrubber is
/// held, so pieces reach their consumer in order. A completion's events use it, and so does an
/// external agent's streamed output.
pub struct TextScrubber {
    stream: Mutex<TextStream>,
}

impl TextScrubber {
    /// A scrubber of the values `redactor` knows.
    pub fn new(redactor: &Redactor) -> Self {
        Self {
            stream: Mutex::new(TextStream {
                redactor: redactor.stream(),
                partial: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TextStream> {
        self.stream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes in `text`; hands `sink` the scrubbed text it releases, if any (the rest is held
    /// back until it is known not to begin a value).
    pub fn push(&self, text: &str, sink: impl FnOnce(&str)) {
        let mut stream = self.lock();
        let released = stream.redactor.push(text.as_bytes());
        let text = stream.characters(released);
        if !text.is_empty() {
            sink(&text);
        }
    }

    /// Hands `sink` everything still held back, scrubbed: the stream ended, or (`cut`) broke off,
    /// in which case a value begun at its end is replaced too.
    pub fn finish(&self, cut: bool, sink: impl FnOnce(&str)) {
        let mut stream = self.lock();
        let text = stream.drain(cut);
        if !text.is_empty() {
            sink(&text);
        }
    }
}

/// The events of one completion, scrubbed on their way to `inner`.
struct ScrubbingEvents<'a> {
    inner: &'a dyn ProviderEvents,
    redactor: &'a Redactor,
    stream: TextScrubber,
    /// The reasoning, a stream of its own.
    reasoning: TextScrubber,
}

/// Streamed text between the redactor and the consumer.
struct TextStream {
    redactor: StreamRedactor,
    /// Scrubbed bytes that end inside a UTF-8 character, waiting for its rest.
    partial: Vec<u8>,
}

impl TextStream {
    /// The whole characters of `bytes` after what was waiting, keeping a trailing part of one.
    fn characters(&mut self, bytes: Vec<u8>) -> String {
        if self.partial.is_empty() {
            self.partial = bytes;
        } else {
            self.partial.extend_from_slice(&bytes);
        }
        let whole = match std::str::from_utf8(&self.partial) {
            Ok(_) => self.partial.len(),
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            // Not UTF-8 at all (cannot happen for text from a `&str`): passed on as it can be.
            Err(_) => self.partial.len(),
        };
        let rest = self.partial.split_off(whole);
        let text = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial = rest;
        text
    }

    /// Everything still held, as text.
    fn drain(&mut self, cut: bool) -> String {
        let tail = if cut {
            self.redactor.finish_cut()
        } else {
            self.redactor.finish()
        };
        let mut text = self.characters(tail);
        if !self.partial.is_empty() {
            text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        }
        text
    }
}

impl<'a> ScrubbingEvents<'a> {
    fn new(inner: &'a dyn ProviderEvents, redactor: &'a Redactor) -> Self {
        Self {
            inner,
            redactor,
            stream: TextScrubber::new(redactor),
            reasoning: TextScrubber::new(redactor),
        }
    }

    /// Passes on the text and reasoning still held back: at the end of the completion, or
    /// (`cut`) where an attempt broke off.
    fn release(&self, cut: bool) {
        self.reasoning
            .finish(cut, |text| self.inner.reasoning_delta(text));
        self.stream.finish(cut, |text| self.inner.text_delta(text));
    }
}

impl ProviderEvents for ScrubbingEvents<'_> {
    fn text_delta(&self, text: &str) {
        // The answer begins: reasoning held back belongs before it.
        self.reasoning
            .finish(false, |text| self.inner.reasoning_delta(text));
        self.stream.push(text, |text| self.inner.text_delta(text));
    }

    fn reasoning_delta(&self, text: &str) {
        self.reasoning
            .push(text, |text| self.inner.reasoning_delta(text));
    }

    fn retrying(&self, provider: &str, reason: &str, delay: Duration) {
        // The attempt broke off: what it streamed ends here, the next one streams anew.
        self.release(true);
        self.inner.retrying(
            &self.redactor.redact(provider),
            &self.redactor.redact(reason),
            delay,
        );
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.release(true);
        self.inner.failing_over(
            &self.redactor.redact(from),
            &self.redactor.redact(to),
            &self.redactor.redact(reason),
        );
    }
}

/// Whether any text of `message` holds a value.
fn message_contains(redactor: &Redactor, message: &ChatMessage) -> bool {
    message.content.iter().any(|block| match block {
        ContentBlock::Text { text } | ContentBlock::Reasoning { text, .. } => {
            redactor.contains(text.as_bytes())
        }
        ContentBlock::ToolUse { id, name, input } => {
            redactor.contains(id.as_bytes())
                || redactor.contains(name.as_bytes())
                || json_contains(redactor, input)
        }
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            ..
        } => redactor.contains(tool_use_id.as_bytes()) || redactor.contains(content.as_bytes()),
    })
}

fn json_contains(redactor: &Redactor, value: &Value) -> bool {
    match value {
        Value::String(text) => redactor.contains(text.as_bytes()),
        Value::Array(items) => items.iter().any(|item| json_contains(redactor, item)),
        Value::Object(fields) => fields
            .iter()
            .any(|(key, item)| redactor.contains(key.as_bytes()) || json_contains(redactor, item)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// `message` with every value replaced in each of its texts.
pub fn redact_message(redactor: &Redactor, message: &ChatMessage) -> ChatMessage {
    ChatMessage {
        role: message.role,
        cut: message.cut,
        content: message
            .content
            .iter()
            .map(|block| redact_block(redactor, block))
            .collect(),
    }
}

fn redact_block(redactor: &Redactor, block: &ContentBlock) -> ContentBlock {
    match block {
        ContentBlock::Text { text } => ContentBlock::Text {
            text: redactor.redact(text),
        },
        ContentBlock::Reasoning {
            text,
            signature,
            encrypted,
        } => {
            let scrubbed = redactor.redact(text);
            // The signature covers the text as the model wrote it: a changed text cannot keep it.
            let signature = if scrubbed == *text {
                signature.clone()
            } else {
                None
            };
            ContentBlock::Reasoning {
                text: scrubbed,
                signature,
                encrypted: encrypted.clone(),
            }
        }
        ContentBlock::ToolUse { id, name, input } => ContentBlock::ToolUse {
            id: redactor.redact(id),
            name: redactor.redact(name),
            input: redact_json(redactor, input),
        },
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => ContentBlock::ToolResult {
            tool_use_id: redactor.redact(tool_use_id),
            content: redactor.redact(content),
            is_error: *is_error,
        },
    }
}

/// `value` with every value replaced in each string it holds, object keys included.
pub fn redact_json(redactor: &Redactor, value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(redactor.redact(text)),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| redact_json(redactor, item))
                .collect(),
        ),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, item)| (redactor.redact(key), redact_json(redactor, item)))
                .collect(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
    }
}

/// The blocks of a reply, scrubbed. Its text blocks are read as one text, as they were
/// streamed and as [`ChatMessage::text`] joins them: when a value runs across the boundary of
/// two text blocks, the scrubbed whole takes the place of the first and the others are left
/// out (an empty text block is refused by providers), so neither half survives. Its reasoning
/// blocks are read the same way, as one text of their own (as their stream was).
fn redact_content(redactor: &Redactor, content: &[ContentBlock]) -> Vec<ContentBlock> {
    let separately: Vec<ContentBlock> = content
        .iter()
        .map(|block| redact_block(redactor, block))
        .collect();
    let separately = join_if_split(redactor, content, separately, false);
    join_if_split(redactor, content, separately, true)
}

/// `scrubbed` (the blocks of `original` scrubbed one by one), with the text blocks (or, with
/// `reasoning`, the reasoning blocks with text) replaced by their scrubbed whole in the place
/// of the first when a value ran across two of them.
fn join_if_split(
    redactor: &Redactor,
    original: &[ContentBlock],
    scrubbed: Vec<ContentBlock>,
    reasoning: bool,
) -> Vec<ContentBlock> {
    let text_of = |block: &ContentBlock| -> Option<String> {
        match block {
            ContentBlock::Text { text } if !reasoning => Some(text.clone()),
            ContentBlock::Reasoning { text, .. } if reasoning && !text.is_empty() => {
                Some(text.clone())
            }
            _ => None,
        }
    };
    let joined =
        |blocks: &[ContentBlock]| -> String { blocks.iter().filter_map(text_of).collect() };
    let whole = redactor.redact(&joined(original));
    if whole == joined(&scrubbed) {
        return scrubbed;
    }
    let mut whole = Some(whole);
    scrubbed
        .into_iter()
        .filter_map(|block| {
            if text_of(&block).is_none() {
                return Some(block);
            }
            let text = whole.take()?;
            Some(if reasoning {
                // A joined text has no signature that covers it.
                ContentBlock::Reasoning {
                    text,
                    signature: None,
                    encrypted: None,
                }
            } else {
                ContentBlock::Text { text }
            })
        })
        .collect()
}

fn redact_response(redactor: &Redactor, response: ChatResponse) -> ChatResponse {
    ChatResponse {
        content: redact_content(redactor, &response.content),
        stop_reason: match response.stop_reason {
            StopReason::Other(reason) => StopReason::Other(redactor.redact(&reason)),
            other => other,
        },
        usage: response.usage,
        answered_by: redactor.redact(&response.answered_by),
        malformed: response
            .malformed
            .into_iter()
            .map(|malformed| MalformedToolCall {
                tool_use_id: redactor.redact(&malformed.tool_use_id),
                message: redactor.redact(&malformed.message),
            })
            .collect(),
        repairs: response
            .repairs
            .iter()
            .map(|repair| redactor.redact(repair))
            .collect(),
    }
}

/// `error` with every value replaced in its texts (it keeps its kind, so retry and context
/// decisions made on it stay the same).
pub fn redact_error(redactor: &Redactor, error: ProviderError) -> ProviderError {
    let r = |text: String| redactor.redact(&text);
    match error {
        ProviderError::Status {
            provider,
            status,
            message,
            retry_after,
        } => ProviderError::Status {
            provider: r(provider),
            status,
            message: r(message),
            retry_after,
        },
        ProviderError::Timeout { provider, seconds } => ProviderError::Timeout {
            provider: r(provider),
            seconds,
        },
        ProviderError::Connect {
            provider,
            url,
            message,
        } => ProviderError::Connect {
            provider: r(provider),
            url: r(url),
            message: r(message),
        },
        ProviderError::Protocol { provider, message } => ProviderError::Protocol {
            provider: r(provider),
            message: r(message),
        },
        ProviderError::Stream {
            provider,
            kind,
            message,
        } => ProviderError::Stream {
            provider: r(provider),
            kind: r(kind),
            message: r(message),
        },
        ProviderError::Config(message) => ProviderError::Config(r(message)),
        ProviderError::AllFailed(message) => ProviderError::AllFailed(r(message)),
        ProviderError::Budget(message) => ProviderError::Budget(r(message)),
        ProviderError::ScriptExhausted(count) => ProviderError::ScriptExhausted(count),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolRegistry;
    use clawcage_core::Usage;
    use serde_json::json;

    const TOKEN: &str = "123456789:AAFakeTelegramBotTokenValue_x9";

    fn redactor() -> Redactor {
        Redactor::new([("CLAWCAGE_TELEGRAM_TOKEN", TOKEN)])
    }

    /// What the fake model does on each attempt.
    #[derive(Debug, Clone)]
    enum Attempt {
        /// Streams these deltas, then fails with a retryable error naming the token.
        Broken(Vec<String>),
        /// Streams these deltas and answers with their concatenation (plus a tool call).
        Answer(Vec<String>),
    }

    /// A provider that plays attempts in order, reporting retries between them as
    /// [`super::super::Retrying`] does, and records each request's texts.
    #[derive(Debug)]
    struct Model {
        attempts: Vec<Attempt>,
        seen: Mutex<Vec<String>>,
    }

    impl Model {
        fn new(attempts: Vec<Attempt>) -> Arc<Self> {
            Arc::new(Self {
                attempts,
                seen: Mutex::new(Vec::new()),
            })
        }
    }

    impl Provider for Model {
        fn label(&self) -> String {
            "fake/model".into()
        }

        fn complete<'a>(
            &'a self,
            request: ChatRequest<'a>,
            events: &'a dyn ProviderEvents,
        ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            Box::pin(async move {
                {
                    let mut seen = self.seen.lock().unwrap();
                    seen.push(request.system.to_string());
                    for message in request.messages {
                        seen.push(serde_json::to_string(message).unwrap());
                    }
                }
                for attempt in &self.attempts {
                    match attempt {
                        Attempt::Broken(deltas) => {
                            for delta in deltas {
                                events.text_delta(delta);
                            }
                            events.retrying(
                                "fake/model",
                                &format!("HTTP 500: bad token {TOKEN}"),
                                Duration::ZERO,
                            );
                        }
                        Attempt::Answer(deltas) => {
                            for delta in deltas {
                                events.text_delta(delta);
                            }
                            return Ok(ChatResponse {
                                content: vec![
                                    ContentBlock::text(deltas.concat()),
                                    ContentBlock::ToolUse {
                                        id: "call_1".into(),
                                        name: "message".into(),
                                        input: json!({"to": "telegram:1", "parts": [{"text": format!("t={TOKEN}")}], TOKEN: 1}),
                                    },
                                ],
                                stop_reason: StopReason::ToolUse,
                                usage: Usage::default(),
                                answered_by: self.label(),
                                malformed: vec![MalformedToolCall {
                                    tool_use_id: "call_2".into(),
                                    message: format!("they began: {{\"x\": \"{TOKEN}"),
                                }],
                                repairs: vec![format!("message: closed a string after {TOKEN}")],
                            });
                        }
                    }
                }
                Err(ProviderError::Status {
                    provider: "fake/model".into(),
                    status: 401,
                    message: format!("invalid key {TOKEN}"),
                    retry_after: None,
                })
            })
        }
    }

    /// Collects the events passed on.
    #[derive(Default)]
    struct Seen {
        deltas: Mutex<Vec<String>>,
        reasoning: Mutex<Vec<String>>,
        notes: Mutex<Vec<String>>,
    }

    impl ProviderEvents for Seen {
        fn text_delta(&self, text: &str) {
            self.deltas.lock().unwrap().push(text.to_string());
        }
        fn reasoning_delta(&self, text: &str) {
            self.reasoning.lock().unwrap().push(text.to_string());
        }
        fn retrying(&self, provider: &str, reason: &str, _delay: Duration) {
            self.notes
                .lock()
                .unwrap()
                .push(format!("{provider}: {reason}"));
        }
        fn failing_over(&self, from: &str, to: &str, reason: &str) {
            self.notes
                .lock()
                .unwrap()
                .push(format!("{from} {to}: {reason}"));
        }
    }

    fn ask(provider: &dyn Provider, events: &Seen) -> Result<ChatResponse, ProviderError> {
        let tools = ToolRegistry::new();
        let messages = vec![ChatMessage::user(format!(
            "my bot token is {TOKEN}, keep it"
        ))];
        let system = format!("system knows {TOKEN}");
        let request = ChatRequest {
            system: &system,
            messages: &messages,
            tools: &tools,
            stream: true,
            max_tokens: None,
        };
        block_on(provider.complete(request, events))
    }

    fn block_on<T>(future: BoxFuture<'_, T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// The token cut in two across deltas (and once more in its JSON-escaped form).
    fn split_deltas() -> Vec<String> {
        let (head, tail) = TOKEN.split_at(14);
        vec![
            "Here it is: ".into(),
            head.into(),
            format!("{tail} — and é"),
            "\u{301} done".into(),
        ]
    }

    #[test]
    fn streamed_text_split_across_deltas_is_scrubbed_and_matches_the_final_text() {
        let model = Model::new(vec![Attempt::Answer(split_deltas())]);
        let wrapped = Redacting::new(model.clone(), redactor());
        let seen = Seen::default();
        let response = ask(&wrapped, &seen).unwrap();
        let deltas = seen.deltas.lock().unwrap().clone();
        assert_eq!(
            deltas[0], "Here it is: ",
            "text that cannot begin a value is not held"
        );
        let streamed = deltas.concat();
        assert!(!streamed.contains(TOKEN), "{streamed}");
        assert!(!streamed.contains(&TOKEN[..14]), "{streamed}");
        assert!(streamed.contains("[redacted: CLAWCAGE_TELEGRAM_TOKEN]"));
        let ContentBlock::Text { text } = &response.content[0] else {
            panic!("{response:?}");
        };
        assert_eq!(&streamed, text, "the deltas add up to the stored text");
        let whole = format!("{response:?}");
        assert!(!whole.contains(TOKEN), "{whole}");
        let ContentBlock::ToolUse { input, .. } = &response.content[1] else {
            panic!("{response:?}");
        };
        assert_eq!(
            input["parts"][0]["text"],
            "t=[redacted: CLAWCAGE_TELEGRAM_TOKEN]"
        );
        // The model was never given the value either.
        for text in model.seen.lock().unwrap().iter() {
            assert!(!text.contains(TOKEN), "{text}");
        }
    }

    #[test]
    fn every_split_point_and_a_multibyte_character_survive() {
        let text = format!("ünïcode {TOKEN} ✓ end");
        for at in 1..text.len() {
            if !text.is_char_boundary(at) {
                continue;
            }
            let (head, tail) = text.split_at(at);
            let model = Model::new(vec![Attempt::Answer(vec![head.into(), tail.into()])]);
            let seen = Seen::default();
            let response = ask(&Redacting::new(model, redactor()), &seen).unwrap();
            let streamed = seen.deltas.lock().unwrap().concat();
            assert_eq!(
                streamed, "ünïcode [redacted: CLAWCAGE_TELEGRAM_TOKEN] ✓ end",
                "split at {at}"
            );
            assert_eq!(response.content[0], ContentBlock::text(streamed));
        }
    }

    #[test]
    fn a_broken_attempt_releases_its_tail_scrubbed_and_the_retry_streams_anew() {
        let (head, _) = TOKEN.split_at(10);
        let model = Model::new(vec![
            Attempt::Broken(vec!["partial ".into(), head.into()]),
            Attempt::Answer(split_deltas()),
        ]);
        let seen = Seen::default();
        let response = ask(&Redacting::new(model, redactor()), &seen).unwrap();
        let deltas = seen.deltas.lock().unwrap().clone();
        let all = deltas.concat();
        assert!(!all.contains(head), "{all}");
        assert!(
            all.starts_with("partial [redacted: CLAWCAGE_TELEGRAM_TOKEN]"),
            "{all}"
        );
        let notes = seen.notes.lock().unwrap().concat();
        assert!(!notes.contains(TOKEN), "{notes}");
        assert!(notes.contains("[redacted: CLAWCAGE_TELEGRAM_TOKEN]"));
        let ContentBlock::Text { text } = &response.content[0] else {
            panic!("{response:?}");
        };
        assert!(
            all.ends_with(text.as_str()),
            "the retry's deltas add up to its text"
        );
    }

    /// A provider answering with the token cut across two text blocks with a tool call between.
    #[derive(Debug)]
    struct Blocks;

    impl Provider for Blocks {
        fn label(&self) -> String {
            "fake/blocks".into()
        }

        fn complete<'a>(
            &'a self,
            _request: ChatRequest<'a>,
            events: &'a dyn ProviderEvents,
        ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            Box::pin(async move {
                let (head, tail) = TOKEN.split_at(12);
                let (first, second) = (format!("one {head}"), format!("{tail} two"));
                events.text_delta(&first);
                events.text_delta(&second);
                Ok(ChatResponse {
                    content: vec![
                        ContentBlock::text(first),
                        ContentBlock::ToolUse {
                            id: "c".into(),
                            name: "n".into(),
                            input: json!({}),
                        },
                        ContentBlock::text(second),
                    ],
                    stop_reason: StopReason::ToolUse,
                    usage: Usage::default(),
                    answered_by: self.label(),
                    malformed: Vec::new(),
                    repairs: Vec::new(),
                })
            })
        }
    }

    #[test]
    fn a_value_cut_across_two_text_blocks_is_scrubbed_as_the_joined_text() {
        let seen = Seen::default();
        let response = ask(&Redacting::new(Arc::new(Blocks), redactor()), &seen).unwrap();
        let message = ChatMessage {
            role: clawcage_core::Role::Assistant,
            cut: None,
            content: response.content.clone(),
        };
        assert_eq!(
            message.text(),
            "one [redacted: CLAWCAGE_TELEGRAM_TOKEN] two"
        );
        assert_eq!(message.text(), seen.deltas.lock().unwrap().concat());
        assert_eq!(response.content.len(), 2, "{response:?}");
        assert!(matches!(response.content[1], ContentBlock::ToolUse { .. }));
        let whole = format!("{response:?}");
        assert!(
            !whole.contains(&TOKEN[..12]) && !whole.contains(&TOKEN[12..]),
            "{whole}"
        );
    }

    #[test]
    fn errors_are_scrubbed_and_keep_their_kind() {
        let model = Model::new(vec![]);
        let seen = Seen::default();
        let error = ask(&Redacting::new(model, redactor()), &seen).unwrap_err();
        assert!(!error.to_string().contains(TOKEN), "{error}");
        assert!(matches!(error, ProviderError::Status { status: 401, .. }));
    }

    #[test]
    fn an_empty_redactor_adds_no_layer() {
        let model: Arc<dyn Provider> = Model::new(vec![]);
        let wrapped = Redacting::wrap(model.clone(), &Redactor::default());
        assert!(Arc::ptr_eq(&model, &wrapped));
    }

    /// A provider that reasons about the token (cut across two deltas and two blocks) before
    /// answering.
    #[derive(Debug)]
    struct Thinker;

    impl Provider for Thinker {
        fn label(&self) -> String {
            "fake/thinker".into()
        }

        fn complete<'a>(
            &'a self,
            _request: ChatRequest<'a>,
            events: &'a dyn ProviderEvents,
        ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            Box::pin(async move {
                let (head, tail) = TOKEN.split_at(9);
                let first = format!("the user's token is {head}");
                let second = format!("{tail}, so");
                events.reasoning_delta(&first);
                events.reasoning_delta(&second);
                events.text_delta("Done.");
                Ok(ChatResponse {
                    content: vec![
                        ContentBlock::Reasoning {
                            text: first,
                            signature: Some("sig-a".into()),
                            encrypted: None,
                        },
                        ContentBlock::Reasoning {
                            text: second,
                            signature: Some("sig-b".into()),
                            encrypted: None,
                        },
                        ContentBlock::Reasoning {
                            text: "clean".into(),
                            signature: Some("sig-c".into()),
                            encrypted: None,
                        },
                        ContentBlock::text("Done."),
                    ],
                    stop_reason: StopReason::EndTurn,
                    usage: Usage::default(),
                    answered_by: self.label(),
                    malformed: Vec::new(),
                    repairs: Vec::new(),
                })
            })
        }
    }

    #[test]
    fn reasoning_is_scrubbed_like_text_and_loses_the_signature_it_no_longer_matches() {
        let seen = Seen::default();
        let response = ask(&Redacting::new(Arc::new(Thinker), redactor()), &seen).unwrap();
        let streamed = seen.reasoning.lock().unwrap().concat();
        assert_eq!(
            streamed,
            "the user's token is [redacted: CLAWCAGE_TELEGRAM_TOKEN], so"
        );
        assert_eq!(seen.deltas.lock().unwrap().concat(), "Done.");
        let whole = format!("{response:?}");
        assert!(
            !whole.contains(&TOKEN[..9]) && !whole.contains(&TOKEN[9..]),
            "{whole}"
        );
        let message = ChatMessage::new(clawcage_core::Role::Assistant, response.content.clone());
        assert_eq!(message.reasoning(), format!("{streamed}clean"));
        // As with text blocks: the value ran across two blocks, so the scrubbed whole takes the
        // place of the first, without a signature (none covers the joined text).
        assert_eq!(
            response.content,
            vec![
                ContentBlock::Reasoning {
                    text: format!("{streamed}clean"),
                    signature: None,
                    encrypted: None,
                },
                ContentBlock::text("Done."),
            ]
        );
        // Sent back, a reasoning block holding the value is scrubbed and unsigned too.
        let sent = ChatMessage::new(
            clawcage_core::Role::Assistant,
            vec![ContentBlock::Reasoning {
                text: format!("saw {TOKEN}"),
                signature: Some("sig".into()),
                encrypted: None,
            }],
        );
        let scrubbed = redact_message(&redactor(), &sent);
        assert!(message_contains(&redactor(), &sent));
        assert_eq!(
            scrubbed.content[0],
            ContentBlock::Reasoning {
                text: "saw [redacted: CLAWCAGE_TELEGRAM_TOKEN]".into(),
                signature: None,
                encrypted: None,
            }
        );
    }
}
