//! The far ends of the gateway's channels, on 127.0.0.1 and in the real wire formats: a fake
//! Telegram Bot API ([`FakeBotApi`]: `getMe`, `getUpdates` with offsets and long polling,
//! `sendMessage` checked as Telegram checks it — HTML entities, 4,096 UTF-16 units —,
//! `sendChatAction`, scripted failures such as a 429 with `retry_after`) that records every
//! call, and a webhook receiver ([`HookReceiver`]) that records every POST. [`hmac_sha256`] is
//! an HMAC written from its definition over `sha2`, so the tests check the gateway's signatures
//! with code that is not the gateway's.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// How long the waits below wait before failing the test.
pub const WAIT: Duration = Duration::from_secs(120);

/// HMAC-SHA256 from RFC 2104: `H((K ^ opad) || H((K ^ ipad) || message))`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let inner_hash = Sha256::new()
        .chain_update(&inner)
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(&outer)
        .chain_update(inner_hash)
        .finalize()
        .into()
}

/// The headers of a webhook request signed with `secret` at `timestamp`.
pub fn signed_headers(secret: &str, timestamp: u64, body: &[u8]) -> Vec<(String, String)> {
    let mut message = format!("{timestamp}.").into_bytes();
    message.extend_from_slice(body);
    vec![
        ("x-clawcage-timestamp".to_string(), timestamp.to_string()),
        (
            "x-clawcage-signature".to_string(),
            format!(
                "sha256={}",
                hex::encode(hmac_sha256(secret.as_bytes(), &message))
            ),
        ),
    ]
}

/// The Unix time in seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or_default()
}

/// POSTs `body` with `headers` to `url`; the status and the body's text.
pub async fn post(url: &str, headers: &[(String, String)], body: Vec<u8>) -> (u16, String) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A GET of `url`; the status and the body.
pub async fn get(url: &str) -> (u16, String) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let response = client.get(url).send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A GET of `url`; the status.
pub async fn get_status(url: &str) -> u16 {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    client
        .get(url)
        .send()
        .await
        .expect("the gateway answers")
        .status()
        .as_u16()
}

/// One Bot API call as the fake received it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method, e.g. `sendMessage`.
    pub method: String,
    /// The JSON body.
    pub body: Value,
    /// The HTTP status it was answered with.
    pub status: u16,
    /// When it arrived.
    pub at: Instant,
}

struct BotState {
    token: String,
    updates: Vec<Value>,
    next_update_id: u64,
    next_message_id: i64,
    calls: Vec<Call>,
    /// Answers to the next `sendMessage` calls, before the normal ones: `(status, body)`.
    send_script: VecDeque<(u16, Value)>,
    /// Answers to the next `getUpdates` calls, before the normal ones.
    updates_script: VecDeque<(u16, Value)>,
}

/// A fake Telegram Bot API on 127.0.0.1; stops when dropped.
pub struct FakeBotApi {
    url: String,
    state: Arc<Mutex<BotState>>,
    changed: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBotApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bot's id in `getMe`.
pub const BOT_ID: i64 = 7_000_001;
/// The bot's username in `getMe`.
pub const BOT_USERNAME: &str = "clawcage_test_bot";

/// Decodes the entities Telegram's HTML mode knows; `Err` where Telegram would refuse to parse.
pub fn decode_html(text: &str) -> Result<String, String> {
    if text.contains('<') || text.contains('>') {
        return Err("unsupported start tag".to_string());
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (entity, replacement) = [
            ("&lt;", '<'),
            ("&gt;", '>'),
            ("&amp;", '&'),
            ("&quot;", '"'),
        ]
        .into_iter()
        .find(|(entity, _)| tail.starts_with(entity))
        .ok_or_else(|| format!("unknown entity at {:?}", &tail[..tail.len().min(8)]))?;
        out.push(replacement);
        rest = &tail[entity.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

impl FakeBotApi {
    /// A server that accepts `token`.
    pub async fn start(token: &str) -> FakeBotApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let state = Arc::new(Mutex::new(BotState {
            token: token.to_string(),
            updates: Vec::new(),
            next_update_id: 500_000,
            next_message_id: 100,
            calls: Vec::new(),
            send_script: VecDeque::new(),
            updates_script: VecDeque::new(),
        }));
        let (changed, _) = watch::channel(0u64);
        let (shared, notify) = (state.clone(), changed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let (state, notify) = (shared.clone(), notify.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (state, notify) = (state.clone(), notify.clone());
                        async move { Ok::<_, Infallible>(bot_answer(state, notify, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeBotApi {
            url,
            state,
            changed,
            task,
        }
    }

    /// The base URL for `api_base`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BotState> {
        self.state.lock().expect("bot state")
    }

    /// Adds an update with `message`; returns its `update_id` and the message's `message_id`.
    pub fn push_message(&self, mut message: Value) -> (u64, i64) {
        let (update_id, message_id) = {
            let mut state = self.lock();
            state.next_update_id += 1;
            state.next_message_id += 1;
            let (update_id, message_id) = (state.next_update_id, state.next_message_id);
            message["message_id"] = json!(message_id);
            message["date"] = json!(unix_now());
            state
                .updates
                .push(json!({"update_id": update_id, "message": message}));
            (update_id, message_id)
        };
        self.changed.send_modify(|count| *count += 1);
        (update_id, message_id)
    }

    /// Adds a raw update (it gets an `update_id` unless it has one); returns the id.
    pub fn push_raw(&self, mut update: Value) -> u64 {
        let id = {
            let mut state = self.lock();
            state.next_update_id += 1;
            if update.get("update_id").is_none() && update.is_object() {
                update["update_id"] = json!(state.next_update_id);
            }
            state.updates.push(update);
            state.next_update_id
        };
        self.changed.send_modify(|count| *count += 1);
        id
    }

    /// A direct message from user `user` (named `name`).
    pub fn private_message(&self, user: i64, name: &str, text: &str) -> (u64, i64) {
        self.push_message(json!({
            "from": {"id": user, "is_bot": false, "first_name": name},
            "chat": {"id": user, "type": "private", "first_name": name},
            "text": text,
        }))
    }

    /// A message in group `chat` from `user`; `extra` is merged into the message (e.g. a
    /// `reply_to_message`, `message_thread_id`).
    pub fn group_message(
        &self,
        chat: i64,
        user: i64,
        name: &str,
        text: &str,
        extra: Value,
    ) -> (u64, i64) {
        let mut message = json!({
            "from": {"id": user, "is_bot": false, "first_name": name},
            "chat": {"id": chat, "type": "supergroup", "title": "Test group"},
            "text": text,
        });
        if let (Some(message), Value::Object(extra)) = (message.as_object_mut(), extra) {
            message.extend(extra);
        }
        self.push_message(message)
    }

    /// The next `sendMessage` calls get these answers first.
    pub fn script_send(&self, answers: Vec<(u16, Value)>) {
        self.lock().send_script.extend(answers);
    }

    /// The next `getUpdates` calls get these answers first (e.g. a 502, a 429).
    pub fn script_updates(&self, answers: Vec<(u16, Value)>) {
        self.lock().updates_script.extend(answers);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The `sendMessage` calls to `chat` that succeeded, in order.
    pub fn delivered(&self, chat: i64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|call| {
                call.method == "sendMessage" && call.status == 200 && call.body["chat_id"] == chat
            })
            .collect()
    }

    /// The texts delivered to `chat`, decoded from HTML.
    pub fn delivered_texts(&self, chat: i64) -> Vec<String> {
        self.delivered(chat)
            .iter()
            .map(|call| {
                let text = call.body["text"].as_str().unwrap_or_default();
                if call.body["parse_mode"] == "HTML" {
                    decode_html(text).unwrap_or_default()
                } else {
                    text.to_string()
                }
            })
            .collect()
    }

    /// Waits (at most [`WAIT`]) until `done` holds for the calls so far.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&[Call]) -> bool) {
        let mut changed = self.changed.subscribe();
        let waited = tokio::time::timeout(WAIT, async {
            loop {
                if done(&self.calls()) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "timed out waiting for {what}; the Bot API saw {:#?}",
            self.calls()
                .iter()
                .map(|call| (call.method.clone(), call.status, call.body.clone()))
                .collect::<Vec<_>>()
        );
    }

    /// Waits until `count` messages have been delivered to `chat`.
    pub async fn wait_delivered(&self, chat: i64, count: usize) {
        self.wait_for(&format!("{count} messages to chat {chat}"), |calls| {
            calls
                .iter()
                .filter(|call| {
                    call.method == "sendMessage"
                        && call.status == 200
                        && call.body["chat_id"] == chat
                })
                .count()
                >= count
        })
        .await;
    }
}

fn bot_reply(status: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a response")
}

fn bot_error(code: u16, description: &str) -> (u16, Value) {
    (
        code,
        json!({"ok": false, "error_code": code, "description": description}),
    )
}

async fn bot_answer(
    state: Arc<Mutex<BotState>>,
    changed: watch::Sender<u64>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let token = state.lock().expect("bot state").token.clone();
    let method = path
        .strip_prefix(&format!("/bot{token}/"))
        .map(str::to_string);
    let Some(method) = method else {
        let (status, body) = bot_error(401, "Unauthorized");
        return bot_reply(status, body);
    };
    let record = |status: u16, body_in: &Value| {
        state.lock().expect("bot state").calls.push(Call {
            method: method.clone(),
            body: body_in.clone(),
            status,
            at: Instant::now(),
        });
        changed.send_modify(|count| *count += 1);
    };
    let (status, answer) = match method.as_str() {
        "getMe" => (
            200,
            json!({"ok": true, "result": {"id": BOT_ID, "is_bot": true, "first_name": "Test bot", "username": BOT_USERNAME}}),
        ),
        "getUpdates"
            if state
                .lock()
                .expect("bot state")
                .updates_script
                .front()
                .is_some() =>
        {
            state
                .lock()
                .expect("bot state")
                .updates_script
                .pop_front()
                .unwrap_or_else(|| bot_error(500, "the script ran out"))
        }
        "getUpdates" => {
            let offset = body["offset"].as_u64().unwrap_or(0);
            let timeout = body["timeout"].as_u64().unwrap_or(0).min(50);
            record(200, &body);
            let mut watcher = changed.subscribe();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
            let result = loop {
                let pending: Vec<Value> = {
                    let mut state = state.lock().expect("bot state");
                    // An offset confirms every update before it: Telegram forgets them.
                    state.updates.retain(|update| {
                        update["update_id"].as_u64().unwrap_or(u64::MAX) >= offset
                    });
                    state.updates.clone()
                };
                if !pending.is_empty() {
                    break pending;
                }
                if tokio::time::timeout_at(deadline, watcher.changed())
                    .await
                    .is_err()
                {
                    break Vec::new();
                }
            };
            return bot_reply(200, json!({"ok": true, "result": result}));
        }
        "sendMessage" => {
            let scripted = state.lock().expect("bot state").send_script.pop_front();
            match scripted {
                Some(answer) => answer,
                None => check_send(&state, &body),
            }
        }
        "sendChatAction" => (200, json!({"ok": true, "result": true})),
        _ => bot_error(404, "Not Found"),
    };
    record(status, &body);
    bot_reply(status, answer)
}

/// `sendMessage` as Telegram judges it.
fn check_send(state: &Arc<Mutex<BotState>>, body: &Value) -> (u16, Value) {
    let (Some(chat), Some(text)) = (body["chat_id"].as_i64(), body["text"].as_str()) else {
        return bot_error(400, "Bad Request: chat_id and text are required");
    };
    if chat == CHAT_NOT_FOUND {
        return bot_error(400, "Bad Request: chat not found");
    }
    let decoded = if body["parse_mode"] == "HTML" {
        match decode_html(text) {
            Ok(decoded) => decoded,
            Err(why) => {
                return bot_error(400, &format!("Bad Request: can't parse entities: {why}"));
            }
        }
    } else {
        text.to_string()
    };
    if decoded.trim().is_empty() {
        return bot_error(400, "Bad Request: message text is empty");
    }
    if decoded.encode_utf16().count() > 4096 {
        return bot_error(400, "Bad Request: message is too long");
    }
    let message_id = {
        let mut state = state.lock().expect("bot state");
        state.next_message_id += 1;
        state.next_message_id
    };
    (
        200,
        json!({"ok": true, "result": {
            "message_id": message_id,
            "date": unix_now(),
            "chat": {"id": chat},
            "from": {"id": BOT_ID, "is_bot": true, "first_name": "Test bot", "username": BOT_USERNAME},
            "text": decoded,
        }}),
    )
}

/// A chat id the fake answers `chat not found` for.
pub const CHAT_NOT_FOUND: i64 = 404_404;

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    /// The path.
    pub path: String,
    /// Headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// The body's bytes.
    pub body: Vec<u8>,
}

impl Received {
    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A webhook receiver on 127.0.0.1 answering 200 to every POST; stops when dropped.
pub struct HookReceiver {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
    changed: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HookReceiver {
    /// Starts one.
    pub async fn start() -> HookReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (changed, _) = watch::channel(0u64);
        let (shared, notify) = (received.clone(), changed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (received, notify) = (shared.clone(), notify.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (received, notify) = (received.clone(), notify.clone());
                        async move {
                            let path = request.uri().path().to_string();
                            let headers = request
                                .headers()
                                .iter()
                                .map(|(name, value)| {
                                    (
                                        name.as_str().to_string(),
                                        value.to_str().unwrap_or_default().to_string(),
                                    )
                                })
                                .collect();
                            let body = request
                                .into_body()
                                .collect()
                                .await
                                .map(|body| body.to_bytes().to_vec())
                                .unwrap_or_default();
                            received.lock().expect("received").push(Received {
                                path,
                                headers,
                                body,
                            });
                            notify.send_modify(|count| *count += 1);
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(200)
                                    .body(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                                    .expect("a response"),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        HookReceiver {
            url,
            received,
            changed,
            task,
        }
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What was received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received").clone()
    }

    /// Waits (at most [`WAIT`]) until `count` POSTs have arrived.
    pub async fn wait_for(&self, count: usize) -> Vec<Received> {
        let mut changed = self.changed.subscribe();
        let waited = tokio::time::timeout(WAIT, async {
            while self.received().len() < count {
                if changed.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "timed out waiting for {count} webhook replies; got {:?}",
            self.received()
        );
        self.received()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hmac_matches_rfc_4231() {
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // A key longer than the block is hashed first (test case 6).
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn html_decoding_refuses_what_telegram_refuses() {
        assert_eq!(decode_html("a &lt;b&gt; &amp; c").unwrap(), "a <b> & c");
        assert!(decode_html("<b>x").is_err());
        assert!(decode_html("a & b").is_err());
    }
}
