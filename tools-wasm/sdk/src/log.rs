//! Log lines into the host's tracing, through the `clawcage:tool/log` import.
//! The host tags each line with the component and the tool being called.
//!
//! Outside WebAssembly (the SDK's and tools' native unit tests) there is no
//! host: the lines go to standard error instead.

/// How important a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Detail useful when debugging a tool.
    Debug,
    /// Normal operation worth recording.
    Info,
    /// Something unexpected that the tool handled.
    Warn,
    /// Something failed.
    Error,
}

/// Record one log line at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::clawcage::tool::log as wit;
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Record a trace line.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Record a debug line.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Record an info line.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Record a warning.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Record an error line.
pub fn error(message: &str) {
    log(Level::Error, message);
}
