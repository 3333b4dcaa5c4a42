//! Approvals over the gateway: every connection whose `connect` asked for the scope
//! `operator.approvals` (or `operator.admin`) is an operator front end of the runtime's approvals
//! broker while it stays connected. It receives `exec.approval.requested` (the requests waiting
//! when it connects first) and `exec.approval.resolved`, and may answer with
//! `exec.approval.resolve {id, decision}`; `exec.approval.list` shows what waits;
//! `exec.approval.policy` sets a session's own exec and ask modes. A connection
//! without the scope hears none of it and is refused if it tries to answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawcage_agent::approvals::{
    ApprovalBroker, ApprovalError, ApprovalRequest, OperatorEvent, OperatorFilter, SessionPolicy,
};
use clawcage_core::approval::{ApprovalDecision, AskMode, ExecMode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

use crate::connection::Conn;
use crate::hub::Outbox;
use crate::protocol::{self, Code, GatewayError};

/// The scopes that make a connection an approver.
pub const APPROVER_SCOPES: &[&str] = &["operator.approvals", "operator.admin"];

/// The gateway's side of the approvals broker: one operator per approver connection.
pub struct Approvals {
    broker: ApprovalBroker,
    /// Each approver connection's forwarder, stopped when it is removed.
    forwarders: Mutex<HashMap<u64, AbortOnDropHandle<()>>>,
}

/// A request as the protocol sends it.
pub fn request_payload(request: &ApprovalRequest) -> Value {
    json!({
        "id": request.id,
        "sessionKey": request.session_key,
        "toolCallId": request.tool_call_id,
        "tool": request.tool,
        "plan": request.plan,
        "summary": request.plan.summary(),
        "description": request.describe(),
        "reasons": request.reasons,
        "expiresAtMs": request.expires_at_ms,
    })
}

impl Approvals {
    /// The gateway's approvals over `broker`.
    pub fn new(broker: ApprovalBroker) -> Arc<Approvals> {
        Arc::new(Approvals {
            broker,
            forwarders: Mutex::new(HashMap::new()),
        })
    }

    /// Makes the connection behind `outbox` an operator until [`Approvals::disconnect`]: of
    /// `session`'s requests (and its sub-agents') when it names one, else of every request.
    pub fn connect(&self, outbox: Outbox, session: Option<String>) {
        let mut operator = self.broker.operator(filter(session));
        let id = outbox.id;
        let forwarder = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Some(event) = operator.next().await {
                let frame = match event {
                    OperatorEvent::Requested(request) => {
                        protocol::event("exec.approval.requested", request_payload(&request), None)
                    }
                    OperatorEvent::Resolved { id, decision, by } => protocol::event(
                        "exec.approval.resolved",
                        json!({"id": id, "decision": decision.as_str(), "by": by}),
                        None,
                    ),
                };
                if !outbox.push(frame) {
                    break;
                }
            }
        }));
        // A previous forwarder of the same id is dropped, so stopped.
        self.lock().insert(id, forwarder);
    }

    /// The connection `id` is gone: it stops being an operator.
    pub fn disconnect(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, AbortOnDropHandle<()>>> {
        self.forwarders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `exec.approval.list`: the requests waiting now that the connection may answer.
    pub fn list(&self, conn: &Conn) -> Result<Value, GatewayError> {
        require_approver(conn, "exec.approval.list")?;
        let mine = filter(conn.client.approval_session.clone());
        let pending: Vec<Value> = self
            .broker
            .pending()
            .iter()
            .filter(|request| mine.accepts(request.session_key.as_deref()))
            .map(request_payload)
            .collect();
        Ok(json!({ "pending": pending }))
    }

    /// `exec.approval.resolve {id, decision}`.
    pub fn resolve(&self, conn: &Conn, params: &Value) -> Result<Value, GatewayError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Resolve {
            id: String,
            /// `allow-once`, `allow-always` or `deny`.
            decision: ApprovalDecision,
        }
        require_approver(conn, "exec.approval.resolve")?;
        let resolve: Resolve = serde_json::from_value(params.clone())
            .map_err(|error| GatewayError::params("exec.approval.resolve", error))?;
        let decision = resolve.decision;
        let mine = filter(conn.client.approval_session.clone());
        let theirs = self
            .broker
            .pending()
            .into_iter()
            .find(|request| request.id == resolve.id)
            .is_some_and(|request| !mine.accepts(request.session_key.as_deref()));
        if theirs {
            return Err(GatewayError::new(
                Code::Unauthorized,
                format!(
                    "unauthorized: request `{}` is not of this connection's approvalSession; answer it from a front end of its own session",
                    resolve.id
                ),
            ));
        }
        let by = format!("gateway:{}", conn.client.id);
        match self.broker.resolve(&resolve.id, decision, &by) {
            Ok(()) => Ok(json!({"id": resolve.id, "decision": decision.as_str()})),
            Err(error @ ApprovalError::Unknown(_)) => {
                Err(GatewayError::new(Code::NotFound, error.to_string()))
            }
            Err(error) => Err(GatewayError::new(Code::Internal, error.to_string())),
        }
    }
}

impl Approvals {
    /// `exec.approval.policy {sessionKey, exec?, ask?, reset?}`: sets (or, with `reset`, drops)
    /// a session's own exec and ask modes, and answers the modes that now apply.
    pub fn policy(&self, conn: &Conn, params: &Value) -> Result<Value, GatewayError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Policy {
            session_key: String,
            exec: Option<ExecMode>,
            ask: Option<AskMode>,
            #[serde(default)]
            reset: bool,
        }
        const METHOD: &str = "exec.approval.policy";
        require_approver(conn, METHOD)?;
        let policy: Policy = serde_json::from_value(params.clone())
            .map_err(|error| GatewayError::params(METHOD, error))?;
        crate::keys::check_key(&policy.session_key)?;
        let own = SessionPolicy {
            exec: policy.exec,
            ask: policy.ask,
        };
        match (policy.reset, own == SessionPolicy::default()) {
            (true, true) => self.broker.set_session_policy(&policy.session_key, None),
            (true, false) => {
                return Err(GatewayError::params(
                    METHOD,
                    "reset goes back to the configuration's modes; give it alone",
                ));
            }
            (false, true) => {}
            (false, false) => self
                .broker
                .set_session_policy(&policy.session_key, Some(own)),
        }
        let (exec, ask, own) = self.broker.effective(Some(&policy.session_key));
        Ok(json!({"sessionKey": policy.session_key, "exec": exec, "ask": ask, "own": own}))
    }
}

/// What an approver connection approves: one session (and its sub-agents) or every request.
fn filter(session: Option<String>) -> OperatorFilter {
    session.map_or(OperatorFilter::All, OperatorFilter::Session)
}

fn require_approver(conn: &Conn, method: &str) -> Result<(), GatewayError> {
    if conn.client.approver {
        Ok(())
    } else {
        Err(GatewayError::new(
            Code::Unauthorized,
            format!(
                "{method} needs a connection allowed to approve: connect with scopes [\"operator.approvals\"]"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_core::approval::ExecPlan;

    #[test]
    fn a_write_request_carries_its_description_for_people() {
        let request = ApprovalRequest {
            id: "apr-1".into(),
            session_key: Some("agent:main:web:x".into()),
            tool_call_id: Some("toolu_1".into()),
            tool: "write".into(),
            plan: ExecPlan {
                command: "create or change /ws/a.txt".into(),
                commands: Vec::new(),
                writes: Vec::new(),
            },
            reasons: Vec::new(),
            expires_at_ms: 0,
        };
        let payload = request_payload(&request);
        assert_eq!(payload["tool"], "write");
        assert_eq!(payload["summary"], "");
        assert_eq!(
            payload["description"],
            "a tool wants to write in the read-only workspace:\n  create or change /ws/a.txt"
        );
    }
}
