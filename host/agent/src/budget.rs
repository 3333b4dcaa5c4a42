//! Token budgets: `[budget] session_tokens` bounds what one session may use since its last
//! reset, `daily_tokens` what the agent's sessions may use together in one UTC day. Tokens are
//! counted as the providers report them, prompt (cached or not) and output together. A turn
//! learns what it may still use ([`Budget::allowance`]) and stops when that is spent; a turn
//! that would start on a spent budget is refused with a message saying which budget and what to
//! do; crossing 80 % or 100 % of either is said once ([`Budget::record`]). The day's count is
//! kept in the state directory (`usage/daily.json`, written atomically), so a restart does not
//! start the day afresh.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::agent_loop::Allowance;

/// The share of a budget at which the user is told.
pub const NOTICE_SHARE: f64 = 0.8;

/// The limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Tokens one session may use since its last reset.
    pub session_tokens: Option<u64>,
    /// Tokens all sessions may use together in one UTC day.
    pub daily_tokens: Option<u64>,
}

/// The day's count as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Daily {
    /// `YYYY-MM-DD`, UTC.
    day: String,
    /// Tokens used that day.
    tokens: u64,
}

/// An agent's budgets and the day's count.
#[derive(Debug)]
pub struct Budget {
    config: BudgetConfig,
    file: Option<PathBuf>,
    daily: Mutex<Daily>,
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

fn percent(used: u64, limit: u64) -> u64 {
    (used as f64 * 100.0 / limit.max(1) as f64).floor() as u64
}

impl Budget {
    /// Budgets `config`, with the day's count kept in `file` (none: in memory only).
    pub fn new(config: BudgetConfig, file: Option<PathBuf>) -> Self {
        let daily = file
            .as_ref()
            .and_then(|path| read_daily(path))
            .unwrap_or_default();
        Self {
            config,
            file,
            daily: Mutex::new(daily),
        }
    }

    /// The limits.
    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// Tokens used today by every session (0 on a new day).
    pub fn used_today(&self) -> u64 {
        let mut daily = self.lock();
        self.refresh(&mut daily);
        daily.tokens
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Daily> {
        self.daily
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start a new day's count when the day changed, and take in what other clawcage
    /// processes on the same state directory added.
    fn refresh(&self, daily: &mut Daily) {
        let day = today();
        if let Some(stored) = self.file.as_ref().and_then(|path| read_daily(path))
            && stored.day == day
            && stored.tokens > daily.tokens
        {
            *daily = stored;
        }
        if daily.day != day {
            *daily = Daily { day, tokens: 0 };
        }
    }

    /// What a turn of a session that has used `session_used` tokens may use: `Ok(None)`
    /// without limits, the smaller remainder otherwise, and an error saying which budget is
    /// spent when one is.
    pub fn allowance(&self, session_used: u64) -> Result<Option<Allowance>, String> {
        let mut remaining: Option<Allowance> = None;
        if let Some(limit) = self.config.session_tokens {
            let message = format!(
                "this session has used its budget of {limit} tokens ([budget] session_tokens, counted since its last reset): /reset starts it afresh, or raise the budget"
            );
            if session_used >= limit {
                return Err(message);
            }
            remaining = Some(Allowance {
                tokens: limit - session_used,
                exhausted: message,
            });
        }
        if let Some(limit) = self.config.daily_tokens {
            let used = self.used_today();
            let message = format!(
                "today's budget of {limit} tokens is spent ([budget] daily_tokens, counted from 00:00 UTC): it renews at 00:00 UTC, or raise the budget"
            );
            if used >= limit {
                return Err(message);
            }
            if remaining
                .as_ref()
                .is_none_or(|allowance| limit - used < allowance.tokens)
            {
                remaining = Some(Allowance {
                    tokens: limit - used,
                    exhausted: message,
                });
            }
        }
        Ok(remaining)
    }

    /// Count `tokens` a turn used in a session that had used `session_before`; returns the
    /// notices to show: each budget whose 80 % or 100 % mark this crossed.
    pub fn record(&self, session_before: u64, tokens: u64) -> Vec<String> {
        let mut notices = Vec::new();
        if tokens == 0 {
            return notices;
        }
        let daily_before = {
            let mut daily = self.lock();
            self.refresh(&mut daily);
            let before = daily.tokens;
            daily.tokens = daily.tokens.saturating_add(tokens);
            if let Some(path) = &self.file {
                let written = serde_json::to_vec(&*daily)
                    .map_err(std::io::Error::other)
                    .and_then(|bytes| {
                        if let Some(parent) = path.parent() {
                            std::fs::create_dir_all(parent)?;
                        }
                        clawcage_core::files::write_atomically(path, &bytes, true)
                    });
                if let Err(error) = written {
                    tracing::warn!(path = %path.display(), "cannot record the day's token use: {error}");
                }
            }
            before
        };
        let mut check = |what: &str, key: &str, limit: Option<u64>, before: u64| {
            let Some(limit) = limit else {
                return;
            };
            let after = before.saturating_add(tokens);
            let notice_at = (limit as f64 * NOTICE_SHARE) as u64;
            if before < limit && after >= limit {
                notices.push(format!(
                    "{what} has used all of its {limit} tokens ([budget] {key}); the next message will be refused"
                ));
            } else if before < notice_at && after >= notice_at {
                notices.push(format!(
                    "{what} has used {}% of its {limit} tokens ([budget] {key})",
                    percent(after, limit)
                ));
            }
        };
        check(
            "this session",
            "session_tokens",
            self.config.session_tokens,
            session_before,
        );
        check(
            "today's budget",
            "daily_tokens",
            self.config.daily_tokens,
            daily_before,
        );
        notices
    }
}

fn read_daily(path: &std::path::Path) -> Option<Daily> {
    let text =
        clawcage_core::files::read_regular_text(path, 4096, clawcage_core::files::Symlinks::Refuse)
            .ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_may_use_the_smaller_remainder_and_a_spent_budget_refuses() {
        let budget = Budget::new(
            BudgetConfig {
                session_tokens: Some(1000),
                daily_tokens: Some(5000),
            },
            None,
        );
        let allowance = budget.allowance(300).ok().flatten();
        assert_eq!(allowance.map(|a| a.tokens), Some(700));
        assert!(
            budget
                .record(0, 4500)
                .iter()
                .any(|n| n.contains("today's budget has used 90%"))
        );
        let allowance = budget.allowance(300).ok().flatten();
        assert_eq!(allowance.map(|a| a.tokens), Some(500));
        let spent = budget.allowance(1000).err().unwrap_or_default();
        assert!(spent.contains("[budget] session_tokens"), "{spent}");
    }

    #[test]
    fn notices_come_once_at_80_and_100_percent() {
        let budget = Budget::new(
            BudgetConfig {
                session_tokens: Some(1000),
                daily_tokens: None,
            },
            None,
        );
        assert!(budget.record(0, 500).is_empty());
        assert_eq!(
            budget.record(500, 300),
            ["this session has used 80% of its 1000 tokens ([budget] session_tokens)"]
        );
        assert!(budget.record(800, 100).is_empty());
        assert!(budget.record(900, 200)[0].contains("the next message will be refused"));
    }

    #[test]
    fn the_day_is_kept_across_restarts() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let file = dir.path().join("usage").join("daily.json");
        let config = BudgetConfig {
            session_tokens: None,
            daily_tokens: Some(100),
        };
        Budget::new(config, Some(file.clone())).record(0, 60);
        assert_eq!(Budget::new(config, Some(file)).used_today(), 60);
    }
}
