//! Channels: adapters inside the gateway process that reach people where they already are —
//! Telegram ([`telegram`]) and signed webhooks ([`webhook`]). Each is a client of the
//! [`Hub`] like a WebSocket connection: a message from a person is handed to its session's lane
//! with [`Hub::send`] (so the session's queue mode decides what it does to a busy session), the
//! run's result comes back through [`Hub::wait_run`], and the reply goes out through the channel.
//! Who may talk is decided before anything reaches a lane ([`pairing`]); a reply that cannot be
//! delivered is retried and then recorded in `<state-dir>/channels/status.json` (shown by
//! `clawcage gateway status` and the `status` method) and the log, never dropped silently. The
//! secrets (the bot token, webhook secrets) stay in this process: no sandbox, file or
//! transcript ever holds one.

pub(crate) mod elsewhere;
pub mod pairing;
pub mod telegram;
pub mod webhook;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clawcage_agent::StateDir;
use clawcage_agent::approvals::ApprovalBroker;
use clawcage_agent::session::Admission;
use clawcage_core::approval::ApprovalDecision;
use clawcage_core::command::{APPROVE_USAGE, Command};
use clawcage_runtime::Error;
use clawcage_runtime::channel_config::{self, HttpPost};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, RunResult, RunStatus, Sent};
use crate::protocol::{Code, GatewayError};

/// Failed deliveries kept in the status file.
const KEPT_FAILURES: usize = 50;

/// Session key of `channel` and `peer` for the channels' agent.
pub fn session_key(channel: &str, peer: &str) -> String {
    format!("agent:{}:{channel}:{peer}", channel_config::CHANNEL_AGENT)
}

/// What the channels report: each channel's state and the deliveries that failed, kept in
/// `<state-dir>/channels/status.json` for `clawcage gateway status`.
pub struct ChannelStatus {
    file: PathBuf,
    inner: Mutex<StatusInner>,
}

#[derive(Default)]
struct StatusInner {
    channels: serde_json::Map<String, Value>,
    failures: VecDeque<Value>,
    failed_total: u64,
}

impl ChannelStatus {
    fn new(state_dir: &Path) -> Self {
        Self {
            file: StateDir::new(state_dir).channels_status(),
            inner: Mutex::new(StatusInner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusInner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets `channel`'s state, e.g. `{"state": "polling", "bot": "@name"}`.
    pub fn set(&self, channel: &str, state: Value) {
        let mut inner = self.lock();
        if inner.channels.get(channel) == Some(&state) {
            return;
        }
        inner.channels.insert(channel.to_string(), state);
        self.save(&inner);
    }

    /// Records a reply that could not be delivered, after its retries.
    pub fn delivery_failed(&self, channel: &str, peer: &str, chars: usize, error: &str) {
        tracing::error!(
            channel,
            peer,
            chars,
            "a reply could not be delivered and was given up: {error}"
        );
        let mut inner = self.lock();
        inner.failed_total += 1;
        inner.failures.push_back(json!({
            "channel": channel,
            "peer": peer,
            "chars": chars,
            "error": error,
            "atMs": clawcage_agent::transcript::now_ms(),
        }));
        while inner.failures.len() > KEPT_FAILURES {
            inner.failures.pop_front();
        }
        self.save(&inner);
    }

    /// `{channels, failedDeliveries, recentFailures}`.
    pub fn snapshot(&self) -> Value {
        let inner = self.lock();
        Self::json(&inner)
    }

    fn json(inner: &StatusInner) -> Value {
        json!({
            "channels": inner.channels,
            "failedDeliveries": inner.failed_total,
            "recentFailures": inner.failures,
        })
    }

    fn save(&self, inner: &StatusInner) {
        let text = Self::json(inner).to_string();
        if let Err(error) =
            clawcage_core::files::write_atomically(&self.file, text.as_bytes(), true)
        {
            tracing::warn!(%error, file = %self.file.display(), "cannot write the channels' status");
        }
    }
}

/// The channels' status a gateway on `state_dir` wrote, if any.
pub fn read_status(state_dir: &Path) -> Option<Value> {
    let file = StateDir::new(state_dir).channels_status();
    clawcage_core::files::read_regular_file(&file, 1 << 20, clawcage_core::files::Symlinks::Refuse)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// What the channels share.
pub(crate) struct Shared {
    pub(crate) hub: Arc<Hub>,
    pub(crate) status: ChannelStatus,
    pub(crate) pairing: pairing::PairingStore,
    pub(crate) shutdown: CancellationToken,
    /// The runtime's approvals, when its policy may ask a person.
    pub(crate) approvals: Option<ApprovalBroker>,
    /// How a message for a session another host serves reaches it, when the hosts of a
    /// cluster serve partitions.
    pub(crate) other_hosts: Option<Arc<crate::forward::HostClient>>,
    /// The Telegram conversations whose approval requests this host posts to their chat.
    pub(crate) approval_chats: Mutex<std::collections::HashSet<String>>,
}

/// The running channels of a gateway.
pub struct Channels {
    shared: Arc<Shared>,
    telegram: Option<Arc<telegram::Telegram>>,
    webhooks: Option<Arc<webhook::Webhooks>>,
    message_targets: Vec<String>,
}

/// What became of a message handed to a lane.
pub(crate) enum Submitted {
    /// A run was admitted (or an earlier one with the same idempotency key is known).
    Run(String),
    /// The lane refused it: the text says why, for the person.
    Refused(String),
}

/// Hands `text` from a channel to `key`'s lane: this host's, or the lane of the host serving
/// the session.
pub(crate) async fn submit(
    shared: &Shared,
    key: &str,
    text: String,
    idempotency: &str,
) -> Submitted {
    let hub = &shared.hub;
    if let Some(other_hosts) = &shared.other_hosts
        && hub.served_elsewhere(key)
    {
        let answer = other_hosts
            .request(
                "chat.send",
                json!({"sessionKey": key, "message": text, "idempotencyKey": idempotency}),
            )
            .await;
        return match answer {
            Ok(frame) if frame["ok"] == true => {
                let payload = &frame["payload"];
                match (payload["status"].as_str(), payload["runId"].as_str()) {
                    (Some("dropped"), _) => Submitted::Refused(
                        payload["reason"]
                            .as_str()
                            .unwrap_or("the session's queue refused the message")
                            .to_string(),
                    ),
                    (_, Some(run)) => Submitted::Run(run.to_string()),
                    _ => Submitted::Refused(format!("an unexpected answer: {payload}")),
                }
            }
            Ok(frame) => Submitted::Refused(
                frame["error"]["message"]
                    .as_str()
                    .unwrap_or("the host serving the session refused the message")
                    .to_string(),
            ),
            Err(why) => Submitted::Refused(why),
        };
    }
    let mut refused = None;
    let sent = hub
        .send(key, text, Some(idempotency), None, |_, admission, _| {
            if let Admission::Dropped { reason } = admission {
                refused = Some(reason.to_string());
            }
        })
        .await;
    match sent {
        Ok(Sent::Started(run_id)) | Ok(Sent::Duplicate(run_id, _)) => Submitted::Run(run_id),
        Ok(Sent::Refused) => Submitted::Refused(
            refused.unwrap_or_else(|| "the session's queue refused the message".to_string()),
        ),
        Err(error) => Submitted::Refused(error.message),
    }
}

/// What to tell the person once a run has ended.
pub(crate) enum Outcome {
    /// This text.
    Reply(String),
    /// Nothing: the message joined another run, whose reply answers it.
    Nothing,
    /// The gateway is stopping and the run was stopped: keep the message for the next start.
    Retry,
}

/// `text` with every secret value the runtime holds replaced (the redactor the lanes use). A
/// reply comes from the model's output, already scrubbed at the provider; a channel scrubs what
/// it sends and stores once more, since it also sends texts of its own (errors, notes).
pub(crate) fn scrub(hub: &Hub, text: &str) -> String {
    hub.parts.sessions.agent().redactor().redact(text)
}

/// Waits for `run_id` and says what to reply (scrubbed).
pub(crate) async fn outcome(hub: &Hub, run_id: &str) -> Outcome {
    match raw_outcome(hub, run_id).await {
        Outcome::Reply(text) => Outcome::Reply(scrub(hub, &text)),
        other => other,
    }
}

async fn raw_outcome(hub: &Hub, run_id: &str) -> Outcome {
    let result = hub.wait_run(run_id, crate::methods::MAX_WAIT).await;
    let Some(Some(RunResult { status, payload })) = result else {
        return if hub.shutting_down() {
            Outcome::Retry
        } else {
            Outcome::Reply("(no answer: the run was not found or took longer than an hour)".into())
        };
    };
    let error = payload
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("unknown error")
        .to_string();
    match status {
        RunStatus::Ok | RunStatus::InFlight => {
            if payload.get("joinedRun").is_some_and(|run| !run.is_null()) {
                return Outcome::Nothing;
            }
            match payload.get("text").and_then(Value::as_str) {
                Some(text) if !text.trim().is_empty() => Outcome::Reply(text.to_string()),
                _ => Outcome::Nothing,
            }
        }
        RunStatus::Aborted | RunStatus::Interrupted if hub.shutting_down() => Outcome::Retry,
        RunStatus::Aborted => Outcome::Reply("(stopped)".to_string()),
        RunStatus::Interrupted => Outcome::Retry,
        RunStatus::Error => Outcome::Reply(format!("(the turn failed: {error})")),
        RunStatus::Dropped => Outcome::Reply(format!("(your message was dropped: {error})")),
    }
}

impl Channels {
    /// Starts the configured channels on `hub`: Telegram's long polling, the webhooks' routes.
    /// With `poller_lease` (the cluster's leases and their time to live, when its hosts serve
    /// partitions), Telegram is polled only while this host holds the poller's lease.
    /// A channel whose secret variable is unset is an error naming the variable. With
    /// `approvals`, a Telegram conversation of approved people hears its sessions' approval
    /// requests and answers them with `/approve`.
    pub(crate) fn start(
        hub: Arc<Hub>,
        config: &channel_config::Channels,
        post: HttpPost,
        approvals: Option<ApprovalBroker>,
        shutdown: CancellationToken,
        other_hosts: Option<Arc<crate::forward::HostClient>>,
        poller_lease: Option<(clawcage_cluster::Leases, std::time::Duration)>,
    ) -> Result<Arc<Channels>, Error> {
        let state_dir = hub.parts.state_dir.clone();
        let pairing = hub.parts.pairing();
        let shared = Arc::new(Shared {
            hub,
            status: ChannelStatus::new(&state_dir),
            pairing,
            shutdown,
            approvals,
            other_hosts,
            approval_chats: Mutex::new(std::collections::HashSet::new()),
        });
        let telegram = match &config.telegram {
            // Every host of the cluster sends; the one holding the poller's lease polls.
            Some(settings) => match poller_lease {
                Some((leases, ttl)) => {
                    let sender = telegram::Telegram::sender(shared.clone(), settings)?;
                    tokio::spawn(telegram::poll_while_leased(
                        shared.clone(),
                        settings.clone(),
                        leases,
                        ttl,
                    ));
                    Some(sender)
                }
                None => Some(telegram::Telegram::start(
                    shared.clone(),
                    settings,
                    shared.shutdown.clone(),
                )?),
            },
            None => None,
        };
        if let Some(telegram) = &telegram {
            telegram.post_approvals_of_known_people();
        }
        let webhooks = if config.webhooks.is_empty() {
            None
        } else {
            Some(webhook::Webhooks::new(
                shared.clone(),
                &config.webhooks,
                post,
            )?)
        };
        Ok(Arc::new(Channels {
            shared,
            telegram,
            webhooks,
            message_targets: config.message_targets.clone(),
        }))
    }

    /// The channels' part of `status`.
    pub fn status(&self) -> Value {
        self.shared.status.snapshot()
    }

    /// The pairing records.
    pub fn pairing(&self) -> &pairing::PairingStore {
        &self.shared.pairing
    }

    /// The webhooks, if any is configured.
    pub fn webhooks(&self) -> Option<&Arc<webhook::Webhooks>> {
        self.webhooks.as_ref()
    }

    /// What the host polling a channel asks of this one for conversation `key`, which this
    /// host serves ([`elsewhere`]), with the proof (made at `at_secs`) that a host asks: from now on the approval requests of its turns are posted to
    /// the conversation (`by`, an approved person, wrote in it), and `line`, a command
    /// (`/queue …`, `/approve …`), is carried out here. The command's reply (empty without one).
    pub(crate) fn conversation(
        &self,
        (key, by, line): (&str, &str, Option<&str>),
        at_secs: u64,
        proof: &str,
    ) -> Result<String, GatewayError> {
        let telegram = self.telegram.as_ref().ok_or_else(|| {
            GatewayError::new(
                Code::Unavailable,
                "this host has no Telegram channel: give every host of the cluster the same [channels.telegram]",
            )
        })?;
        elsewhere::check_proof(
            telegram.bot_token(),
            clawcage_agent::transcript::now_ms() / 1000,
            at_secs,
            (key, by, line),
            proof,
        )
        .map_err(|why| GatewayError::new(Code::Unauthorized, why))?;
        let params = |why: String| GatewayError::params(elsewhere::CONVERSATION_METHOD, why);
        let chat = elsewhere::telegram_chat_of(key)
            .ok_or_else(|| params(format!("{key} is not a Telegram conversation's session")))?;
        telegram.post_approvals(key, chat.0, chat.1);
        match line {
            Some(line) => conversation_command(&self.shared, key, line, by).map_err(params),
            None => Ok(String::new()),
        }
    }

    /// The `message` tool of a turn of `key`: delivers `content` to the channel and peer of the
    /// session (`target` absent or `user`), or to `target` (`telegram:<chatId>`,
    /// `webhook:<name>`) where `[channels] message_targets` allows it. `Ok(false)` when `key`
    /// is not a channel's session and no target was named (nothing to deliver here).
    pub async fn deliver_message(
        &self,
        key: &str,
        target: &str,
        content: &str,
    ) -> Result<bool, String> {
        let own = key_target(key);
        let wanted = if target.is_empty() || target == "user" {
            match &own {
                Some(own) => own.clone(),
                None => return Ok(false),
            }
        } else {
            target.to_string()
        };
        let allowed = own.as_deref().is_some_and(|own| {
            own == wanted || own.split(":topic:").next() == Some(wanted.as_str())
        }) || self.message_targets.contains(&wanted);
        if !allowed {
            return Err(format!(
                "this session may not send to `{wanted}`: the operator can list it in [channels] message_targets; leave `channel` out to answer the person of this conversation"
            ));
        }
        if let Some(rest) = wanted.strip_prefix("telegram:") {
            let Some(telegram) = &self.telegram else {
                return Err("the Telegram channel is not configured".to_string());
            };
            let (chat, thread) = match rest.split_once(":topic:") {
                Some((chat, thread)) => (chat, thread.parse::<i64>().ok()),
                None => (rest, None),
            };
            let chat: i64 = chat
                .parse()
                .map_err(|_| format!("`{wanted}` names no Telegram chat id"))?;
            return telegram
                .send_text(chat, thread, None, content)
                .await
                .map(|()| true);
        }
        if let Some(rest) = wanted.strip_prefix("webhook:") {
            let Some(webhooks) = &self.webhooks else {
                return Err("no webhook is configured".to_string());
            };
            let (name, peer) = match rest.split_once(':') {
                Some((name, peer)) => (name, Some(peer)),
                None => (rest, None),
            };
            return webhooks
                .post_message(name, peer, content)
                .await
                .map(|()| true);
        }
        Err(format!(
            "`{wanted}` is not a channel destination; use telegram:<chatId> or webhook:<name>"
        ))
    }
}

/// Whether an approval request of `session` (a sub-agent's too) belongs to the conversation
/// `key`.
fn request_of(key: &str, session: Option<&str>) -> bool {
    session.is_some_and(|session| {
        session == key
            || session
                .strip_prefix(key)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// A conversation's command `line` (`/queue …`, `/approve …`) for session `key`, asked by
/// `by` (an approved person), carried out on this host: the reply. A line that is neither is an
/// error.
pub(crate) fn conversation_command(
    shared: &Shared,
    key: &str,
    line: &str,
    by: &str,
) -> Result<String, String> {
    match Command::parse(line) {
        Some(Ok(Command::Queue(line))) => Ok(shared
            .hub
            .parts
            .sessions
            .queue_command(key, &line)
            .unwrap_or_else(|error| error.to_string())),
        Some(Ok(Command::Approve { id, decision })) => {
            Ok(approve_command(shared, key, Some((&id, decision)), by))
        }
        Some(Ok(Command::ApproveUsage)) => Ok(approve_command(shared, key, None, by)),
        Some(Err(error)) => Ok(error.to_string()),
        _ => Err(format!(
            "`{}` is not a conversation command: /queue or /approve",
            line.split_whitespace().next().unwrap_or_default()
        )),
    }
}

/// `/approve ID allow-once|allow-always|deny` from the conversation `key`, by an approved
/// person (`by` names them): `decided` is the id and answer, or `None` for `/approve` without
/// them (what waits is listed). Only the requests of this conversation's session can be answered.
pub(crate) fn approve_command(
    shared: &Shared,
    key: &str,
    decided: Option<(&str, ApprovalDecision)>,
    by: &str,
) -> String {
    let Some(broker) = &shared.approvals else {
        return "approvals are off in this gateway: nothing waits for an answer".to_string();
    };
    let Some((id, decision)) = decided else {
        let waiting: Vec<String> = broker
            .pending()
            .into_iter()
            .filter(|request| request_of(key, request.session_key.as_deref()))
            .map(|request| format!("{}: {}", request.id, request.describe()))
            .collect();
        return if waiting.is_empty() {
            format!("nothing waits for approval here; use {APPROVE_USAGE}")
        } else {
            format!("use {APPROVE_USAGE}. Waiting:\n{}", waiting.join("\n"))
        };
    };
    let ours = broker
        .pending()
        .into_iter()
        .any(|request| request.id == id && request_of(key, request.session_key.as_deref()));
    if !ours {
        return format!(
            "no approval request {id} waits in this conversation (it was decided, it timed out, or the id is wrong)"
        );
    }
    match broker.resolve(id, decision, by) {
        Ok(()) => format!("{id}: {}", decision.as_str()),
        Err(error) => error.to_string(),
    }
}

/// The destination a channel session's key names: `telegram:<chat>[:topic:<thread>]` or
/// `webhook:<name>[:<peer>]`.
fn key_target(key: &str) -> Option<String> {
    let rest = key.strip_prefix(&format!("agent:{}:", channel_config::CHANNEL_AGENT))?;
    (rest.starts_with("telegram:") || rest.starts_with("webhook:")).then(|| rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_keys_name_their_destination() {
        assert_eq!(
            key_target("agent:main:telegram:42").as_deref(),
            Some("telegram:42")
        );
        assert_eq!(
            key_target("agent:main:telegram:-100:topic:7").as_deref(),
            Some("telegram:-100:topic:7")
        );
        assert_eq!(key_target("agent:main:webchat:abc"), None);
        assert_eq!(key_target("chat"), None);
        assert_eq!(
            session_key("webhook", "ops:ada"),
            "agent:main:webhook:ops:ada"
        );
    }
}
