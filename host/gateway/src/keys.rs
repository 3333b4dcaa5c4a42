//! Session keys. A key the gateway creates sessions under has the form
//! `agent:<agentId>:<channel>:<peer>` (e.g. `agent:main:webchat:3f2a`, `agent:main:cli:main`):
//! agent id and channel of `a-z`, `0-9`, `_` and `-` (1 to 64 characters), the peer of ASCII
//! letters, digits and `._@+-` (1 to 128 characters, not starting with a dot); channel sessions
//! may be one level finer: `agent:<agentId>:telegram:<chatId>:topic:<threadId>` (a forum topic)
//! and `agent:<agentId>:webhook:<name>:<peer>`. Sessions made
//! elsewhere (`clawcage chat --session chat`, cron's default `main`) may be read through the
//! gateway with any key of at most 256 printable characters. A key is data, never a path: the
//! files of a session are named by its escaped key (`transcript::key_file_stem`).

use crate::protocol::{Code, GatewayError};

/// The longest key accepted for reading.
pub const MAX_KEY_BYTES: usize = 256;

/// Checks that `key` has the gateway's form, for methods that start turns or change a session.
pub fn check_key(key: &str) -> Result<(), GatewayError> {
    let refuse = |why: &str| {
        GatewayError::new(
            Code::InvalidParams,
            format!(
                "invalid sessionKey `{}`: {why}; use agent:<agentId>:<channel>:<peer>, e.g. agent:main:webchat:my-browser",
                key.chars().take(80).collect::<String>()
            ),
        )
    };
    let parts: Vec<&str> = key.split(':').collect();
    // Channel sessions one level finer: a Telegram forum topic, a webhook's peer.
    let sub_peer_ok = |part: &str| {
        (1..=64).contains(&part.len())
            && !part.starts_with('.')
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b))
    };
    match parts.as_slice() {
        ["agent", _, "telegram", _, "topic", thread]
            if (1..=20).contains(&thread.len()) && thread.bytes().all(|b| b.is_ascii_digit()) =>
        {
            return check_key(&parts[..4].join(":"));
        }
        ["agent", _, "webhook", _, peer] if sub_peer_ok(peer) => {
            return check_key(&parts[..4].join(":"));
        }
        _ => {}
    }
    let [prefix, agent, channel, peer] = parts.as_slice() else {
        return Err(refuse("it needs four parts separated by `:`"));
    };
    if *prefix != "agent" {
        return Err(refuse("it must start with `agent:`"));
    }
    let word = |part: &str| {
        (1..=64).contains(&part.len())
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    };
    if !word(agent) {
        return Err(refuse(
            "the agent id must be 1 to 64 of a-z, 0-9, `_` and `-`",
        ));
    }
    if !word(channel) {
        return Err(refuse(
            "the channel must be 1 to 64 of a-z, 0-9, `_` and `-`",
        ));
    }
    let peer_ok = (1..=128).contains(&peer.len())
        && !peer.starts_with('.')
        && peer
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b));
    if !peer_ok {
        return Err(refuse(
            "the peer must be 1 to 128 of letters, digits and `._@+-`, not starting with a dot",
        ));
    }
    Ok(())
}

/// Checks a key for reading: any printable key of at most [`MAX_KEY_BYTES`] bytes.
pub fn check_readable_key(key: &str) -> Result<(), GatewayError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(GatewayError::new(
            Code::InvalidParams,
            format!(
                "invalid sessionKey: it must be 1 to {MAX_KEY_BYTES} bytes without control characters"
            ),
        ));
    }
    Ok(())
}

/// Whether `key` has the gateway's form.
pub fn is_gateway_key(key: &str) -> bool {
    check_key(key).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_part_by_part() {
        for good in [
            "agent:main:webchat:3f2a",
            "agent:main:cli:main",
            "agent:ops-2:telegram:+4917612345",
            "agent:main:email:ada@example.org",
            "agent:main:telegram:-1001234:topic:42",
            "agent:main:webhook:ops:ada@example.org",
        ] {
            assert!(check_key(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "main",
            "agent:main:webchat",
            "agent:main:webchat:a:b",
            "agents:main:webchat:a",
            "agent:Main:webchat:a",
            "agent:main:web chat:a",
            "agent:main:webchat:../../etc",
            "agent:main:webchat:.hidden",
            "agent:main:webchat:a/b",
            "agent::webchat:a",
            "agent:main:telegram:1:topic:x",
            "agent:main:telegram:1:topic:",
            "agent:main:webhook:ops:../x",
            "agent:main:webhook:ops:a:b",
            "agent:main:webchat:1:topic:2",
        ] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_readable_key("chat").is_ok());
        assert!(check_readable_key("a\nb").is_err());
        assert!(check_readable_key(&"x".repeat(300)).is_err());
    }
}
