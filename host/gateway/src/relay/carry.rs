//! What a relayed connection needs to be carried over to the next active gateway when the one
//! it is relayed to goes away: the requests sent on and not answered yet (their fate is not
//! known, so the client is told), the sessions the client follows with the `seq` of the last
//! `agent` event passed to it of each (the next active gateway is asked for exactly the events
//! after it), and the requests the client sends while no gateway is there (held, in order, and
//! sent on once one is). The relay looks into each frame only this far; the frames themselves
//! pass unchanged.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Deserialize;

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::protocol::{self, Code, GatewayError};

/// Requests a client may send while its connection waits for the next active gateway; one
/// more closes the connection (it should slow down and connect again).
pub(crate) const MAX_HELD_REQUESTS: usize = 256;

/// Bytes of requests held for one connection at most, whatever their number (a connection's
/// frames may each be as large as the gateway takes).
pub(crate) const MAX_HELD_BYTES: usize = 1 << 20;

/// The prefix of the ids of the relay's own requests (re-subscriptions), which a client's ids
/// do not take.
const OWN_ID_PREFIX: &str = "clawcage-relay:";

/// A request sent on, waiting for its answer.
struct Waiting {
    id: Value,
    method: String,
    session: Option<String>,
    since: Option<u64>,
}

/// What kind of frame one from the active gateway is (its other fields skipped over).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    event: Option<Cow<'a, str>>,
}

/// Where an `agent` event stands: its session and `seq`.
#[derive(Deserialize)]
struct AgentPeek<'a> {
    #[serde(default)]
    seq: Option<u64>,
    #[serde(borrow)]
    payload: SessionPeek<'a>,
}

#[derive(Deserialize)]
struct SessionPeek<'a> {
    #[serde(rename = "sessionKey", default, borrow)]
    session_key: Option<Cow<'a, str>>,
}

/// What to do with a frame from the active gateway.
#[derive(Debug, PartialEq)]
pub(crate) enum FromGateway {
    /// Pass it to the client.
    Pass,
    /// The answer to the relay's own request: not the client's.
    Keep,
    /// The answer to the relay's own request, which asks for this next (the next page of a
    /// re-subscription).
    Send(Utf8Bytes),
}

/// One relayed connection's requests in flight and followed sessions.
#[derive(Default)]
pub(crate) struct Carried {
    waiting: HashMap<String, Waiting>,
    /// Followed sessions: the `seq` of the last event of each passed to the client.
    followed: BTreeMap<String, u64>,
    /// The relay's own requests in flight, by id: the session each re-subscribes.
    own: HashMap<String, String>,
    next_own: u64,
    /// Requests held while no gateway is there.
    held: VecDeque<Utf8Bytes>,
}

fn text_of(frame: &Value, field: &str) -> Option<String> {
    frame.get(field).and_then(Value::as_str).map(str::to_string)
}

impl Carried {
    /// Takes note of `frame`, sent by the client to the active gateway.
    pub(crate) fn sent(&mut self, frame: &str) {
        let Ok(frame) = serde_json::from_str::<Value>(frame) else {
            return;
        };
        if frame["type"] != "req" {
            return;
        }
        let method = text_of(&frame, "method").unwrap_or_default();
        let params = &frame["params"];
        let session = text_of(params, "sessionKey");
        if method == "sessions.unsubscribe"
            && let Some(session) = &session
        {
            self.followed.remove(session);
        }
        self.waiting.insert(
            frame["id"].to_string(),
            Waiting {
                id: frame["id"].clone(),
                method,
                session,
                since: params["since"].as_u64(),
            },
        );
    }

    /// Takes note of `frame`, sent by the active gateway to the client, and says what to do
    /// with it.
    pub(crate) fn received(&mut self, frame: &str) -> FromGateway {
        // Every frame passes here: only what is looked at is read out of it, and an event's
        // text is scanned over, not built into a tree.
        let Ok(peek) = serde_json::from_str::<Peek<'_>>(frame) else {
            return FromGateway::Pass;
        };
        match (peek.kind.as_ref(), peek.event.as_deref()) {
            ("res", _) => {
                let Ok(frame) = serde_json::from_str::<Value>(frame) else {
                    return FromGateway::Pass;
                };
                let id = frame["id"].to_string();
                if let Some(session) = self.own.remove(&id) {
                    return self.own_answered(session, &frame);
                }
                if let Some(waiting) = self.waiting.remove(&id)
                    && waiting.method == "sessions.subscribe"
                    && frame["ok"] == true
                    && let Some(session) = waiting.session
                {
                    self.subscribed(session, waiting.since, &frame["payload"]);
                }
                FromGateway::Pass
            }
            // The active gateway stopping says so before it closes: the relay carries the
            // connection over to the next one, so it is not the client's news.
            ("event", Some("shutdown")) => FromGateway::Keep,
            ("event", Some("agent")) if !self.followed.is_empty() => {
                if let Ok(AgentPeek {
                    seq: Some(seq),
                    payload:
                        SessionPeek {
                            session_key: Some(session),
                        },
                }) = serde_json::from_str::<AgentPeek<'_>>(frame)
                    && let Some(last) = self.followed.get_mut(session.as_ref())
                {
                    *last = (*last).max(seq);
                }
                FromGateway::Pass
            }
            _ => FromGateway::Pass,
        }
    }

    /// A subscription answered: followed from `since` (its replay comes next), or from the
    /// last event stored; one that ends after its page (`more`) is not live.
    fn subscribed(&mut self, session: String, since: Option<u64>, payload: &Value) {
        if payload["more"] == true {
            self.followed.remove(&session);
            return;
        }
        let from = since.or_else(|| payload["lastSeq"].as_u64()).unwrap_or(0);
        self.followed.insert(session, from);
    }

    fn own_answered(&mut self, session: String, frame: &Value) -> FromGateway {
        if frame["ok"] != true {
            tracing::warn!(session, answer = %frame, "a relayed client's session could not be followed again");
            self.followed.remove(&session);
            return FromGateway::Keep;
        }
        let payload = &frame["payload"];
        if payload["more"] == true
            && let Some(next) = payload["nextSince"].as_u64()
        {
            // More was missed than one page: the next page, until the subscription is live.
            return FromGateway::Send(self.subscribe(session, next));
        }
        FromGateway::Keep
    }

    fn subscribe(&mut self, session: String, since: u64) -> Utf8Bytes {
        self.next_own += 1;
        let id = json!(format!("{OWN_ID_PREFIX}{}", self.next_own));
        let frame = json!({
            "type": "req",
            "id": id,
            "method": "sessions.subscribe",
            "params": {"sessionKey": session, "since": since},
        });
        self.own.insert(id.to_string(), session);
        frame.to_string().into()
    }

    /// The gateway went away: the answers the client gets for its requests still in flight
    /// (they may or may not have been done). The relay's own are forgotten.
    pub(crate) fn unanswered(&mut self) -> Vec<Utf8Bytes> {
        self.own.clear();
        self.waiting
            .drain()
            .map(|(_, waiting)| {
                let idempotent = matches!(waiting.method.as_str(), "chat.send" | "agent");
                let advice = if idempotent {
                    "send it again with the same idempotencyKey: it is not run twice"
                } else {
                    "send it again"
                };
                protocol::err(
                    &waiting.id,
                    &GatewayError::new(
                        Code::Unavailable,
                        format!(
                            "the active gateway went away before it answered {} (it may have been done): {advice} (this connection goes on with the host that takes over)",
                            waiting.method
                        ),
                    ),
                )
            })
            .collect()
    }

    /// Holds `frame`, sent by the client while no gateway is there: false when too many (or
    /// too many bytes) are held already.
    pub(crate) fn hold(&mut self, frame: Utf8Bytes) -> bool {
        let bytes: usize = self.held.iter().map(|held| held.len()).sum();
        if self.held.len() >= MAX_HELD_REQUESTS || bytes + frame.len() > MAX_HELD_BYTES {
            return false;
        }
        self.held.push_back(frame);
        true
    }

    /// What to send the next active gateway first: a subscription again of each followed
    /// session from the last event the client got, then the requests held meanwhile (each
    /// noted as sent).
    pub(crate) fn resume(&mut self) -> Vec<Utf8Bytes> {
        let followed: Vec<(String, u64)> = self
            .followed
            .iter()
            .map(|(session, last)| (session.clone(), *last))
            .collect();
        let mut frames: Vec<Utf8Bytes> = followed
            .into_iter()
            .map(|(session, last)| self.subscribe(session, last))
            .collect();
        let held: Vec<Utf8Bytes> = self.held.drain(..).collect();
        for frame in held {
            self.sent(frame.as_str());
            frames.push(frame);
        }
        frames
    }

    /// The sessions followed, with the last `seq` passed of each.
    #[cfg(test)]
    pub(crate) fn followed(&self) -> &BTreeMap<String, u64> {
        &self.followed
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "tests fail by panicking"
    )]

    use super::*;

    fn req(id: Value, method: &str, params: Value) -> String {
        json!({"type": "req", "id": id, "method": method, "params": params}).to_string()
    }

    fn res(id: Value, payload: Value) -> String {
        json!({"type": "res", "id": id, "ok": true, "payload": payload}).to_string()
    }

    fn agent(session: &str, seq: u64) -> String {
        protocol::event(
            "agent",
            json!({"sessionKey": session, "seq": seq, "stream": "assistant"}),
            Some(seq),
        )
        .to_string()
    }

    #[test]
    fn followed_sessions_are_subscribed_again_after_the_last_event_passed() {
        let mut carried = Carried::default();
        carried.sent(&req(
            json!(1),
            "sessions.subscribe",
            json!({"sessionKey": "a"}),
        ));
        carried.sent(&req(
            json!("x"),
            "sessions.subscribe",
            json!({"sessionKey": "b", "since": 3}),
        ));
        assert_eq!(
            carried.received(&res(json!(1), json!({"lastSeq": 7, "more": false}))),
            FromGateway::Pass
        );
        assert_eq!(
            carried.received(&res(json!("x"), json!({"lastSeq": 9, "more": false}))),
            FromGateway::Pass
        );
        for frame in [agent("a", 8), agent("b", 4), agent("b", 5), agent("c", 50)] {
            assert_eq!(carried.received(&frame), FromGateway::Pass);
        }
        // A chat frame carries the same seq: nothing new.
        carried.received(&protocol::event(
            "chat",
            json!({"sessionKey": "a", "seq": 99}),
            Some(99),
        ));
        assert_eq!(
            carried.followed().clone(),
            BTreeMap::from([("a".to_string(), 8), ("b".to_string(), 5)])
        );
        // Unsubscribed: no longer followed.
        carried.sent(&req(
            json!(2),
            "sessions.unsubscribe",
            json!({"sessionKey": "a"}),
        ));
        carried.received(&res(json!(2), json!({})));
        let resumed: Vec<Value> = carried
            .resume()
            .iter()
            .map(|frame| serde_json::from_str(frame.as_str()).unwrap())
            .collect();
        assert_eq!(resumed.len(), 1);
        assert_eq!(resumed[0]["method"], "sessions.subscribe");
        assert_eq!(resumed[0]["params"], json!({"sessionKey": "b", "since": 5}));
        // Its answer is the relay's, not the client's; a long gap is followed page by page.
        let id = resumed[0]["id"].clone();
        let next = carried.received(&res(id, json!({"more": true, "nextSince": 1005})));
        let FromGateway::Send(next) = next else {
            panic!("{next:?}")
        };
        let next: Value = serde_json::from_str(next.as_str()).unwrap();
        assert_eq!(next["params"]["since"], 1005);
        assert_eq!(
            carried.received(&res(next["id"].clone(), json!({"more": false}))),
            FromGateway::Keep
        );
    }

    #[test]
    fn requests_in_flight_are_answered_and_those_sent_meanwhile_go_on_after() {
        let mut carried = Carried::default();
        carried.sent(&req(
            json!(5),
            "chat.send",
            json!({"sessionKey": "a", "message": "hi"}),
        ));
        carried.sent(&req(json!(6), "agent.wait", json!({"runId": "r"})));
        carried.received(&res(json!(6), json!({"status": "ok"})));
        let answered: Vec<Value> = carried
            .unanswered()
            .iter()
            .map(|frame| serde_json::from_str(frame.as_str()).unwrap())
            .collect();
        assert_eq!(answered.len(), 1, "{answered:?}");
        assert_eq!(answered[0]["id"], 5);
        assert_eq!(answered[0]["error"]["code"], "UNAVAILABLE");
        let message = answered[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("same idempotencyKey"), "{message}");
        assert!(carried.unanswered().is_empty());

        let held = req(
            json!(7),
            "chat.send",
            json!({"sessionKey": "a", "message": "again"}),
        );
        assert!(carried.hold(held.clone().into()));
        for _ in 1..MAX_HELD_REQUESTS {
            assert!(carried.hold("{}".into()));
        }
        assert!(!carried.hold("{}".into()), "a flood is refused");
        // So is a megabyte, in however few frames.
        let mut bulky = Carried::default();
        let half = "x".repeat(MAX_HELD_BYTES / 2);
        assert!(bulky.hold(half.clone().into()));
        assert!(!bulky.hold(format!("{half}y").into()));
        let resumed = carried.resume();
        assert_eq!(resumed[0].as_str(), held);
        // Sent on now: in flight again.
        assert_eq!(carried.unanswered().len(), 1);
    }

    #[test]
    fn a_paged_subscription_is_not_followed_and_malformed_frames_pass() {
        let mut carried = Carried::default();
        carried.sent(&req(
            json!(1),
            "sessions.subscribe",
            json!({"sessionKey": "a", "since": 0}),
        ));
        carried.received(&res(json!(1), json!({"more": true, "nextSince": 1000})));
        assert!(carried.followed().is_empty());
        carried.sent("not json");
        assert_eq!(carried.received("not json either"), FromGateway::Pass);
        let shutdown = protocol::event("shutdown", json!({"restartExpected": true}), None);
        assert_eq!(carried.received(shutdown.as_str()), FromGateway::Keep);
        assert_eq!(
            carried.received(&res(json!(99), json!({}))),
            FromGateway::Pass
        );
    }
}
