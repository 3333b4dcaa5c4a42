//! A session queue's settings: the four modes, the drop policy, the cap and the collect window,
//! as configured (`[queue]`) and as a session's `/queue` overrides them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::QueueUsageError;

/// What a message that arrives while its session is busy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueMode {
    /// Enter the running turn at its next safe point (the default).
    #[default]
    Steer,
    /// Become its own turn after the running one, in arrival order.
    Followup,
    /// Wait for a quiet window, then drain with the other queued messages as one turn.
    Collect,
    /// Stop the running turn and run the newest message.
    Interrupt,
}

impl QueueMode {
    /// Every mode, in the order they are documented.
    pub const ALL: [QueueMode; 4] = [
        QueueMode::Steer,
        QueueMode::Followup,
        QueueMode::Collect,
        QueueMode::Interrupt,
    ];

    /// The mode's name in the configuration and the `/queue` command.
    pub fn name(self) -> &'static str {
        match self {
            QueueMode::Steer => "steer",
            QueueMode::Followup => "followup",
            QueueMode::Collect => "collect",
            QueueMode::Interrupt => "interrupt",
        }
    }
}

impl fmt::Display for QueueMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QueueMode {
    type Err = QueueUsageError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        QueueMode::ALL
            .into_iter()
            .find(|mode| mode.name() == text)
            .ok_or_else(|| {
                QueueUsageError(format!(
                    "unknown queue mode `{text}`; use steer, followup, collect or interrupt"
                ))
            })
    }
}

/// What happens to a message that arrives when the queue already holds `cap` messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DropPolicy {
    /// Evict the oldest queued message.
    Old,
    /// Refuse the incoming message, telling its sender.
    New,
    /// Evict the oldest, keeping a one-line summary of it for the next turn (the default).
    #[default]
    Summarize,
}

impl DropPolicy {
    /// Every policy.
    pub const ALL: [DropPolicy; 3] = [DropPolicy::Old, DropPolicy::New, DropPolicy::Summarize];

    /// The policy's name in the configuration and the `/queue` command.
    pub fn name(self) -> &'static str {
        match self {
            DropPolicy::Old => "old",
            DropPolicy::New => "new",
            DropPolicy::Summarize => "summarize",
        }
    }
}

impl fmt::Display for DropPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DropPolicy {
    type Err = QueueUsageError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        DropPolicy::ALL
            .into_iter()
            .find(|policy| policy.name() == text)
            .ok_or_else(|| {
                QueueUsageError(format!(
                    "unknown drop policy `{text}`; use old, new or summarize"
                ))
            })
    }
}

/// The default quiet window of `collect`, in milliseconds.
pub const DEFAULT_DEBOUNCE_MS: u64 = 1000;
/// The default number of messages a session's queue holds.
pub const DEFAULT_CAP: usize = 20;
/// The longest quiet window accepted, in milliseconds (10 minutes).
pub const MAX_DEBOUNCE_MS: u64 = 600_000;
/// The largest cap accepted.
pub const MAX_CAP: usize = 10_000;
/// The longest summary kept of a message dropped under `drop = summarize`, in characters.
pub const SUMMARY_CHARS: usize = 160;

/// How one message is queued: the mode and the options that apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// The mode.
    pub mode: QueueMode,
    /// `collect`'s quiet window: the batch drains once no message joined it for this long.
    pub debounce_ms: u64,
    /// User messages a session's queue holds at most.
    pub cap: usize,
    /// What a message arriving at a full queue does.
    pub drop: DropPolicy,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            mode: QueueMode::default(),
            debounce_ms: DEFAULT_DEBOUNCE_MS,
            cap: DEFAULT_CAP,
            drop: DropPolicy::default(),
        }
    }
}

impl fmt::Display for QueueSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, debounce {} ms, cap {}, drop {}",
            self.mode, self.debounce_ms, self.cap, self.drop
        )
    }
}

/// The operator's queue configuration (`[queue]` and `[queue.by_channel]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// `[queue]`: the settings of every session.
    pub settings: QueueSettings,
    /// `[queue.by_channel]`: the mode of messages from a channel, over `settings.mode`.
    pub by_channel: BTreeMap<String, QueueMode>,
}

/// A session's own settings (`/queue <mode> [debounce:2s] [cap:25] [drop:summarize]`), over
/// the channel's and the configuration's. Options left out come from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOverride {
    /// The mode.
    pub mode: QueueMode,
    /// `debounce:`, in milliseconds.
    pub debounce_ms: Option<u64>,
    /// `cap:`.
    pub cap: Option<usize>,
    /// `drop:`.
    pub drop: Option<DropPolicy>,
}
