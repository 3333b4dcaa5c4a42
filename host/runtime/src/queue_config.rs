//! `[queue]` in the config: what a message that reaches a busy session does (`mode`: steer,
//! followup, collect or interrupt), `collect`'s quiet window (`debounce_ms`), how many messages a
//! session's queue holds (`cap`) and what happens past it (`drop`: old, new or summarize), and
//! `[queue.by_channel]`, the mode per channel. Checked here, so a bad value is a configuration
//! error at start-up that names the key and the valid values; a session's `/queue` command takes
//! precedence over both.

use std::collections::BTreeMap;

use anyhow::bail;
use clawcage_agent::session::queue::{MAX_CAP, MAX_DEBOUNCE_MS};
use clawcage_agent::session::{DropPolicy, QueueConfig, QueueMode, QueueSettings};
use serde::Deserialize;

/// `[queue]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// `steer` (default), `followup`, `collect` or `interrupt`.
    pub mode: Option<String>,
    /// Milliseconds without a new message before a `collect` batch drains (default 1000).
    pub debounce_ms: Option<u64>,
    /// User messages a session's queue holds (default 20).
    pub cap: Option<usize>,
    /// `old`, `new` or `summarize` (default): what a message arriving at a full queue does.
    pub drop: Option<String>,
    /// `[queue.by_channel]`: `<channel> = "<mode>"`, over `mode` for that channel's messages.
    #[serde(default)]
    pub by_channel: BTreeMap<String, String>,
}

fn mode(key: &str, value: &str) -> anyhow::Result<QueueMode> {
    match value.parse() {
        Ok(mode) => Ok(mode),
        Err(_) => bail!(
            "{key} = {value:?} is not valid; use \"steer\", \"followup\", \"collect\" or \"interrupt\""
        ),
    }
}

impl QueueSection {
    /// The sessions' queue configuration, checked.
    pub fn config(&self) -> anyhow::Result<QueueConfig> {
        let defaults = QueueSettings::default();
        let mode = match &self.mode {
            None => defaults.mode,
            Some(value) => mode("[queue] mode", value)?,
        };
        let debounce_ms = match self.debounce_ms {
            None => defaults.debounce_ms,
            Some(ms) if ms <= MAX_DEBOUNCE_MS => ms,
            Some(ms) => {
                bail!("[queue] debounce_ms = {ms} is out of range; use 0 to {MAX_DEBOUNCE_MS}")
            }
        };
        let cap = match self.cap {
            None => defaults.cap,
            Some(cap) if (1..=MAX_CAP).contains(&cap) => cap,
            Some(cap) => bail!("[queue] cap = {cap} is out of range; use 1 to {MAX_CAP}"),
        };
        let drop = match self.drop.as_deref() {
            None => defaults.drop,
            Some(value) => match value.parse::<DropPolicy>() {
                Ok(drop) => drop,
                Err(_) => bail!(
                    "[queue] drop = {value:?} is not valid; use \"old\", \"new\" or \"summarize\""
                ),
            },
        };
        let mut by_channel = BTreeMap::new();
        for (channel, value) in &self.by_channel {
            by_channel.insert(
                channel.clone(),
                self::mode(&format!("[queue.by_channel] {channel}"), value)?,
            );
        }
        Ok(QueueConfig {
            settings: QueueSettings {
                mode,
                debounce_ms,
                cap,
                drop,
            },
            by_channel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<QueueConfig> {
        toml::from_str::<QueueSection>(text)
            .map_err(|error| anyhow::anyhow!("{error}"))?
            .config()
    }

    #[test]
    fn the_section_is_read_and_checked() {
        let config = parse(
            "mode = \"collect\"\ndebounce_ms = 2500\ncap = 25\ndrop = \"new\"\n[by_channel]\ntelegram = \"interrupt\"\n",
        )
        .unwrap();
        assert_eq!(
            config.settings,
            QueueSettings {
                mode: QueueMode::Collect,
                debounce_ms: 2500,
                cap: 25,
                drop: DropPolicy::New,
            }
        );
        assert_eq!(config.by_channel["telegram"], QueueMode::Interrupt);
        assert_eq!(parse("").unwrap(), QueueConfig::default());
    }

    #[test]
    fn bad_values_name_the_key_and_the_valid_ones() {
        for (text, needle) in [
            (
                "mode = \"fast\"",
                "[queue] mode = \"fast\" is not valid; use \"steer\", \"followup\", \"collect\" or \"interrupt\"",
            ),
            (
                "drop = \"all\"",
                "[queue] drop = \"all\" is not valid; use \"old\", \"new\" or \"summarize\"",
            ),
            ("cap = 0", "[queue] cap = 0 is out of range; use 1 to 10000"),
            ("debounce_ms = 600001", "use 0 to 600000"),
            (
                "[by_channel]\nslack = \"later\"",
                "[queue.by_channel] slack = \"later\" is not valid",
            ),
            ("modes = \"steer\"", "unknown field `modes`"),
        ] {
            let error = format!("{:#}", parse(text).unwrap_err());
            assert!(error.contains(needle), "{text}: {error}");
        }
    }
}
