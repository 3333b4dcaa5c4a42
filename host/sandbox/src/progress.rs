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

/// Compilations come in batches (the bundled tools at start, exec's programs when a command
/// first needs them): a line counts within its batch, "2 of 5", and a batch of one says no count.
#[derive(Default)]
struct Counts {
    /// Compilations announced, all batches together.
    expected: AtomicUsize,
    /// Compilations started, all batches together.
    started: AtomicUsize,
    /// `started` when the current batch began.
    batch_base: AtomicUsize,
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
        let started = self.counts.started.load(Ordering::Relaxed);
        if self.counts.expected.load(Ordering::Relaxed) <= started {
            // The earlier batches are done: this one counts from 1 again.
            self.counts.batch_base.store(started, Ordering::Relaxed);
            self.counts
                .expected
                .store(started + count, Ordering::Relaxed);
        } else {
            self.counts.expected.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Reports that `name` is being compiled now.
    pub(crate) fn compiling(&self, name: &str) {
        let Some(report) = &self.report else {
            return;
        };
        let started = self.counts.started.fetch_add(1, Ordering::Relaxed);
        let base = self.counts.batch_base.load(Ordering::Relaxed).min(started);
        let expected = self.counts.expected.load(Ordering::Relaxed);
        let number = started + 1 - base;
        let count = if expected > started {
            format!(" ({number} of {})", expected - base)
        } else {
            // Not announced: no total to count against.
            String::new()
        };
        let first = if started == 0 {
            " (the first start compiles each component for this machine once; later starts load the result)"
        } else {
            ""
        };
        report(&format!("compiling `{name}`{count}{first}…"));
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
        // Not announced: no total that would grow as it goes.
        progress.compiling("extra");
        // A later batch counts from 1 again.
        progress.expect(3);
        progress.compiling("find");
        progress.compiling("grep");
        progress.expect(1);
        progress.compiling("sed");
        progress.expect(1);
        progress.compiling("awk");
        let lines = lines.lock().unwrap();
        assert!(lines[0].starts_with("compiling `file` (1 of 2) (the first start"));
        assert_eq!(lines[1], "compiling `web` (2 of 2)…");
        assert_eq!(lines[2], "compiling `extra`…");
        assert_eq!(lines[3], "compiling `find` (1 of 3)…");
        assert_eq!(lines[4], "compiling `grep` (2 of 3)…");
        assert_eq!(
            lines[5], "compiling `sed` (3 of 4)…",
            "joined the running batch"
        );
        assert_eq!(lines[6], "compiling `awk` (4 of 5)…");
        CompileProgress::quiet().compiling("silent");
    }
}
