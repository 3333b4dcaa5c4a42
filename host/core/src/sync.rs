//! Locking that survives a panic elsewhere: a mutex whose holder panicked is still taken, since
//! every state kept behind one here stays valid between statements (no half-applied change is
//! left for another thread to see).

use std::sync::{Mutex, MutexGuard};

/// Takes `mutex`, whether or not a thread panicked while holding it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_poisoned_by_a_panic_is_still_taken() {
        let shared = std::sync::Arc::new(Mutex::new(1));
        let held = shared.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("while holding the lock");
        })
        .join();
        assert!(shared.is_poisoned());
        *lock(&shared) += 1;
        assert_eq!(*lock(&shared), 2);
    }
}
