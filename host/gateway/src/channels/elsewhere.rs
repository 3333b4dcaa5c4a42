//! A Telegram conversation whose session another host of the cluster serves (the hosts serve
//! partitions, and the host polling Telegram is not the one serving the session): its commands
//! (`/queue …`, `/approve …`) are carried out by the serving host, which holds the session's
//! queue and the approval requests its turns wait on, and that host is told to post those
//! requests to the conversation. Both go as `channels.conversation` through this host's
//! [`HostClient`](crate::forward::HostClient), forwarded by the session's key.

use serde_json::json;

use super::Shared;

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
    key: &str,
    by: &str,
    line: Option<&str>,
) -> Result<String, String> {
    let Some(other_hosts) = &shared.other_hosts else {
        return Err("this host is not part of a cluster serving partitions".to_string());
    };
    let answer = other_hosts
        .request(
            CONVERSATION_METHOD,
            json!({"sessionKey": key, "by": by, "line": line}),
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
