//! Audit: one JSON line per boundary decision (egress allowed or denied, credential injected or
//! mismatched, approval asked or answered, policy changed or rejected). Every text field is
//! redacted before it is written: secrets and placeholders become `[REDACTED]`, and paths never
//! carry their query string.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

const REDACTED: &str = "[REDACTED]";

/// What an audit line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    Egress,
    Credential,
    Approval,
    Policy,
}

/// One audit line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    pub time_unix_ms: u64,
    pub sandbox_id: String,
    pub kind: Option<AuditKind>,
    /// `allowed`, `denied`, `injected`, `mismatched`, `asked`, `approved_once`,
    /// `approved_always`, `denied`, `timed_out`, `changed`, `rejected`.
    pub outcome: String,
    /// The rule that allowed the request, when one did.
    pub rule: Option<String>,
    /// The error code the client saw, for denials.
    pub code: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// `CONNECT` for tunnels.
    pub method: Option<String>,
    /// Without the query string.
    pub path: Option<String>,
    /// `passthrough` or `inspect` for tunnels.
    pub tunnel: Option<String>,
    pub credential: Option<String>,
    pub approval_id: Option<String>,
    pub policy_generation: Option<u64>,
    pub detail: Option<String>,
    /// The sandbox process behind the connection, when the caller of the proxy knows it.
    pub pid: Option<u32>,
    pub exe: Option<String>,
}

impl AuditEvent {
    pub(crate) fn new(kind: AuditKind, outcome: &str) -> Self {
        Self {
            kind: Some(kind),
            outcome: outcome.to_owned(),
            ..Self::default()
        }
    }
}

type Callback = dyn Fn(&AuditEvent, &str) + Send + Sync;

#[derive(Clone)]
enum Target {
    Discard,
    Writer(Arc<Mutex<Box<dyn Write + Send>>>),
    Callback(Arc<Callback>),
}

/// Where audit lines go.
#[derive(Clone)]
pub struct AuditSink {
    target: Target,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match self.target {
            Target::Discard => "discard",
            Target::Writer(_) => "writer",
            Target::Callback(_) => "callback",
        };
        f.debug_struct("AuditSink")
            .field("target", &target)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot open the audit file {path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl AuditSink {
    /// Appends lines to a file (created with mode 0600 if missing).
    pub fn file(path: &Path) -> Result<Self, AuditError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file: File = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| AuditError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self::writer(file))
    }

    /// Writes each line (with its newline) to `writer` in one call.
    pub fn writer(writer: impl Write + Send + 'static) -> Self {
        Self {
            target: Target::Writer(Arc::new(Mutex::new(Box::new(writer)))),
        }
    }

    /// Hands each event and its JSON line (without newline) to `callback`, e.g. the daemon's
    /// event store. It runs on the proxy's tasks, so it must be quick.
    pub fn callback(callback: impl Fn(&AuditEvent, &str) + Send + Sync + 'static) -> Self {
        Self {
            target: Target::Callback(Arc::new(callback)),
        }
    }

    pub fn discard() -> Self {
        Self {
            target: Target::Discard,
        }
    }

    /// Stamps, redacts and writes one event. Audit must not stop traffic: a failed write is
    /// dropped (the file sink reports nothing further).
    pub(crate) fn record(&self, sandbox_id: &str, sensitive: &[String], mut event: AuditEvent) {
        if matches!(self.target, Target::Discard) {
            return;
        }
        event.time_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        event.sandbox_id = sandbox_id.to_owned();
        redact_event(&mut event, sensitive);
        let Ok(line) = serde_json::to_string(&event) else {
            return;
        };
        match &self.target {
            Target::Discard => {}
            Target::Writer(writer) => {
                let mut writer = writer.lock().unwrap_or_else(|e| e.into_inner());
                let mut bytes = line.into_bytes();
                bytes.push(b'\n');
                let _ = writer.write_all(&bytes).and_then(|()| writer.flush());
            }
            Target::Callback(callback) => callback(&event, &line),
        }
    }
}

/// Replaces every sensitive string in `text`.
pub(crate) fn redact(text: &str, sensitive: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in sensitive {
        if !secret.is_empty() && out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), REDACTED);
        }
    }
    out
}

fn redact_event(event: &mut AuditEvent, sensitive: &[String]) {
    if let Some(path) = &mut event.path
        && let Some(cut) = path.find('?')
    {
        path.truncate(cut);
    }
    for field in [
        &mut event.rule,
        &mut event.code,
        &mut event.host,
        &mut event.method,
        &mut event.path,
        &mut event.credential,
        &mut event.detail,
        &mut event.exe,
    ]
    .into_iter()
    .flatten()
    {
        *field = redact(field, sensitive);
    }
}

/// The proxy's handle on its sink: stamps the sandbox and redacts every secret and placeholder
/// any generation of the plan has held (an old placeholder may still be in the sandbox's env).
#[derive(Debug, Clone)]
pub(crate) struct Auditor {
    sink: AuditSink,
    sandbox_id: Arc<str>,
    sensitive: Arc<Mutex<Vec<String>>>,
}

impl Auditor {
    pub(crate) fn new(sink: AuditSink, sandbox_id: &str) -> Self {
        Self {
            sink,
            sandbox_id: Arc::from(sandbox_id),
            sensitive: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub(crate) fn add_sensitive(&self, strings: Vec<String>) {
        let mut sensitive = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        for string in strings {
            if !sensitive.contains(&string) {
                sensitive.push(string);
            }
        }
        // Longest first, so that a string containing another is replaced whole.
        sensitive.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    pub(crate) fn record(&self, event: AuditEvent) {
        let sensitive = self
            .sensitive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.sink.record(&self.sandbox_id, &sensitive, event);
    }

    pub(crate) fn redact(&self, text: &str) -> String {
        let sensitive = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        redact(text, &sensitive)
    }
}
