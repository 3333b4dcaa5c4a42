//! Approvals across the hosts serving partitions: an approver connected to any host is linked
//! to every other live host with its own `connect` (looked at again every
//! [`APPROVER_LINK_REFRESH`]), hears their `exec.approval.*` events through those links, and
//! its `exec.approval.resolve` goes to the host that asked; its `exec.approval.list` lists what
//! every host it is linked to waits for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Pending, Target, open, request_frame};
use crate::Gateway;
use crate::connection::Conn;
use serde_json::Value;

use crate::protocol::{Code, GatewayError, Request};

/// How often an approver's links to the other hosts are looked at (a host joined or came back).
const APPROVER_LINK_REFRESH: Duration = Duration::from_secs(2);

/// The host that asked the approval `request` answers (`exec.approval.resolve {id}`), when it
/// is another host whose request this connection heard.
pub(crate) fn approval_host(conn: &Conn, request: &Request) -> Option<String> {
    if request.method != "exec.approval.resolve" || conn.forwarded {
        return None;
    }
    let id = request.params.get("id")?.as_str()?;
    clawcage_core::sync::lock(&conn.forwarder.approvals)
        .get(id)
        .cloned()
}

/// Sends the answer `request` to `host`, which asked it, over the connection it came through.
pub(crate) async fn answer_approval(conn: &Arc<Conn>, host: &str, request: Request) {
    let upstreams = conn.forwarder.upstreams.lock().await;
    let sent = match upstreams.get(host) {
        Some(upstream) if !upstream.send.is_closed() => {
            clawcage_core::sync::lock(&upstream.pending).insert(
                request.id.to_string(),
                Pending {
                    request: request.clone(),
                    patience: Instant::now(),
                    method: request.method.clone(),
                    key: String::new(),
                    follow_since: None,
                    answered: false,
                    answer_to: None,
                },
            );
            upstream.send.send(request_frame(&request)).await.is_ok()
        }
        _ => false,
    };
    if !sent {
        conn.respond(
            &request.id,
            Err(GatewayError::new(
                Code::Unavailable,
                format!(
                    "host {host}, which asked this approval, went away; the turn resumes on another host, which asks again"
                ),
            )),
        );
    }
}

/// Keeps approver connection `conn` linked to every other live host of the cluster while it
/// lives, so that it hears (and answers) the approvals every host asks: a host that joins or
/// comes back is linked within [`APPROVER_LINK_REFRESH`].
pub(crate) async fn link_approver(gateway: Arc<Gateway>, conn: Arc<Conn>) {
    let Some(owners) = gateway.owners.get().cloned() else {
        return;
    };
    let closed = conn.outbox.clone();
    loop {
        if let Ok(hosts) = owners.leases.live_hosts().await {
            for record in hosts {
                let host = record.holder.host.clone();
                if host == owners.me {
                    continue;
                }
                // Live: it holds its liveness lease (a dead host's record outlives it).
                let alive = owners
                    .leases
                    .holder(&clawcage_cluster::ownership::host_lease(&host))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|(holder, _)| holder == record.holder);
                let Some(authority) = record
                    .url
                    .as_deref()
                    .and_then(|url| url.strip_prefix("http://"))
                    .and_then(|rest| rest.split('/').next())
                    .filter(|authority| !authority.is_empty() && alive)
                else {
                    continue;
                };
                let mut upstreams = conn.forwarder.upstreams.lock().await;
                if upstreams
                    .get(&host)
                    .is_some_and(|upstream| !upstream.send.is_closed())
                {
                    continue;
                }
                let target = Target {
                    host: host.clone(),
                    authority: authority.to_string(),
                };
                match open(&gateway, &conn, &owners, &target).await {
                    Ok(upstream) => {
                        upstreams.insert(host, upstream);
                    }
                    Err(why) => {
                        tracing::debug!(%why, "cannot link an approver to another host yet")
                    }
                }
            }
        }
        tokio::select! {
            () = closed.closed() => return,
            () = tokio::time::sleep(APPROVER_LINK_REFRESH) => {}
        }
    }
}

/// `exec.approval.list` for an approver linked to the other hosts: the requests waiting here
/// and on every host it is linked to (each asked with the approver's own connection, for at
/// most [`LIST_PATIENCE`]).
pub(crate) async fn list_everywhere(conn: &Arc<Conn>, here: Value, request: &Request) -> Value {
    let mut pending: Vec<Value> = here["pending"].as_array().cloned().unwrap_or_default();
    let mut answers = Vec::new();
    {
        let upstreams = conn.forwarder.upstreams.lock().await;
        for (host, upstream) in upstreams.iter() {
            if upstream.send.is_closed() {
                continue;
            }
            let (answer_to, answer) = tokio::sync::oneshot::channel();
            let asked = Request {
                id: serde_json::json!(format!("list-{host}-{}", request.id)),
                method: "exec.approval.list".to_string(),
                params: serde_json::json!({}),
            };
            clawcage_core::sync::lock(&upstream.pending).insert(
                asked.id.to_string(),
                Pending {
                    request: asked.clone(),
                    patience: Instant::now(),
                    method: asked.method.clone(),
                    key: String::new(),
                    follow_since: None,
                    answered: false,
                    answer_to: Some(answer_to),
                },
            );
            if upstream.send.send(request_frame(&asked)).await.is_ok() {
                answers.push(answer);
            }
        }
    }
    for answer in answers {
        if let Ok(Ok(frame)) = tokio::time::timeout(LIST_PATIENCE, answer).await
            && let Some(theirs) = frame["payload"]["pending"].as_array()
        {
            pending.extend(theirs.iter().cloned());
        }
    }
    serde_json::json!({ "pending": pending })
}

/// How long `exec.approval.list` waits for each other host's list.
const LIST_PATIENCE: Duration = Duration::from_secs(5);
