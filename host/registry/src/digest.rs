//! Content digests, `sha256:` and 64 lowercase hex digits: every manifest and blob a registry
//! hands over is checked against the digest it was asked for before anything else reads it.

use std::fmt;

use sha2::{Digest as _, Sha256};

/// A SHA-256 content digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:HEX`. Other algorithms are refused: this client checks SHA-256 only.
    pub fn parse(text: &str) -> Result<Digest, String> {
        let Some(hex) = text.strip_prefix("sha256:") else {
            return Err(format!(
                "the digest {text:?} is not a sha256: digest (sha256: and 64 lowercase hex digits)"
            ));
        };
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "the digest {text:?} must be sha256: and 64 lowercase hex digits"
            ));
        }
        Ok(Digest(hex.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(hex::encode(Sha256::digest(bytes)))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0
    }

    /// Whether `bytes` have this digest.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        Digest::of(bytes) == *self
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    #[test]
    fn a_digest_round_trips_and_checks_bytes() {
        let digest = Digest::of(b"hello");
        assert_eq!(Digest::parse(&digest.to_string()).unwrap(), digest);
        assert!(digest.matches(b"hello"));
        assert!(!digest.matches(b"hellO"));
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
    }
}
