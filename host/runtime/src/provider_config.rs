//! The agent's part of the configuration: `[provider]` (which model to ask, the fail-over chain,
//! retries and timeouts) and `[agent]` (iterations, history, system prompt), merged with the
//! `--provider`, `--model`, `--base-url` and `--script` flags ([`ProviderOverrides`]). Keys come only from the
//! environment (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`); the file cannot hold one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clawcage_agent::provider::window::ServerWindow;
use clawcage_agent::provider::{
    self, ApiKey, FailoverChain, HttpSettings, ProviderConfig, ProviderKind, RetryPolicy, Retrying,
    Script,
};
use clawcage_agent::{AgentConfig, Provider};
use serde::Deserialize;

/// Default Anthropic base URL (the client appends `/v1/messages`).
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// Default OpenAI-compatible base URL, a local Ollama (the client appends `/chat/completions`).
pub const OPENAI_BASE_URL: &str = "http://localhost:11434/v1";
/// Default Anthropic model.
pub const ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";

/// What the command line says about the model, over `[provider]` in the config.
#[derive(Debug, Clone, Default)]
pub struct ProviderOverrides {
    /// `anthropic`, `openai` or `scripted`.
    pub provider: Option<String>,
    /// The model.
    pub model: Option<String>,
    /// The server's base URL.
    pub base_url: Option<String>,
    /// The recorded script the scripted provider plays (JSON).
    pub script: Option<PathBuf>,
}

/// `[provider]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// `anthropic`, `openai` or `scripted`.
    pub kind: Option<String>,
    /// The model.
    pub model: Option<String>,
    /// The server's base URL.
    pub base_url: Option<String>,
    /// The script of the scripted provider, relative to the config file.
    pub script: Option<PathBuf>,
    /// Output tokens per request (default 8192).
    pub max_tokens: Option<u32>,
    /// Seconds a request may take (default 300).
    pub timeout_secs: Option<f64>,
    /// Retries of a request that failed with 429, 5xx or a timeout (default 3).
    pub max_retries: Option<u32>,
    /// Mark the stable prefix of each Anthropic request for the prompt cache (default true).
    pub prompt_cache: Option<bool>,
    /// Provider/model pairs tried in order when the primary fails.
    #[serde(default)]
    pub fallback: Vec<FallbackSection>,
}

/// One `[[provider.fallback]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackSection {
    /// `anthropic` or `openai`.
    pub kind: String,
    /// The model.
    pub model: String,
    /// The server's base URL (default: the provider's).
    pub base_url: Option<String>,
}

/// `[agent]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// Model calls per turn at most (default 10).
    pub max_iterations: Option<usize>,
    /// Messages a session keeps (default 200).
    pub history_limit: Option<usize>,
    /// Identical consecutive tool calls that end a turn (default 3).
    pub repeat_limit: Option<usize>,
    /// Replaces the built-in system prompt.
    pub system_prompt: Option<String>,
}

impl AgentSection {
    /// The loop configuration, checked.
    pub fn agent_config(&self, stream: bool) -> anyhow::Result<AgentConfig> {
        let defaults = AgentConfig::default();
        let max_iterations = match self.max_iterations {
            None => defaults.max_iterations,
            Some(n) if (1..=1000).contains(&n) => n,
            Some(n) => bail!("[agent] max_iterations = {n} is out of range; use 1 to 1000"),
        };
        let repeat_limit = match self.repeat_limit {
            None => defaults.repeat_limit,
            Some(n) if (2..=100).contains(&n) => n,
            Some(n) => bail!("[agent] repeat_limit = {n} is out of range; use 2 to 100"),
        };
        Ok(AgentConfig {
            system_prompt: self.system_prompt.clone().unwrap_or(defaults.system_prompt),
            max_iterations,
            repeat_limit,
            stream,
        })
    }

    /// The history limit, checked.
    pub fn history_limit(&self) -> anyhow::Result<usize> {
        match self.history_limit {
            None => Ok(clawcage_agent::session::DEFAULT_HISTORY_LIMIT),
            Some(n) if n >= 2 => Ok(n),
            Some(n) => bail!("[agent] history_limit = {n} is too small; use at least 2"),
        }
    }
}

/// The provider chosen by flags and config, ready to be asked.
pub struct ChosenProvider {
    /// The chain (with retries), or the scripted provider.
    pub provider: Arc<dyn Provider>,
    /// Whether it is the scripted provider (front ends say so).
    pub scripted: bool,
    /// Where to ask each model's server for its context window (not the public APIs).
    pub windows: Vec<ServerWindow>,
}

/// Build the provider chain from the flags, `[provider]` and the environment.
/// `config_dir` resolves a relative `script` path; `tools` names the tools the agent offers.
pub fn choose_provider(
    args: &ProviderOverrides,
    section: &ProviderSection,
    config_dir: Option<&Path>,
    tools: &[&str],
) -> anyhow::Result<ChosenProvider> {
    let config_kind = section
        .kind
        .as_deref()
        .map(ProviderKind::parse)
        .transpose()?;
    let kind = match &args.provider {
        Some(name) => ProviderKind::parse(name)?,
        None => config_kind.unwrap_or(ProviderKind::Anthropic),
    };
    // The config's model, URL and script describe its own kind; another kind from the command
    // line starts from that kind's defaults.
    let same_kind = config_kind.is_none_or(|configured| configured == kind);
    let pick = |flag: &Option<String>, configured: &Option<String>| {
        flag.clone()
            .or_else(|| if same_kind { configured.clone() } else { None })
    };

    if kind == ProviderKind::Scripted {
        let path = args
            .script
            .clone()
            .or_else(|| {
                section.script.as_ref().filter(|_| same_kind).map(|path| match config_dir {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.clone(),
                })
            })
            .context("the scripted provider plays a recorded script: pass --script FILE (or set [provider] script); `clawcage demo` shows one built in")?;
        let text = clawcage_core::files::read_regular_text(
            &path,
            64 << 20,
            clawcage_core::files::Symlinks::Follow,
        )
        .with_context(|| format!("cannot read the script {}", path.display()))?;
        let script = Script::from_json(&text)?;
        return Ok(ChosenProvider {
            provider: provider::build(ProviderConfig::Scripted(script), tools)?,
            scripted: true,
            windows: Vec::new(),
        });
    }

    let timeout = match section.timeout_secs {
        None => Duration::from_secs(300),
        Some(seconds) if seconds > 0.0 && seconds <= 3600.0 => Duration::from_secs_f64(seconds),
        Some(seconds) => bail!(
            "[provider] timeout_secs = {seconds} is out of range; use more than 0 and at most 3600"
        ),
    };
    let max_tokens = match section.max_tokens {
        None => clawcage_agent::provider::DEFAULT_MAX_TOKENS,
        Some(n) if n >= 1 => n,
        Some(n) => bail!("[provider] max_tokens = {n} is too small"),
    };
    let max_retries = match section.max_retries {
        None => 3,
        Some(n) if n <= 20 => n,
        Some(n) => bail!("[provider] max_retries = {n} is out of range; use 0 to 20"),
    };
    let policy = RetryPolicy {
        max_retries,
        ..RetryPolicy::default()
    };
    let model = pick(&args.model, &section.model);
    let base_url = pick(&args.base_url, &section.base_url);
    let cache = section.prompt_cache.unwrap_or(true);
    let mut windows = Vec::new();
    let mut members: Vec<Arc<dyn Provider>> = vec![http_member(
        kind,
        model,
        base_url,
        max_tokens,
        timeout,
        policy,
        cache,
        tools,
        &mut windows,
    )?];
    for fallback in &section.fallback {
        let kind = ProviderKind::parse(&fallback.kind)?;
        if kind == ProviderKind::Scripted {
            bail!(
                "[[provider.fallback]] kind = \"scripted\" is not allowed; a fallback must be a model"
            );
        }
        members.push(http_member(
            kind,
            Some(fallback.model.clone()),
            fallback.base_url.clone(),
            max_tokens,
            timeout,
            policy,
            cache,
            tools,
            &mut windows,
        )?);
    }
    let provider: Arc<dyn Provider> = if members.len() == 1 {
        members.remove(0)
    } else {
        Arc::new(FailoverChain::new(members)?)
    };
    Ok(ChosenProvider {
        provider,
        scripted: false,
        windows,
    })
}

#[allow(
    clippy::too_many_arguments,
    reason = "one member's settings, passed from the one place that reads them"
)]
fn http_member(
    kind: ProviderKind,
    model: Option<String>,
    base_url: Option<String>,
    max_tokens: u32,
    timeout: Duration,
    policy: RetryPolicy,
    prompt_cache: bool,
    tools: &[&str],
    windows: &mut Vec<ServerWindow>,
) -> anyhow::Result<Arc<dyn Provider>> {
    let (default_url, default_model) = match kind {
        ProviderKind::Anthropic => (ANTHROPIC_BASE_URL, Some(ANTHROPIC_MODEL)),
        _ => (OPENAI_BASE_URL, None),
    };
    let model = model.or(default_model.map(str::to_string)).with_context(|| {
        format!(
            "the {} provider needs a model: pass --model (e.g. llama3.1 for Ollama) or set [provider] model",
            kind.as_str()
        )
    })?;
    let base_url = base_url.unwrap_or_else(|| default_url.to_string());
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        bail!("the base URL {base_url:?} must start with http:// or https://");
    }
    let mut settings = HttpSettings::new(base_url, model);
    settings.max_tokens = max_tokens;
    settings.timeout = timeout;
    settings.prompt_cache = prompt_cache;
    settings.api_key = kind
        .key_variable()
        .and_then(|name| std::env::var(name).ok())
        .filter(|key| !key.trim().is_empty())
        .map(|key| ApiKey::new(key.trim()));
    let config = match kind {
        ProviderKind::Anthropic => ProviderConfig::Anthropic(settings),
        _ => ProviderConfig::OpenAi(settings),
    };
    windows.extend(ServerWindow::for_config(&config));
    Ok(Arc::new(Retrying::new(
        provider::build(config, tools)?,
        policy,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn sections_reject_unknown_keys_and_check_ranges() {
        let config: Config = toml::from_str(
            "[provider]\nkind = \"openai\"\nmodel = \"m\"\n[[provider.fallback]]\nkind = \"anthropic\"\nmodel = \"c\"\n[agent]\nmax_iterations = 4\nhistory_limit = 50\n",
        )
        .unwrap();
        assert_eq!(config.agent.agent_config(false).unwrap().max_iterations, 4);
        assert_eq!(config.agent.history_limit().unwrap(), 50);
        assert_eq!(config.provider.fallback[0].model, "c");
        for bad in [
            "[provider]\nmodle = \"x\"\n",
            "[provider]\napi_key = \"sk-123\"\n",
            "[[provider.fallback]]\nkind = \"openai\"\nmodel = \"m\"\nkey = \"k\"\n",
            "[agent]\nmax_iter = 3\n",
        ] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad}");
        }
        let zero: Config = toml::from_str("[agent]\nmax_iterations = 0\n").unwrap();
        assert!(zero.agent.agent_config(false).is_err());
    }

    #[test]
    fn the_provider_is_chosen_from_flags_then_config() {
        let section = ProviderSection {
            kind: Some("openai".into()),
            model: Some("llama3.1".into()),
            ..ProviderSection::default()
        };
        let chosen = choose_provider(&ProviderOverrides::default(), &section, None, &[]).unwrap();
        assert_eq!(chosen.provider.label(), "openai/llama3.1");
        // Another kind on the command line does not inherit the config's model.
        let args = ProviderOverrides {
            provider: Some("openai".into()),
            model: Some("qwen".into()),
            ..ProviderOverrides::default()
        };
        assert_eq!(
            choose_provider(&args, &section, None, &[])
                .unwrap()
                .provider
                .label(),
            "openai/qwen"
        );
        let no_model = ProviderOverrides {
            provider: Some("openai".into()),
            ..ProviderOverrides::default()
        };
        let error = choose_provider(&no_model, &ProviderSection::default(), None, &[])
            .err()
            .unwrap();
        assert!(error.to_string().contains("needs a model"), "{error}");
        let scripted = ProviderOverrides {
            provider: Some("scripted".into()),
            ..ProviderOverrides::default()
        };
        let error = choose_provider(&scripted, &ProviderSection::default(), None, &[])
            .err()
            .unwrap();
        assert!(error.to_string().contains("--script"), "{error}");
        let bad = ProviderOverrides {
            provider: Some("gpt".into()),
            ..ProviderOverrides::default()
        };
        assert!(choose_provider(&bad, &ProviderSection::default(), None, &[]).is_err());
    }
}
