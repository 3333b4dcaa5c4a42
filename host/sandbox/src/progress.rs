//! Reporting the first start's compilation: turning a component into machine code takes seconds
//! (coreutils takes about a minute), once per machine and clawcage version, so the operator is
//! told which component is being compiled and how many of how many, instead of facing a silent
//! pause. Later starts load the cached artifacts and report nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A function that shows one line.
type Report = Arc<dyn Fn(&str) + Send + Sync>;

/// Where compile progress goes: a function given one line per component compiled.
#[derive(Clone, Default)]
pub struct CompileProgress {
    report: Option<Report>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    expected: AtomicUsize,
    started: AtomicUsize,
}

impl std::fmt::Debug for CompileProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileProgress")
            .field("reported", &self.report.is_some())
            .finish()
    }
}

impl CompileProgress {
    /// Nothing is reported.
    pub fn quiet() -> Self {
        Self::default()
    }

    /// Each compilation is reported to `report` as one line.
    pub fn to(report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self {
            report: Some(Arc::new(report)),
            counts: Arc::default(),
        }
    }

    /// Announces that `count` more components are about to be compiled, so lines can say "2 of
    /// 5".
    pub fn expect(&self, count: usize) {
        self.counts.expected.fetch_add(count, Ordering::Relaxed);
    }

    /// Reports that `name` is being compiled now.
    pub(crate) fn compiling(&self, name: &str) {
        let Some(report) = &self.report else {
            return;
        };
        let number = self.counts.started.fetch_add(1, Ordering::Relaxed) + 1;
        let expected = self.counts.expected.load(Ordering::Relaxed).max(number);
        let first = if number == 1 {
            " (the first start compiles each component for this machine once; later starts load the result)"
        } else {
            ""
        };
        report(&format!(
            "compiling `{name}` ({number} of {expected}){first}…"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn lines_count_up_to_the_expected_total() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let progress = CompileProgress::to(move |line| sink.lock().unwrap().push(line.to_string()));
        progress.expect(2);
        progress.compiling("file");
        progress.compiling("web");
        progress.compiling("extra");
        let lines = lines.lock().unwrap();
        assert!(lines[0].starts_with("compiling `file` (1 of 2) (the first start"));
        assert_eq!(lines[1], "compiling `web` (2 of 2)…");
        assert_eq!(lines[2], "compiling `extra` (3 of 3)…");
        CompileProgress::quiet().compiling("silent");
    }
}
