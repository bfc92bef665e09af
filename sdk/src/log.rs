//! Writing to the server's log (with the model's name attached).
//!
//! Natively (in unit tests) lines go to stderr instead. `println!`/`eprintln!` also reach the
//! server's log, one line at a time.

#[cfg(target_family = "wasm")]
use crate::bindings::wisp::plugin::logging;

/// Log severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// Whether a line at `level` would be written.
pub fn enabled(level: Level) -> bool {
    #[cfg(target_family = "wasm")]
    {
        logging::enabled(to_wit(level))
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let _ = level;
        true
    }
}

/// Writes `message` at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    {
        logging::log(to_wit(level), message)
    }
    #[cfg(not(target_family = "wasm"))]
    {
        eprintln!("[{level:?}] {message}")
    }
}

#[cfg(target_family = "wasm")]
fn to_wit(level: Level) -> logging::Level {
    match level {
        Level::Trace => logging::Level::Trace,
        Level::Debug => logging::Level::Debug,
        Level::Info => logging::Level::Info,
        Level::Warn => logging::Level::Warn,
        Level::Error => logging::Level::Error,
    }
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message)
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message)
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message)
}

/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message)
}
