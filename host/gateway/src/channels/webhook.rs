//! Webhooks: `POST /hooks/<name>` on the gateway starts a turn in the session
//! `agent:main:webhook:<name>[:<peer>]`, and the reply is POSTed to the hook's `reply_url`
//! through the host's network policy (its host must be on `[network] allow`).
//!
//! Both directions are signed the same way: `X-Clawcage-Timestamp` holds the Unix time in
//! seconds and `X-Clawcage-Signature` holds `sha256=` and the lowercase hex HMAC-SHA256, keyed
//! with the hook's secret, of the timestamp, a `.`, and the body's bytes. An inbound request is
//! accepted only with a valid signature (checked in constant time), a timestamp inside the
//! replay window (default 5 minutes either way) and a signature not seen before within that
//! window (the cache survives a restart; in a cluster it is the cluster's, so a request replayed
//! to another host is refused too); anything else is 401 and nothing enters a session. The body (at most 64 KiB) is
//! `{"message": "...", "peer"?: "...", "id"?: "..."}`; the answer is 202 with the run's id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clawcage_agent::provider::redacting::redact_json;
use clawcage_runtime::Error;
use clawcage_runtime::channel_config::{ChannelSecret, HttpPost, Webhook};
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};
use sha2::Sha256;

use super::{Outcome, Shared, Submitted, outcome, session_key, submit};

/// The largest body accepted.
pub const MAX_BODY_BYTES: usize = 64 << 10;

/// The timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-clawcage-timestamp";

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-clawcage-signature";

/// Signatures remembered at most (beyond, requests are refused until some expire).
const MAX_SEEN: usize = 100_000;

/// Attempts to deliver a reply.
const POST_ATTEMPTS: u32 = 5;

type HmacSha256 = Hmac<Sha256>;
type Response = http::Response<Full<Bytes>>;

/// `sha256=<hex>` of `timestamp` `.` `body` under `secret`.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes keys of any length.
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn verify(secret: &[u8], timestamp: &str, body: &[u8], signature: &[u8]) -> bool {
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return false;
    };
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(signature).is_ok()
}

fn now_secs() -> u64 {
    clawcage_agent::transcript::now_ms() / 1000
}

fn answer(status: http::StatusCode, body: Value) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn refuse(status: http::StatusCode, error: &str) -> Response {
    answer(status, json!({"ok": false, "error": error}))
}

struct Hook {
    secret: ChannelSecret,
    reply_url: Option<String>,
    window: u64,
}

/// The configured webhooks.
pub struct Webhooks {
    shared: Arc<Shared>,
    hooks: HashMap<String, Hook>,
    post: HttpPost,
    /// Signatures accepted within their window: `(hook, signature)` → when they expire.
    seen: Mutex<Seen>,
}

/// The replay cache, kept across restarts in `<state-dir>/channels/webhooks-seen.log`: one line
/// `<hook> <signature hex> <expires>` appended (and synced) per accepted request before it is
/// handled, the file rewritten with the live entries at the start and whenever the dead ones
/// outnumber them.
struct Seen {
    entries: HashMap<(String, Vec<u8>), u64>,
    file: std::path::PathBuf,
    /// Lines in the file.
    lines: usize,
    /// The second expired entries were last dropped (the clock has whole seconds, so once per
    /// second is all there is to drop).
    pruned_at: u64,
}

impl Seen {
    fn load(file: std::path::PathBuf, now: u64) -> Seen {
        let mut entries = HashMap::new();
        if let Ok(bytes) = clawcage_core::files::read_regular_file(
            &file,
            64 << 20,
            clawcage_core::files::Symlinks::Refuse,
        ) {
            for line in String::from_utf8_lossy(&bytes).lines() {
                let mut words = line.split(' ');
                if let (Some(hook), Some(Ok(signature)), Some(Ok(expires))) = (
                    words.next(),
                    words.next().map(hex::decode),
                    words.next().map(str::parse::<u64>),
                ) && expires >= now
                {
                    entries.insert((hook.to_string(), signature), expires);
                }
            }
        }
        let mut seen = Seen {
            entries,
            file,
            lines: 0,
            pruned_at: 0,
        };
        seen.compact();
        seen
    }

    fn compact(&mut self) {
        if let Err(error) = self.rewrite() {
            tracing::warn!(%error, file = %self.file.display(), "cannot rewrite the webhooks' replay cache");
        }
    }

    fn rewrite(&mut self) -> std::io::Result<()> {
        let text: String = self
            .entries
            .iter()
            .map(|((hook, signature), expires)| {
                format!("{hook} {} {expires}\n", hex::encode(signature))
            })
            .collect();
        clawcage_core::files::write_atomically(&self.file, text.as_bytes(), true)?;
        self.lines = self.entries.len();
        Ok(())
    }

    fn append(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let mut file = options.open(&self.file)?;
        file.write_all(line.as_bytes())?;
        file.sync_data()?;
        self.lines += 1;
        Ok(())
    }

    /// Records an accepted signature durably; on an error it is not recorded at all.
    fn record(&mut self, hook: &str, signature: &[u8], expires: u64) -> std::io::Result<()> {
        let key = (hook.to_string(), signature.to_vec());
        self.entries.insert(key.clone(), expires);
        let written = if self.lines > 1000 && self.lines > 2 * self.entries.len() {
            self.rewrite()
        } else {
            self.append(&format!("{hook} {} {expires}\n", hex::encode(signature)))
        };
        if written.is_err() {
            self.entries.remove(&key);
        }
        written
    }
}

fn peer_ok(peer: &str) -> bool {
    (1..=64).contains(&peer.len())
        && !peer.starts_with('.')
        && peer
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b))
}

impl Webhooks {
    pub(crate) fn new(
        shared: Arc<Shared>,
        config: &[Webhook],
        post: HttpPost,
    ) -> Result<Arc<Webhooks>, Error> {
        let mut hooks = HashMap::new();
        for hook in config {
            let Some(secret) = &hook.secret else {
                return Err(Error::Usage(format!(
                    "[channels.webhooks.{}] needs its signing secret in the environment variable {}: export {}=<a long random value, e.g. from `openssl rand -hex 32`> before `clawcage gateway`",
                    hook.name, hook.secret_env, hook.secret_env
                )));
            };
            hooks.insert(
                hook.name.clone(),
                Hook {
                    secret: secret.clone(),
                    reply_url: hook.reply_url.clone(),
                    window: hook.replay_window.as_secs(),
                },
            );
        }
        shared.status.set(
            "webhooks",
            json!({"state": "listening", "hooks": hooks.len()}),
        );
        let seen = Seen::load(
            shared
                .hub
                .parts
                .state_dir
                .join("channels")
                .join("webhooks-seen.log"),
            now_secs(),
        );
        Ok(Arc::new(Webhooks {
            shared,
            hooks,
            post,
            seen: Mutex::new(seen),
        }))
    }

    /// Answers `POST /hooks/<name>`.
    pub async fn receive(
        self: &Arc<Self>,
        name: &str,
        request: http::Request<Incoming>,
    ) -> Response {
        if request.method() != http::Method::POST {
            let mut response = refuse(
                http::StatusCode::METHOD_NOT_ALLOWED,
                "webhooks take POST with a signed JSON body",
            );
            response
                .headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            return response;
        }
        let Some(hook) = self.hooks.get(name) else {
            return refuse(
                http::StatusCode::NOT_FOUND,
                "no such webhook: the operator configures one as [channels.webhooks.<name>]",
            );
        };
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string)
        };
        let too_large = header(http::header::CONTENT_LENGTH.as_str())
            .and_then(|length| length.parse::<u64>().ok())
            .is_some_and(|length| length > MAX_BODY_BYTES as u64);
        if too_large {
            return refuse(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "the body is larger than 64 KiB",
            );
        }
        let (timestamp, signature) = (header(TIMESTAMP_HEADER), header(SIGNATURE_HEADER));
        let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                return refuse(
                    http::StatusCode::PAYLOAD_TOO_LARGE,
                    "the body is larger than 64 KiB or was cut off",
                );
            }
        };
        let unauthorized = |why: &str| {
            tracing::warn!(hook = name, "refused a webhook request: {why}");
            refuse(http::StatusCode::UNAUTHORIZED, why)
        };
        let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
            return unauthorized(
                "sign the request: X-Clawcage-Timestamp (Unix seconds) and X-Clawcage-Signature (sha256=<hex HMAC-SHA256 of timestamp.body>)",
            );
        };
        let Ok(sent_at) = timestamp.trim().parse::<u64>() else {
            return unauthorized("X-Clawcage-Timestamp is not a Unix time in seconds");
        };
        let now = now_secs();
        if now.abs_diff(sent_at) > hook.window {
            return unauthorized("the timestamp is outside the replay window");
        }
        let Some(Ok(signature)) = signature.trim().strip_prefix("sha256=").map(hex::decode) else {
            return unauthorized("X-Clawcage-Signature must be sha256=<hex>");
        };
        if !verify(
            hook.secret.expose().as_bytes(),
            timestamp.trim(),
            &body,
            &signature,
        ) {
            return unauthorized("the signature does not match");
        }
        if let Some(records) = self.shared.hub.parts.shared_records.clone() {
            // In a cluster the signature is taken once across every host, so a request
            // replayed to another host (after a takeover) is refused too.
            let key = format!("webhook.{name}.{}", hex::encode(&signature));
            let taken = tokio::task::spawn_blocking(move || records.take_once(&key)).await;
            match taken {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    return unauthorized("this signed request was seen before (a replay)");
                }
                Ok(Err(error)) => {
                    tracing::error!(%error, "cannot record a webhook signature in the cluster");
                    return refuse(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "the gateway cannot record the request against replays; retry later",
                    );
                }
                Err(error) => {
                    tracing::error!(%error, "the replay check stopped");
                    return refuse(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "the gateway cannot record the request against replays; retry later",
                    );
                }
            }
        } else {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if seen.pruned_at != now {
                seen.entries.retain(|_, expires| *expires >= now);
                seen.pruned_at = now;
            }
            let entry = (name.to_string(), signature.clone());
            if seen.entries.contains_key(&entry) {
                return unauthorized("this signed request was seen before (a replay)");
            }
            if seen.entries.len() >= MAX_SEEN {
                return refuse(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "too many requests within the replay window; retry later",
                );
            }
            if let Err(error) = seen.record(name, &signature, sent_at + hook.window + 1) {
                tracing::error!(%error, "cannot record a webhook signature in the replay cache");
                return refuse(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "the gateway cannot record the request against replays; retry later",
                );
            }
        }
        let payload: Value = match serde_json::from_slice(&body) {
            Ok(payload @ Value::Object(_)) => payload,
            _ => {
                return refuse(
                    http::StatusCode::BAD_REQUEST,
                    "the body must be a JSON object {\"message\": \"...\", \"peer\"?: \"...\", \"id\"?: \"...\"}",
                );
            }
        };
        let message = match payload.get("message").and_then(Value::as_str) {
            Some(text) if !text.trim().is_empty() && text.chars().count() <= 100_000 => text,
            _ => {
                return refuse(
                    http::StatusCode::BAD_REQUEST,
                    "`message` must be a non-empty string of at most 100,000 characters",
                );
            }
        };
        let peer = match payload.get("peer") {
            None | Some(Value::Null) => None,
            Some(Value::String(peer)) if peer_ok(peer) => Some(peer.clone()),
            Some(_) => {
                return refuse(
                    http::StatusCode::BAD_REQUEST,
                    "`peer` must be 1 to 64 of letters, digits and ._@+- (not starting with a dot)",
                );
            }
        };
        let id = match payload.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) if (1..=128).contains(&id.len()) => Some(id.clone()),
            Some(_) => {
                return refuse(
                    http::StatusCode::BAD_REQUEST,
                    "`id` must be a string of 1 to 128 characters",
                );
            }
        };
        let key = match &peer {
            Some(peer) => session_key("webhook", &format!("{name}:{peer}")),
            None => session_key("webhook", name),
        };
        let idempotency = format!(
            "webhook:{}",
            id.clone()
                .unwrap_or_else(|| hex::encode(&signature[..16.min(signature.len())]))
        );
        let run = match submit(&self.shared, &key, message.to_string(), &idempotency).await {
            Submitted::Run(run) => run,
            Submitted::Refused(why) => {
                return refuse(http::StatusCode::TOO_MANY_REQUESTS, &why);
            }
        };
        let hooks = self.clone();
        let (hook_name, reply_run) = (name.to_string(), run.clone());
        tokio::spawn(async move {
            let text = match outcome(&hooks.shared.hub, &reply_run).await {
                Outcome::Reply(text) => text,
                Outcome::Nothing | Outcome::Retry => return,
            };
            let reply = json!({
                "hook": hook_name,
                "peer": peer,
                "inReplyTo": id,
                "runId": reply_run,
                "kind": "reply",
                "text": text,
            });
            hooks.deliver(&hook_name, peer.as_deref(), &reply).await;
        });
        answer(
            http::StatusCode::ACCEPTED,
            json!({"ok": true, "runId": run, "sessionKey": key}),
        )
    }

    /// The `message` tool's text to hook `name` (and `peer`).
    pub async fn post_message(
        &self,
        name: &str,
        peer: Option<&str>,
        text: &str,
    ) -> Result<(), String> {
        let payload = json!({"hook": name, "peer": peer, "kind": "message", "text": text});
        self.post_signed(name, &payload).await
    }

    async fn deliver(&self, name: &str, peer: Option<&str>, payload: &Value) {
        if let Err(error) = self.post_signed(name, payload).await {
            let chars = payload
                .get("text")
                .and_then(Value::as_str)
                .map_or(0, |text| text.chars().count());
            let who = peer.map_or_else(|| name.to_string(), |peer| format!("{name}:{peer}"));
            self.shared
                .status
                .delivery_failed("webhook", &who, chars, &error);
        }
    }

    /// POSTs `payload` to hook `name`'s `reply_url`, signed, through the network policy;
    /// retried on network errors, 429 and 5xx.
    async fn post_signed(&self, name: &str, payload: &Value) -> Result<(), String> {
        let Some(hook) = self.hooks.get(name) else {
            return Err(format!("no webhook `{name}` is configured"));
        };
        let Some(url) = &hook.reply_url else {
            return Err(format!(
                "[channels.webhooks.{name}] has no reply_url, so the reply has nowhere to go; set one"
            ));
        };
        // Every string of the payload scrubbed of secret values before it is signed and sent.
        let redactor = self.shared.hub.parts.sessions.agent().redactor();
        let body = redact_json(redactor, payload).to_string().into_bytes();
        let mut last = String::new();
        for attempt in 0..POST_ATTEMPTS {
            if attempt > 0 {
                let wait = Duration::from_secs(1 << attempt.min(4));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.shared.shutdown.cancelled() => {
                        return Err(format!("the gateway stopped before the reply was delivered ({last})"));
                    }
                }
            }
            let timestamp = now_secs();
            let headers = vec![
                ("content-type".to_string(), "application/json".to_string()),
                (TIMESTAMP_HEADER.to_string(), timestamp.to_string()),
                (
                    SIGNATURE_HEADER.to_string(),
                    sign(hook.secret.expose().as_bytes(), timestamp, &body),
                ),
            ];
            match (self.post)(url.clone(), headers, body.clone()).await {
                Ok(status) if (200..300).contains(&status) => return Ok(()),
                Ok(status) if status == 429 || status >= 500 => {
                    last = format!("{url} answered {status}");
                }
                Ok(status) => return Err(format!("{url} answered {status}")),
                // The policy's refusals name what to add to [network] allow: not worth retrying.
                Err(error) if error.contains("[network]") => return Err(error),
                Err(error) => last = error,
            }
            tracing::warn!(hook = name, "a webhook reply failed: {last}; retrying");
        }
        Err(format!(
            "the reply to {url} failed {POST_ATTEMPTS} times; the last error: {last}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_and_any_change_breaks_them() {
        let secret = b"0123456789abcdef-secret";
        let signed = sign(secret, 1_700_000_000, b"{\"message\":\"hi\"}");
        let raw = hex::decode(signed.strip_prefix("sha256=").unwrap()).unwrap();
        assert!(verify(secret, "1700000000", b"{\"message\":\"hi\"}", &raw));
        assert!(!verify(secret, "1700000001", b"{\"message\":\"hi\"}", &raw));
        assert!(!verify(secret, "1700000000", b"{\"message\":\"hI\"}", &raw));
        assert!(!verify(
            b"another-secret-of-16",
            "1700000000",
            b"{\"message\":\"hi\"}",
            &raw
        ));
        assert!(!verify(
            secret,
            "1700000000",
            b"{\"message\":\"hi\"}",
            &raw[..31]
        ));
        // The well-known test vector of RFC 4231 (case 2) through the same construction.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn the_replay_cache_survives_a_reload_and_forgets_expired_entries() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seen.log");
        std::fs::write(&file, "ops 00ff 50\nops zz 500\ngarbage\nops 0a0b 90\n").unwrap();
        let mut seen = Seen::load(file.clone(), 60);
        assert_eq!(
            seen.entries.len(),
            1,
            "the expired and broken lines are dropped"
        );
        assert!(
            seen.entries
                .contains_key(&("ops".to_string(), vec![0x0a, 0x0b]))
        );
        seen.record("ops", &[1, 2, 3], 120).unwrap();
        let reloaded = Seen::load(file.clone(), 100);
        assert_eq!(reloaded.entries.len(), 1, "0a0b expired at 90");
        assert_eq!(
            reloaded.entries.get(&("ops".to_string(), vec![1, 2, 3])),
            Some(&120)
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn peers_are_checked() {
        assert!(peer_ok("ada@example.org"));
        assert!(!peer_ok(".hidden"));
        assert!(!peer_ok("a/b"));
        assert!(!peer_ok("a:b"));
        assert!(!peer_ok(&"x".repeat(65)));
    }
}
