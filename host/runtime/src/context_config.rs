//! The long-session part of the configuration: `[models."NAME"] context_window`, each model's
//! window in tokens over what its server reports and the built-in table; `[context] compact_threshold`, the share of the
//! window at which a session's older messages are summarised; and `[budget] session_tokens` and
//! `daily_tokens`, the token budgets. Checked here, so a bad value is a configuration error at
//! start-up that names the key and the valid range.

use std::collections::BTreeMap;

use anyhow::bail;
use clawcage_agent::BudgetConfig;
use clawcage_agent::context::{ContextPolicy, DEFAULT_COMPACT_THRESHOLD, ModelWindow};
use clawcage_agent::provider::window::ServerWindow;
use serde::Deserialize;

/// One `[models."NAME"]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The model's context window in tokens.
    pub context_window: Option<u64>,
}

/// `[context]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextSection {
    /// The share of the window at which the history is compacted (default 0.7).
    pub compact_threshold: Option<f64>,
}

/// `[budget]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Tokens one session may use since its last reset (default: unlimited).
    pub session_tokens: Option<u64>,
    /// Tokens all sessions may use together in one UTC day (default: unlimited).
    pub daily_tokens: Option<u64>,
}

/// The smallest window accepted in `[models."NAME"] context_window`.
const MIN_WINDOW: u64 = 1024;

/// The models of a provider label: `anthropic/claude-sonnet-4-5`, or a fail-over chain
/// `anthropic/a -> openai/b`; `None` for the scripted provider, which has no window.
pub fn models_of_label(label: &str) -> Option<Vec<String>> {
    let mut models = Vec::new();
    for member in label.split(" -> ") {
        let (kind, model) = member.split_once('/')?;
        if kind == "scripted" {
            return None;
        }
        models.push(model.to_string());
    }
    Some(models)
}

/// The context policy for the models of `label` (the smallest window of a fail-over chain,
/// since any member may answer), replies of `reply_tokens`, `[models]` and `[context]`; a model
/// whose window `[models]` does not give is asked of its server in `servers` on the first model
/// call (precedence: configuration, server, built-in table, 32k).
pub fn context_policy(
    label: &str,
    reply_tokens: u64,
    models: &BTreeMap<String, ModelSection>,
    context: &ContextSection,
    servers: &[ServerWindow],
) -> anyhow::Result<Option<ContextPolicy>> {
    for (name, model) in models {
        if let Some(window) = model.context_window
            && window < MIN_WINDOW
        {
            bail!(
                "[models.\"{name}\"] context_window = {window} is too small; use at least {MIN_WINDOW} tokens"
            );
        }
    }
    let threshold = match context.compact_threshold {
        None => DEFAULT_COMPACT_THRESHOLD,
        Some(share) if (0.1..=0.95).contains(&share) => share,
        Some(share) => {
            bail!("[context] compact_threshold = {share} is out of range; use 0.1 to 0.95")
        }
    };
    let Some(names) = models_of_label(label) else {
        return Ok(None);
    };
    let members = names
        .iter()
        .map(|name| {
            let configured = models.get(name).and_then(|model| model.context_window);
            let server = servers
                .iter()
                .find(|server| server.model() == name)
                .cloned();
            ModelWindow::new(name, configured, server)
        })
        .collect();
    let Some(mut policy) = ContextPolicy::for_models(members, reply_tokens) else {
        return Ok(None);
    };
    policy.compact_threshold = threshold;
    Ok(Some(policy))
}

impl BudgetSection {
    /// The budgets, checked.
    pub fn config(&self) -> anyhow::Result<BudgetConfig> {
        for (key, value) in [
            ("session_tokens", self.session_tokens),
            ("daily_tokens", self.daily_tokens),
        ] {
            if value == Some(0) {
                bail!("[budget] {key} = 0 would refuse every message; leave it out for no limit");
            }
        }
        Ok(BudgetConfig {
            session_tokens: self.session_tokens,
            daily_tokens: self.daily_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use clawcage_agent::WindowSource;
    use clawcage_agent::provider::ProviderKind;

    #[test]
    fn windows_budgets_and_the_threshold_are_read_and_checked() {
        let config: Config = toml::from_str(
            "[models.\"llama3.1:8b\"]\ncontext_window = 8192\n[context]\ncompact_threshold = 0.6\n[budget]\nsession_tokens = 50000\ndaily_tokens = 1000000\n",
        )
        .unwrap();
        let policy = context_policy(
            "anthropic/claude-sonnet-4-5 -> openai/llama3.1:8b",
            8192,
            &config.models,
            &config.context,
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(policy.window, 8192);
        assert_eq!(policy.window_source, WindowSource::Configured);
        assert!((policy.compact_threshold - 0.6).abs() < 1e-9);
        let alone = context_policy(
            "anthropic/claude-sonnet-4-5",
            8192,
            &config.models,
            &config.context,
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(alone.window, 200_000);
        assert_eq!(alone.window_source, WindowSource::Table);
        assert_eq!(
            context_policy("scripted/demo", 8192, &config.models, &config.context, &[]).unwrap(),
            None
        );
        // A model's server is asked only when the configuration does not give the window.
        let server = |model: &str| {
            ServerWindow::new(ProviderKind::OpenAi, "http://127.0.0.1:9/v1", model, None)
        };
        let asked = context_policy(
            "openai/llama3.1:8b -> openai/unknown",
            8192,
            &config.models,
            &config.context,
            &[server("llama3.1:8b"), server("unknown")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(asked.models[0].server, None);
        assert_eq!(asked.models[1].server, Some(server("unknown")));
        assert_eq!(asked.models[1].source, WindowSource::Default);
        assert_eq!(asked.window, 8192);
        assert_eq!(config.budget.config().unwrap().session_tokens, Some(50_000));
        for bad in [
            "[models.\"m\"]\ncontext = 8192\n",
            "[budget]\nsession = 5\n",
            "[context]\nthreshold = 0.5\n",
        ] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad}");
        }
        let tiny: Config = toml::from_str("[models.\"m\"]\ncontext_window = 10\n").unwrap();
        let error = context_policy("openai/m", 10, &tiny.models, &tiny.context, &[]).unwrap_err();
        assert!(
            error.to_string().contains("[models.\"m\"] context_window"),
            "{error}"
        );
        let high: Config = toml::from_str("[context]\ncompact_threshold = 1.5\n").unwrap();
        assert!(context_policy("openai/m", 10, &high.models, &high.context, &[]).is_err());
        let zero: Config = toml::from_str("[budget]\ndaily_tokens = 0\n").unwrap();
        assert!(zero.budget.config().is_err());
    }
}
