//! The daemon's log: structured `tracing` events on stderr, as text or JSON lines.
//!
//! Lifecycle events are logged where the store records them (target `airlock::event`), so the
//! log and `GET /v1/sandboxes/{id}/logs` tell the same story; start-up choices, failed accepts
//! and 5xx answers are logged where they happen.

use tracing::level_filters::LevelFilter;

use crate::config::{LogFormat, LogLevel};

/// Installs the process-wide subscriber. A second call (a test that starts several daemons in
/// one process) keeps the first one.
pub fn init(format: LogFormat, level: LogLevel) {
    let level = match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(true);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
