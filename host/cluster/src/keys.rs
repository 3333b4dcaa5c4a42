//! Session keys, run ids and idempotency keys as NATS subject tokens and key-value keys. A
//! session key such as `agent:main:webchat:alice` may hold any character, while a subject token
//! may not contain `.`, `*`, `>` or white space and a key-value key allows only
//! `[-/_=.a-zA-Z0-9]`; so every byte outside `[A-Za-z0-9_-]` becomes `=XX` (upper-case hex), the
//! empty key becomes `=`, and a key whose escaped form would be longer than
//! [`MAX_TOKEN_CHARS`] becomes `=h` and the SHA-256 of the key. The mapping is deterministic and
//! collision-free: `=` is itself escaped, an escape is always `=` and two upper-case hex digits,
//! and neither a lone `=` nor `=h` can come out of escaping.

use sha2::{Digest, Sha256};

/// The longest escaped token kept readable; longer ones are hashed (subjects travel in the
/// protocol's control lines, whose default limit is 4,096 bytes).
pub const MAX_TOKEN_CHARS: usize = 600;

/// `key` as one subject token and key-value key (see the module's description).
pub fn token(key: &str) -> String {
    if key.is_empty() {
        return "=".to_string();
    }
    let mut escaped = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            escaped.push(char::from(byte));
        } else {
            escaped.push('=');
            escaped.push_str(&format!("{byte:02X}"));
        }
        if escaped.len() > MAX_TOKEN_CHARS {
            return format!("=h{}", hex::encode(Sha256::digest(key.as_bytes())));
        }
    }
    escaped
}

/// A key-value key back to the name it escapes (see [`token`]; a hashed one, `=h…`, stays as it
/// is): what a listing of keys names.
pub fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'='
            && let Some(hex) = key.get(index + 1..index + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The key-value key of `session`'s idempotency key `idempotency`: the session's token, a dot,
/// and the SHA-256 of the idempotency key (a client's key never appears in the store).
pub fn idempotency_key(session: &str, idempotency: &str) -> String {
    format!(
        "{}.{}",
        token(session),
        hex::encode(Sha256::digest(idempotency.as_bytes()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_valid_token(token: &str) -> bool {
        !token.is_empty()
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'='))
    }

    #[test]
    fn keys_with_subject_syntax_become_distinct_valid_tokens() {
        let keys = [
            "agent:main:webchat:alice",
            "agent.main",
            "agent*main",
            "agent>main",
            "agent main",
            "agent\tmain",
            "agent=3Amain",
            "agent:main",
            "",
            "=",
            "=h",
            "é",
            ">",
            "*",
            ".",
            "..",
        ];
        let tokens: Vec<String> = keys.iter().map(|key| token(key)).collect();
        for (key, token) in keys.iter().zip(&tokens) {
            assert!(is_valid_token(token), "{key:?} -> {token:?}");
        }
        let mut unique = tokens.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "{tokens:?}");
        assert_eq!(
            token("agent:main:webchat:alice"),
            "agent=3Amain=3Awebchat=3Aalice"
        );
        assert_eq!(token("agent=3Amain"), "agent=3D3Amain");
        assert_eq!(token("é"), "=C3=A9");
    }

    #[test]
    fn long_keys_are_hashed_and_stay_distinct() {
        let long = ":".repeat(1_000);
        let other = format!("{long}x");
        let (a, b) = (token(&long), token(&other));
        assert!(a.starts_with("=h") && a.len() == 66, "{a}");
        assert_ne!(a, b);
        assert_eq!(a, token(&long), "deterministic");
        let readable = "a".repeat(MAX_TOKEN_CHARS);
        assert_eq!(token(&readable), readable);
    }

    #[test]
    fn idempotency_keys_hide_the_clients_key() {
        let key = idempotency_key("agent:main:x", "secret key.*>");
        assert!(key.starts_with("agent=3Amain=3Ax."), "{key}");
        assert!(!key.contains("secret"));
        assert_ne!(key, idempotency_key("agent:main:y", "secret key.*>"));
    }
}
