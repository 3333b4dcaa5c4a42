//! What every benchmark prints for a set of samples: the median and the 99th percentile, in
//! microseconds below a millisecond and in milliseconds above, the sample count and, when a
//! baseline measured in the same run is given, the ratio of the medians.

use std::time::Duration;

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
