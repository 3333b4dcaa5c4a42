//! The `/queue` command's words, parsed into a [`QueueCommand`] (every front end reads it here),
//! with the usage message that names the valid values.

use super::{MAX_CAP, MAX_DEBOUNCE_MS, QueueMode, QueueOverride};

/// The usage error of a `/queue` command or a queue option, naming the valid values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QueueUsageError(pub String);

/// How to use `/queue`.
pub const QUEUE_USAGE: &str = "usage: /queue <steer|followup|collect|interrupt> [debounce:2s] [cap:25] [drop:old|new|summarize], /queue reset to use the configured settings again, /queue alone to show them";

/// A parsed `/queue` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueCommand {
    /// `/queue`: show the session's settings.
    Show,
    /// `/queue <mode> [options]`: set the session's override.
    Set(QueueOverride),
    /// `/queue reset`: remove the session's override.
    Reset,
}

/// Parse a `/queue` command line (with or without the leading `/queue`).
pub fn parse_queue_command(line: &str) -> Result<QueueCommand, QueueUsageError> {
    let mut words = line.split_whitespace().peekable();
    if words.peek() == Some(&"/queue") {
        words.next();
    }
    let usage = |message: String| QueueUsageError(format!("{message}\n{QUEUE_USAGE}"));
    let Some(first) = words.next() else {
        return Ok(QueueCommand::Show);
    };
    if first == "reset" {
        return match words.next() {
            None => Ok(QueueCommand::Reset),
            Some(extra) => Err(usage(format!(
                "/queue reset takes nothing after it (got `{extra}`)"
            ))),
        };
    }
    let mode: QueueMode = first.parse().map_err(|error: QueueUsageError| {
        let hint = if first.contains(':') || first.contains('=') {
            " (the mode comes first)"
        } else {
            ""
        };
        usage(format!("{error}{hint}"))
    })?;
    let mut result = QueueOverride {
        mode,
        debounce_ms: None,
        cap: None,
        drop: None,
    };
    for word in words {
        let Some((name, value)) = word.split_once(':').or_else(|| word.split_once('=')) else {
            return Err(usage(format!(
                "`{word}` is not an option; write options as name:value (debounce, cap, drop)"
            )));
        };
        match name {
            "debounce" => {
                result.debounce_ms = Some(parse_duration_ms(value).map_err(usage)?);
            }
            "cap" => {
                let cap = value
                    .parse::<usize>()
                    .ok()
                    .filter(|cap| (1..=MAX_CAP).contains(cap))
                    .ok_or_else(|| {
                        usage(format!(
                            "cap:{value} is not valid; use a whole number from 1 to {MAX_CAP}"
                        ))
                    })?;
                result.cap = Some(cap);
            }
            "drop" => {
                result.drop = Some(
                    value
                        .parse()
                        .map_err(|error: QueueUsageError| usage(error.0))?,
                )
            }
            other => {
                return Err(usage(format!(
                    "unknown option `{other}`; the options are debounce, cap and drop"
                )));
            }
        }
    }
    Ok(QueueCommand::Set(result))
}

/// A duration such as `2s`, `1.5s`, `500ms`, `1m` or `750` (milliseconds), in milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let invalid = || {
        format!(
            "debounce:{text} is not valid; write a duration such as 500ms, 2s or 1m (at most {} minutes)",
            MAX_DEBOUNCE_MS / 60_000
        )
    };
    let (number, scale) = if let Some(number) = text.strip_suffix("ms") {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1000.0)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60_000.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.parse().map_err(|_| invalid())?;
    let ms = value * scale;
    if !ms.is_finite() || ms < 0.0 || ms > MAX_DEBOUNCE_MS as f64 {
        return Err(invalid());
    }
    Ok(ms.round() as u64)
}
