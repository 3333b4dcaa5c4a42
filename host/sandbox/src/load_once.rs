//! Code loaded on its first use and shared by every later one: the sandbox's one lazy loader,
//! behind a component whose tools are called ([`crate::sandbox::LazyComponent`]) and a program
//! exec runs ([`crate::programs::LazyProgram`]). Concurrent first users wait for the one load.
//! A failure can be remembered (a program's file does not change under it, so a broken one is
//! not compiled again on every call, and the listing shows why) or not (a component's load is
//! tried again at its next call); a problem known before any load (an unreadable file) is given
//! at construction.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::OnceCell;

/// Whether a failed load is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// Remember the problem and give it to every later use.
    Remember,
    /// Try again at the next use.
    Retry,
}

/// A `T` loaded on first use.
pub(crate) struct LoadOnce<T> {
    ready: OnceCell<Arc<T>>,
    problem: OnceLock<String>,
    on_failure: OnFailure,
}

impl<T> LoadOnce<T> {
    /// Nothing loaded yet.
    pub(crate) fn new(on_failure: OnFailure) -> Self {
        Self {
            ready: OnceCell::new(),
            problem: OnceLock::new(),
            on_failure,
        }
    }

    /// Known not to load, for `problem`, before anything is tried.
    pub(crate) fn failed(problem: String) -> Self {
        let load = Self::new(OnFailure::Remember);
        let _ = load.problem.set(problem);
        load
    }

    /// The loaded value: loaded by `load` on the first use; the problem, in plain words, when
    /// it could not be (remembered or not, as constructed).
    pub(crate) async fn get<F, Fut>(&self, load: F) -> Result<&Arc<T>, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<T>, String>>,
    {
        if let Some(problem) = self.problem.get() {
            return Err(problem.clone());
        }
        self.ready
            .get_or_try_init(load)
            .await
            .inspect_err(|problem| {
                if self.on_failure == OnFailure::Remember {
                    let _ = self.problem.set(problem.clone());
                }
            })
    }

    /// Whether it is loaded.
    pub(crate) fn is_loaded(&self) -> bool {
        self.ready.get().is_some()
    }

    /// Why it cannot be loaded, once known and remembered.
    pub(crate) fn problem(&self) -> Option<&String> {
        self.problem.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_load_is_shared_and_failures_are_remembered_or_retried_as_asked() {
        let loads = AtomicUsize::new(0);
        let once = LoadOnce::<u32>::new(OnFailure::Retry);
        let attempt = || async {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok::<Arc<u32>, String>(Arc::new(7))
        };
        assert_eq!(**once.get(attempt).await.unwrap(), 7);
        assert_eq!(**once.get(attempt).await.unwrap(), 7);
        assert_eq!(loads.load(Ordering::SeqCst), 1, "loaded once");
        assert!(once.is_loaded());

        let failing = || async {
            loads.fetch_add(1, Ordering::SeqCst);
            Err::<Arc<u32>, String>("broken".to_string())
        };
        let retried = LoadOnce::<u32>::new(OnFailure::Retry);
        assert_eq!(retried.get(failing).await.unwrap_err(), "broken");
        assert_eq!(retried.get(failing).await.unwrap_err(), "broken");
        assert_eq!(retried.problem(), None);
        let remembered = LoadOnce::<u32>::new(OnFailure::Remember);
        let before = loads.load(Ordering::SeqCst);
        assert_eq!(remembered.get(failing).await.unwrap_err(), "broken");
        assert_eq!(remembered.get(attempt).await.unwrap_err(), "broken");
        assert_eq!(loads.load(Ordering::SeqCst), before + 1, "not tried again");
        assert_eq!(remembered.problem().map(String::as_str), Some("broken"));
        let known = LoadOnce::<u32>::failed("unreadable".to_string());
        assert_eq!(known.get(attempt).await.unwrap_err(), "unreadable");
    }
}
