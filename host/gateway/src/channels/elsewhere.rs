//! A Telegram conversation whose session another host of the cluster serves (the hosts serve
//! partitions, and the host polling Telegram is not the one serving the session): its commands
//! (`/queue …`, `/approve …`) are carried out by the serving host, which holds the session's
//! queue and the approval requests its turns wait on, and that host is told to post those
//! requests to the conversation. Both go as `channels.conversation` through this host's
//! [`HostClient`](crate::forward::HostClient), forwarded by the session's key. A client holds
//! the gateway's token and could ask that method too (through any host, which forwards it):
//! each request therefore carries a [`proof`] under the Telegram bot token, which every host
//! holds and no client ever sees, and the serving host carries out none without it (an
//! `/approve` asked so would otherwise pass by the approvals scope a client needs).

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::Shared;

/// How far a request's time may be from the serving host's clock for its proof to count.
const PROOF_WINDOW_SECS: u64 = 60;

/// The internal method by which a host polling a channel reaches the host serving a
/// conversation's session.
pub(crate) const CONVERSATION_METHOD: &str = "channels.conversation";

/// Whether `key` is served by another host that this one can reach (the hosts serve
/// partitions).
pub(crate) fn served_elsewhere(shared: &Shared, key: &str) -> bool {
    shared.other_hosts.is_some() && shared.hub.served_elsewhere(key)
}

/// Asks the host serving `key` to post the approval requests of its turns to the conversation
/// (`by`, an approved person, wrote in it), and with `line` to carry out that command: the
/// reply to the command, or why the host did not answer.
pub(crate) async fn ask_serving_host(
    shared: &Shared,
    bot_token: &str,
    key: &str,
    by: &str,
    line: Option<&str>,
) -> Result<String, String> {
    let Some(other_hosts) = &shared.other_hosts else {
        return Err("this host is not part of a cluster serving partitions".to_string());
    };
    let at = clawcage_agent::transcript::now_ms() / 1000;
    let answer = other_hosts
        .request(
            CONVERSATION_METHOD,
            json!({
                "sessionKey": key,
                "by": by,
                "line": line,
                "at": at,
                "proof": proof(bot_token, at, key, by, line),
            }),
        )
        .await?;
    if answer["ok"] == true {
        return Ok(answer["payload"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string());
    }
    Err(answer["error"]["message"]
        .as_str()
        .unwrap_or("the host serving this conversation refused the command")
        .to_string())
}

/// The proof that a `channels.conversation` request made at `at_secs` comes from a host of
/// this deployment: an HMAC-SHA256 under the Telegram bot token of its time, session, person and
/// line, in hex.
pub(crate) fn proof(
    bot_token: &str,
    at_secs: u64,
    key: &str,
    by: &str,
    line: Option<&str>,
) -> String {
    mac_of(bot_token, at_secs, key, by, line)
        .map(|mac| hex::encode(mac.finalize().into_bytes()))
        .unwrap_or_default()
}

/// Checks a request's `proof` ([`proof`]) at `now_secs`: made with this host's bot token, for
/// exactly this session, person and line, within [`PROOF_WINDOW_SECS`].
pub(crate) fn check_proof(
    bot_token: &str,
    now_secs: u64,
    at_secs: u64,
    (key, by, line): (&str, &str, Option<&str>),
    proof: &str,
) -> Result<(), String> {
    if now_secs.abs_diff(at_secs) > PROOF_WINDOW_SECS {
        return Err(format!(
            "{CONVERSATION_METHOD} is refused: it was made {} s from this host's time (more than {PROOF_WINDOW_SECS} s); check the hosts' clocks",
            now_secs.abs_diff(at_secs)
        ));
    }
    let refused = || {
        format!(
            "{CONVERSATION_METHOD} is refused: its proof does not hold (the hosts of a cluster ask it of each other, with the bot token each of them holds; a client cannot)"
        )
    };
    let given = hex::decode(proof).map_err(|_| refused())?;
    mac_of(bot_token, at_secs, key, by, line)
        .ok_or_else(refused)?
        .verify_slice(&given)
        .map_err(|_| refused())
}

/// The HMAC of a request (`None` only if HMAC refused the key, which it takes of any length).
fn mac_of(
    bot_token: &str,
    at_secs: u64,
    key: &str,
    by: &str,
    line: Option<&str>,
) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(bot_token.as_bytes()).ok()?;
    // One JSON array: no two different requests write the same bytes.
    mac.update(
        json!([CONVERSATION_METHOD, at_secs, key, by, line])
            .to_string()
            .as_bytes(),
    );
    Some(mac)
}

/// The Telegram chat and forum topic a conversation's session key names
/// (`agent:main:telegram:<chat>[:topic:<thread>]`).
pub(crate) fn telegram_chat_of(key: &str) -> Option<(i64, Option<i64>)> {
    let rest = super::key_target(key)?;
    let rest = rest.strip_prefix("telegram:")?;
    match rest.split_once(":topic:") {
        Some((chat, thread)) => Some((chat.parse().ok()?, Some(thread.parse().ok()?))),
        None => Some((rest.parse().ok()?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_only_for_its_request_its_time_and_the_bot_token() {
        const TOKEN: &str = "7000001:AAE-test-bot-token";
        let request = (
            "agent:main:telegram:42",
            "telegram:42",
            Some("/approve apr-1 allow-once"),
        );
        let (key, by, line) = request;
        let made = proof(TOKEN, 1_000, key, by, line);
        assert_eq!(check_proof(TOKEN, 1_030, 1_000, request, &made), Ok(()));
        // Another line, person, session or time: refused.
        for other in [
            (key, by, Some("/approve apr-1 allow-always")),
            (key, by, None),
            (key, "telegram:43", line),
            ("agent:main:telegram:43", by, line),
        ] {
            assert!(
                check_proof(TOKEN, 1_000, 1_000, other, &made).is_err(),
                "{other:?}"
            );
        }
        assert!(check_proof(TOKEN, 1_001, 1_001, request, &made).is_err());
        // Made with another token, or no proof at all: refused.
        let forged = proof("the gateway token", 1_000, key, by, line);
        assert!(check_proof(TOKEN, 1_000, 1_000, request, &forged).is_err());
        assert!(check_proof(TOKEN, 1_000, 1_000, request, "").is_err());
        assert!(check_proof(TOKEN, 1_000, 1_000, request, "not hex").is_err());
        // Too old or from the future: refused.
        assert!(check_proof(TOKEN, 1_061, 1_000, request, &made).is_err());
        assert!(check_proof(TOKEN, 939, 1_000, request, &made).is_err());
    }

    #[test]
    fn a_conversation_key_names_its_chat_and_topic() {
        assert_eq!(telegram_chat_of("agent:main:telegram:42"), Some((42, None)));
        assert_eq!(
            telegram_chat_of("agent:main:telegram:-100:topic:7"),
            Some((-100, Some(7)))
        );
        assert_eq!(telegram_chat_of("agent:main:webhook:ops:ada"), None);
        assert_eq!(telegram_chat_of("agent:main:telegram:ada"), None);
        assert_eq!(telegram_chat_of("agent:main:telegram:1:topic:x"), None);
    }
}
