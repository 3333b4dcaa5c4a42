//! Requests for a session another host serves, when the hosts of a cluster serve partitions
//! (`[cluster] serve = "partitions"`): a client may connect to any host, and what it asks of a
//! session whose partition another host owns (`chat.send`, `agent`, `chat.history`,
//! `chat.abort`, `sessions.reset`, `sessions.delete`) is forwarded to that host over a
//! connection this host opens for the client with the client's own `connect` (so the owner
//! checks its token and scopes), one per owner, kept while the client's connection lives. The
//! owner's answers come back unchanged, under the client's ids. The session's events do not
//! come that way: a client that sends to a session follows it here, from the session's log,
//! which whichever host serves the session writes (so a turn the next owner resumes after the
//! first one died reaches the client on the same connection). The follow starts after the
//! send's answer, from the last event the log held before the send was forwarded: the answer
//! comes first, and no event of the run is missed. A request in flight when the owner goes
//! away is answered `UNAVAILABLE` (it may have been done). A connection forwarded here is never
//! forwarded again: a host that no longer serves the session answers `UNAVAILABLE`, so no
//! request goes round.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use clawcage_cluster::Leases;
use clawcage_cluster::leases::{partition_lease, partition_of};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

mod approvers;
mod host_client;
pub(crate) use approvers::{answer_approval, approval_host, link_approver, list_everywhere};
pub(crate) use host_client::HostClient;

use crate::Gateway;
use crate::connection::Conn;
use crate::hub::{SERVED_ELSEWHERE, TAKING_UP};
use crate::protocol::{Code, GatewayError, Request};
use crate::relay::{Target, open_upstream};

/// The methods forwarded to the host serving their session.
pub(crate) const FORWARDED_METHODS: &[&str] = &[
    "chat.send",
    "agent",
    "chat.history",
    "chat.abort",
    "sessions.reset",
    "sessions.delete",
    "exec.approval.policy",
    crate::channels::elsewhere::CONVERSATION_METHOD,
];

/// Requests of one connection waiting for their owner's answer, at most.
const MAX_FORWARDED_IN_FLIGHT: usize = 256;

/// How long a request waits for its session's partition to settle (no host serving it yet, its
/// owner unreachable or saying it no longer serves it, this host taking it up) before it is
/// answered `UNAVAILABLE`: a hand-over takes about a second, a dead host's partitions move
/// after a lease's time to live.
pub(crate) const FORWARD_PATIENCE: Duration = Duration::from_secs(15);

/// The pause between two looks while a partition moves.
const SETTLE_PAUSE: Duration = Duration::from_millis(250);

/// Who serves each partition, from the partition leases, and where each host listens.
pub(crate) struct Owners {
    leases: Leases,
    /// This host's id.
    me: String,
    /// Where each host said its clients connect (`host:port`), by host and incarnation (a
    /// host started again listens elsewhere), as last read.
    addresses: Mutex<HashMap<(String, String), String>>,
}

impl Owners {
    pub(crate) fn new(leases: Leases, me: String) -> Arc<Self> {
        Arc::new(Self {
            leases,
            me,
            addresses: Mutex::new(HashMap::new()),
        })
    }

    /// The host serving `key` and where to reach it; why not, said for the client.
    async fn owner_of(&self, key: &str) -> Result<Target, String> {
        let partition = partition_of(key);
        let holder = self
            .leases
            .holder(&partition_lease(partition))
            .await
            .map_err(|error| format!("the cluster did not say who serves it: {error}"))?;
        let Some((holder, _)) = holder else {
            return Err(format!(
                "no host serves its partition {partition} right now (one takes it within the lease's time to live); send again in a few seconds"
            ));
        };
        if holder.host == self.me {
            return Err(format!(
                "its partition {partition} {TAKING_UP}; send again in a moment"
            ));
        }
        let incarnation = (holder.host.clone(), holder.incarnation.clone());
        let known = clawcage_core::sync::lock(&self.addresses)
            .get(&incarnation)
            .cloned();
        let authority = match known {
            Some(authority) => authority,
            None => {
                let url = self
                    .leases
                    .live_hosts()
                    .await
                    .map_err(|error| format!("the cluster did not say where hosts listen: {error}"))?
                    .into_iter()
                    .find(|record| record.holder == holder)
                    .and_then(|record| record.url)
                    .ok_or_else(|| {
                        format!(
                            "host {} serves it but has not said where it listens yet; send again in a moment",
                            holder.host
                        )
                    })?;
                let authority = url
                    .strip_prefix("http://")
                    .and_then(|rest| rest.split('/').next())
                    .filter(|authority| !authority.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        format!(
                            "host {} serves it at {url}, which is not an http:// address: set its [cluster] advertise_url",
                            holder.host
                        )
                    })?;
                clawcage_core::sync::lock(&self.addresses).insert(incarnation, authority.clone());
                authority
            }
        };
        Ok(Target {
            host: holder.host,
            authority,
        })
    }

    /// Forgets where `host` listens (it did not answer there).
    fn forget(&self, host: &str) {
        clawcage_core::sync::lock(&self.addresses).retain(|(known, _), _| known != host);
    }
}

/// A request forwarded and not fully answered yet.
struct Pending {
    /// The request, to ask again when the owner says it no longer serves the session.
    request: Request,
    /// Until when it is asked again while the session's partition moves.
    patience: Instant,
    method: String,
    key: String,
    /// Follow the session here from after this event once the send is accepted.
    follow_since: Option<u64>,
    /// Whether an answer came (an `agent` request gets two: its acceptance and its end).
    answered: bool,
    /// Where its answer goes instead of the client (a request this host asks of every host).
    answer_to: Option<tokio::sync::oneshot::Sender<Value>>,
}

/// One connection to a host serving some of the client's sessions.
struct Upstream {
    send: mpsc::Sender<Utf8Bytes>,
    pending: Arc<Mutex<HashMap<String, Pending>>>,
}

/// A connection's forwarding: its connection to each owner it needed (for an approver, to every
/// other host), and which host asked each approval it heard through them.
#[derive(Default)]
pub(crate) struct Forwarder {
    upstreams: tokio::sync::Mutex<HashMap<String, Upstream>>,
    approvals: Mutex<HashMap<String, String>>,
}

/// The session `request` asks about, when it is to be forwarded from this host: the hosts
/// serve partitions, the method is one of [`FORWARDED_METHODS`], another host owns the
/// session's partition, and the connection was not itself forwarded here. While this host is
/// taking the session's partition up, waits (up to [`FORWARD_PATIENCE`]) to serve it here.
pub(crate) async fn forwardable(
    gateway: &Gateway,
    conn: &Conn,
    request: &Request,
) -> Option<String> {
    gateway.owners.get()?;
    if !FORWARDED_METHODS.contains(&request.method.as_str()) {
        return None;
    }
    let key = request.params.get("sessionKey")?.as_str()?;
    let patience = Instant::now() + FORWARD_PATIENCE;
    while gateway.hub.taking_up(key) && Instant::now() < patience {
        tokio::time::sleep(SETTLE_PAUSE / 5).await;
    }
    (!conn.forwarded && gateway.hub.served_elsewhere(key)).then(|| key.to_string())
}

/// Forwards `request` about `key` to the host serving it, answering the client under its id.
pub(crate) async fn forward(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    request: Request,
    key: String,
) {
    forward_patiently(
        gateway,
        conn,
        request,
        key,
        Instant::now() + FORWARD_PATIENCE,
    )
    .await;
}

/// [`forward`], looking for the session's host again until `patience` while it cannot be found
/// or reached (its partition moving). Boxed: it may dispatch the request here after all (this
/// host took the partition over meanwhile), and dispatching may forward.
fn forward_patiently<'a>(
    gateway: &'a Arc<Gateway>,
    conn: &'a Arc<Conn>,
    request: Request,
    key: String,
    patience: Instant,
) -> futures_util::future::BoxFuture<'a, ()> {
    Box::pin(forward_patiently_now(gateway, conn, request, key, patience))
}

async fn forward_patiently_now(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    request: Request,
    key: String,
    patience: Instant,
) {
    let unavailable = |why: String| {
        GatewayError::new(
            Code::Unavailable,
            format!("session {key} {SERVED_ELSEWHERE}: {why}"),
        )
    };
    let Some(owners) = gateway.owners.get() else {
        return conn.respond(&request.id, Err(unavailable("no host is known".into())));
    };
    loop {
        if !gateway.hub.served_elsewhere(&key) {
            // Served here now (this host took the partition over meanwhile).
            return crate::methods::dispatch(gateway, conn, request).await;
        }
        let target = match owners.owner_of(&key).await {
            Ok(target) => target,
            Err(why) if Instant::now() >= patience => {
                return conn.respond(&request.id, Err(unavailable(why)));
            }
            Err(_) => {
                tokio::time::sleep(SETTLE_PAUSE).await;
                continue;
            }
        };
        match send_to(gateway, conn, owners, &target, &request, &key, patience).await {
            Ok(()) => return,
            Err(why) if Instant::now() >= patience => {
                return conn.respond(&request.id, Err(unavailable(why)));
            }
            Err(_) => tokio::time::sleep(SETTLE_PAUSE).await,
        }
    }
}

/// Sends `request` to `target` over the connection's connection to it (opened if needed);
/// why not, when it cannot be.
async fn send_to(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    owners: &Owners,
    target: &Target,
    request: &Request,
    key: &str,
    patience: Instant,
) -> Result<(), String> {
    // A send follows the session here, from what its log holds now (unless followed already).
    let sends = matches!(request.method.as_str(), "chat.send" | "agent");
    let follow_since = if sends && !conn.subscriptions().contains(key) {
        match gateway.hub.parts.events.last_seq(key).await {
            Ok(last) => Some(last),
            Err(error) => {
                conn.respond(
                    &request.id,
                    Err(GatewayError::internal(
                        "cannot read the session's events",
                        error,
                    )),
                );
                return Ok(());
            }
        }
    } else {
        None
    };
    let frame = request_frame(request);
    let mut upstreams = conn.forwarder.upstreams.lock().await;
    let reusable = upstreams
        .get(&target.host)
        .is_some_and(|upstream| !upstream.send.is_closed());
    if !reusable {
        upstreams.remove(&target.host);
        match open(gateway, conn, owners, target).await {
            Ok(upstream) => {
                upstreams.insert(target.host.clone(), upstream);
            }
            Err(why) => {
                owners.forget(&target.host);
                return Err(why);
            }
        }
    }
    let Some(upstream) = upstreams.get(&target.host) else {
        return Err(format!("host {} went away", target.host));
    };
    {
        let mut waiting = clawcage_core::sync::lock(&upstream.pending);
        if waiting.len() >= MAX_FORWARDED_IN_FLIGHT {
            drop(waiting);
            conn.respond(
                &request.id,
                Err(GatewayError::new(
                    Code::RateLimited,
                    format!(
                        "{MAX_FORWARDED_IN_FLIGHT} requests of this connection are waiting for host {}; wait for their answers",
                        target.host
                    ),
                )),
            );
            return Ok(());
        }
        waiting.insert(
            request.id.to_string(),
            Pending {
                request: request.clone(),
                patience,
                method: request.method.clone(),
                key: key.to_string(),
                follow_since,
                answered: false,
                answer_to: None,
            },
        );
    }
    if upstream.send.send(frame).await.is_err() {
        clawcage_core::sync::lock(&upstream.pending).remove(&request.id.to_string());
        return Err(format!("host {} went away", target.host));
    }
    Ok(())
}

/// `request` as a frame, as its client sent it.
fn request_frame(request: &Request) -> Utf8Bytes {
    json!({
        "type": "req",
        "id": request.id,
        "method": request.method,
        "params": request.params,
    })
    .to_string()
    .into()
}

/// Opens the client's connection to `target` with its `connect`, and the task that carries it.
async fn open(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    owners: &Owners,
    target: &Target,
) -> Result<Upstream, String> {
    let (socket, answer) = open_upstream(&owners.me, target, conn.connect_frame.clone())
        .await
        .map_err(|why| {
            format!(
                "host {} at {} cannot be reached ({why})",
                target.host, target.authority
            )
        })?;
    let accepted: Value = serde_json::from_str(answer.as_str()).unwrap_or(Value::Null);
    if accepted["ok"] != true {
        return Err(format!(
            "host {} refused this client: {}",
            target.host, accepted["error"]["message"]
        ));
    }
    let (send, outgoing) = mpsc::channel(64);
    let pending = Arc::new(Mutex::new(HashMap::new()));
    tracing::info!(connection = conn.outbox.id, owner = %target.host, "forwarding a client's requests to the host serving its session");
    tokio::spawn(carry(
        socket,
        outgoing,
        pending.clone(),
        Arc::downgrade(gateway),
        Arc::downgrade(conn),
        target.host.clone(),
    ));
    Ok(Upstream { send, pending })
}

/// Carries one upstream connection: requests out, answers back to the client, until either
/// side ends; then answers what is still waiting `UNAVAILABLE`.
async fn carry(
    mut socket: WebSocketStream<TcpStream>,
    mut outgoing: mpsc::Receiver<Utf8Bytes>,
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    gateway: Weak<Gateway>,
    conn: Weak<Conn>,
    host: String,
) {
    let Some(closed) = conn.upgrade().map(|conn| conn.outbox.clone()) else {
        return;
    };
    loop {
        tokio::select! {
            () = closed.closed() => break,
            frame = outgoing.recv() => match frame {
                Some(frame) => {
                    if socket.send(Message::Text(frame)).await.is_err() {
                        break;
                    }
                }
                None => break,
            },
            message = socket.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    let (Some(gateway), Some(conn)) = (gateway.upgrade(), conn.upgrade()) else {
                        break;
                    };
                    from_owner(&gateway, &conn, &pending, &host, text).await;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    outgoing.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), socket.close(None)).await;
    let unanswered: Vec<(String, Pending)> = clawcage_core::sync::lock(&pending).drain().collect();
    let Some(conn) = conn.upgrade() else {
        return;
    };
    for (id, waiting) in unanswered {
        if waiting.answered {
            continue;
        }
        let Ok(id) = serde_json::from_str::<Value>(&id) else {
            continue;
        };
        let again = if matches!(waiting.method.as_str(), "chat.send" | "agent") {
            "; send it again with the same idempotencyKey (a duplicate is recognised)"
        } else {
            ""
        };
        conn.respond(
            &id,
            Err(GatewayError::new(
                Code::Unavailable,
                format!(
                    "host {host}, serving session {}, went away before it answered {}: it may have been done{again}",
                    waiting.key, waiting.method
                ),
            )),
        );
    }
}

/// One frame from the owner: an answer goes back to the client (a send accepted first makes
/// the client follow the session here); an approval request is passed on; the session's
/// events are not (the client follows them here) nor the owner's own ticks and notices.
async fn from_owner(
    gateway: &Arc<Gateway>,
    conn: &Arc<Conn>,
    pending: &Mutex<HashMap<String, Pending>>,
    host: &str,
    text: Utf8Bytes,
) {
    let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
        return;
    };
    match frame["type"].as_str() {
        Some("res") => {
            let id = frame["id"].to_string();
            let accepted = frame["ok"] == true;
            // The owner no longer serves the session (its partition moved meanwhile): asked
            // again of whoever does, while the request's patience lasts.
            let moved = !accepted
                && frame["error"]["code"] == "UNAVAILABLE"
                && frame["error"]["message"].as_str().is_some_and(|message| {
                    message.contains(SERVED_ELSEWHERE) || message.contains(TAKING_UP)
                });
            let follow = {
                let mut waiting = clawcage_core::sync::lock(pending);
                let Some(entry) = waiting.get_mut(&id) else {
                    return;
                };
                if entry.answer_to.is_some() {
                    if let Some(answer_to) = waiting.remove(&id).and_then(|entry| entry.answer_to) {
                        let _ = answer_to.send(frame);
                    }
                    return;
                }
                if moved && !entry.answered && Instant::now() < entry.patience {
                    let Some(entry) = waiting.remove(&id) else {
                        return;
                    };
                    let (gateway, conn) = (gateway.clone(), conn.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(SETTLE_PAUSE).await;
                        forward_patiently(
                            &gateway,
                            &conn,
                            entry.request,
                            entry.key,
                            entry.patience,
                        )
                        .await;
                    });
                    return;
                }
                let follow = entry
                    .follow_since
                    .take()
                    .filter(|_| accepted)
                    .map(|since| (entry.key.clone(), since));
                let done = entry.answered || !accepted || entry.method != "agent";
                entry.answered = true;
                if done {
                    waiting.remove(&id);
                }
                follow
            };
            if let Some((key, since)) = follow
                && let Err(error) = gateway
                    .hub
                    .follow_from(&key, since, &conn.outbox, &conn.subscriptions)
                    .await
            {
                tracing::warn!(session = %key, error = %error.message, "cannot follow a session another host serves");
            }
            conn.outbox.push(text);
        }
        Some("event")
            if frame["event"]
                .as_str()
                .is_some_and(|name| name.starts_with("exec.approval")) =>
        {
            // Its answer goes to the host that asked.
            if frame["event"] == "exec.approval.requested"
                && let Some(id) = frame["payload"]["id"].as_str()
            {
                let mut asked = clawcage_core::sync::lock(&conn.forwarder.approvals);
                if asked.len() >= MAX_FORWARDED_IN_FLIGHT * 4 {
                    asked.clear();
                }
                asked.insert(id.to_string(), host.to_string());
            }
            conn.outbox.push(text);
        }
        _ => {}
    }
}
