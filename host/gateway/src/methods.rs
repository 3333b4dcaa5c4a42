//! The methods: each reads its parameters, asks the [`Hub`](crate::hub::Hub) or the runtime's
//! pieces, and answers under the request's id. Parameters are checked before anything happens;
//! wrong ones get `INVALID_PARAMS` with what was expected.

use clawcage_core::command::Command;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::session::{Admission, DropReason};
use clawcage_core::scheduler::JobRequest;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Gateway;
use crate::connection::Conn;
use crate::hub::{RunStatus, Sent, admission_json};
use crate::keys::{check_key, check_readable_key};
use crate::protocol::{Code, GatewayError, Request};

/// The longest message a client may send, in characters.
pub const MAX_MESSAGE_CHARS: usize = 100_000;

/// The longest `agent.wait` (and `agent`'s wait for its final answer).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

fn params<T: DeserializeOwned>(method: &str, value: &Value) -> Result<T, GatewayError> {
    serde_json::from_value(value.clone()).map_err(|error| GatewayError::params(method, error))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendParams {
    session_key: String,
    message: String,
    #[serde(default)]
    idempotency_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionOnly {
    session_key: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Subscribe {
    session_key: String,
    #[serde(default)]
    since: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct History {
    session_key: String,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Abort {
    session_key: String,
    #[serde(default)]
    run_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wait {
    run_id: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct List {
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rename {
    session_key: String,
    title: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CronAdd {
    message: String,
    session_key: String,
    #[serde(default)]
    every_seconds: Option<u64>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct ById {
    id: String,
}

/// Answers `request`.
pub async fn dispatch(gateway: &Arc<Gateway>, conn: &Arc<Conn>, request: Request) {
    // A session another host of the cluster serves: asked of that host.
    if let Some(key) = crate::forward::forwardable(gateway, conn, &request).await {
        return crate::forward::forward(gateway, conn, request, key).await;
    }
    if let Some(host) = crate::forward::approval_host(conn, &request) {
        return crate::forward::answer_approval(conn, &host, request).await;
    }
    let Request { id, method, params } = request;
    let result = match method.as_str() {
        "health" => {
            Ok(json!({"ok": true, "uptimeMs": gateway.hub.started.elapsed().as_millis() as u64}))
        }
        "status" => Ok(gateway.status()),
        "connect" => Err(GatewayError::new(
            Code::InvalidRequest,
            "already connected: connect is only the first request",
        )),
        "chat.send" => return chat_send(gateway, conn, &id, &params, false).await,
        "agent" => return chat_send(gateway, conn, &id, &params, true).await,
        "agent.wait" => agent_wait(gateway, &params).await,
        "chat.abort" => chat_abort(gateway, &params).await,
        "chat.history" => chat_history(gateway, &params).await,
        "sessions.list" => self::params::<List>(&method, &params).and_then(|list| {
            gateway
                .hub
                .list_sessions(list.limit.unwrap_or(100).clamp(1, 1000))
        }),
        "sessions.subscribe" => {
            match self::params::<Subscribe>(&method, &params)
                .and_then(|p| check_readable_key(&p.session_key).map(|()| p))
            {
                Ok(p) => {
                    match gateway
                        .hub
                        .subscribe(
                            &p.session_key,
                            p.since,
                            &conn.outbox,
                            &conn.subscriptions,
                            &id,
                        )
                        .await
                    {
                        // The response was queued with the replay.
                        Ok(()) => return,
                        Err(error) => Err(error),
                    }
                }
                Err(error) => Err(error),
            }
        }
        "sessions.unsubscribe" => self::params::<SessionOnly>(&method, &params).map(|p| {
            gateway.hub.unsubscribe(&p.session_key, &conn.outbox);
            conn.subscriptions().remove(&p.session_key);
            json!({"sessionKey": p.session_key})
        }),
        "sessions.reset" | "sessions.delete" => {
            match self::params::<SessionOnly>(&method, &params)
                .and_then(|p| check_key(&p.session_key).map(|()| p))
            {
                Ok(p) => {
                    let delete = method == "sessions.delete";
                    gateway
                        .hub
                        .reset(&p.session_key, delete)
                        .await
                        .map(|()| json!({"sessionKey": p.session_key, "ok": true}))
                }
                Err(error) => Err(error),
            }
        }
        "sessions.rename" => self::params::<Rename>(&method, &params)
            .and_then(|p| check_key(&p.session_key).map(|()| p))
            .and_then(|p| gateway.hub.rename(&p.session_key, &p.title)),
        "tools.list" => Ok(tools_list(gateway)),
        "cron.list" | "cron.add" | "cron.remove" => cron(gateway, &method, &params).await,
        "subagents.list" => Ok(match &gateway.hub.parts.subagents {
            Some(manager) => json!({"enabled": true, "runs": manager.records()}),
            None => json!({"enabled": false, "runs": []}),
        }),
        "subagents.stop" => subagents_stop(gateway, &params),
        "pairing.list" | "pairing.approve" => pairing(gateway, &method, &params).await,
        crate::channels::elsewhere::CONVERSATION_METHOD => conversation(gateway, &params),
        "exec.approval.list" | "exec.approval.resolve" | "exec.approval.policy" => match gateway
            .approvals
            .get()
        {
            Some(approvals) if method == "exec.approval.list" => match approvals.list(conn) {
                // Linked to the other hosts (they serve partitions): theirs too.
                Ok(here) if gateway.owners.get().is_some() && !conn.forwarded => {
                    let request = Request {
                        id: id.clone(),
                        method: method.clone(),
                        params: params.clone(),
                    };
                    Ok(crate::forward::list_everywhere(conn, here, &request).await)
                }
                other => other,
            },
            Some(approvals) if method == "exec.approval.policy" => approvals.policy(conn, &params),
            Some(approvals) => approvals.resolve(conn, &params),
            None => Err(GatewayError::new(
                Code::Unavailable,
                "approvals are off: set [approvals] ask = \"on-miss\" or \"always\" (or exec = \"allowlist\") to use them",
            )),
        },
        other => Err(GatewayError::new(
            Code::UnknownMethod,
            format!(
                "unknown method `{}`; the methods are listed in hello-ok (features.methods)",
                other.chars().take(64).collect::<String>()
            ),
        )),
    };
    conn.respond(&id, result);
}

/// `channels.conversation {sessionKey, by, line?, at, proof}`, asked by the host polling a
/// channel of the host serving one of its conversations, with the proof that a host asks (no
/// client can make it): posts the approval requests of the session's turns to the
/// conversation from now on, and carries out the command `line` (`/queue …`, `/approve …`) of
/// the approved person `by`.
fn conversation(gateway: &Gateway, params: &Value) -> Result<Value, GatewayError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Conversation {
        session_key: String,
        by: String,
        #[serde(default)]
        line: Option<String>,
        at: u64,
        proof: String,
    }
    const METHOD: &str = crate::channels::elsewhere::CONVERSATION_METHOD;
    let asked: Conversation = self::params(METHOD, params)?;
    check_key(&asked.session_key)?;
    gateway.hub.check_served(&asked.session_key)?;
    let channels = gateway.channels.get().ok_or_else(|| {
        GatewayError::new(
            Code::Unavailable,
            "this host runs no channels: give every host of the cluster the same [channels]",
        )
    })?;
    channels
        .conversation(
            (&asked.session_key, &asked.by, asked.line.as_deref()),
            asked.at,
            &asked.proof,
        )
        .map(|text| json!({"sessionKey": asked.session_key, "text": text}))
}

async fn chat_send(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    id: &Value,
    params: &Value,
    wait_final: bool,
) {
    let method = if wait_final { "agent" } else { "chat.send" };
    let send = match self::params::<SendParams>(method, params).and_then(|send| {
        check_key(&send.session_key)?;
        if send.message.trim().is_empty() {
            return Err(GatewayError::params(method, "message is empty"));
        }
        if send.message.chars().count() > MAX_MESSAGE_CHARS {
            return Err(GatewayError::params(
                method,
                format!("message is longer than {MAX_MESSAGE_CHARS} characters"),
            ));
        }
        if send
            .idempotency_key
            .as_ref()
            .is_some_and(|key| key.is_empty() || key.len() > 128)
        {
            return Err(GatewayError::params(
                method,
                "idempotencyKey must have 1 to 128 characters",
            ));
        }
        Ok(send)
    }) {
        Ok(send) => send,
        Err(error) => return conn.respond(id, Err(error)),
    };
    // `/queue ...` is a command: it answers with the session's queue settings, runs no turn.
    if let Some(Ok(Command::Queue(line))) = Command::parse(&send.message) {
        let said = gateway
            .hub
            .parts
            .sessions
            .queue_command(&send.session_key, &line);
        return conn.respond(
            id,
            said.map(|text| {
                json!({
                    "status": "command",
                    "command": "queue",
                    "sessionKey": send.session_key,
                    "text": text,
                })
            })
            .map_err(|error| GatewayError::new(Code::InvalidParams, error.to_string())),
        );
    }
    let allowed = conn
        .sends
        .lock()
        .map(|mut limit| limit.take())
        .unwrap_or(true);
    if !allowed {
        return conn.respond(
            id,
            Err(GatewayError::new(
                Code::RateLimited,
                format!(
                    "rate limited: at most {} chat.send and agent requests per minute on one connection",
                    gateway.settings.sends_per_minute
                ),
            )),
        );
    }
    let sent = gateway
        .hub
        .send(
            &send.session_key,
            send.message,
            send.idempotency_key.as_deref(),
            Some((&conn.outbox, &conn.subscriptions)),
            |run_id, admission, into| {
                conn.respond(id, acknowledgement(run_id, admission, into, wait_final))
            },
        )
        .await;
    let run_id = match sent {
        Ok(Sent::Started(run_id)) => run_id,
        Ok(Sent::Refused) => return,
        Ok(Sent::Duplicate(run_id, status)) => {
            conn.respond(
                id,
                Ok(json!({"runId": run_id, "status": status.as_str(), "duplicate": true})),
            );
            if !wait_final || status != RunStatus::InFlight {
                if wait_final
                    && let Some(Some(result)) = gateway.hub.wait_run(&run_id, Duration::ZERO).await
                {
                    conn.respond(id, Ok(result.payload));
                }
                return;
            }
            run_id
        }
        Err(error) => return conn.respond(id, Err(error)),
    };
    if wait_final {
        match gateway.hub.wait_run(&run_id, MAX_WAIT).await {
            Some(Some(result)) => conn.respond(id, Ok(result.payload)),
            _ => conn.respond(id, Ok(json!({"runId": run_id, "status": "timeout"}))),
        }
    }
}

/// The answer to a `chat.send` or `agent` the session's queue admitted (or refused).
fn acknowledgement(
    run_id: &str,
    admission: &Admission,
    into: Option<&str>,
    wait_final: bool,
) -> Result<Value, GatewayError> {
    if let Admission::Dropped { reason } = admission {
        let code = match reason {
            DropReason::QueueFull { .. } => Code::QueueFull,
            _ => Code::Unavailable,
        };
        return Err(GatewayError::new(code, reason.to_string()));
    }
    let mut payload = admission_json(admission);
    payload["runId"] = json!(run_id);
    if *admission == Admission::Started && wait_final {
        payload["status"] = json!("accepted");
    }
    if *admission == Admission::Steered
        && let Some(into) = into
    {
        payload["into"] = json!(into);
    }
    Ok(payload)
}

async fn agent_wait(gateway: &Gateway, params: &Value) -> Result<Value, GatewayError> {
    let wait = self::params::<Wait>("agent.wait", params)?;
    let timeout = Duration::from_millis(wait.timeout_ms.unwrap_or(30_000)).min(MAX_WAIT);
    match gateway.hub.wait_run(&wait.run_id, timeout).await {
        Some(Some(result)) => Ok(result.payload),
        Some(None) => Ok(json!({"runId": wait.run_id, "status": "timeout"})),
        None => Err(GatewayError::new(
            Code::NotFound,
            format!(
                "no run `{}`: runs are kept for 10 minutes after they end",
                wait.run_id.chars().take(80).collect::<String>()
            ),
        )),
    }
}

async fn chat_abort(gateway: &Gateway, params: &Value) -> Result<Value, GatewayError> {
    let abort = self::params::<Abort>("chat.abort", params)?;
    check_readable_key(&abort.session_key)?;
    gateway.hub.check_served(&abort.session_key)?;
    if let Some(run_id) = &abort.run_id {
        match gateway.hub.run_status(run_id).await {
            Some((session, _)) if session == abort.session_key => {}
            _ => {
                return Err(GatewayError::new(
                    Code::NotFound,
                    format!("no run `{run_id}` in session {}", abort.session_key),
                ));
            }
        }
    }
    let stopped = gateway
        .hub
        .abort(&abort.session_key, abort.run_id.as_deref());
    Ok(json!({"sessionKey": abort.session_key, "aborted": !stopped.is_empty(), "runIds": stopped}))
}

async fn chat_history(gateway: &Gateway, params: &Value) -> Result<Value, GatewayError> {
    let history = self::params::<History>("chat.history", params)?;
    check_readable_key(&history.session_key)?;
    let limit = history
        .limit
        .unwrap_or(gateway.hub.parts.history_limit)
        .clamp(1, 1000);
    gateway.hub.history(&history.session_key, limit).await
}

fn tools_list(gateway: &Gateway) -> Value {
    let tools: Vec<Value> = gateway
        .hub
        .parts
        .tools
        .tools()
        .map(|tool| {
            let spec = tool.spec();
            json!({
                "name": spec.name,
                "description": spec.description,
                "inputSchema": spec.input_schema,
                "origin": tool.origin(),
                "grants": tool.grants_summary(),
            })
        })
        .collect();
    json!({"tools": tools})
}

async fn cron(gateway: &Gateway, method: &str, params: &Value) -> Result<Value, GatewayError> {
    let Some(scheduler) = gateway.hub.parts.cron.clone() else {
        return Err(GatewayError::new(
            Code::Unavailable,
            format!(
                "cron is not available in this gateway: {}",
                gateway.hub.parts.cron_note
            ),
        ));
    };
    let refused = |why: String| GatewayError::new(Code::InvalidParams, why);
    let work: Box<dyn FnOnce() -> Result<Value, GatewayError> + Send> = match method {
        "cron.list" => Box::new(move || Ok(json!({"jobs": scheduler.list()}))),
        "cron.add" => {
            let add = self::params::<CronAdd>(method, params)?;
            check_key(&add.session_key)?;
            Box::new(move || {
                scheduler
                    .add(JobRequest {
                        every_seconds: add.every_seconds,
                        cron: add.cron,
                        timezone: add.timezone,
                        message: add.message,
                        name: add.name,
                        session: Some(add.session_key),
                    })
                    .map(|job| json!({"job": job}))
                    .map_err(refused)
            })
        }
        _ => {
            let remove = self::params::<ById>(method, params)?;
            Box::new(move || {
                scheduler
                    .remove(&remove.id)
                    .map(|job| json!({"job": job}))
                    .map_err(|why| GatewayError::new(Code::NotFound, why))
            })
        }
    };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| GatewayError::internal("the cron call failed", error))?
}

fn subagents_stop(gateway: &Gateway, params: &Value) -> Result<Value, GatewayError> {
    let stop = self::params::<ById>("subagents.stop", params)?;
    let Some(manager) = &gateway.hub.parts.subagents else {
        return Err(GatewayError::new(
            Code::Unavailable,
            "sub-agents are turned off ([subagents] enabled = false)",
        ));
    };
    manager
        .stop(&stop.id)
        .map(|record| json!({"run": record}))
        .map_err(|why| GatewayError::new(Code::NotFound, why))
}

#[derive(Deserialize)]
struct PairingCode {
    code: String,
}

/// `pairing.list {}` → `{pending, approved}`; `pairing.approve {code}` → `{approved}`.
async fn pairing(gateway: &Gateway, method: &str, params: &Value) -> Result<Value, GatewayError> {
    let store = gateway.hub.parts.pairing();
    let approve = match method {
        "pairing.approve" => Some(self::params::<PairingCode>(method, params)?.code),
        _ => None,
    };
    let answer = tokio::task::spawn_blocking(move || match approve {
        Some(code) => store
            .approve(&code)
            .map(|approved| json!({"approved": approved})),
        None => store.list_json(),
    })
    .await
    .map_err(|error| GatewayError::internal("the pairing records failed", error))?;
    answer.map_err(|error| match error {
        clawcage_runtime::Error::Usage(why) => GatewayError::new(Code::NotFound, why),
        other => GatewayError::internal("cannot use the pairing records", other),
    })
}
