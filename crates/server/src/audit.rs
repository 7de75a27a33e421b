//! Audit logs: one JSON line ([`AuditRecord`]) per boundary decision or lifecycle event, in
//! the daemon-wide `<state>/audit.jsonl` and in each sandbox's `<state>/sandboxes/<id>/
//! audit.jsonl` (which goes with the sandbox's directory).
//!
//! The egress proxy writes its lines (egress, credential, approval, policy) through
//! [`Audit::sink`], already redacted: secrets and placeholders never reach this module. The
//! daemon adds `lifecycle` lines (the store's events, written here too) and `file` lines (a
//! file-API call the sandbox refused). Each log is rotated at `--audit-max-bytes` to `.1`, and
//! one older file is kept. Writes never fail the operation they describe.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use airlock_api::v1::{AuditRecord, Event, SandboxEvents};
use airlock_egress::{AuditKind, AuditSink};

use crate::config::AUDIT_FILE;
use crate::metrics::Metrics;
use crate::store::now_ms;

/// The most events one `GET .../events` answers with.
pub const MAX_EVENTS_PER_PAGE: usize = 10_000;

/// One JSON-lines file, rotated to `<path>.1` when the next line would pass `max_bytes`.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    /// The open file and its size; opened on first write (and again after a rotation).
    file: Mutex<Option<(File, u64)>>,
}

impl AuditLog {
    pub fn new(path: PathBuf, max_bytes: u64) -> AuditLog {
        AuditLog {
            path,
            max_bytes,
            file: Mutex::new(None),
        }
    }

    fn rotated(&self) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(".1");
        PathBuf::from(name)
    }

    fn open(&self) -> std::io::Result<(File, u64)> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)?;
        let size = file.metadata()?.len();
        Ok((file, size))
    }

    /// Appends `line` and a newline in one write. A failure drops the line: audit must never
    /// stop the sandbox's traffic or the API.
    pub fn write(&self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            match self.open() {
                Ok(opened) => *guard = Some(opened),
                Err(_) => return,
            }
        }
        let full = guard
            .as_ref()
            .is_some_and(|(_, size)| *size > 0 && size + bytes.len() as u64 > self.max_bytes);
        if full {
            *guard = None;
            if std::fs::rename(&self.path, self.rotated()).is_err() {
                return;
            }
            match self.open() {
                Ok(opened) => *guard = Some(opened),
                Err(_) => return,
            }
        }
        if let Some((file, size)) = guard.as_mut()
            && file.write_all(&bytes).is_ok()
        {
            *size += bytes.len() as u64;
        }
    }

    /// Every line, the rotated file's first.
    pub fn read_lines(&self) -> Vec<String> {
        let _guard = self.lock_for_reading();
        let mut lines = Vec::new();
        for path in [self.rotated(), self.path.clone()] {
            if let Ok(text) = std::fs::read_to_string(&path) {
                lines.extend(text.lines().map(str::to_owned));
            }
        }
        lines
    }

    /// Held while reading so that a rotation does not happen between the two files.
    fn lock_for_reading(&self) -> MutexGuard<'_, Option<(File, u64)>> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The daemon's audit logs: its own and one per sandbox it manages.
#[derive(Debug)]
pub struct Audit {
    daemon: Arc<AuditLog>,
    /// Counts the egress proxies' decisions (`GET /metrics`).
    metrics: Option<Arc<Metrics>>,
    sandboxes_dir: PathBuf,
    max_bytes: u64,
    sandboxes: Mutex<HashMap<String, Arc<AuditLog>>>,
}

impl Audit {
    pub fn new(state_dir: &Path, sandboxes_dir: PathBuf, max_bytes: u64) -> Audit {
        Audit {
            daemon: Arc::new(AuditLog::new(state_dir.join(AUDIT_FILE), max_bytes)),
            metrics: None,
            sandboxes_dir,
            max_bytes,
            sandboxes: Mutex::new(HashMap::new()),
        }
    }

    /// Counts every egress decision in `metrics` too.
    pub fn counting(mut self, metrics: Arc<Metrics>) -> Audit {
        self.metrics = Some(metrics);
        self
    }

    fn sandboxes(&self) -> MutexGuard<'_, HashMap<String, Arc<AuditLog>>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts writing sandbox `id`'s own log (its directory exists), or returns the one open
    /// already (a warm pool's member whose egress proxy opened it as it started).
    pub fn open_sandbox(&self, id: &str) -> Arc<AuditLog> {
        self.sandboxes()
            .entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(AuditLog::new(
                    self.sandboxes_dir.join(id).join(AUDIT_FILE),
                    self.max_bytes,
                ))
            })
            .clone()
    }

    /// Stops writing sandbox `id`'s log (its directory is about to go).
    pub fn close_sandbox(&self, id: &str) {
        self.sandboxes().remove(id);
    }

    /// Where an egress proxy's lines go: the sandbox's log and the daemon's.
    pub fn sink(&self, id: &str) -> AuditSink {
        // One lock for both: the map's guard must not be held into a second lock of it.
        let sandbox = self.open_sandbox(id);
        let daemon = self.daemon.clone();
        let prefix = format!("{id}-");
        let metrics = self.metrics.clone();
        AuditSink::callback(move |event, line| {
            if let Some(metrics) = &metrics {
                let kind = match event.kind {
                    Some(AuditKind::Egress) => "egress",
                    Some(AuditKind::Credential) => "credential",
                    Some(AuditKind::Approval) => "approval",
                    Some(AuditKind::Policy) => "policy",
                    None => "other",
                };
                metrics.egress_decision(kind, &event.outcome);
            }
            // Approval ids as the API names them: unique across sandboxes.
            let global = event.approval_id.as_ref().and_then(|local| {
                let mut event = event.clone();
                event.approval_id = Some(format!("{prefix}{local}"));
                serde_json::to_string(&event).ok()
            });
            let line = global.as_deref().unwrap_or(line);
            sandbox.write(line);
            daemon.write(line);
        })
    }

    fn write(&self, record: &AuditRecord) {
        let Ok(line) = serde_json::to_string(record) else {
            return;
        };
        let sandbox = self.sandboxes().get(&record.sandbox_id).cloned();
        if let Some(log) = sandbox {
            log.write(&line);
        }
        self.daemon.write(&line);
    }

    /// A lifecycle event (the same one the store records).
    pub fn lifecycle(&self, sandbox_id: Option<&str>, kind: &str, message: &str) {
        let mut record = record(sandbox_id.unwrap_or_default(), "lifecycle", kind);
        record.detail = Some(message.to_owned());
        self.write(&record);
    }

    /// One wasm-tier evaluation (a host call into the sandbox's isolate): the language as
    /// `method`, the code's SHA-256 (never the code) and the outcome's error kind, if any.
    pub fn eval(&self, sandbox_id: &str, language: &str, code_sha256: &str, outcome: &str) {
        let mut record = record(sandbox_id, "eval", outcome);
        record.method = Some(language.to_owned());
        record.detail = Some(format!("code sha256:{code_sha256}"));
        self.write(&record);
    }

    /// One tool call of a wasm guest (performed by the daemon): the tool's name as `method`,
    /// where it went, the outcome (`ok`, `denied`, `failed`), the arguments' SHA-256 (never
    /// the arguments) and, on failure, why.
    pub fn tool(&self, sandbox_id: &str, call: &ToolAudit<'_>) {
        let mut record = record(sandbox_id, "tool", call.outcome);
        record.method = Some(call.name.to_owned());
        record.host = call.host.map(str::to_owned);
        record.port = call.port;
        record.path = call.path.map(str::to_owned);
        record.approval_id = None;
        record.detail = Some(match call.why {
            Some(why) => format!("{}; args sha256:{}", why, call.args_sha256),
            None => format!("args sha256:{}", call.args_sha256),
        });
        self.write(&record);
    }

    /// A file-API call that the sandbox refused.
    pub fn file_denied(&self, sandbox_id: &str, method: &str, path: Option<&str>, why: &str) {
        let mut record = record(sandbox_id, "file", "denied");
        record.method = Some(method.to_owned());
        record.path = path.map(str::to_owned);
        record.code = Some("permission_denied".to_owned());
        record.detail = Some(why.to_owned());
        self.write(&record);
    }

    /// Sandbox `id`'s audit lines (while its directory exists) merged by time with its
    /// lifecycle events from the store: those at or after `since_ms`, oldest first, at most
    /// `limit`.
    pub fn events(
        &self,
        id: &str,
        lifecycle: Vec<Event>,
        since_ms: u64,
        limit: usize,
    ) -> SandboxEvents {
        let log = AuditLog::new(self.sandboxes_dir.join(id).join(AUDIT_FILE), self.max_bytes);
        let open = self.sandboxes().get(id).cloned();
        let lines = open.as_deref().unwrap_or(&log).read_lines();
        let mut records: Vec<AuditRecord> = lines
            .iter()
            .filter_map(|line| serde_json::from_str::<AuditRecord>(line).ok())
            // The store is the lifecycle's source: it outlives the sandbox's directory.
            .filter(|record| record.kind != "lifecycle")
            .collect();
        records.extend(lifecycle.into_iter().map(|event| {
            let mut record = record(id, "lifecycle", &event.kind);
            record.time_unix_ms = event.at_ms;
            record.detail = Some(event.message);
            record
        }));
        records.sort_by_key(|record| record.time_unix_ms);
        let mut events: Vec<AuditRecord> = records
            .into_iter()
            .filter(|record| record.time_unix_ms >= since_ms)
            .collect();
        let limit = limit.clamp(1, MAX_EVENTS_PER_PAGE);
        let next_since_ms = events.get(limit).map(|record| record.time_unix_ms);
        events.truncate(limit);
        SandboxEvents {
            events,
            next_since_ms,
        }
    }
}

/// What the audit line of one tool call says.
#[derive(Debug, Clone, Copy)]
pub struct ToolAudit<'a> {
    pub name: &'a str,
    pub outcome: &'a str,
    pub host: Option<&'a str>,
    pub port: Option<u16>,
    pub path: Option<&'a str>,
    pub args_sha256: &'a str,
    pub why: Option<&'a str>,
}

fn record(sandbox_id: &str, kind: &str, outcome: &str) -> AuditRecord {
    AuditRecord {
        time_unix_ms: now_ms(),
        sandbox_id: sandbox_id.to_owned(),
        kind: kind.to_owned(),
        outcome: outcome.to_owned(),
        rule: None,
        code: None,
        host: None,
        port: None,
        method: None,
        path: None,
        tunnel: None,
        credential: None,
        approval_id: None,
        policy_generation: None,
        detail: None,
        pid: None,
        exe: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("airlock-audit-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn test_log_rotates_at_its_cap_and_keeps_one_older_file() {
        let dir = temp_dir("rotate");
        let log = AuditLog::new(dir.join("audit.jsonl"), 100);
        for i in 0..30 {
            log.write(&format!("{{\"n\":{i:02}}}"));
        }
        let current = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap();
        let older = std::fs::read_to_string(dir.join("audit.jsonl.1")).unwrap();
        assert!(
            current.len() <= 100 && older.len() <= 100,
            "{current}{older}"
        );
        assert!(current.ends_with("{\"n\":29}\n"), "{current}");
        let lines = log.read_lines();
        assert_eq!(lines.last().map(String::as_str), Some("{\"n\":29}"));
        // Nine bytes a line: eleven fit in 100; 30 lines = 11 + 11 (rotated away) + 8.
        assert_eq!(older.lines().count(), 11, "{older}");
        assert_eq!(lines.len(), 19, "{lines:?}");
        assert_eq!(lines.first().map(String::as_str), Some("{\"n\":11}"));
        let numbers: Vec<&str> = lines.iter().map(|l| &l[5..7]).collect();
        let mut sorted = numbers.clone();
        sorted.sort_unstable();
        assert_eq!(numbers, sorted, "older file first, in order");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("audit.jsonl"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn test_events_merge_audit_lines_and_lifecycle_by_time_with_pages() {
        let dir = temp_dir("events");
        std::fs::create_dir_all(dir.join("sandboxes/s1")).unwrap();
        let audit = Audit::new(&dir, dir.join("sandboxes"), 1 << 20);
        audit.open_sandbox("s1");
        audit.lifecycle(Some("s1"), "create", "template base");
        let sink_line = |t: u64, outcome: &str| {
            format!(
                r#"{{"time_unix_ms":{t},"sandbox_id":"s1","kind":"egress","outcome":"{outcome}","rule":null,"code":null,"host":"a.test","port":80,"method":"GET","path":"/","tunnel":null,"credential":null,"approval_id":null,"policy_generation":null,"detail":null,"pid":null,"exe":null}}"#
            )
        };
        let log = audit.sandboxes().get("s1").cloned().unwrap();
        log.write(&sink_line(20, "allowed"));
        log.write("not json");
        log.write(&sink_line(40, "denied"));
        let event = |seq, at_ms, kind: &str| Event {
            seq,
            at_ms,
            sandbox_id: Some("s1".into()),
            kind: kind.into(),
            message: "m".into(),
        };
        let lifecycle = vec![event(1, 10, "create"), event(2, 30, "ready")];
        let all = audit.events("s1", lifecycle.clone(), 0, 100);
        let seen: Vec<(u64, &str, &str)> = all
            .events
            .iter()
            .map(|r| (r.time_unix_ms, r.kind.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (10, "lifecycle", "create"),
                (20, "egress", "allowed"),
                (30, "lifecycle", "ready"),
                (40, "egress", "denied")
            ],
            "the file's own lifecycle line is not repeated"
        );
        assert_eq!(all.next_since_ms, None);
        let page = audit.events("s1", lifecycle.clone(), 15, 2);
        assert_eq!(page.events.len(), 2);
        assert_eq!(page.events[0].time_unix_ms, 20);
        assert_eq!(page.next_since_ms, Some(40));
        let daemon = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap();
        assert!(
            daemon.contains(r#""kind":"lifecycle","outcome":"create""#),
            "{daemon}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
