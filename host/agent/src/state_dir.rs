//! The state directory's layout, written once. Every file and folder clawcage keeps under
//! `--state-dir` is named by a method of [`StateDir`], so no front end spells a path of its own
//! and the layout in docs/configuration.md is this file. The directory holds the host's own
//! records (transcripts, inboxes, approvals, the component cache, the gateway's token); it may
//! never lie inside a workspace, which the runtime checks before anything runs.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// The state directory and what lives in it. Dereferences to its [`Path`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state directory at `root` (nothing is created).
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `sessions/`: one JSONL transcript per session key.
    pub fn sessions(&self) -> PathBuf {
        self.root.join("sessions")
    }

    /// `inbox/`: each session's inputs until the turn answering them is committed, and the
    /// owner lock.
    pub fn inbox(&self) -> PathBuf {
        self.root.join("inbox")
    }

    /// `cron/`: the jobs file (`jobs.json`) and its lock.
    pub fn cron(&self) -> PathBuf {
        self.root.join("cron")
    }

    /// `usage/daily.json`: the tokens used today, for `[budget] daily_tokens`.
    pub fn daily_usage(&self) -> PathBuf {
        self.root.join("usage").join("daily.json")
    }

    /// `audit.jsonl`: the audit log, unless `[audit] path` names another file.
    pub fn audit_log(&self) -> PathBuf {
        self.root.join("audit.jsonl")
    }

    /// `subagents/runs.json`: the sub-agent runs and their results.
    pub fn subagent_runs(&self) -> PathBuf {
        self.root.join("subagents").join("runs.json")
    }

    /// `approvals.json`: the approvals a person made permanent.
    pub fn approvals(&self) -> PathBuf {
        self.root.join("approvals.json")
    }

    /// `trusted-configs.json`: the digests of workspace configurations trusted with
    /// `clawcage trust`.
    pub fn trusted_configs(&self) -> PathBuf {
        self.root.join("trusted-configs.json")
    }

    /// `cache/components/`: compiled components, each sealed.
    pub fn components_cache(&self) -> PathBuf {
        self.root.join("cache").join("components")
    }

    /// `programs/`: the programs installed for exec (`clawcage programs install`).
    pub fn programs(&self) -> PathBuf {
        self.root.join("programs")
    }

    /// `chat_history.txt`: the lines typed in `clawcage chat`.
    pub fn chat_history(&self) -> PathBuf {
        self.root.join("chat_history.txt")
    }

    /// `gateway/`: the gateway's own files (token, lock, epoch, events, runs, titles).
    pub fn gateway(&self) -> PathBuf {
        self.root.join("gateway")
    }

    /// `gateway/token`: the token clients present.
    pub fn gateway_token(&self) -> PathBuf {
        self.gateway().join("token")
    }

    /// `gateway/gateway.json`: where the running gateway listens.
    pub fn gateway_info(&self) -> PathBuf {
        self.gateway().join("gateway.json")
    }

    /// `gateway/gateway.lock`: held by the one gateway serving this directory.
    pub fn gateway_lock(&self) -> PathBuf {
        self.gateway().join("gateway.lock")
    }

    /// `gateway/events/`: each session's event log.
    pub fn gateway_events(&self) -> PathBuf {
        self.gateway().join("events")
    }

    /// `gateway/runs/`: the gateway's runs and idempotency keys.
    pub fn gateway_runs(&self) -> PathBuf {
        self.gateway().join("runs")
    }

    /// `gateway/titles.json`: the sessions' titles.
    pub fn gateway_titles(&self) -> PathBuf {
        self.gateway().join("titles.json")
    }

    /// `channels/`: pairing codes and allowed senders of the chat channels.
    pub fn channels(&self) -> PathBuf {
        self.root.join("channels")
    }

    /// `channels/status.json`: replies a channel could not deliver.
    pub fn channels_status(&self) -> PathBuf {
        self.channels().join("status.json")
    }
}

impl Deref for StateDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.root
    }
}

impl AsRef<Path> for StateDir {
    fn as_ref(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_lies_beneath_the_directory_and_no_two_coincide() {
        let state = StateDir::new("/var/lib/clawcage");
        let places = [
            state.sessions(),
            state.inbox(),
            state.cron(),
            state.daily_usage(),
            state.audit_log(),
            state.subagent_runs(),
            state.approvals(),
            state.trusted_configs(),
            state.components_cache(),
            state.programs(),
            state.chat_history(),
            state.gateway_token(),
            state.gateway_info(),
            state.gateway_lock(),
            state.gateway_events(),
            state.gateway_runs(),
            state.gateway_titles(),
            state.channels_status(),
        ];
        for place in &places {
            assert!(
                place.starts_with(state.path()) && place != state.path(),
                "{}",
                place.display()
            );
        }
        let distinct: std::collections::HashSet<_> = places.iter().collect();
        assert_eq!(distinct.len(), places.len());
        assert_eq!(state.join("x"), Path::new("/var/lib/clawcage/x"));
    }
}
