//! Token budgets: `[budget] session_tokens` bounds what one session may use since its last
//! reset, `daily_tokens` what the agent's sessions may use together in one UTC day. Tokens are
//! counted as the providers report them, prompt (cached or not) and output together, for every
//! model call made on a session's behalf: its own turns, its compactions, its sub-agents (nested
//! ones too) and the usage its external agents report. The count is kept here, per call, by
//! [`Metered`], the provider wrapper the runtime puts around the whole provider chain: before a
//! call it refuses when a budget is spent ([`ProviderError::Budget`], a message saying which
//! budget and what to do), after it charges the call to the session the work belongs to (the
//! budget account, a task-local set by the session's lane and carried into its children by the
//! sub-agent manager: [`charged_to`], [`budget_account`]). Crossing 80 % or 100 % of either is
//! said once ([`Budget::take_notices`]). The day's count is kept in the state directory
//! (`usage/daily.json`, written atomically under a lock) or, in a cluster, in a record every
//! gateway host shares; each charge adds to the count as stored, so a restart does not start the
//! day afresh and processes (or hosts) charging at once lose none of it. A session's count is
//! rebuilt at load from its transcript ([`Budget::seed`]).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use clawcage_core::records::{FileRecord, RecordStore, StoredRecord, read_change_write};
use clawcage_core::{BoxFuture, Usage};
use serde::{Deserialize, Serialize};

use crate::provider::{ChatRequest, ChatResponse, Provider, ProviderError, ProviderEvents};

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

/// What is counted in memory: the day's tokens, each session's since its reset, and the notices
/// not yet shown per session.
#[derive(Debug, Default)]
struct Ledger {
    daily: Daily,
    sessions: HashMap<String, u64>,
    notices: HashMap<String, Vec<String>>,
}

/// An agent's budgets and the counts they are judged on.
#[derive(Debug)]
pub struct Budget {
    config: BudgetConfig,
    /// Where the day's count is kept (none: in memory only).
    store: Option<Arc<dyn RecordStore>>,
    ledger: Mutex<Ledger>,
}

tokio::task_local! {
    /// The session whose budget the model calls of the current task are charged to.
    static ACCOUNT: String;
}

/// The session the current task's model calls are charged to, if any.
pub fn budget_account() -> Option<String> {
    ACCOUNT.try_with(Clone::clone).ok()
}

/// Run `future` with its model calls charged to session `account`'s budget (and the day's).
/// A session's lane wraps its turns and compactions in it; the sub-agent manager wraps a child's
/// run in its parent's account, so a child (and its children) spend the parent session's budget.
pub async fn charged_to<F: std::future::Future>(account: String, future: F) -> F::Output {
    ACCOUNT.scope(account, future).await
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
        let store = file
            .map(|path| -> Arc<dyn RecordStore> { Arc::new(FileRecord::new(path, 4096, true)) });
        Self::in_store(config, store)
    }

    /// Budgets `config`, with the day's count kept in `store` (a cluster's shared record).
    pub fn in_store(config: BudgetConfig, store: Option<Arc<dyn RecordStore>>) -> Self {
        let daily = store.as_deref().and_then(read_daily).unwrap_or_default();
        Self {
            config,
            store,
            ledger: Mutex::new(Ledger {
                daily,
                ..Ledger::default()
            }),
        }
    }

    /// The limits.
    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.config.session_tokens.is_some() || self.config.daily_tokens.is_some()
    }

    /// Tokens used today by every session (0 on a new day).
    pub fn used_today(&self) -> u64 {
        let mut ledger = self.lock();
        self.refresh(&mut ledger.daily);
        ledger.daily.tokens
    }

    /// Tokens session `account` has used since its reset, its children's included.
    pub fn session_used(&self, account: &str) -> u64 {
        self.lock().sessions.get(account).copied().unwrap_or(0)
    }

    /// Take in what session `account` used before it was loaded (from its transcript): the
    /// count becomes at least `tokens`.
    pub fn seed(&self, account: &str, tokens: u64) {
        let mut ledger = self.lock();
        let used = ledger.sessions.entry(account.to_string()).or_default();
        *used = (*used).max(tokens);
    }

    /// Session `account` was reset: its count starts afresh (the day's does not).
    pub fn reset(&self, account: &str) {
        self.lock().sessions.insert(account.to_string(), 0);
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start a new day's count when the day changed, and take in what other clawcage
    /// processes on the same state directory added.
    fn refresh(&self, daily: &mut Daily) {
        let day = today();
        if let Some(stored) = self.store.as_deref().and_then(read_daily)
            && stored.day == day
            && stored.tokens > daily.tokens
        {
            *daily = stored;
        }
        if daily.day != day {
            *daily = Daily { day, tokens: 0 };
        }
    }

    /// Whether a model call for session `account` (none: work of no session) may be made: an
    /// error saying which budget is spent and what to do when one is.
    pub fn check(&self, account: Option<&str>) -> Result<(), String> {
        if let Some(limit) = self.config.session_tokens
            && let Some(account) = account
            && self.session_used(account) >= limit
        {
            return Err(format!(
                "this session has used its budget of {limit} tokens ([budget] session_tokens, counted since its last reset, its sub-agents included): /reset starts it afresh, or raise the budget"
            ));
        }
        if let Some(limit) = self.config.daily_tokens
            && self.used_today() >= limit
        {
            return Err(format!(
                "today's budget of {limit} tokens is spent ([budget] daily_tokens, counted from 00:00 UTC): it renews at 00:00 UTC, or raise the budget"
            ));
        }
        Ok(())
    }

    /// Count `tokens` used on behalf of session `account` (none: work of no session) against the
    /// session's budget and the day's; each budget whose 80 % or 100 % mark this crossed leaves a
    /// notice for the session ([`Budget::take_notices`]).
    pub fn charge(&self, account: Option<&str>, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let mut ledger = self.lock();
        let ledger = &mut *ledger;
        self.refresh(&mut ledger.daily);
        let mut daily_before = ledger.daily.tokens;
        ledger.daily.tokens = ledger.daily.tokens.saturating_add(tokens);
        if let Some(store) = &self.store {
            // Added to the count as stored (read, add, written at the version read), so what
            // other processes charged meanwhile is kept.
            let day = today();
            let stored = read_change_write(
                store.as_ref(),
                |bytes| serde_json::from_slice::<Daily>(bytes).map_err(|error| error.to_string()),
                |daily| serde_json::to_vec(daily).map_err(|error| error.to_string()),
                |daily: &mut Daily| {
                    if daily.day != day {
                        *daily = Daily {
                            day: day.clone(),
                            tokens: 0,
                        };
                    }
                    daily.tokens = daily.tokens.saturating_add(tokens);
                    (daily.clone(), true)
                },
            );
            match stored {
                Ok(stored) => {
                    daily_before = stored.tokens.saturating_sub(tokens);
                    ledger.daily = stored;
                }
                Err(error) => tracing::warn!(
                    place = %store.describe(),
                    "cannot record the day's token use: {error}"
                ),
            }
        }
        let mut notices = Vec::new();
        if let Some(account) = account {
            let used = ledger.sessions.entry(account.to_string()).or_default();
            let session_before = *used;
            *used = used.saturating_add(tokens);
            crossed(
                &mut notices,
                "this session",
                "session_tokens",
                self.config.session_tokens,
                session_before,
                tokens,
            );
        }
        crossed(
            &mut notices,
            "today's budget",
            "daily_tokens",
            self.config.daily_tokens,
            daily_before,
            tokens,
        );
        if !notices.is_empty() {
            ledger
                .notices
                .entry(account.unwrap_or_default().to_string())
                .or_default()
                .extend(notices);
        }
    }

    /// The notices left for session `account` since it last took them, oldest first.
    pub fn take_notices(&self, account: &str) -> Vec<String> {
        self.lock().notices.remove(account).unwrap_or_default()
    }
}

/// Adds the notice for a budget whose 80 % or 100 % mark `tokens` crossed from `before`.
fn crossed(
    notices: &mut Vec<String>,
    what: &str,
    key: &str,
    limit: Option<u64>,
    before: u64,
    tokens: u64,
) {
    let Some(limit) = limit else {
        return;
    };
    let after = before.saturating_add(tokens);
    let notice_at = (limit as f64 * NOTICE_SHARE) as u64;
    if before < limit && after >= limit {
        notices.push(format!(
            "{what} has used all of its {limit} tokens ([budget] {key}); the next model call will be refused"
        ));
    } else if before < notice_at && after >= notice_at {
        notices.push(format!(
            "{what} has used {}% of its {limit} tokens ([budget] {key})",
            percent(after, limit)
        ));
    }
}

/// A provider held to a [`Budget`]: each call is refused while a budget of the session it is
/// made for is spent, and charged to it when it returns. The runtime puts it around the whole
/// provider chain (so a fail-over never hides a refusal), once, and hands the same provider to
/// sessions, compaction and sub-agents, so no model call escapes the count.
pub struct Metered {
    inner: Arc<dyn Provider>,
    budget: Arc<Budget>,
}

impl Metered {
    /// `inner` held to `budget`.
    pub fn new(inner: Arc<dyn Provider>, budget: Arc<Budget>) -> Self {
        Self { inner, budget }
    }
}

impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("inner", &self.inner)
            .field("budget", &self.budget.config())
            .finish()
    }
}

impl Provider for Metered {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let account = budget_account();
            self.budget
                .check(account.as_deref())
                .map_err(ProviderError::Budget)?;
            let response = self.inner.complete(request, events).await?;
            self.budget
                .charge(account.as_deref(), response.usage.total());
            Ok(response)
        })
    }
}

/// Charge usage reported by something that is not a [`Provider`] (an external ACP agent's own
/// model calls) to the current budget account, when a budget is in force.
pub fn charge_reported(budget: Option<&Budget>, usage: Usage) {
    if let Some(budget) = budget {
        budget.charge(budget_account().as_deref(), usage.total());
    }
}

/// The day's count as `store` keeps it, if it keeps a readable one.
fn read_daily(store: &dyn RecordStore) -> Option<Daily> {
    match store.read(None).ok()? {
        StoredRecord::Found { bytes, .. } => serde_json::from_slice(&bytes).ok(),
        StoredRecord::Missing | StoredRecord::Unchanged => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(session: Option<u64>, daily: Option<u64>) -> Budget {
        Budget::new(
            BudgetConfig {
                session_tokens: session,
                daily_tokens: daily,
            },
            None,
        )
    }

    #[test]
    fn a_spent_session_or_day_refuses_and_says_which() {
        let budget = limits(Some(1000), Some(5000));
        budget.seed("a", 300);
        assert!(budget.check(Some("a")).is_ok());
        budget.charge(Some("a"), 700);
        let spent = budget.check(Some("a")).err().unwrap_or_default();
        assert!(spent.contains("[budget] session_tokens"), "{spent}");
        // Another session still has its own budget, until the day is spent.
        assert!(budget.check(Some("b")).is_ok());
        // Work of no session (a cron job's) spends the day.
        budget.charge(None, 4300);
        let spent = budget.check(Some("b")).err().unwrap_or_default();
        assert!(spent.contains("[budget] daily_tokens"), "{spent}");
        // Work of no session is held to the day's budget only.
        assert!(budget.check(None).is_err());
        assert!(limits(Some(10), None).check(None).is_ok());
    }

    #[test]
    fn a_reset_starts_the_session_afresh_but_not_the_day() {
        let budget = limits(Some(100), Some(1000));
        budget.charge(Some("a"), 150);
        assert!(budget.check(Some("a")).is_err());
        budget.reset("a");
        assert!(budget.check(Some("a")).is_ok());
        assert_eq!(budget.used_today(), 150);
        // Seeding from a transcript never lowers what was counted.
        budget.charge(Some("a"), 40);
        budget.seed("a", 10);
        assert_eq!(budget.session_used("a"), 40);
    }

    #[test]
    fn notices_come_once_at_80_and_100_percent() {
        let budget = limits(Some(1000), None);
        budget.charge(Some("a"), 500);
        assert!(budget.take_notices("a").is_empty());
        budget.charge(Some("a"), 300);
        assert_eq!(
            budget.take_notices("a"),
            ["this session has used 80% of its 1000 tokens ([budget] session_tokens)"]
        );
        assert!(budget.take_notices("a").is_empty());
        budget.charge(Some("a"), 100);
        assert!(budget.take_notices("a").is_empty());
        budget.charge(Some("a"), 200);
        assert!(budget.take_notices("a")[0].contains("the next model call will be refused"));
    }

    #[test]
    fn the_day_is_kept_across_restarts() {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let file = dir.path().join("usage").join("daily.json");
        let config = BudgetConfig {
            session_tokens: None,
            daily_tokens: Some(100),
        };
        Budget::new(config, Some(file.clone())).charge(None, 60);
        assert_eq!(Budget::new(config, Some(file)).used_today(), 60);
    }

    /// A provider whose every answer costs 60 tokens.
    #[derive(Debug)]
    struct Costly;

    impl Provider for Costly {
        fn label(&self) -> String {
            "test/costly".to_string()
        }

        fn complete<'a>(
            &'a self,
            _request: ChatRequest<'a>,
            _events: &'a dyn ProviderEvents,
        ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            Box::pin(async move {
                Ok(ChatResponse {
                    content: vec![clawcage_core::ContentBlock::text("ok")],
                    stop_reason: crate::provider::StopReason::EndTurn,
                    usage: Usage {
                        input_tokens: 40,
                        output_tokens: 20,
                        ..Usage::default()
                    },
                    answered_by: self.label(),
                    malformed: Vec::new(),
                    repairs: Vec::new(),
                })
            })
        }
    }

    #[tokio::test]
    async fn a_metered_provider_charges_the_account_and_refuses_when_spent() {
        let budget = Arc::new(limits(Some(100), None));
        let provider = Metered::new(Arc::new(Costly), budget.clone());
        let tools = crate::ToolRegistry::new();
        let messages = [clawcage_core::ChatMessage::user("hi")];
        let request = ChatRequest {
            system: "",
            messages: &messages,
            tools: &tools,
            stream: false,
            max_tokens: None,
        };
        let events = crate::provider::NoEvents;
        // Calls of a child, charged to its parent's account.
        for _ in 0..2 {
            let answered = charged_to("parent".into(), provider.complete(request, &events)).await;
            assert!(answered.is_ok(), "{answered:?}");
        }
        assert_eq!(budget.session_used("parent"), 120);
        assert_eq!(budget.used_today(), 120);
        let refused = charged_to("parent".into(), provider.complete(request, &events)).await;
        assert!(
            matches!(&refused, Err(ProviderError::Budget(message)) if message.contains("session_tokens")),
            "{refused:?}"
        );
        // 60 then 120 of 100: the crossing of the whole budget is said, once.
        assert_eq!(budget.take_notices("parent").len(), 1);
    }
}
