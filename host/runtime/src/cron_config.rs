//! `[cron]` in the config: whether the agent gets the `cron` tool, the session a job goes to
//! when it is added outside any session's turn, and how many jobs may exist. Checked here, so a
//! bad value is a configuration error at start-up that names the key. The jobs themselves live
//! in `<state>/cron/jobs.json`.

use anyhow::bail;
use clawcage_agent::CronOptions;
use clawcage_agent::cron::DEFAULT_MAX_JOBS;
use serde::Deserialize;

/// The most jobs `max_jobs` may allow.
const MAX_JOBS_LIMIT: usize = 10_000;

/// `[cron]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CronSection {
    /// Offer the `cron` tool and run scheduled jobs (default true).
    pub enabled: Option<bool>,
    /// The session a job goes to when added outside a turn (default `main`).
    pub default_session: Option<String>,
    /// Jobs kept at most (default 100).
    pub max_jobs: Option<usize>,
}

impl CronSection {
    /// Whether the `cron` tool is offered and jobs run.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The service's options, checked.
    pub fn options(&self) -> anyhow::Result<CronOptions> {
        let defaults = CronOptions::default();
        let default_session = match self.default_session.as_deref() {
            None => defaults.default_session,
            Some(key)
                if !key.is_empty() && key.len() <= 200 && !key.chars().any(char::is_control) =>
            {
                key.to_string()
            }
            Some(key) => bail!(
                "[cron] default_session = {key:?} is not valid; use 1 to 200 characters without control characters"
            ),
        };
        let max_jobs = match self.max_jobs {
            None => DEFAULT_MAX_JOBS,
            Some(n) if (1..=MAX_JOBS_LIMIT).contains(&n) => n,
            Some(n) => bail!("[cron] max_jobs = {n} is out of range; use 1 to {MAX_JOBS_LIMIT}"),
        };
        Ok(CronOptions {
            default_session,
            max_jobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_range_checks() {
        let section: CronSection = toml::from_str("").unwrap();
        assert!(section.enabled());
        assert_eq!(section.options().unwrap(), CronOptions::default());

        let section: CronSection =
            toml::from_str("enabled = false\ndefault_session = \"ops\"\nmax_jobs = 5").unwrap();
        assert!(!section.enabled());
        let options = section.options().unwrap();
        assert_eq!(options.default_session, "ops");
        assert_eq!(options.max_jobs, 5);

        let section: CronSection = toml::from_str("max_jobs = 0").unwrap();
        assert!(
            section
                .options()
                .unwrap_err()
                .to_string()
                .contains("max_jobs = 0")
        );
        let section: CronSection = toml::from_str("default_session = \"\"").unwrap();
        assert!(
            section
                .options()
                .unwrap_err()
                .to_string()
                .contains("default_session")
        );
        assert!(toml::from_str::<CronSection>("every = 1").is_err());
    }
}
