//! [`HostClient`]: this host as a client of the hosts serving other sessions, for what reaches
//! it other than through a client connection (a webhook's message).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::FORWARD_PATIENCE;
use crate::Gateway;
use crate::connection::Conn;
use crate::protocol::{self, Request};

/// This host as a client of the hosts serving other sessions, for what reaches it other than
/// through a client connection (a webhook's message): its requests go through the same
/// dispatch as a client's, forwarded when another host serves their session, presenting the
/// gateway's token (every host of a cluster has the same).
pub(crate) struct HostClient {
    gateway: Weak<Gateway>,
    conn: Arc<Conn>,
    waiting: Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<Value>>>>,
    next: std::sync::atomic::AtomicU64,
}

impl HostClient {
    pub(crate) fn new(gateway: &Arc<Gateway>) -> Arc<Self> {
        let (outbox, mut frames) =
            crate::hub::Outbox::new(gateway.hub.next_id(), gateway.settings.send_queue);
        let connect: Utf8Bytes = json!({
            "type": "req",
            "id": "connect",
            "method": "connect",
            "params": {
                "minProtocol": protocol::PROTOCOL_VERSION,
                "maxProtocol": protocol::PROTOCOL_VERSION,
                "client": {"id": "clawcage-gateway", "version": env!("CARGO_PKG_VERSION"), "mode": "internal"},
                "auth": {"token": gateway.settings.token.value()},
            },
        })
        .to_string()
        .into();
        let waiting: Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<Value>>>> =
            Arc::new(Mutex::new(HashMap::new()));
        let answered = waiting.clone();
        // Its answers reach the waiting requests; the events its sends follow are dropped.
        tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                let Ok(frame) = serde_json::from_str::<Value>(frame.as_str()) else {
                    continue;
                };
                if frame["type"] != "res" {
                    continue;
                }
                let id = frame["id"].as_str().unwrap_or_default().to_string();
                if let Some(waiter) = clawcage_core::sync::lock(&answered).remove(&id) {
                    let _ = waiter.send(frame);
                }
            }
        });
        Arc::new(Self {
            gateway: Arc::downgrade(gateway),
            conn: Arc::new(Conn::internal(outbox, connect)),
            waiting,
            next: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Asks `method` with `params` of whichever host serves its session; the answer frame.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let gateway = self
            .gateway
            .upgrade()
            .ok_or_else(|| "the gateway has stopped".to_string())?;
        let id = format!(
            "host-{}",
            self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (answer, answered) = tokio::sync::oneshot::channel();
        clawcage_core::sync::lock(&self.waiting).insert(id.clone(), answer);
        let key = params.get("sessionKey").cloned();
        crate::methods::dispatch(
            &gateway,
            &self.conn,
            Request {
                id: json!(id),
                method: method.to_string(),
                params,
            },
        )
        .await;
        let frame = tokio::time::timeout(FORWARD_PATIENCE * 2, answered).await;
        clawcage_core::sync::lock(&self.waiting).remove(&id);
        // What it asked needs no following here.
        if let Some(Value::String(key)) = key {
            gateway.hub.unsubscribe(&key, &self.conn.outbox);
            self.conn.subscriptions().remove(&key);
        }
        match frame {
            Ok(Ok(frame)) => Ok(frame),
            _ => Err(format!(
                "no answer to {method} within {} s",
                (FORWARD_PATIENCE * 2).as_secs()
            )),
        }
    }
}
