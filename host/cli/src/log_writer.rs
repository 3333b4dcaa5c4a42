//! Where the log (`-v`, `RUST_LOG`) goes: standard error, each event through the runtime's
//! redactor once the runtime exists, so a provider's error text with a key in it, logged by a
//! retry or a fail-over, never reaches the terminal or a log file in clear. The logger starts
//! before the runtime (which knows the secret values) is built; events logged before then are
//! written as they are, and none of them carries a credential (they come from argument parsing
//! and configuration loading, which never log values).

use std::io::Write as _;
use std::sync::RwLock;

use clawcage_core::redact::Redactor;

/// The redactor every later event goes through.
static REDACTOR: RwLock<Option<Redactor>> = RwLock::new(None);

/// From now on, every event is scrubbed by `redactor` before it is written.
pub(crate) fn scrub_with(redactor: Redactor) {
    let mut slot = REDACTOR
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *slot = Some(redactor);
}

/// Makes one [`EventWriter`] per event.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ScrubbedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbedStderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter(Vec::new())
    }
}

/// One event's text, gathered, then scrubbed and written in one piece when it is dropped (an
/// event is formatted in several writes, and a secret may straddle two of them).
pub(crate) struct EventWriter(Vec<u8>);

impl std::io::Write for EventWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let scrubbed = scrub(&self.0);
        // A closed stderr drops the line, as the logger's own errors are dropped.
        let _ = std::io::stderr().lock().write_all(&scrubbed);
    }
}

/// `bytes` with every secret value the redactor knows replaced.
fn scrub(bytes: &[u8]) -> Vec<u8> {
    let slot = REDACTOR
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match slot.as_ref() {
        Some(redactor) => redactor.redact_bytes(bytes),
        None => bytes.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_scrubbed_once_a_redactor_is_set() {
        assert_eq!(
            scrub(b"before: sk-test-0123456789abcdef\n"),
            b"before: sk-test-0123456789abcdef\n"
        );
        scrub_with(Redactor::new([(
            "TEST_KEY".to_string(),
            "sk-test-0123456789abcdef".to_string(),
        )]));
        let scrubbed = String::from_utf8(scrub(
            b"HTTP 401: bad key sk-test-0123456789abcdef; retrying\n",
        ))
        .unwrap();
        assert!(!scrubbed.contains("sk-test-0123456789abcdef"), "{scrubbed}");
        assert!(scrubbed.contains("; retrying"), "{scrubbed}");
    }
}
