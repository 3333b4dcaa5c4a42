//! The wire protocol: JSON text frames in OpenClaw's shapes. A client sends requests
//! `{"type":"req","id","method","params"}`; the gateway answers each with
//! `{"type":"res","id","ok":true,"payload"}` or `{"type":"res","id","ok":false,"error":{"code",
//! "message","retryable"}}`, and pushes events `{"type":"event","event","payload","seq"}`, where
//! `seq` is the session's event number for `agent` and `chat` events (so one serialised frame
//! serves every subscriber) and absent for the others. This module parses requests, builds
//! frames, and turns an [`AgentEvent`] into its `agent` frame and, for the text, end and failure
//! of a run, the derived `chat` frame.

use clawcage_agent::events::{AgentEvent, Stream};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// The protocol version this gateway speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// The methods, as `hello-ok` lists them.
pub const METHODS: &[&str] = &[
    "health",
    "status",
    "sessions.list",
    "sessions.rename",
    "sessions.reset",
    "sessions.delete",
    "sessions.subscribe",
    "sessions.unsubscribe",
    "chat.send",
    "chat.history",
    "chat.abort",
    "agent",
    "agent.wait",
    "tools.list",
    "cron.list",
    "cron.add",
    "cron.remove",
    "subagents.list",
    "subagents.stop",
    "pairing.list",
    "pairing.approve",
    "exec.approval.list",
    "exec.approval.resolve",
    "exec.approval.policy",
];

/// The events, as `hello-ok` lists them.
pub const EVENTS: &[&str] = &[
    "connect.challenge",
    "agent",
    "chat",
    "gap",
    "session.deleted",
    "tick",
    "shutdown",
    "exec.approval.requested",
    "exec.approval.resolved",
];

/// Why a request failed, as the `error.code` of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The frame is not a request (not JSON, not an object, no id or method).
    InvalidRequest,
    /// No such method.
    UnknownMethod,
    /// The parameters are missing or of the wrong type.
    InvalidParams,
    /// The token is missing or wrong.
    Unauthorized,
    /// No such run, session, job or sub-agent.
    NotFound,
    /// Too many requests; try again later.
    RateLimited,
    /// The session's queue is full and its drop policy (`drop = new`) refused the message.
    QueueFull,
    /// The gateway cannot do it now (shutting down, cron owned elsewhere).
    Unavailable,
    /// The state does not allow it (a session with a run in flight cannot be deleted).
    Conflict,
    /// Something failed inside the gateway (a file could not be read or written).
    Internal,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "INVALID_REQUEST",
            Code::UnknownMethod => "UNKNOWN_METHOD",
            Code::InvalidParams => "INVALID_PARAMS",
            Code::Unauthorized => "UNAUTHORIZED",
            Code::NotFound => "NOT_FOUND",
            Code::RateLimited => "RATE_LIMITED",
            Code::QueueFull => "QUEUE_FULL",
            Code::Unavailable => "UNAVAILABLE",
            Code::Conflict => "CONFLICT",
            Code::Internal => "INTERNAL",
        }
    }

    /// Whether the same request may succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Code::RateLimited | Code::QueueFull | Code::Unavailable | Code::Internal
        )
    }
}

/// A failed request: the code and a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayError {
    /// The code.
    pub code: Code,
    /// What went wrong and what to do next.
    pub message: String,
}

impl GatewayError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Wrong parameters of `method`.
    pub fn params(method: &str, why: impl std::fmt::Display) -> Self {
        Self::new(
            Code::InvalidParams,
            format!("invalid params for {method}: {why}; see docs/gateway-protocol.md"),
        )
    }

    /// A failure of the gateway's own files.
    pub fn internal(what: &str, error: impl std::fmt::Display) -> Self {
        Self::new(
            Code::Internal,
            format!("{what}: {error}; check the state directory's permissions and free space"),
        )
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The id to answer under (a string or a number, echoed as sent).
    pub id: Value,
    /// The method.
    pub method: String,
    /// The parameters (`{}` when absent).
    pub params: Value,
}

/// Reads a request frame. On failure, returns the id when one could be read (so the error can
/// be answered under it) and the error.
pub fn parse_request(text: &str) -> Result<Request, (Value, GatewayError)> {
    let value: Value = serde_json::from_str(text).map_err(|error| {
        (
            Value::Null,
            GatewayError::new(
                Code::InvalidRequest,
                format!("the frame is not valid JSON ({error}); send {{\"type\":\"req\",\"id\":\"1\",\"method\":\"health\",\"params\":{{}}}}"),
            ),
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err((
            Value::Null,
            GatewayError::new(Code::InvalidRequest, "the frame is not a JSON object"),
        ));
    };
    let id = match object.remove("id") {
        Some(id @ Value::String(_))
            if id.as_str().is_some_and(|s| !s.is_empty() && s.len() <= 128) =>
        {
            id
        }
        Some(id @ Value::Number(_)) => id,
        _ => {
            return Err((
                Value::Null,
                GatewayError::new(
                    Code::InvalidRequest,
                    "the request has no id: give each request a string id of 1 to 128 characters",
                ),
            ));
        }
    };
    if object.get("type").and_then(Value::as_str) != Some("req") {
        return Err((
            id,
            GatewayError::new(Code::InvalidRequest, "the frame's type must be \"req\""),
        ));
    }
    let method = match object.remove("method") {
        Some(Value::String(method)) if !method.is_empty() => method,
        _ => {
            return Err((
                id,
                GatewayError::new(Code::InvalidRequest, "the request has no method"),
            ));
        }
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => json!({}),
        Some(params @ Value::Object(_)) => params,
        Some(_) => {
            return Err((
                id,
                GatewayError::params(&method, "params must be a JSON object"),
            ));
        }
    };
    Ok(Request { id, method, params })
}

/// A successful response.
pub fn ok(id: &Value, payload: Value) -> Utf8Bytes {
    json!({"type": "res", "id": id, "ok": true, "payload": payload})
        .to_string()
        .into()
}

/// A failed response.
pub fn err(id: &Value, error: &GatewayError) -> Utf8Bytes {
    json!({
        "type": "res",
        "id": id,
        "ok": false,
        "error": {
            "code": error.code.as_str(),
            "message": error.message,
            "retryable": error.code.retryable(),
        },
    })
    .to_string()
    .into()
}

/// An event frame.
pub fn event(name: &str, payload: Value, seq: Option<u64>) -> Utf8Bytes {
    let mut frame = json!({"type": "event", "event": name, "payload": payload});
    if let Some(seq) = seq {
        frame["seq"] = json!(seq);
    }
    frame.to_string().into()
}

/// The frames an agent event is sent as: its `agent` frame, then the `chat` frame derived from
/// it, if any.
pub fn agent_frames(event: &AgentEvent) -> Vec<Utf8Bytes> {
    let mut frames = Vec::with_capacity(2);
    let payload = serde_json::to_value(event).unwrap_or(Value::Null);
    frames.push(self::event("agent", payload, Some(event.seq)));
    if let Some(chat) = chat_payload(event) {
        frames.push(self::event("chat", chat, Some(event.seq)));
    }
    frames
}

/// The `chat` view of an agent event: `delta` for streamed text, `final` with the answer and
/// usage, `aborted`, `error`. Other events have none.
pub fn chat_payload(event: &AgentEvent) -> Option<Value> {
    let base = |state: &str| {
        json!({
            "runId": event.run_id,
            "sessionKey": event.session_key,
            "seq": event.seq,
            "state": state,
        })
    };
    match (event.stream, event.phase()) {
        (Stream::Assistant, _) => {
            let delta = event.data.get("delta")?.as_str()?;
            let mut payload = base("delta");
            payload["delta"] = json!(delta);
            Some(payload)
        }
        (Stream::Lifecycle, Some("end")) => {
            let mut payload = base("final");
            payload["message"] = json!({
                "role": "assistant",
                "content": [{"type": "text", "text": event.data.get("text").cloned().unwrap_or_default()}],
            });
            payload["usage"] = event.data.get("usage").cloned().unwrap_or_default();
            payload["stopReason"] = event.data.get("end").cloned().unwrap_or_default();
            Some(payload)
        }
        (Stream::Lifecycle, Some("error")) => {
            let aborted = event.data.get("aborted").and_then(Value::as_bool) == Some(true);
            let mut payload = base(if aborted { "aborted" } else { "error" });
            payload["errorMessage"] = event.data.get("message").cloned().unwrap_or_default();
            Some(payload)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_and_refusals_keep_the_id() {
        let request =
            parse_request(r#"{"type":"req","id":"7","method":"health"}"#).expect("a request");
        assert_eq!(request.params, json!({}));
        assert_eq!(request.method, "health");
        let (id, error) = parse_request("not json").expect_err("refused");
        assert_eq!((id, error.code), (Value::Null, Code::InvalidRequest));
        let (id, error) =
            parse_request(r#"{"type":"req","id":3,"method":"x","params":[1]}"#).expect_err("x");
        assert_eq!((id, error.code), (json!(3), Code::InvalidParams));
        let (id, error) =
            parse_request(r#"{"type":"event","id":"a","method":"x"}"#).expect_err("x");
        assert_eq!((id, error.code), (json!("a"), Code::InvalidRequest));
        let (_, error) = parse_request(r#"{"type":"req","id":"","method":"x"}"#).expect_err("x");
        assert_eq!(error.code, Code::InvalidRequest);
    }

    #[test]
    fn chat_frames_follow_the_agent_events() {
        let mut delta = AgentEvent::new("k", "r", Stream::Assistant, json!({"delta": "Hi"}));
        delta.seq = 4;
        let frames = agent_frames(&delta);
        assert_eq!(frames.len(), 2);
        let chat: Value = serde_json::from_str(frames[1].as_str()).expect("json");
        assert_eq!(chat["event"], "chat");
        assert_eq!(chat["seq"], 4);
        assert_eq!(chat["payload"]["state"], "delta");
        assert_eq!(chat["payload"]["delta"], "Hi");
        let tool = AgentEvent::new("k", "r", Stream::Tool, json!({"phase": "start"}));
        assert_eq!(agent_frames(&tool).len(), 1);
        let aborted = AgentEvent::new(
            "k",
            "r",
            Stream::Lifecycle,
            json!({"phase": "error", "aborted": true, "message": "stopped"}),
        );
        assert_eq!(
            chat_payload(&aborted).map(|p| p["state"].clone()),
            Some(json!("aborted"))
        );
    }
}
