//! `[channels]` in the config: the chat apps and webhooks the gateway reaches people through.
//! Checked here, so a bad value is a configuration error at start-up that names the key and what
//! to write instead. Secrets (the Telegram bot token, each webhook's signing secret) are read from
//! the environment variables the config names, never from the file; they are kept in
//! [`ChannelSecret`], which prints as `[redacted]`, stay on the host (no sandbox ever sees one)
//! and are handed to the runtime's redactor, so a value that reaches any output is scrubbed.
//!
//! ```toml
//! [channels]
//! message_targets = ["telegram:123456789"]   # where the message tool may send besides its own peer
//!
//! [channels.telegram]
//! token_env = "TELEGRAM_BOT_TOKEN"
//! api_base = "https://api.telegram.org"      # the default
//! dm_policy = "pairing"                      # pairing (default) | allowlist | open
//! allow_from = [123456789]                   # user ids that may always talk
//! groups = "mention"                         # mention (default) | all | off
//! poll_timeout_secs = 30
//!
//! [channels.webhooks.ops]
//! secret_env = "CLAWCAGE_HOOK_OPS_SECRET"
//! reply_url = "https://hooks.example.org/clawcage"   # its host must be on [network] allow
//! replay_window_secs = 300
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use clawcage_core::BoxFuture;
use serde::Deserialize;

/// The agent id of the sessions channels create (`agent:main:<channel>:<peer>`).
pub const CHANNEL_AGENT: &str = "main";

/// The public Bot API.
pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// The shortest webhook secret accepted, in bytes.
pub const MIN_WEBHOOK_SECRET_BYTES: usize = 16;

/// `[channels]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsSection {
    /// Destinations (`telegram:<chatId>`, `webhook:<name>`) the `message` tool may send to from a
    /// session of another peer. Its own peer is always allowed.
    #[serde(default)]
    pub message_targets: Vec<String>,
    /// `[channels.telegram]`.
    pub telegram: Option<TelegramSection>,
    /// `[channels.webhooks.<name>]`.
    #[serde(default)]
    pub webhooks: BTreeMap<String, WebhookSection>,
}

/// A user or chat id as TOML may write it: a number or a string of digits.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum IdValue {
    /// `123456789`
    Number(i64),
    /// `"123456789"`
    Text(String),
}

/// `[channels.telegram]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramSection {
    /// The environment variable holding the bot token (from @BotFather).
    pub token_env: String,
    /// The Bot API's base URL (default the public one; the tests point it at 127.0.0.1).
    pub api_base: Option<String>,
    /// Who may talk in a direct message: `pairing` (default), `allowlist` or `open`.
    pub dm_policy: Option<String>,
    /// User ids that may always talk (the only ones with `allowlist`).
    #[serde(default)]
    pub allow_from: Vec<IdValue>,
    /// Groups: `mention` (default: only when the bot is mentioned or replied to), `all`, `off`.
    pub groups: Option<String>,
    /// Seconds one `getUpdates` long poll waits (default 30).
    pub poll_timeout_secs: Option<u64>,
}

/// `[channels.webhooks.<name>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    /// The environment variable holding the signing secret (at least 16 bytes).
    pub secret_env: String,
    /// Where replies are POSTed, signed the same way; its host must be on `[network] allow`.
    pub reply_url: Option<String>,
    /// Seconds a signed request stays valid (default 300).
    pub replay_window_secs: Option<u64>,
}

/// A secret read from the environment: prints as `[redacted]`, never serialized.
pub type ChannelSecret = clawcage_sandbox::SecretValue;

/// Who may talk to the bot in a direct message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmPolicy {
    /// An unknown sender gets a one-time code; nothing reaches the agent until the operator
    /// approves it.
    Pairing,
    /// Only `allow_from` (and approved pairings).
    Allowlist,
    /// Anyone (must be set explicitly).
    Open,
}

/// When the bot answers in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupPolicy {
    /// Only when mentioned (`@botname`) or replied to.
    Mention,
    /// Every message.
    All,
    /// Never.
    Off,
}

/// The Telegram channel, checked.
#[derive(Debug, Clone)]
pub struct Telegram {
    /// The token, when the variable is set.
    pub token: Option<ChannelSecret>,
    /// The variable's name, for messages.
    pub token_env: String,
    /// The Bot API base URL, without a trailing slash.
    pub api_base: String,
    /// Who may talk in a direct message.
    pub dm_policy: DmPolicy,
    /// User ids that may always talk.
    pub allow_from: Vec<String>,
    /// When the bot answers in a group.
    pub groups: GroupPolicy,
    /// One long poll's wait.
    pub poll_timeout: Duration,
}

/// One webhook, checked.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// Its name: the path `/hooks/<name>`.
    pub name: String,
    /// The signing secret, when the variable is set.
    pub secret: Option<ChannelSecret>,
    /// The variable's name, for messages.
    pub secret_env: String,
    /// Where replies go.
    pub reply_url: Option<String>,
    /// How long a signed request stays valid.
    pub replay_window: Duration,
}

/// Every channel, checked.
#[derive(Debug, Clone, Default)]
pub struct Channels {
    /// The Telegram channel, when configured.
    pub telegram: Option<Telegram>,
    /// The webhooks, by name.
    pub webhooks: Vec<Webhook>,
    /// Where the `message` tool may send besides its own peer.
    pub message_targets: Vec<String>,
}

/// A POST through the host's network policy: `(url, headers, body)` → the status code, or why
/// it was refused or failed. The runtime builds it over `[network]`, so the URL's host must be on
/// `[network] allow`.
pub type HttpPost = std::sync::Arc<
    dyn Fn(String, Vec<(String, String)>, Vec<u8>) -> BoxFuture<'static, Result<u16, String>>
        + Send
        + Sync,
>;

fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// `url` as the network policy reads it (the parser its requests use, so no second reading of
/// the host can differ): `None` when it is not an http(s) URL with a host, or carries a user
/// name or password; else whether a secret may travel to it (https, or plain http to the
/// loopback interface).
fn secret_may_travel(url: &str) -> Option<bool> {
    let parsed = clawcage_sandbox::network::parse_url(url).ok()?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return None;
    }
    Some(parsed.scheme() == "https" || clawcage_sandbox::network::is_loopback_url(&parsed))
}

fn id_text(key: &str, value: &IdValue) -> anyhow::Result<String> {
    let text = match value {
        IdValue::Number(number) => number.to_string(),
        IdValue::Text(text) => text.trim().to_string(),
    };
    let digits = text.strip_prefix('-').unwrap_or(&text);
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        bail!(
            "{key} entry {text:?} is not a Telegram id; write the numeric user id, e.g. 123456789 (the bot's pairing message tells a user theirs)"
        );
    }
    Ok(text)
}

/// Whether `name` may name a webhook: the path `/hooks/<name>` and the session key part.
pub fn webhook_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl ChannelsSection {
    /// The channels these settings describe, secrets read with `env`. A variable that is unset
    /// leaves its secret out; the gateway refuses to start such a channel and says which
    /// variable to set, while other commands need no channel secret.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Channels> {
        let secret = |key: &str, name: &str| -> anyhow::Result<Option<ChannelSecret>> {
            if !env_name_ok(name) {
                bail!(
                    "{key} = {name:?} is not an environment variable name; write the NAME of the variable that holds the secret (A-Z, 0-9, _), never the secret itself"
                );
            }
            Ok(env(name)
                .map(|value| value.trim().to_string())
                .filter(|value| !value.is_empty())
                .map(ChannelSecret::new))
        };
        let telegram = match &self.telegram {
            None => None,
            Some(section) => {
                let token = secret("[channels.telegram] token_env", &section.token_env)?;
                let api_base = section
                    .api_base
                    .clone()
                    .unwrap_or_else(|| TELEGRAM_API.to_string())
                    .trim_end_matches('/')
                    .to_string();
                match secret_may_travel(&api_base) {
                    Some(true) => {}
                    Some(false) => bail!(
                        "[channels.telegram] api_base = {api_base:?} would send the bot token over plain http; use https:// (plain http only to 127.0.0.1 or localhost)"
                    ),
                    None => bail!(
                        "[channels.telegram] api_base = {api_base:?} is not an http(s) URL without a user name or password; write e.g. \"{TELEGRAM_API}\""
                    ),
                }
                let dm_policy = match section.dm_policy.as_deref() {
                    None | Some("pairing") => DmPolicy::Pairing,
                    Some("allowlist") => DmPolicy::Allowlist,
                    Some("open") => DmPolicy::Open,
                    Some(other) => bail!(
                        "[channels.telegram] dm_policy = {other:?} is not valid; use \"pairing\", \"allowlist\" or \"open\""
                    ),
                };
                let groups = match section.groups.as_deref() {
                    None | Some("mention") => GroupPolicy::Mention,
                    Some("all") => GroupPolicy::All,
                    Some("off") => GroupPolicy::Off,
                    Some(other) => bail!(
                        "[channels.telegram] groups = {other:?} is not valid; use \"mention\", \"all\" or \"off\""
                    ),
                };
                let allow_from = section
                    .allow_from
                    .iter()
                    .map(|value| id_text("[channels.telegram] allow_from", value))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                if dm_policy == DmPolicy::Allowlist && allow_from.is_empty() {
                    bail!(
                        "[channels.telegram] dm_policy = \"allowlist\" with an empty allow_from lets nobody talk; list user ids in allow_from, or use dm_policy = \"pairing\""
                    );
                }
                let poll = section.poll_timeout_secs.unwrap_or(30);
                if !(1..=50).contains(&poll) {
                    bail!(
                        "[channels.telegram] poll_timeout_secs = {poll} is out of range; use 1 to 50"
                    );
                }
                Some(Telegram {
                    token,
                    token_env: section.token_env.clone(),
                    api_base,
                    dm_policy,
                    allow_from,
                    groups,
                    poll_timeout: Duration::from_secs(poll),
                })
            }
        };
        let mut webhooks = Vec::new();
        for (name, section) in &self.webhooks {
            if !webhook_name_ok(name) {
                bail!(
                    "[channels.webhooks.{name}]: a webhook name must be 1 to 64 of a-z, 0-9, `_` and `-` (it becomes the path /hooks/<name>)"
                );
            }
            let key = format!("[channels.webhooks.{name}] secret_env");
            let secret = secret(&key, &section.secret_env)?;
            if let Some(value) = &secret
                && value.expose().len() < MIN_WEBHOOK_SECRET_BYTES
            {
                bail!(
                    "the webhook secret in {} is shorter than {MIN_WEBHOOK_SECRET_BYTES} bytes; use a long random value (e.g. `openssl rand -hex 32`)",
                    section.secret_env
                );
            }
            if let Some(url) = &section.reply_url
                && secret_may_travel(url).is_none()
            {
                bail!(
                    "[channels.webhooks.{name}] reply_url = {url:?} is not an http(s) URL without a user name or password; write e.g. \"https://hooks.example.org/clawcage\" and add its host to [network] allow"
                );
            }
            let window = section.replay_window_secs.unwrap_or(300);
            if !(1..=86_400).contains(&window) {
                bail!(
                    "[channels.webhooks.{name}] replay_window_secs = {window} is out of range; use 1 to 86400"
                );
            }
            webhooks.push(Webhook {
                name: name.clone(),
                secret,
                secret_env: section.secret_env.clone(),
                reply_url: section.reply_url.clone(),
                replay_window: Duration::from_secs(window),
            });
        }
        for target in &self.message_targets {
            let ok = match target.split_once(':') {
                Some(("telegram", id)) => id_text("", &IdValue::Text(id.to_string())).is_ok(),
                Some(("webhook", name)) => webhooks.iter().any(|hook| hook.name == name),
                _ => false,
            };
            if !ok {
                bail!(
                    "[channels] message_targets entry {target:?} is not valid; write \"telegram:<chatId>\" or \"webhook:<name>\" of a configured webhook"
                );
            }
        }
        Ok(Channels {
            telegram,
            webhooks,
            message_targets: self.message_targets.clone(),
        })
    }
}

impl Channels {
    /// The secret values held, labelled by their variables, for the redactor.
    pub fn secrets(&self) -> Vec<(String, String)> {
        let mut secrets = Vec::new();
        if let Some(telegram) = &self.telegram
            && let Some(token) = &telegram.token
        {
            secrets.push((telegram.token_env.clone(), token.expose().to_string()));
        }
        for hook in &self.webhooks {
            if let Some(secret) = &hook.secret {
                secrets.push((hook.secret_env.clone(), secret.expose().to_string()));
            }
        }
        secrets
    }

    /// Whether any channel is configured.
    pub fn any(&self) -> bool {
        self.telegram.is_some() || !self.webhooks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, env: &[(&str, &str)]) -> anyhow::Result<Channels> {
        let section: ChannelsSection =
            toml::from_str(text).map_err(|error| anyhow::anyhow!("{error}"))?;
        section.resolve(|name| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn the_section_is_read_with_secrets_from_the_environment() {
        let channels = parse(
            "message_targets = [\"telegram:-100200\", \"webhook:ops\"]\n[telegram]\ntoken_env = \"TG_TOKEN\"\nallow_from = [42, \"43\"]\ngroups = \"all\"\n[webhooks.ops]\nsecret_env = \"OPS_SECRET\"\nreply_url = \"http://127.0.0.1:9/reply\"\n",
            &[
                ("TG_TOKEN", "123456:ABCdefGHIjklMNOpqrSTUvwxYZ"),
                ("OPS_SECRET", "0123456789abcdef0123"),
            ],
        )
        .unwrap();
        let telegram = channels.telegram.as_ref().unwrap();
        assert_eq!(telegram.api_base, TELEGRAM_API);
        assert_eq!(telegram.dm_policy, DmPolicy::Pairing);
        assert_eq!(telegram.groups, GroupPolicy::All);
        assert_eq!(telegram.allow_from, ["42", "43"]);
        assert_eq!(telegram.poll_timeout, Duration::from_secs(30));
        let printed = format!("{channels:?}");
        assert!(!printed.contains("ABCdef"), "{printed}");
        assert!(!printed.contains("0123456789abcdef"), "{printed}");
        assert_eq!(channels.webhooks[0].replay_window, Duration::from_secs(300));
        let labels: Vec<String> = channels.secrets().into_iter().map(|(l, _)| l).collect();
        assert_eq!(labels, ["TG_TOKEN", "OPS_SECRET"]);
        let unset = parse("[telegram]\ntoken_env = \"TG_TOKEN\"\n", &[]).unwrap();
        assert!(unset.telegram.unwrap().token.is_none());
        assert!(!parse("", &[]).unwrap().any());
    }

    #[test]
    fn bad_values_name_the_key_and_what_to_write() {
        for (text, needle) in [
            (
                "[telegram]\ntoken_env = \"123:abc\"",
                "token_env = \"123:abc\" is not an environment variable name",
            ),
            (
                "[telegram]\ntoken_env = \"T\"\ndm_policy = \"everyone\"",
                "use \"pairing\", \"allowlist\" or \"open\"",
            ),
            (
                "[telegram]\ntoken_env = \"T\"\ndm_policy = \"allowlist\"",
                "list user ids in allow_from",
            ),
            (
                "[telegram]\ntoken_env = \"T\"\napi_base = \"http://api.example.org\"",
                "would send the bot token over plain http",
            ),
            (
                "[telegram]\ntoken_env = \"T\"\ngroups = \"loud\"",
                "use \"mention\", \"all\" or \"off\"",
            ),
            (
                "[telegram]\ntoken_env = \"T\"\nallow_from = [\"@ada\"]",
                "write the numeric user id",
            ),
            (
                "[webhooks.Bad]\nsecret_env = \"S\"",
                "a webhook name must be 1 to 64",
            ),
            (
                "[webhooks.ok]\nsecret_env = \"S\"\nreply_url = \"ftp://x\"",
                "is not an http(s) URL",
            ),
            ("message_targets = [\"slack:x\"]", "message_targets entry"),
            ("[telegram]\ntoken = \"x\"", "unknown field `token`"),
        ] {
            let error = format!("{:#}", parse(text, &[]).unwrap_err());
            assert!(error.contains(needle), "{text}: {error}");
        }
        let short = parse("[webhooks.ok]\nsecret_env = \"S\"", &[("S", "short")]).unwrap_err();
        assert!(
            short.to_string().contains("shorter than 16 bytes"),
            "{short}"
        );
        let local = parse(
            "[telegram]\ntoken_env = \"T\"\napi_base = \"http://127.0.0.1:8081/\"",
            &[],
        )
        .unwrap();
        assert_eq!(local.telegram.unwrap().api_base, "http://127.0.0.1:8081");
        // The host as the request will read it: plain http only where that is loopback.
        for (api_base, allowed) in [
            ("http://[::1]:8081", true),
            ("http://LOCALHOST:8081", true),
            ("http://0x7f.1:8081", true),
            ("https://api.example.org", true),
            ("http://127.0.0.1.example.org", false),
            ("http://localhost.example.org", false),
            ("http://api.example.org\\@127.0.0.1", false),
            ("http://user:pw@127.0.0.1", false),
            ("http://127.0.0.1:8081@api.example.org", false),
            ("http:127.0.0.1", true),
            ("file:///etc/passwd", false),
            ("http://", false),
        ] {
            let text = format!("[telegram]\ntoken_env = \"T\"\napi_base = {api_base:?}");
            assert_eq!(parse(&text, &[]).is_ok(), allowed, "{api_base}");
        }
    }
}
