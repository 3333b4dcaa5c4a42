//! `clawcage gateway status`: whether a gateway runs on a state directory (its lock held), where
//! it listens, and its channels' states and the replies they could not deliver.

use std::path::Path;

use clawcage_runtime::Error;
use serde_json::Value;

use crate::{channels, running_info, take_lock};

/// `clawcage gateway status`.
pub(crate) fn status(state_dir: &Path) -> Result<(), Error> {
    match take_lock(state_dir)? {
        None => {
            let info = running_info(state_dir).unwrap_or_default();
            let field = |name: &str| {
                info.get(name)
                    .map(|value| {
                        value
                            .as_str()
                            .map_or_else(|| value.to_string(), str::to_string)
                    })
                    .unwrap_or_else(|| "?".to_string())
            };
            println!(
                "a gateway runs on {} (pid {}) at {} · WebSocket {}",
                state_dir.display(),
                field("pid"),
                field("url"),
                field("ws")
            );
            if let Some(report) = channels::read_status(state_dir) {
                print_channel_status(&report);
            }
            Ok(())
        }
        Some(_lock) => Err(Error::Failed(format!(
            "no gateway runs on the state directory {}; start one with `clawcage gateway`",
            state_dir.display()
        ))),
    }
}

/// The channels' lines of `clawcage gateway status`: each channel's state and the replies that
/// could not be delivered.
fn print_channel_status(report: &Value) {
    if let Some(channels) = report.get("channels").and_then(Value::as_object) {
        for (name, state) in channels {
            let what = state.get("state").and_then(Value::as_str).unwrap_or("?");
            let detail = state
                .get("error")
                .or_else(|| state.get("bot"))
                .and_then(Value::as_str)
                .map(|detail| format!(" ({detail})"))
                .unwrap_or_default();
            println!("channel {name}: {what}{detail}");
        }
    }
    let failed = report
        .get("failedDeliveries")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if failed > 0 {
        println!("{failed} replies could not be delivered; the latest:");
        for failure in report
            .get("recentFailures")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .rev()
            .take(5)
        {
            println!(
                "  {}:{} ({} characters): {}",
                failure["channel"].as_str().unwrap_or("?"),
                failure["peer"].as_str().unwrap_or("?"),
                failure["chars"],
                failure["error"].as_str().unwrap_or("?")
            );
        }
    }
}
