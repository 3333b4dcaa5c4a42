//! `[approvals]` in the config: what exec may run (`exec` = "deny" / "allowlist" / "full"), when
//! a person is asked (`ask` = "off" / "on-miss" / "always"), what decides when nobody can be asked
//! (`ask_fallback`), how long a request waits (`timeout_secs`), the allowlist (`allow`, entries
//! `PROGRAM [ARGS-GLOB]`), the safe bins (`safe_bins`), and whether a host off the network
//! allow-list (`network`) or a write under a read-only workspace (`write`) is asked. Checked here, so a bad value is a
//! configuration error at start-up that names the key and the valid values.

use std::time::Duration;

use anyhow::bail;
use clawcage_agent::approvals::{ApprovalSettings, DEFAULT_TIMEOUT};
use clawcage_core::approval::{AllowEntry, AskMode, ExecMode};
use serde::Deserialize;

/// The longest an approval request may wait: one day.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// `[approvals]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsSection {
    /// `deny`, `allowlist` or `full` (default).
    pub exec: Option<String>,
    /// `off` (default), `on-miss` or `always`.
    pub ask: Option<String>,
    /// `deny` (default), `allowlist` or `full`: what decides when no operator is connected.
    pub ask_fallback: Option<String>,
    /// Seconds a request waits for a decision (default 1800); then it is denied.
    pub timeout_secs: Option<u64>,
    /// `deny` (default) or `ask`: a web request to a host off `[network] allow`.
    pub network: Option<String>,
    /// `deny` (default) or `ask`: a change under a read-only workspace.
    pub write: Option<String>,
    /// Allowlist entries: `"ls"`, `"git status *"`, `"rm -r build/*"`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Programs that pass when they read standard input only (default: head tail wc cut uniq tr
    /// sort).
    pub safe_bins: Option<Vec<String>>,
}

fn mode<M: std::str::FromStr<Err = String>>(key: &str, value: &str) -> anyhow::Result<M> {
    value
        .parse()
        .map_err(|valid| anyhow::anyhow!("[approvals] {key} = {value:?} is not valid; {valid}"))
}

impl ApprovalsSection {
    /// The broker's settings, checked.
    pub fn settings(&self) -> anyhow::Result<ApprovalSettings> {
        let mut settings = ApprovalSettings::default();
        if let Some(value) = &self.exec {
            settings.exec.mode = mode("exec", value)?;
        }
        if let Some(value) = &self.ask {
            settings.ask = mode("ask", value)?;
        }
        if let Some(value) = &self.ask_fallback {
            settings.ask_fallback = mode("ask_fallback", value)?;
        }
        settings.timeout = match self.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(secs) if (1..=MAX_TIMEOUT_SECS).contains(&secs) => Duration::from_secs(secs),
            Some(secs) => bail!(
                "[approvals] timeout_secs = {secs} is out of range; use 1 to {MAX_TIMEOUT_SECS}"
            ),
        };
        settings.network_ask = match self.network.as_deref() {
            None | Some("deny") => false,
            Some("ask") => true,
            Some(other) => bail!(
                "[approvals] network = {other:?} is not valid; use \"deny\" (refuse hosts off [network] allow) or \"ask\""
            ),
        };
        settings.write_ask = match self.write.as_deref() {
            None | Some("deny") => false,
            Some("ask") => true,
            Some(other) => bail!(
                "[approvals] write = {other:?} is not valid; use \"deny\" (a read-only workspace stays read-only) or \"ask\" (each write under it is asked)"
            ),
        };
        for entry in &self.allow {
            settings.exec.allow.push(
                AllowEntry::parse(entry)
                    .map_err(|error| anyhow::anyhow!("[approvals] allow: {error}"))?,
            );
        }
        if let Some(bins) = &self.safe_bins {
            for bin in bins {
                if bin.is_empty() || bin.contains('/') {
                    bail!(
                        "[approvals] safe_bins: {bin:?} is not a program name; write names such as \"head\""
                    );
                }
            }
            settings.exec.safe_bins = bins.clone();
        }
        if settings.exec.mode == ExecMode::Deny && settings.ask != AskMode::Off {
            bail!(
                "[approvals] exec = \"deny\" refuses every command, so ask = {:?} would never be used; use exec = \"allowlist\" with ask = \"on-miss\" to ask instead",
                self.ask.as_deref().unwrap_or_default()
            );
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<ApprovalSettings> {
        let section: ApprovalsSection = toml::from_str(text)?;
        section.settings()
    }

    #[test]
    fn defaults_run_everything_without_asking() {
        let settings = parse("").expect("defaults");
        assert_eq!(settings.exec.mode, ExecMode::Full);
        assert_eq!(settings.ask, AskMode::Off);
        assert_eq!(settings.ask_fallback, ExecMode::Deny);
        assert_eq!(settings.timeout, DEFAULT_TIMEOUT);
        assert!(settings.exec.safe_bins.iter().any(|bin| bin == "head"));
    }

    #[test]
    fn a_full_section_is_read() {
        let settings = parse(
            "exec = \"allowlist\"\nask = \"on-miss\"\nask_fallback = \"allowlist\"\ntimeout_secs = 60\nallow = [\"ls\", \"rm -r build/*\"]\nsafe_bins = [\"head\"]\n",
        )
        .expect("valid");
        assert_eq!(settings.exec.mode, ExecMode::Allowlist);
        assert_eq!(settings.ask, AskMode::OnMiss);
        assert_eq!(settings.exec.allow.len(), 2);
        assert_eq!(settings.exec.safe_bins, ["head"]);
        assert_eq!(settings.timeout, Duration::from_secs(60));
        assert!(!settings.write_ask);
        assert!(parse("write = \"ask\"").expect("valid").write_ask);
    }

    #[test]
    fn bad_values_name_the_key_and_the_valid_values() {
        for (text, expected) in [
            ("exec = \"some\"", "[approvals] exec"),
            ("ask = \"sometimes\"", "[approvals] ask"),
            ("ask_fallback = \"ask\"", "[approvals] ask_fallback"),
            ("timeout_secs = 0", "timeout_secs"),
            ("network = \"allow\"", "[approvals] network"),
            ("write = \"allow\"", "[approvals] write"),
            ("allow = [\"/bin/rm\"]", "bare name"),
            ("safe_bins = [\"/bin/head\"]", "safe_bins"),
            ("exec = \"deny\"\nask = \"always\"", "never be used"),
            ("asks = \"off\"", "unknown field"),
        ] {
            let error = parse(text).expect_err(text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
