//! The Telegram channel over the Bot API (HTTPS through reqwest, rustls, no proxy): long polling
//! with `getUpdates`, replies with `sendMessage` (HTML parse mode with `&`, `<` and `>` escaped,
//! split at 4,096 UTF-16 units, preferably at a blank line, a line end or a space), the typing
//! indicator while a turn runs. Session keys are `agent:main:telegram:<chatId>`, with
//! `:topic:<threadId>` for a forum topic.
//!
//! Nothing is lost or done twice across a restart: every update of a batch is written to
//! `<state-dir>/channels/telegram.json` (atomically, mode 0600) together with the next offset
//! before any of it is handled, so Telegram forgets the batch only once it is on disk. Each
//! record stays until its reply is delivered; the reply is recorded before it is sent. At the
//! next start a record with a reply is delivered, one without is handed to its lane again (a
//! killed gateway saved none of the interrupted run's messages). A 429 waits its `retry_after`,
//! network errors back off; a reply that still cannot be sent is recorded in the status and the
//! log. The token is only ever part of the request URL, which no error, log line or file shows.
//!
//! Here: the bot (over 700 lines: polling, judging each update, handing it to its lane and
//! delivering replies all work on the one `Telegram` state and pass records to each other);
//! `journal` the offset and the records kept until answered; `api` the Bot API calls; `format` a
//! reply's HTML and its pieces.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clawcage_core::sync::lock;
use clawcage_runtime::Error;
use clawcage_runtime::channel_config::{
    ChannelSecret, DmPolicy, GroupPolicy, Telegram as Settings,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use clawcage_agent::approvals::{OperatorEvent, OperatorFilter};
use clawcage_core::command::{Command, CommandError};

mod api;
mod format;
mod journal;
mod poller_lease;
pub(crate) use poller_lease::poll_while_leased;

use api::{Api, ApiError};
pub use format::{escape_html, split_message};
use journal::{Journal, Pending};

use super::pairing::CodeRequest;
use super::{Outcome, Shared, Submitted, outcome, session_key, submit};

/// The longest message Telegram accepts, in UTF-16 code units.
pub const MAX_MESSAGE_UNITS: usize = 4096;

/// Attempts to send one message before it is given up.
const SEND_ATTEMPTS: u32 = 6;

/// The longest `retry_after` honoured by waiting (longer ones count as a failed attempt).
const MAX_RETRY_AFTER: u64 = 300;

/// The largest Bot API answer read (a full `getUpdates` batch is far smaller).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The longest text handed to the agent, in characters.
const MAX_INPUT_CHARS: usize = 20_000;

/// The bot as `getMe` describes it.
#[derive(Debug, Clone)]
struct Bot {
    id: i64,
    username: String,
}

/// A chat and, in a forum, its topic.
type Chat = (i64, Option<i64>);

/// One item of a chat's delivery queue.
struct Job {
    pending: Pending,
    run: Option<String>,
}

/// The running Telegram channel.
pub struct Telegram {
    shared: Arc<Shared>,
    settings: Settings,
    api: Api,
    journal: Journal,
    bot: OnceLock<Bot>,
    chats: Mutex<HashMap<Chat, mpsc::UnboundedSender<Job>>>,
    /// Cancelled when this poller stops: the gateway stops, or (a cluster whose hosts serve
    /// partitions) this host no longer holds the poller's lease.
    stop: CancellationToken,
}

/// The next wait of an exponential backoff: 1, 2, 4, … 30 seconds.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// How long to wait after the Bot API refused the token `refusals` times before (0 for the
/// first refusal): 1, 2, 4, … minutes, at most an hour. A token is not fixed by asking again;
/// the operator is told once, and the gateway keeps asking now and then in case it changes.
fn refused_token_wait(refusals: u32) -> Duration {
    Duration::from_secs(60u64 << refusals.min(6)).min(Duration::from_secs(3600))
}

impl Telegram {
    /// Reads the journal and starts polling, until `stop`.
    pub(crate) fn start(
        shared: Arc<Shared>,
        settings: &Settings,
        stop: CancellationToken,
    ) -> Result<Arc<Telegram>, Error> {
        let telegram = Self::new(shared, settings, stop)?;
        tokio::spawn(telegram.clone().poll());
        Ok(telegram)
    }

    /// The channel without its poller: it sends (the `message` tool's deliveries) but takes no
    /// update (another host of the cluster polls).
    pub(crate) fn sender(shared: Arc<Shared>, settings: &Settings) -> Result<Arc<Telegram>, Error> {
        let stop = shared.shutdown.clone();
        Self::new(shared, settings, stop)
    }

    fn new(
        shared: Arc<Shared>,
        settings: &Settings,
        stop: CancellationToken,
    ) -> Result<Arc<Telegram>, Error> {
        let Some(token) = &settings.token else {
            return Err(Error::Usage(format!(
                "[channels.telegram] needs the bot token in the environment variable {}: export {}=<the token @BotFather gave you> before `clawcage gateway`, or remove [channels.telegram]",
                settings.token_env, settings.token_env
            )));
        };
        let journal = Journal::open(shared.hub.parts.telegram_journal())?;
        let telegram = Arc::new(Telegram {
            api: Api::new(settings, token)?,
            shared,
            settings: settings.clone(),
            journal,
            bot: OnceLock::new(),
            chats: Mutex::new(HashMap::new()),
            stop,
        });
        Ok(telegram)
    }

    async fn sleep(&self, wait: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// `getMe`, then the journal's records, then long polling until the gateway stops.
    async fn poll(self: Arc<Self>) {
        let status = &self.shared.status;
        status.set("telegram", json!({"state": "starting"}));
        let mut attempt = 0;
        let mut refusals = 0;
        let nothing = json!({});
        let bot = loop {
            let me = tokio::select! {
                me = self.api.call("getMe", &nothing) => me,
                () = self.stop.cancelled() => return,
            };
            let wait = match me {
                Ok(me) => {
                    let id = me.get("id").and_then(Value::as_i64).unwrap_or_default();
                    let username = me
                        .get("username")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    break Bot { id, username };
                }
                Err(ApiError::RetryAfter(seconds)) => {
                    Duration::from_secs(seconds.min(MAX_RETRY_AFTER))
                }
                Err(ApiError::Refused(code @ (401 | 404), _)) => {
                    let wait = refused_token_wait(refusals);
                    let why = format!(
                        "the Bot API refused the token ({code}); check the token in {} (from @BotFather) and restart the gateway",
                        self.settings.token_env
                    );
                    // Said once as an error; asking again is only worth a debug line.
                    if refusals == 0 {
                        tracing::error!("{why}; asking again in {} s", wait.as_secs());
                    } else {
                        tracing::debug!(refusals, "{why}; asking again in {} s", wait.as_secs());
                    }
                    refusals += 1;
                    status.set(
                        "telegram",
                        json!({"state": "error", "error": why, "refusals": refusals, "retryInS": wait.as_secs()}),
                    );
                    wait
                }
                Err(error) => {
                    tracing::warn!("Telegram getMe failed: {error}; retrying");
                    status.set(
                        "telegram",
                        json!({"state": "retrying", "error": error.to_string()}),
                    );
                    attempt += 1;
                    backoff(attempt - 1)
                }
            };
            if !self.sleep(wait).await {
                return;
            }
        };
        tracing::info!(bot = %bot.username, "Telegram: polling");
        status.set(
            "telegram",
            json!({"state": "polling", "bot": format!("@{}", bot.username)}),
        );
        let _ = self.bot.set(bot);
        // What the last process left: deliver the known replies, hand the rest to the lanes.
        let left = self.journal.pending();
        for pending in left {
            self.dispatch(pending).await;
        }
        let mut attempt = 0;
        loop {
            let offset = self.journal.offset();
            let mut request = json!({
                "timeout": self.settings.poll_timeout.as_secs(),
                "allowed_updates": ["message"],
            });
            if offset > 0 {
                request["offset"] = json!(offset);
            }
            let answer = tokio::select! {
                answer = self.api.call("getUpdates", &request) => answer,
                () = self.stop.cancelled() => return,
            };
            let wait = match answer {
                Ok(Value::Array(updates)) => {
                    if attempt > 0 {
                        status.set(
                            "telegram",
                            json!({"state": "polling", "bot": format!("@{}", self.bot_name())}),
                        );
                    }
                    attempt = 0;
                    if let Err(error) = self.take(updates).await {
                        tracing::error!("{error}");
                        status.set("telegram", json!({"state": "error", "error": error}));
                        backoff(5)
                    } else {
                        continue;
                    }
                }
                Ok(_) => {
                    tracing::warn!("Telegram getUpdates answered something other than a list");
                    attempt += 1;
                    backoff(attempt - 1)
                }
                Err(ApiError::RetryAfter(seconds)) => {
                    Duration::from_secs(seconds.min(MAX_RETRY_AFTER))
                }
                Err(error) => {
                    tracing::warn!("Telegram getUpdates failed: {error}; backing off");
                    attempt += 1;
                    status.set(
                        "telegram",
                        json!({"state": "retrying", "error": error.to_string()}),
                    );
                    backoff(attempt - 1)
                }
            };
            if !self.sleep(wait).await {
                return;
            }
        }
    }

    fn bot_name(&self) -> String {
        self.bot
            .get()
            .map(|bot| bot.username.clone())
            .unwrap_or_default()
    }

    /// Records a batch (and the offset after it) in the journal, then handles it.
    async fn take(self: &Arc<Self>, updates: Vec<Value>) -> Result<(), String> {
        let taken = self
            .journal
            .record(&updates, |id, update| self.judge(id, update))?;
        for pending in taken {
            self.dispatch(pending).await;
        }
        Ok(())
    }

    /// What to do with one update: `None` to ignore it.
    fn judge(self: &Arc<Self>, update_id: u64, update: &Value) -> Option<Pending> {
        let message = update.get("message")?;
        let chat = message.get("chat")?;
        let chat_id = chat.get("id").and_then(Value::as_i64)?;
        let chat_type = chat.get("type").and_then(Value::as_str).unwrap_or_default();
        let from = message.get("from");
        let user_id = from
            .and_then(|from| from.get("id"))
            .and_then(Value::as_i64)?;
        if from
            .and_then(|from| from.get("is_bot"))
            .and_then(Value::as_bool)
            == Some(true)
        {
            return None;
        }
        let name = from
            .map(|from| {
                [from.get("first_name"), from.get("last_name")]
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let text = message
            .get("text")
            .or_else(|| message.get("caption"))
            .and_then(Value::as_str)?;
        let message_id = message.get("message_id").and_then(Value::as_i64);
        let thread_id = if message.get("is_topic_message").and_then(Value::as_bool) == Some(true) {
            message.get("message_thread_id").and_then(Value::as_i64)
        } else {
            None
        };
        let reply = |text: String| Pending {
            update_id,
            chat_id,
            thread_id,
            message_id,
            session_key: None,
            text: None,
            reply: Some(text),
            approved_by: None,
            command: false,
        };
        let user = user_id.to_string();
        let known = self.knows(&user);
        let private = chat_type == "private";
        let mut text = text.to_string();
        if private {
            if !known && self.settings.dm_policy != DmPolicy::Open {
                if self.settings.dm_policy == DmPolicy::Allowlist {
                    tracing::info!(user = %user, "Telegram: a message from a sender not on allow_from was ignored");
                    return None;
                }
                return match self.shared.pairing.request("telegram", &user, &name) {
                    Ok(CodeRequest::Issued(code)) => {
                        tracing::info!(user = %user, code = %code, "Telegram: an unknown sender was given a pairing code");
                        Some(reply(format!(
                            "I don't know you yet, so your message was not passed on. Your pairing code is {code} (valid for an hour). Ask the operator of this bot to run:\n\nclawcage pairing approve {code}\n\nthen write again. (Your Telegram user id is {user}.)"
                        )))
                    }
                    Ok(CodeRequest::AlreadyPending(_)) => None,
                    Ok(CodeRequest::Full) => {
                        tracing::warn!(
                            "Telegram: too many pairing requests are waiting; an unknown sender got no code"
                        );
                        None
                    }
                    Err(error) => {
                        tracing::error!("{error}");
                        None
                    }
                };
            }
        } else {
            match self.settings.groups {
                GroupPolicy::Off => return None,
                GroupPolicy::All => {}
                GroupPolicy::Mention => {
                    let bot = self.bot.get()?;
                    let mention = format!("@{}", bot.username);
                    let replied_to_bot = message
                        .pointer("/reply_to_message/from/id")
                        .and_then(Value::as_i64)
                        == Some(bot.id);
                    let mentioned = !bot.username.is_empty()
                        && text.to_lowercase().contains(&mention.to_lowercase());
                    if !mentioned && !replied_to_bot {
                        return None;
                    }
                }
            }
            if let Some(bot) = self.bot.get()
                && !bot.username.is_empty()
            {
                text = strip_mention(&text, &bot.username);
            }
        }
        let key = match thread_id {
            Some(thread) => session_key("telegram", &format!("{chat_id}:topic:{thread}")),
            None => session_key("telegram", &chat_id.to_string()),
        };
        let trimmed = text.trim();
        let by = format!("telegram:{user}");
        let parsed = Command::parse(trimmed);
        let for_approved_people = matches!(
            parsed,
            Some(Ok(Command::Queue(_)
                | Command::Approve { .. }
                | Command::ApproveUsage))
                | Some(Err(CommandError::BadApprove(_)))
        );
        if for_approved_people && !known {
            let word = trimmed.split_whitespace().next().unwrap_or_default();
            let word = word.split('@').next().unwrap_or(word);
            return Some(reply(format!(
                "{word} is for approved people: ask the operator to approve you (allow_from in [channels.telegram], or a pairing)."
            )));
        }
        match parsed {
            Some(Ok(Command::Start)) if private => {
                return Some(reply(
                    "Hello! Write to me and the agent answers.".to_string(),
                ));
            }
            Some(Ok(Command::Queue(_) | Command::Approve { .. } | Command::ApproveUsage)) => {
                // The session's queue and the requests its turns wait on are the serving
                // host's: a command for a session another host serves is carried out there.
                if super::elsewhere::served_elsewhere(&self.shared, &key) {
                    return Some(Pending {
                        session_key: Some(key),
                        // Journaled as every text is: secret values replaced.
                        text: Some(super::scrub(&self.shared.hub, trimmed)),
                        reply: None,
                        approved_by: Some(by),
                        command: true,
                        ..reply(String::new())
                    });
                }
                return Some(reply(
                    super::conversation_command(&self.shared, &key, trimmed, &by)
                        .unwrap_or_else(|why| why),
                ));
            }
            Some(Err(error @ CommandError::BadApprove(_))) => {
                return Some(reply(error.to_string()));
            }
            // Other slash lines go to the agent as they are.
            _ => {}
        }
        if trimmed.is_empty() {
            return None;
        }
        if known {
            self.post_approvals(&key, chat_id, thread_id);
        }
        let mut input: String = trimmed.chars().take(MAX_INPUT_CHARS).collect();
        if !private {
            let who = if name.trim().is_empty() {
                user.clone()
            } else {
                name
            };
            input = format!("[{who}] {input}");
        }
        Some(Pending {
            update_id,
            chat_id,
            thread_id,
            message_id,
            session_key: Some(key),
            // The journal on disk holds what the lane gets: the text with secret values replaced.
            text: Some(super::scrub(&self.shared.hub, &input)),
            reply: None,
            approved_by: known.then_some(by),
            command: false,
        })
    }

    /// The bot's token (a channel without one is never made): the key of the proofs by which
    /// the hosts of a cluster ask each other about a conversation ([`super::elsewhere`]).
    pub(super) fn bot_token(&self) -> &str {
        self.settings
            .token
            .as_ref()
            .map(|token| token.expose())
            .unwrap_or_default()
    }

    /// Whether Telegram user `user` is an approved person (listed in `allow_from`, or paired).
    fn knows(&self, user: &str) -> bool {
        self.settings
            .allow_from
            .iter()
            .any(|allowed| allowed == user)
            || self
                .shared
                .pairing
                .is_approved("telegram", user)
                .unwrap_or_else(|error| {
                    tracing::error!("{error}");
                    false
                })
    }

    /// Watches every approval request asked on this host while it runs: one of a private
    /// conversation with an approved person, or of a group an approved person wrote in (the
    /// journal remembers), gets that conversation's requests posted to it
    /// ([`Telegram::post_approvals`]) even when no message came through this host first (a
    /// turn resumed here after a restart or a takeover).
    pub(super) fn post_approvals_of_known_people(self: &Arc<Self>) {
        let Some(broker) = &self.shared.approvals else {
            return;
        };
        let mut operator = broker.operator(OperatorFilter::All);
        let telegram = self.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = operator.next() => event,
                    () = telegram.shared.shutdown.cancelled() => return,
                };
                let request = match event {
                    None => return,
                    Some(OperatorEvent::Requested(request)) => request,
                    Some(_) => continue,
                };
                // A sub-agent's request is its conversation's (`KEY/sub-N`).
                let Some(key) = request
                    .session_key
                    .as_deref()
                    .and_then(|session| session.split('/').next())
                else {
                    continue;
                };
                let Some((chat, thread)) = super::elsewhere::telegram_chat_of(key) else {
                    continue;
                };
                if lock(&telegram.shared.approval_chats).contains(key) {
                    continue;
                }
                // A private chat's id is its person's; a group's are negative.
                if thread.is_none() && chat > 0 && telegram.knows(&chat.to_string()) {
                    telegram.post_approvals(key, chat, None);
                    continue;
                }
                // A group, or a topic, where an approved person wrote (the journal says so,
                // whichever host polls).
                let store = telegram.shared.hub.parts.telegram_journal();
                let asked = key.to_string();
                let wrote = tokio::task::spawn_blocking(move || {
                    journal::approved_person_wrote_in(store.as_ref(), &asked)
                })
                .await
                .unwrap_or(false);
                if wrote {
                    telegram.post_approvals(key, chat, thread);
                }
            }
        });
    }

    /// From now on, the approval requests of `key`'s turns (and its sub-agents') are posted to
    /// the chat, to be answered with `/approve` by an approved person (those waiting now
    /// first). Without approvals, or once done for `key` on this host (by any of its Telegram
    /// pollers and its sender), nothing happens.
    pub(super) fn post_approvals(self: &Arc<Self>, key: &str, chat: i64, thread: Option<i64>) {
        let Some(broker) = &self.shared.approvals else {
            return;
        };
        if !lock(&self.shared.approval_chats).insert(key.to_string()) {
            return;
        }
        let mut operator = broker.operator(OperatorFilter::Session(key.to_string()));
        let telegram = self.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = operator.next() => event,
                    // The host's own, not a poller's: this host may stop polling and serve on.
                    () = telegram.shared.shutdown.cancelled() => return,
                };
                let text = match event {
                    None => return,
                    Some(OperatorEvent::Requested(request)) => {
                        let mut text =
                            format!("Approval needed ({}):\n{}", request.id, request.describe());
                        for reason in &request.reasons {
                            text.push_str(&format!("\n({reason})"));
                        }
                        text.push_str(&format!(
                            "\n\nAnswer with:\n/approve {id} allow-once\n/approve {id} allow-always\n/approve {id} deny",
                            id = request.id
                        ));
                        text
                    }
                    Some(OperatorEvent::Resolved { id, decision, by }) if by == "timeout" => {
                        format!("{id}: nobody answered in time ({})", decision.as_str())
                    }
                    Some(OperatorEvent::Resolved { .. }) => continue,
                };
                if let Err(error) = telegram.send_text(chat, thread, None, &text).await {
                    telegram.shared.status.delivery_failed(
                        "telegram",
                        &chat.to_string(),
                        text.chars().count(),
                        &error,
                    );
                }
            }
        });
    }

    /// Hands a record's text to its lane (in update order) and queues its delivery.
    async fn dispatch(self: &Arc<Self>, pending: Pending) {
        let run = match (&pending.reply, &pending.session_key, &pending.text) {
            // A command for the host serving the session: its answer goes out at once.
            (None, Some(key), Some(line)) if pending.command => {
                let (telegram, key, line) = (self.clone(), key.clone(), line.clone());
                tokio::spawn(async move {
                    let by = pending.approved_by.clone().unwrap_or_default();
                    let answer = if super::elsewhere::served_elsewhere(&telegram.shared, &key) {
                        super::elsewhere::ask_serving_host(
                            &telegram.shared,
                            telegram.bot_token(),
                            &key,
                            &by,
                            Some(&line),
                        )
                        .await
                        .unwrap_or_else(|why| {
                            format!("(the command was not carried out: {why}; send it again)")
                        })
                    } else {
                        super::conversation_command(&telegram.shared, &key, &line, &by)
                            .unwrap_or_else(|why| why)
                    };
                    telegram.deliver(&pending, &answer).await;
                });
                return;
            }
            (None, Some(key), Some(text)) => {
                // An approved person wrote to a session another host serves: that host posts
                // the approval requests of its turns here.
                if let Some(by) = &pending.approved_by
                    && super::elsewhere::served_elsewhere(&self.shared, key)
                    && let Err(why) = super::elsewhere::ask_serving_host(
                        &self.shared,
                        self.bot_token(),
                        key,
                        by,
                        None,
                    )
                    .await
                {
                    tracing::warn!(session = %key, "the host serving the conversation was not told to post its approval requests: {why}");
                }
                match submit(
                    &self.shared,
                    key,
                    text.clone(),
                    &format!("telegram:{}", pending.update_id),
                )
                .await
                {
                    Submitted::Run(run) => Some(run),
                    Submitted::Refused(why) => {
                        let why = format!("(your message was not taken: {why})");
                        self.journal.update(pending.update_id, |mut kept| {
                            kept.reply = Some(why.clone());
                            Some(kept)
                        });
                        let mut pending = pending;
                        pending.reply = Some(why);
                        return self.enqueue(Job { pending, run: None });
                    }
                }
            }
            // A command's answer or a pairing code goes out at once, not behind a running
            // turn (which may be waiting for the `/approve` this answers).
            (Some(reply), None, _) => {
                let (telegram, reply) = (self.clone(), reply.clone());
                tokio::spawn(async move { telegram.deliver(&pending, &reply).await });
                return;
            }
            _ => None,
        };
        self.enqueue(Job { pending, run });
    }

    /// Queues `job` on its chat's delivery task, which answers the chat's messages in order.
    fn enqueue(self: &Arc<Self>, job: Job) {
        let chat = (job.pending.chat_id, job.pending.thread_id);
        let mut chats = lock(&self.chats);
        let sender = chats.entry(chat).or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(self.clone().deliver_in_order(receiver));
            sender
        });
        if let Err(mpsc::error::SendError(job)) = sender.send(job) {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(self.clone().deliver_in_order(receiver));
            let _ = sender.send(job);
            chats.insert(chat, sender);
        }
    }

    async fn deliver_in_order(self: Arc<Self>, mut jobs: mpsc::UnboundedReceiver<Job>) {
        while let Some(Job { pending, run }) = jobs.recv().await {
            let reply = match (&pending.reply, run) {
                (Some(reply), _) => Some(reply.clone()),
                (None, Some(run)) => {
                    let waited = self
                        .with_typing(&pending, outcome(&self.shared.hub, &run))
                        .await;
                    match waited {
                        Outcome::Retry => continue,
                        Outcome::Nothing => None,
                        Outcome::Reply(text) => {
                            // Recorded before it is sent: a restart delivers it, never runs it again.
                            self.journal.update(pending.update_id, |mut kept| {
                                kept.reply = Some(text.clone());
                                Some(kept)
                            });
                            Some(text)
                        }
                    }
                }
                (None, None) => None,
            };
            match reply {
                Some(reply) => self.deliver(&pending, &reply).await,
                None => self.journal.update(pending.update_id, |_| None),
            }
        }
    }

    /// Sends `reply` for `pending` and drops its record; a reply that cannot be sent is
    /// reported, one cut off by a shutdown stays for the next start.
    async fn deliver(&self, pending: &Pending, reply: &str) {
        let sent = self
            .send_text(
                pending.chat_id,
                pending.thread_id,
                pending.message_id,
                reply,
            )
            .await;
        if self.stop.is_cancelled() && sent.is_err() {
            return;
        }
        if let Err(error) = sent {
            self.shared.status.delivery_failed(
                "telegram",
                &pending.chat_id.to_string(),
                reply.chars().count(),
                &error,
            );
        }
        self.journal.update(pending.update_id, |_| None);
    }

    /// Runs `work` while showing "typing…" in the chat (renewed every 4 s, Telegram shows it 5).
    async fn with_typing<T>(&self, pending: &Pending, work: impl Future<Output = T>) -> T {
        let mut action = json!({"chat_id": pending.chat_id, "action": "typing"});
        if let Some(thread) = pending.thread_id {
            action["message_thread_id"] = json!(thread);
        }
        let mut work = std::pin::pin!(work);
        loop {
            let typing = async {
                if let Err(error) = self.api.call("sendChatAction", &action).await {
                    tracing::debug!("Telegram sendChatAction failed: {error}");
                }
                tokio::time::sleep(Duration::from_secs(4)).await;
            };
            tokio::select! {
                value = &mut work => return value,
                () = typing => {}
            }
        }
    }

    /// Sends `text` to `chat` (and `thread`), split into messages of at most 4,096 units, the
    /// first one replying to `reply_to`. Each is retried (429 after its `retry_after`, network
    /// errors with backoff) before the whole is given up.
    pub async fn send_text(
        &self,
        chat: i64,
        thread: Option<i64>,
        reply_to: Option<i64>,
        text: &str,
    ) -> Result<(), String> {
        let text = super::scrub(&self.shared.hub, text);
        for (index, piece) in split_message(&text, MAX_MESSAGE_UNITS).iter().enumerate() {
            if piece.trim().is_empty() {
                continue;
            }
            let mut body = json!({
                "chat_id": chat,
                "text": escape_html(piece),
                "parse_mode": "HTML",
                "link_preview_options": {"is_disabled": true},
            });
            if let Some(thread) = thread {
                body["message_thread_id"] = json!(thread);
            }
            if index == 0
                && let Some(message) = reply_to
            {
                body["reply_parameters"] =
                    json!({"message_id": message, "allow_sending_without_reply": true});
            }
            self.send_one(&mut body, piece).await?;
        }
        Ok(())
    }

    async fn send_one(&self, body: &mut Value, plain: &str) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..SEND_ATTEMPTS {
            let wait = match self.api.call("sendMessage", body).await {
                Ok(_) => return Ok(()),
                Err(ApiError::RetryAfter(seconds)) if seconds <= MAX_RETRY_AFTER => {
                    last = format!("too many requests (retry after {seconds} s)");
                    Duration::from_secs(seconds)
                }
                Err(ApiError::Refused(400, description))
                    if description.contains("parse entities")
                        && body.get("parse_mode").is_some() =>
                {
                    // Should not happen with escaped text; plain text is interpreted as nothing.
                    tracing::warn!(
                        "Telegram could not parse a reply's entities; sending it as plain text"
                    );
                    if let Some(object) = body.as_object_mut() {
                        object.remove("parse_mode");
                        object.insert("text".to_string(), json!(plain));
                    }
                    Duration::ZERO
                }
                Err(error @ ApiError::Refused(..)) => return Err(error.to_string()),
                Err(error) => {
                    last = error.to_string();
                    tracing::warn!("Telegram sendMessage failed: {error}; retrying");
                    backoff(attempt)
                }
            };
            if !self.sleep(wait).await {
                return Err(format!(
                    "the gateway stopped before the reply was sent ({last})"
                ));
            }
        }
        Err(format!(
            "sendMessage failed {SEND_ATTEMPTS} times; the last error: {last}"
        ))
    }
}

/// `text` without the bot's `@username` (any case).
fn strip_mention(text: &str, username: &str) -> String {
    let mention = format!("@{}", username.to_lowercase());
    let lower = text.to_lowercase();
    match lower.find(&mention) {
        // Lowercasing ASCII usernames keeps byte offsets.
        Some(at) if text.is_char_boundary(at) && text.is_char_boundary(at + mention.len()) => {
            format!("{}{}", &text[..at], &text[at + mention.len()..])
                .trim()
                .to_string()
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::format::units;
    use super::*;

    #[test]
    fn pieces_fit_and_join_back_to_the_text() {
        let paragraph = "word ".repeat(300) + "\n\n";
        let text = paragraph.repeat(8) + &"x".repeat(5000) + "😀".repeat(3000).as_str();
        let pieces = split_message(&text, MAX_MESSAGE_UNITS);
        assert!(pieces.len() > 3);
        assert!(pieces.iter().all(|piece| units(piece) <= MAX_MESSAGE_UNITS));
        assert_eq!(pieces.concat(), text);
        // Cut after the blank line, not inside a word.
        assert!(
            pieces[0].ends_with("\n\n"),
            "{:?}",
            &pieces[0][pieces[0].len() - 10..]
        );
        assert_eq!(split_message("short", 4096), ["short"]);
        assert_eq!(split_message("", 4096), [""]);
        // A surrogate pair is never cut.
        let emoji = "😀".repeat(5);
        let pieces = split_message(&emoji, 3);
        assert!(
            pieces
                .iter()
                .all(|piece| units(piece) <= 3 && !piece.is_empty())
        );
        assert_eq!(pieces.concat(), emoji);
    }

    #[test]
    fn html_is_escaped_and_mentions_stripped() {
        assert_eq!(
            escape_html("<b>a & b</b> \"q\""),
            "&lt;b&gt;a &amp; b&lt;/b&gt; \"q\""
        );
        assert_eq!(
            strip_mention("@Clawcage_Bot hello", "clawcage_bot"),
            "hello"
        );
        assert_eq!(strip_mention("hi @clawcage_bot!", "clawcage_bot"), "hi !");
        assert_eq!(strip_mention("no mention", "clawcage_bot"), "no mention");
    }

    #[test]
    fn a_refused_token_is_asked_about_less_and_less_often() {
        let waits: Vec<u64> = (0..9).map(|n| refused_token_wait(n).as_secs()).collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
    }

    #[test]
    fn the_backoff_grows_to_thirty_seconds() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(9), Duration::from_secs(30));
    }
}
