//! The effective grant of one plugin: the intersection of what its manifest asks for and what
//! the operator grants, with a sentence for everything asked and not given. Environment names
//! that hold the host's own credentials never pass, and names that look like secrets pass only
//! when the operator lists them twice.

use crate::grants::FsMode;

use super::manifest::{Capabilities, OperatorGrant, WorkspaceAccess};

/// Environment variables of the host that hold its own credentials (the model providers' API
/// keys). They are never passed to a plugin, whatever the operator's grant says.
pub const HOST_SECRET_ENV: &[&str] = clawcage_core::CREDENTIAL_ENV;

/// Name endings that mark an environment variable as a likely secret. Such a name is passed only
/// when the operator lists it in `allow_secret_env` as well as in `env`.
pub const SECRET_LIKE_SUFFIXES: &[&str] = &["_KEY", "_TOKEN", "_SECRET", "_PASSWORD"];

/// The effective grant of one plugin, before it is bound to a workspace directory: what both the
/// manifest asks for and the operator grants, with the reasons for everything asked and not given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// Workspace access, if any.
    pub workspace: Option<FsMode>,
    /// Hosts both sides name.
    pub network: Vec<String>,
    /// Environment names both sides name and that passed the secret rule.
    pub env: Vec<String>,
    /// What was asked for and not granted, one sentence each.
    pub notes: Vec<String>,
}

/// Whether `name` looks like a secret by its ending (`_KEY`, `_TOKEN`, `_SECRET`, `_PASSWORD`,
/// any case) or is one of those words alone.
pub fn looks_like_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_LIKE_SUFFIXES
        .iter()
        .any(|suffix| upper.ends_with(suffix) || upper == suffix[1..])
}

/// The intersection of what `asked` and what `granted` allow. `host_secrets` are names that are
/// never passed; names that [look like secrets](looks_like_secret) pass only when the operator
/// lists them in `allow_secret_env`.
pub fn decide(
    asked: &Capabilities,
    granted: Option<&OperatorGrant>,
    host_secrets: &[String],
) -> Decision {
    let mut decision = Decision::default();
    let empty = OperatorGrant::default();
    let grant = match granted {
        Some(grant) => grant,
        None => {
            let asks_anything = asked.workspace.and_then(WorkspaceAccess::mode).is_some()
                || !asked.network.is_empty()
                || !asked.env.is_empty();
            if asks_anything {
                decision.notes.push(
                    "the operator's config has no grant for this plugin, so it gets nothing it asks for"
                        .to_string(),
                );
            }
            &empty
        }
    };

    let asked_mode = asked.workspace.and_then(WorkspaceAccess::mode);
    let granted_mode = grant.workspace.and_then(WorkspaceAccess::mode);
    decision.workspace = match (asked_mode, granted_mode) {
        (Some(asked), Some(granted)) => {
            if granted < asked {
                decision.notes.push(format!(
                    "asked for the workspace {}, granted {}",
                    asked.as_str(),
                    granted.as_str()
                ));
            }
            Some(asked.min(granted))
        }
        (Some(asked), None) => {
            if granted.is_some() {
                decision.notes.push(format!(
                    "asked for the workspace {}, not granted",
                    asked.as_str()
                ));
            }
            None
        }
        (None, _) => None,
    };

    for host in &asked.network {
        let wanted = host.to_ascii_lowercase();
        if grant
            .network
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(&wanted))
        {
            decision.network.push(wanted);
        } else if granted.is_some() {
            decision
                .notes
                .push(format!("asked for network host {host}, not granted"));
        }
    }

    for name in &asked.env {
        if !grant.env.contains(name) {
            if granted.is_some() {
                decision
                    .notes
                    .push(format!("asked for env {name}, not granted"));
            }
            continue;
        }
        if host_secrets.contains(name) {
            decision.notes.push(format!(
                "env {name} refused: it holds one of clawcage's own credentials, which never enter a sandbox"
            ));
            continue;
        }
        if looks_like_secret(name) && !grant.allow_secret_env.contains(name) {
            decision.notes.push(format!(
                "env {name} refused: its name looks like a secret; list it in allow_secret_env as well to pass it"
            ));
            continue;
        }
        decision.env.push(name.clone());
    }
    decision.network.sort();
    decision.network.dedup();
    decision.env.sort();
    decision.env.dedup();
    decision
}
#[cfg(test)]
mod tests {
    use super::*;

    fn caps(workspace: Option<WorkspaceAccess>, network: &[&str], env: &[&str]) -> Capabilities {
        Capabilities {
            workspace,
            network: network.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn grant(
        workspace: Option<WorkspaceAccess>,
        network: &[&str],
        env: &[&str],
        allow_secret_env: &[&str],
    ) -> OperatorGrant {
        OperatorGrant {
            workspace,
            network: network.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
            allow_secret_env: allow_secret_env.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_effective_grant_is_the_intersection() {
        let asked = caps(
            Some(WorkspaceAccess::ReadWrite),
            &["api.example.com", "evil.example"],
            &["LANG", "TZ", "HOME"],
        );
        let granted = grant(
            Some(WorkspaceAccess::ReadOnly),
            &["API.example.com", "other.example"],
            &["LANG", "TZ", "USER"],
            &[],
        );
        let decision = decide(&asked, Some(&granted), &[]);
        assert_eq!(decision.workspace, Some(FsMode::ReadOnly));
        assert_eq!(decision.network, ["api.example.com"]);
        assert_eq!(decision.env, ["LANG", "TZ"]);
        let notes = decision.notes.join("\n");
        assert!(
            notes.contains("asked for the workspace rw, granted ro"),
            "{notes}"
        );
        assert!(
            notes.contains("network host evil.example, not granted"),
            "{notes}"
        );
        assert!(notes.contains("env HOME, not granted"), "{notes}");
        assert!(!notes.contains("USER"), "granted but not asked: {notes}");

        // The operator grants more than asked: the plugin still gets only what it asked for.
        let wide = grant(
            Some(WorkspaceAccess::ReadWrite),
            &["a.example"],
            &["LANG"],
            &[],
        );
        let narrow = decide(
            &caps(Some(WorkspaceAccess::ReadOnly), &[], &[]),
            Some(&wide),
            &[],
        );
        assert_eq!(narrow.workspace, Some(FsMode::ReadOnly));
        assert!(narrow.network.is_empty() && narrow.env.is_empty());
    }

    #[test]
    fn no_grant_means_nothing() {
        let asked = caps(Some(WorkspaceAccess::ReadWrite), &["a.example"], &["LANG"]);
        let decision = decide(&asked, None, &[]);
        assert_eq!(decision.workspace, None);
        assert!(decision.network.is_empty() && decision.env.is_empty());
        assert!(decision.notes[0].contains("no grant for this plugin"));
        assert_eq!(decide(&Capabilities::default(), None, &[]).notes.len(), 0);
    }

    #[test]
    fn secrets_need_an_explicit_second_listing_and_host_credentials_never_pass() {
        let asked = caps(
            None,
            &[],
            &[
                "GITHUB_TOKEN",
                "DB_PASSWORD",
                "api_key",
                "OPENAI_API_KEY",
                "LANG",
            ],
        );
        let granted = grant(
            None,
            &[],
            &[
                "GITHUB_TOKEN",
                "DB_PASSWORD",
                "api_key",
                "OPENAI_API_KEY",
                "LANG",
            ],
            &["GITHUB_TOKEN", "OPENAI_API_KEY"],
        );
        let host_secrets: Vec<String> = HOST_SECRET_ENV.iter().map(|s| s.to_string()).collect();
        let decision = decide(&asked, Some(&granted), &host_secrets);
        assert_eq!(decision.env, ["GITHUB_TOKEN", "LANG"]);
        let notes = decision.notes.join("\n");
        assert!(
            notes.contains("env DB_PASSWORD refused: its name looks like a secret"),
            "{notes}"
        );
        assert!(notes.contains("env api_key refused"), "{notes}");
        assert!(
            notes
                .contains("env OPENAI_API_KEY refused: it holds one of clawcage's own credentials"),
            "{notes}"
        );
        assert!(looks_like_secret("TOKEN") && !looks_like_secret("KEYBOARD_LAYOUT"));
    }
}
