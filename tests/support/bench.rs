//! What every benchmark prints for a set of samples: the median and the 99th percentile, in
//! microseconds below a millisecond and in milliseconds above, the sample count and, when a
//! baseline measured in the same run is given, the ratio of the medians; and the pieces every
//! benchmark starts from: the runtime they run on, an Anthropic provider pointed at the scripted
//! LLM server, a one-tool registry of host tools.

use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::provider::{self, ApiKey, HttpSettings, ProviderConfig};
use clawcage_agent::{Provider, ToolRegistry};
use clawcage_core::ToolOutput;
use serde_json::json;

use crate::host_tools::HostTool;

/// The runtime every benchmark runs on: multi-threaded with two workers, the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The Anthropic provider talking to the scripted LLM server at `url` as model `model`.
pub fn anthropic_provider(url: &str, model: &str) -> Arc<dyn Provider> {
    let mut settings = HttpSettings::new(url, model);
    settings.api_key = Some(ApiKey::new("bench-key"));
    provider::build(ProviderConfig::Anthropic(settings), &[]).expect("the benchmark's provider")
}

/// A registry with one host tool, `lookup`, answering `value of KEY`.
pub fn lookup_tools() -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    registry
        .register(HostTool::new(
            "lookup",
            "Look something up.",
            json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
            |args| Ok(ToolOutput::text(format!("value of {}", args["key"]))),
        ))
        .expect("the lookup tool registers");
    registry
}

/// The sample at `fraction` (0.5 for the median) of `sorted`.
pub fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index]
}

/// Print one line for `samples` under `label`; returns the median.
pub fn report(label: &str, samples: Vec<Duration>) -> Duration {
    report_against(label, samples, None)
}

/// As [`report`], with the ratio of the median to `baseline`'s.
pub fn report_against(
    label: &str,
    mut samples: Vec<Duration>,
    baseline: Option<Duration>,
) -> Duration {
    samples.sort();
    let p50 = percentile(&samples, 0.5);
    let p99 = percentile(&samples, 0.99);
    let (scale, unit) = if p50 < Duration::from_millis(1) {
        (1e6, "µs")
    } else {
        (1e3, "ms")
    };
    let ratio = baseline
        .map(|base| format!("   {:.2}x", p50.as_secs_f64() / base.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{label:<52} p50 {:>9.2} {unit}   p99 {:>9.2} {unit}   (n={}){ratio}",
        p50.as_secs_f64() * scale,
        p99.as_secs_f64() * scale,
        samples.len()
    );
    p50
}
