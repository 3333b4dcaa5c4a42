//! Who may talk through a channel: the pairing records in `<state-dir>/channels/pairing.json`
//! (mode 0600, replaced atomically, read-modify-write under `pairing.lock`, so the gateway and
//! `clawcage pairing` can change it at the same time). An unknown sender of a direct message gets
//! a one-time code (8 letters and digits without look-alikes, valid for an hour); nothing of its
//! messages reaches the agent until the operator approves the code with
//! `clawcage pairing approve CODE` (or the gateway's `pairing.approve` method). An approved sender
//! stays approved until revoked. The gateway reads the file each time it judges a sender that is
//! not on the configured allow-list, so an approval takes effect at once.

use std::path::Path;
use std::sync::Arc;

use clawcage_agent::StateDir;
use clawcage_core::records::{FileRecord, RecordStore, read_change_write};
use clawcage_runtime::Error;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How long a pairing code stays valid.
pub const CODE_LIFETIME_MS: u64 = 60 * 60 * 1000;

/// Pending requests kept at most (beyond, unknown senders get no new code until some expire or
/// are approved).
pub const MAX_PENDING: usize = 100;

/// The letters and digits codes are made of (no 0/O, 1/I/L).
const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";

/// A sender waiting for the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPairing {
    /// The code the sender was given, `ABCD-EFGH`.
    pub code: String,
    /// The channel, e.g. `telegram`.
    pub channel: String,
    /// The sender's id in the channel.
    pub peer: String,
    /// A display name, for the operator (the sender chose it: not trusted).
    pub name: String,
    /// When the code was issued.
    pub created_ms: u64,
}

/// A sender the operator approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovedPeer {
    /// The channel.
    pub channel: String,
    /// The sender's id in the channel.
    pub peer: String,
    /// The display name when approved.
    pub name: String,
    /// When.
    pub approved_ms: u64,
    /// The code that was approved (normalised), so approving it again says who it admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Records {
    #[serde(default)]
    pending: Vec<PendingPairing>,
    #[serde(default)]
    approved: Vec<ApprovedPeer>,
}

/// What a sender's request for a code gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeRequest {
    /// A new code: tell the sender.
    Issued(String),
    /// A code was issued before and is still valid: the sender was told already.
    AlreadyPending(String),
    /// Too many requests are waiting.
    Full,
}

/// The pairing records: the state directory's file, or the cluster's shared record.
#[derive(Debug, Clone)]
pub struct PairingStore {
    store: Arc<dyn RecordStore>,
}

fn now_ms() -> u64 {
    clawcage_agent::transcript::now_ms()
}

/// `ms` milliseconds as `40 s`, `12 min`, `3 h` or `2 days`.
fn how_long(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86_400),
    }
}

fn new_code() -> Result<String, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|error| Error::Failed(format!("cannot draw a pairing code: {error}")))?;
    let letters: String = bytes
        .iter()
        .map(|byte| ALPHABET[usize::from(*byte) % ALPHABET.len()] as char)
        .collect();
    Ok(format!("{}-{}", &letters[..4], &letters[4..]))
}

/// `abcd efgh`, `ABCDEFGH` and `abcd-efgh` are the same code.
fn normalize_code(code: &str) -> String {
    code.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

impl PairingStore {
    /// The records in `<state_dir>/channels/pairing.json` (mode 0600, `pairing.lock` beside).
    pub fn new(state_dir: &Path) -> Self {
        let file = StateDir::new(state_dir).channels().join("pairing.json");
        Self::in_store(Arc::new(FileRecord::new(file, 4 << 20, true)))
    }

    /// The records `store` keeps (a cluster's shared record).
    pub fn in_store(store: Arc<dyn RecordStore>) -> Self {
        Self { store }
    }

    /// Runs `change` on the records and writes them back when it says so (expired codes are
    /// dropped on the way); when another process changed them meanwhile, reads and runs
    /// `change` again.
    fn with_records<T>(
        &self,
        mut change: impl FnMut(&mut Records) -> (T, bool),
    ) -> Result<T, Error> {
        let place = self.store.describe();
        read_change_write(
            self.store.as_ref(),
            |bytes| {
                serde_json::from_slice::<Records>(bytes).map_err(|error| {
                    format!(
                        "the pairings in {place} are not valid ({error}); move them away to start over (every sender must then pair again)"
                    )
                })
            },
            |records| {
                serde_json::to_vec_pretty(records)
                    .map_err(|error| format!("cannot encode the pairings: {error}"))
            },
            |records| {
                let now = now_ms();
                let before = records.pending.len();
                records
                    .pending
                    .retain(|pending| now.saturating_sub(pending.created_ms) < CODE_LIFETIME_MS);
                let expired = records.pending.len() != before;
                let (value, changed) = change(records);
                (value, changed || expired)
            },
        )
        .map_err(|reason| {
            Error::Failed(format!(
                "{reason}; check the permissions of the state directory, or the cluster"
            ))
        })
    }

    /// Whether `peer` of `channel` was approved.
    pub fn is_approved(&self, channel: &str, peer: &str) -> Result<bool, Error> {
        self.with_records(|records| {
            let approved = records
                .approved
                .iter()
                .any(|known| known.channel == channel && known.peer == peer);
            (approved, false)
        })
    }

    /// A code for an unknown sender (the same one while it is valid).
    pub fn request(&self, channel: &str, peer: &str, name: &str) -> Result<CodeRequest, Error> {
        let code = new_code()?;
        let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
        self.with_records(|records| {
            if let Some(pending) = records
                .pending
                .iter()
                .find(|pending| pending.channel == channel && pending.peer == peer)
            {
                return (CodeRequest::AlreadyPending(pending.code.clone()), false);
            }
            if records.pending.len() >= MAX_PENDING {
                return (CodeRequest::Full, false);
            }
            records.pending.push(PendingPairing {
                code: code.clone(),
                channel: channel.to_string(),
                peer: peer.to_string(),
                name: name.clone(),
                created_ms: now_ms(),
            });
            (CodeRequest::Issued(code.clone()), true)
        })
    }

    /// Approves the sender that was given `code`.
    pub fn approve(&self, code: &str) -> Result<ApprovedPeer, Error> {
        let wanted = normalize_code(code);
        self.with_records(|records| {
            let Some(index) = records
                .pending
                .iter()
                .position(|pending| normalize_code(&pending.code) == wanted)
            else {
                let earlier = records
                    .approved
                    .iter()
                    .find(|known| known.code.as_deref() == Some(wanted.as_str()))
                    .cloned();
                return (Err(earlier), false);
            };
            let pending = records.pending.remove(index);
            records
                .approved
                .retain(|known| !(known.channel == pending.channel && known.peer == pending.peer));
            let approved = ApprovedPeer {
                channel: pending.channel,
                peer: pending.peer,
                name: pending.name,
                approved_ms: now_ms(),
                code: Some(wanted.clone()),
            };
            records.approved.push(approved.clone());
            (Ok(approved), true)
        })?
        .map_err(|earlier| match earlier {
            Some(earlier) => Error::Usage(format!(
                "the code {} is already approved: {}:{} ({:?}) may talk to the agent, approved {} ago; `clawcage pairing list` shows the approved senders",
                code.chars().take(32).collect::<String>(),
                earlier.channel,
                earlier.peer,
                earlier.name,
                how_long(now_ms().saturating_sub(earlier.approved_ms))
            )),
            None => Error::Usage(format!(
                "no pending pairing has the code {}: codes are valid for an hour; `clawcage pairing list` shows the pending ones, and the sender gets a new code by writing again once the old one expired",
                code.chars().take(32).collect::<String>()
            )),
        })
    }

    /// Revokes `id`: `<channel>:<peer>`, or a peer id alone when only one channel has it.
    pub fn revoke(&self, id: &str) -> Result<Vec<ApprovedPeer>, Error> {
        let removed = self.with_records(|records| {
            let (removed, kept): (Vec<ApprovedPeer>, Vec<ApprovedPeer>) =
                records.approved.drain(..).partition(|known| {
                    id == format!("{}:{}", known.channel, known.peer) || id == known.peer
                });
            records.approved = kept;
            let changed = !removed.is_empty();
            (removed, changed)
        })?;
        if removed.is_empty() {
            return Err(Error::Usage(format!(
                "no approved sender is `{}`; `clawcage pairing list` shows them as <channel>:<peer>",
                id.chars().take(64).collect::<String>()
            )));
        }
        Ok(removed)
    }

    /// The pending requests and the approved senders.
    pub fn list(&self) -> Result<(Vec<PendingPairing>, Vec<ApprovedPeer>), Error> {
        self.with_records(|records| ((records.pending.clone(), records.approved.clone()), false))
    }

    /// `{pending, approved}` as the gateway's `pairing.list` answers.
    pub fn list_json(&self) -> Result<Value, Error> {
        let (pending, approved) = self.list()?;
        Ok(json!({"pending": pending, "approved": approved}))
    }
}

/// `clawcage pairing ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct PairingArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PairingCommand,
}

/// The `pairing` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PairingCommand {
    /// The senders waiting with a code, and the approved ones.
    List,
    /// Let the sender who was given CODE talk to the agent (from now on, until revoked).
    ///
    /// Example: clawcage pairing approve K7QM-2XPD
    Approve {
        /// The code the sender received, e.g. K7QM-2XPD (case and the dash do not matter).
        code: String,
    },
    /// Stop an approved sender: ID is <channel>:<peer> as `pairing list` shows it (e.g.
    /// telegram:123456789), or the peer id alone.
    Revoke {
        /// The sender.
        id: String,
    },
}

fn when(ms: u64) -> String {
    let ago = now_ms().saturating_sub(ms) / 1000;
    match ago {
        0..60 => format!("{ago} s ago"),
        60..3600 => format!("{} min ago", ago / 60),
        3600..86_400 => format!("{} h ago", ago / 3600),
        _ => format!("{} days ago", ago / 86_400),
    }
}

/// `clawcage pairing list|approve|revoke`, on `store`'s records.
pub fn run(store: &PairingStore, args: &PairingArgs) -> Result<(), Error> {
    match &args.command {
        PairingCommand::List => {
            let (pending, approved) = store.list()?;
            if pending.is_empty() {
                println!("no sender is waiting for approval");
            } else {
                println!("waiting (approve with `clawcage pairing approve CODE`):");
                for request in &pending {
                    println!(
                        "  {}  {}:{}  {:?}  {}",
                        request.code,
                        request.channel,
                        request.peer,
                        request.name,
                        when(request.created_ms)
                    );
                }
            }
            if approved.is_empty() {
                println!("no sender is approved");
            } else {
                println!("approved (revoke with `clawcage pairing revoke ID`):");
                for known in &approved {
                    println!(
                        "  {}:{}  {:?}  approved {}",
                        known.channel,
                        known.peer,
                        known.name,
                        when(known.approved_ms)
                    );
                }
            }
            Ok(())
        }
        PairingCommand::Approve { code } => {
            let approved = store.approve(code)?;
            println!(
                "approved {}:{} ({:?}); their next message reaches the agent",
                approved.channel, approved.peer, approved.name
            );
            Ok(())
        }
        PairingCommand::Revoke { id } => {
            for removed in store.revoke(id)? {
                println!(
                    "revoked {}:{} ({:?})",
                    removed.channel, removed.peer, removed.name
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_issued_once_approved_and_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store = PairingStore::new(dir.path());
        assert!(!store.is_approved("telegram", "42").unwrap());
        let CodeRequest::Issued(code) = store.request("telegram", "42", "Ada\n").unwrap() else {
            panic!("a first request gets a code");
        };
        assert_eq!(code.len(), 9);
        assert_eq!(
            store.request("telegram", "42", "Ada").unwrap(),
            CodeRequest::AlreadyPending(code.clone())
        );
        assert!(store.approve("NOPE-NOPE").is_err());
        assert!(!store.is_approved("telegram", "42").unwrap());
        let approved = store
            .approve(&code.to_lowercase().replace('-', " "))
            .unwrap();
        assert_eq!(
            (approved.peer.as_str(), approved.name.as_str()),
            ("42", "Ada")
        );
        assert!(store.is_approved("telegram", "42").unwrap());
        assert!(!store.is_approved("webhook", "42").unwrap());
        // A code works once; approving it again says whom it admitted.
        let again = store.approve(&code).unwrap_err().to_string();
        assert!(
            again.contains("already approved: telegram:42 (\"Ada\")"),
            "{again}"
        );
        assert_eq!(store.revoke("telegram:42").unwrap().len(), 1);
        assert!(!store.is_approved("telegram", "42").unwrap());
        assert!(store.revoke("42").is_err());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("channels/pairing.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn pending_requests_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let store = PairingStore::new(dir.path());
        for peer in 0..MAX_PENDING {
            assert!(matches!(
                store.request("telegram", &peer.to_string(), "x").unwrap(),
                CodeRequest::Issued(_)
            ));
        }
        assert_eq!(
            store.request("telegram", "flood", "x").unwrap(),
            CodeRequest::Full
        );
    }
}
