//! The daemon's durable state: one SQLite file, `<state>/airlock.db`.
//!
//! Tables: `sandboxes` (one row per sandbox that exists or is being created or removed),
//! `templates`, `pools` (warm-pool sizes), `api_keys` (SHA-256 of each key, never the key),
//! `events` (an append-only log), `judge0_submissions` (the Judge0 API's submissions and
//! queue), and for template builds `builds`, `build_logs` and `build_cache` (`templates.rs`).
//! The schema version is `PRAGMA user_version`; an older store is migrated in place (version 2
//! added `sandboxes.egress`, 3 the `paused` state and `snapshots`, 4 the built templates'
//! columns and the build tables; `pools` and `judge0_submissions` are additive, created if
//! missing, with no version of their own). WAL with `synchronous=NORMAL` keeps each write one
//! `write(2)`; a crash can lose the last transactions but never corrupts the file,
//! and start-up reconciles rows with what really runs (see `lifecycle`).
//!
//! Memory and disk stay bounded over the daemon's life: the event log is trimmed
//! ([`Store::trim_events`]), SQLite's page cache is capped at [`CACHE_KIB`] and the WAL is
//! checkpointed every 1000 pages and truncated back to [`JOURNAL_SIZE_LIMIT`].

mod judge0;
mod pools;
mod snapshots;
mod templates;

pub use snapshots::SnapshotRow;
pub use templates::{BuildRow, TemplateRow};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_api::v1::{CreateSandboxRequest, Event, PauseMode};
use rusqlite::{Connection, OptionalExtension, params};

/// The schema this build writes.
const SCHEMA_VERSION: i64 = 4;

/// The sandboxes table of version 3 (`paused` and the `pause` column are new): created under
/// this name when a version 2 store is migrated, then renamed.
const SANDBOXES_V3: &str = "
CREATE TABLE IF NOT EXISTS {table} (
    id          TEXT PRIMARY KEY,
    state       TEXT NOT NULL
                CHECK (state IN ('creating', 'committing', 'running', 'paused', 'deleting')),
    request     TEXT NOT NULL,
    token_hash  TEXT NOT NULL,
    live        TEXT,
    created_ms  INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    egress      TEXT,
    pause       TEXT
);";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
    id          TEXT PRIMARY KEY,
    name        TEXT UNIQUE,
    source_id   TEXT NOT NULL,
    request     TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    complete    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS templates (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    rootfs      TEXT,
    builtin     INTEGER NOT NULL,
    family      TEXT,
    image       TEXT,
    build_id    TEXT,
    spec        TEXT,
    updated_ms  INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS api_keys (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    created_ms  INTEGER NOT NULL,
    revoked_ms  INTEGER
);
CREATE TABLE IF NOT EXISTS events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    sandbox_id  TEXT,
    kind        TEXT NOT NULL,
    message     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_sandbox ON events (sandbox_id, seq);
CREATE TABLE IF NOT EXISTS builds (
    id          TEXT PRIMARY KEY,
    template    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('waiting', 'building', 'ready', 'error')),
    request     TEXT NOT NULL,
    progress    TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    finished_ms INTEGER
);
CREATE TABLE IF NOT EXISTS build_logs (
    build_id    TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    level       TEXT NOT NULL,
    step        TEXT,
    message     TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);
CREATE TABLE IF NOT EXISTS build_cache (
    key         TEXT PRIMARY KEY,
    image       TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
);
";

/// SQLite's page cache, in KiB (its default is 2000). The daemon's working set is the tail
/// of the event log and a few pages of the other tables; the kernel's page cache holds the
/// rest of the file. A cache that grows with the file is anonymous memory the daemon keeps.
const CACHE_KIB: i64 = 256;
/// Bytes the WAL is truncated back to after a checkpoint: what 1000 pages (the automatic
/// checkpoint's threshold) take, so a WAL that once grew past it does not keep its size.
const JOURNAL_SIZE_LIMIT: i64 = 4 << 20;

/// Rows one trimming statement deletes at most, so that no request waits long for the store.
const TRIM_BATCH: i64 = 1000;

/// The built-in template every store starts with.
pub const BASE_TEMPLATE: &str = "base";
/// The other built-in one: `base` with E2B's code interpreter serving port 49999.
pub use crate::lifecycle::INTERPRETER_TEMPLATE;
/// The others: `base` with a virtual desktop and a browser (`lifecycle::desktop`), and the
/// wasm tier's engines.
use crate::lifecycle::{
    DESKTOP_DESCRIPTION, DESKTOP_TEMPLATE, WASM_JS_DESCRIPTION, WASM_JS_TEMPLATE,
    WASM_PYTHON_DESCRIPTION, WASM_PYTHON_TEMPLATE,
};
const INTERPRETER_DESCRIPTION: &str = "The host root, read-only, with E2B's code interpreter on port 49999 (the host's kernels: python by ipykernel, bash, javascript and typescript by Deno when installed)";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("store query failed")]
    Sql(#[from] rusqlite::Error),
    #[error("the store has schema version {found}; this airlockd knows up to {SCHEMA_VERSION}")]
    TooNew { found: i64 },
    #[error("the stored request of sandbox {id} is unreadable")]
    Corrupt {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("unknown sandbox state `{0}` in the store")]
    BadState(String),
}

/// Where a sandbox's row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowState {
    /// Inserted before the runtime starts anything; a row still in this state at start-up
    /// belongs to a create that a crash interrupted.
    Creating,
    /// The runtime's record (`live`) is durable, the commit has not been confirmed: at
    /// start-up such a sandbox is destroyed (its create never answered).
    Committing,
    /// Committed: the sandbox outlives the daemon and is, or was, usable.
    Running,
    /// Paused (its row's `pause` says how): frozen processes, or only its files on disk.
    Paused,
    /// Being destroyed.
    Deleting,
}

impl RowState {
    fn as_str(self) -> &'static str {
        match self {
            RowState::Creating => "creating",
            RowState::Committing => "committing",
            RowState::Running => "running",
            RowState::Paused => "paused",
            RowState::Deleting => "deleting",
        }
    }

    fn parse(value: &str) -> Result<RowState, StoreError> {
        match value {
            "creating" => Ok(RowState::Creating),
            "committing" => Ok(RowState::Committing),
            "running" => Ok(RowState::Running),
            "paused" => Ok(RowState::Paused),
            "deleting" => Ok(RowState::Deleting),
            other => Err(StoreError::BadState(other.to_owned())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub id: String,
    pub state: RowState,
    /// The request with every default filled in: what the sandbox really got.
    pub request: CreateSandboxRequest,
    pub token_hash: String,
    /// The runtime's `LiveSandbox` as JSON, once the sandbox is running.
    pub live: Option<String>,
    pub created_ms: u64,
    pub deadline_ms: u64,
    /// A `proxy`-mode sandbox's egress state as JSON (its credential placeholders, never a
    /// secret), so that a restarted daemon keeps what the sandbox's environment holds.
    pub egress: Option<String>,
    /// Set while the sandbox is paused.
    pub pause: Option<PauseRecord>,
}

/// How and when a sandbox was paused, and how much of its lifetime it had left then (its
/// timeout clock stands still while it is paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseRecord {
    pub mode: PauseMode,
    pub paused_ms: u64,
    pub remaining_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub created_ms: u64,
    pub revoked_ms: Option<u64>,
}

/// The store. One connection behind a mutex: every statement is short, and SQLite serialises
/// writers anyway.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the store at `path`, migrates it and seeds the `base`
    /// template.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        // Bounded memory and disk (see the module docs): a small page cache, and a WAL cut
        // back to its usual size after a checkpoint.
        conn.pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(open_err)?;
        conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)
            .map_err(open_err)?;
        // Room for every statement the API runs per request (`run`, `prepare_cached`), so that
        // none is evicted and parsed again; rusqlite's default holds 16.
        conn.set_prepared_statement_cache_capacity(32);
        let found: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(open_err)?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew { found });
        }
        // Version 1 had no `egress` column; CREATE TABLE IF NOT EXISTS leaves its table alone.
        let sandboxes_exist: bool = conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'",
            [],
            |row| row.get::<_, i64>(0).map(|n| n > 0),
        )?;
        let templates_exist: bool = conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'templates'",
            [],
            |row| row.get::<_, i64>(0).map(|n| n > 0),
        )?;
        let tx = conn.unchecked_transaction()?;
        if templates_exist && found < 4 {
            // Version 4: built templates (an image, their build and sandbox defaults). Only
            // the columns missing are added (a store may have been reset to an older version).
            let columns: Vec<String> = {
                let mut stmt = tx.prepare("SELECT name FROM pragma_table_info('templates')")?;
                let rows = stmt.query_map([], |row| row.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for (column, kind) in [
                ("family", "TEXT"),
                ("image", "TEXT"),
                ("build_id", "TEXT"),
                ("spec", "TEXT"),
                ("updated_ms", "INTEGER NOT NULL DEFAULT 0"),
            ] {
                if !columns.iter().any(|c| c == column) {
                    tx.execute_batch(&format!("ALTER TABLE templates ADD COLUMN {column} {kind}"))?;
                }
            }
        }
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(pools::SCHEMA)?;
        tx.execute_batch(&SANDBOXES_V3.replace("{table}", "sandboxes"))?;
        if sandboxes_exist && found < 2 {
            tx.execute_batch("ALTER TABLE sandboxes ADD COLUMN egress TEXT")?;
        }
        if sandboxes_exist && found < 3 {
            // A CHECK cannot be altered: the table is copied into the new shape.
            tx.execute_batch(&SANDBOXES_V3.replace("{table}", "sandboxes_v3"))?;
            tx.execute_batch(
                "INSERT INTO sandboxes_v3
                    (id, state, request, token_hash, live, created_ms, deadline_ms, egress)
                 SELECT id, state, request, token_hash, live, created_ms, deadline_ms, egress
                 FROM sandboxes;
                 DROP TABLE sandboxes;
                 ALTER TABLE sandboxes_v3 RENAME TO sandboxes;",
            )?;
        }
        // The Judge0 API's table: additive, created if missing on any version.
        tx.execute_batch(judge0::SCHEMA)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        tx.commit()?;
        conn.execute(
            "INSERT OR IGNORE INTO templates (name, description, rootfs, builtin, family)
             VALUES (?1, 'The host root, read-only', NULL, 1, ?1)",
            params![BASE_TEMPLATE],
        )?;
        conn.execute(
            "INSERT OR IGNORE INTO templates (name, description, rootfs, builtin, family)
             VALUES (?1, ?2, NULL, 1, ?1)",
            params![INTERPRETER_TEMPLATE, INTERPRETER_DESCRIPTION],
        )?;
        for (name, description) in [
            (DESKTOP_TEMPLATE, DESKTOP_DESCRIPTION),
            (WASM_JS_TEMPLATE, WASM_JS_DESCRIPTION),
            (WASM_PYTHON_TEMPLATE, WASM_PYTHON_DESCRIPTION),
        ] {
            conn.execute(
                "INSERT OR IGNORE INTO templates (name, description, rootfs, builtin, family)
                 VALUES (?1, ?2, NULL, 1, ?1)",
                params![name, description],
            )?;
        }
        Ok(Store {
            conn: Mutex::new(conn),
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-done SQL transaction behind
        // (SQLite rolls it back), so the connection stays usable.
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    // --- sandboxes ---

    pub fn insert_sandbox(&self, row: &SandboxRow) -> Result<(), StoreError> {
        self.insert_sandbox_noting(row, &[])
    }

    /// [`Store::insert_sandbox`] with events `(kind, message)` in the same transaction.
    pub fn insert_sandbox_noting(
        &self,
        row: &SandboxRow,
        events: &[(&str, &str)],
    ) -> Result<(), StoreError> {
        let request =
            serde_json::to_string(&row.request).map_err(|source| StoreError::Corrupt {
                id: row.id.clone(),
                source,
            })?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (kind, message) in events {
            insert_event(&tx, Some(&row.id), kind, message)?;
        }
        run(
            &tx,
            "INSERT INTO sandboxes
                (id, state, request, token_hash, live, created_ms, deadline_ms, egress, pause)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                row.id,
                row.state.as_str(),
                request,
                row.token_hash,
                row.live,
                to_sql(row.created_ms),
                to_sql(row.deadline_ms),
                row.egress,
                encode_pause(row.pause.as_ref())
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Stores the runtime's record of a started sandbox (state `committing`). Returns false if
    /// the row is gone.
    /// Stores the runtime's record of a started sandbox, in state `running`, with an event in
    /// the same transaction (one write on the create path). Returns false if the row is gone.
    pub fn set_started(
        &self,
        id: &str,
        live: &str,
        deadline_ms: u64,
        event: (&str, &str),
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = run(
            &tx,
            "UPDATE sandboxes SET state = 'running', live = ?2, deadline_ms = ?3, pause = NULL
             WHERE id = ?1",
            params![id, live, to_sql(deadline_ms)],
        )?;
        insert_event(&tx, Some(id), event.0, event.1)?;
        tx.commit()?;
        Ok(changed == 1)
    }

    pub fn set_state(&self, id: &str, state: RowState) -> Result<bool, StoreError> {
        self.set_state_noting(id, state, None)
    }

    /// [`Store::set_state`] and, in the same transaction (one write on the create path),
    /// an event `(kind, message)` for the sandbox.
    pub fn set_state_noting(
        &self,
        id: &str,
        state: RowState,
        event: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = run(
            &tx,
            "UPDATE sandboxes SET state = ?2 WHERE id = ?1",
            params![id, state.as_str()],
        )?;
        if let Some((kind, message)) = event {
            insert_event(&tx, Some(id), kind, message)?;
        }
        tx.commit()?;
        Ok(changed == 1)
    }

    pub fn set_deadline(&self, id: &str, deadline_ms: u64) -> Result<bool, StoreError> {
        let changed = run(
            &self.conn(),
            "UPDATE sandboxes SET deadline_ms = ?2 WHERE id = ?1",
            params![id, to_sql(deadline_ms)],
        )?;
        Ok(changed == 1)
    }

    /// Stores a sandbox's egress state (JSON). Returns false if the row is gone.
    pub fn set_egress(&self, id: &str, egress: &str) -> Result<bool, StoreError> {
        let changed = run(
            &self.conn(),
            "UPDATE sandboxes SET egress = ?2 WHERE id = ?1",
            params![id, egress],
        )?;
        Ok(changed == 1)
    }

    /// Stores a hot-reloaded request (its policy) and egress state, with an event, in one
    /// transaction. Returns false if the row is gone.
    pub fn set_policy_noting(
        &self,
        id: &str,
        request: &CreateSandboxRequest,
        egress: &str,
        event: (&str, &str),
    ) -> Result<bool, StoreError> {
        let request = serde_json::to_string(request).map_err(|source| StoreError::Corrupt {
            id: id.to_owned(),
            source,
        })?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = run(
            &tx,
            "UPDATE sandboxes SET request = ?2, egress = ?3 WHERE id = ?1",
            params![id, request, egress],
        )?;
        insert_event(&tx, Some(id), event.0, event.1)?;
        tx.commit()?;
        Ok(changed == 1)
    }

    /// Marks a sandbox paused (`pause`), with an event, in one transaction. Returns false if
    /// the row is gone.
    pub fn set_paused(
        &self,
        id: &str,
        pause: &PauseRecord,
        event: (&str, &str),
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = run(
            &tx,
            "UPDATE sandboxes SET state = 'paused', pause = ?2 WHERE id = ?1",
            params![id, encode_pause(Some(pause))],
        )?;
        insert_event(&tx, Some(id), event.0, event.1)?;
        tx.commit()?;
        Ok(changed == 1)
    }

    pub fn delete_sandbox(&self, id: &str) -> Result<(), StoreError> {
        run(
            &self.conn(),
            "DELETE FROM sandboxes WHERE id = ?1",
            params![id],
        )?;
        Ok(())
    }

    /// [`Store::delete_sandbox`] and, in the same transaction (one write on the delete path),
    /// the event `(kind, message)` that says why: whoever finds the row gone finds the reason.
    pub fn delete_sandbox_noting(
        &self,
        id: &str,
        kind: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        insert_event(&tx, Some(id), kind, message)?;
        run(&tx, "DELETE FROM sandboxes WHERE id = ?1", params![id])?;
        tx.commit()?;
        Ok(())
    }

    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let raw = self
            .conn()
            .prepare_cached(
                "SELECT id, state, request, token_hash, live, created_ms, deadline_ms, egress, pause
                 FROM sandboxes WHERE id = ?1",
            )?
            .query_row(params![id], raw_row)
            .optional()?;
        raw.map(RawRow::parse).transpose()
    }

    /// Every row, oldest first.
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxRow>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare(
                "SELECT id, state, request, token_hash, live, created_ms, deadline_ms, egress, pause
                 FROM sandboxes ORDER BY created_ms, id",
            )?;
            let rows = stmt.query_map([], raw_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawRow::parse).collect()
    }

    // --- events ---

    /// Appends an event. Failing to log must not fail the operation it describes, so callers
    /// usually ignore the error.
    pub fn record_event(
        &self,
        sandbox_id: Option<&str>,
        kind: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        insert_event(&self.conn(), sandbox_id, kind, message)?;
        Ok(())
    }

    /// Deletes the events older than `older_than_ms` (Unix ms) and all but the newest
    /// `keep_rows`; returns how many went. The log is append-only, so both are a prefix in
    /// `seq` order: each statement deletes at most [`TRIM_BATCH`] of the oldest rows and looks
    /// at no others, and the lock is released between statements. With nothing to trim it
    /// costs one look at the oldest and the newest row.
    pub fn trim_events(&self, older_than_ms: u64, keep_rows: u64) -> Result<u64, StoreError> {
        let keep_rows = i64::try_from(keep_rows).unwrap_or(i64::MAX);
        let older_than_ms = to_sql(older_than_ms);
        let mut deleted = 0;
        loop {
            let conn = self.conn();
            let (oldest_seq, oldest_ms, newest_seq): (Option<i64>, Option<i64>, Option<i64>) = conn
                .query_row(
                    "SELECT seq, at_ms, (SELECT MAX(seq) FROM events) FROM events
                     ORDER BY seq LIMIT 1",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?
                .unwrap_or((None, None, None));
            let (Some(oldest_seq), Some(oldest_ms), Some(newest_seq)) =
                (oldest_seq, oldest_ms, newest_seq)
            else {
                return Ok(deleted);
            };
            if oldest_ms >= older_than_ms && oldest_seq > newest_seq.saturating_sub(keep_rows) {
                return Ok(deleted);
            }
            let changed = run(
                &conn,
                "DELETE FROM events WHERE seq <= (
                     SELECT MAX(seq) FROM (
                         SELECT seq, at_ms FROM events ORDER BY seq LIMIT ?1
                     ) WHERE at_ms < ?2 OR seq <= (SELECT MAX(seq) FROM events) - ?3
                 )",
                params![TRIM_BATCH, older_than_ms, keep_rows],
            )?;
            drop(conn);
            deleted += changed as u64;
            if changed == 0 {
                return Ok(deleted);
            }
        }
    }

    /// The last `limit` events of one sandbox (or, with `None`, of the daemon), oldest first.
    pub fn events(&self, sandbox_id: Option<&str>, limit: u32) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT seq, at_ms, sandbox_id, kind, message FROM events
             WHERE (?1 IS NULL OR sandbox_id = ?1) ORDER BY seq DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![sandbox_id, limit], |row| {
            Ok(Event {
                seq: row.get(0)?,
                at_ms: from_sql(row.get(1)?),
                sandbox_id: row.get(2)?,
                kind: row.get(3)?,
                message: row.get(4)?,
            })
        })?;
        let mut events = rows.collect::<Result<Vec<_>, _>>()?;
        events.reverse();
        Ok(events)
    }

    // --- API keys ---

    pub fn insert_key(&self, id: &str, name: &str, hash: &str) -> Result<(), StoreError> {
        run(
            &self.conn(),
            "INSERT INTO api_keys (id, name, hash, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![id, name, hash, to_sql(now_ms())],
        )?;
        Ok(())
    }

    pub fn list_keys(&self) -> Result<Vec<KeyRow>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, name, created_ms, revoked_ms FROM api_keys ORDER BY created_ms, id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(KeyRow {
                id: row.get(0)?,
                name: row.get(1)?,
                created_ms: from_sql(row.get(2)?),
                revoked_ms: row.get::<_, Option<i64>>(3)?.map(from_sql),
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Revokes the active keys whose id or name is `id_or_name`; returns how many.
    pub fn revoke_key(&self, id_or_name: &str) -> Result<usize, StoreError> {
        Ok(run(
            &self.conn(),
            "UPDATE api_keys SET revoked_ms = ?2
             WHERE (id = ?1 OR name = ?1) AND revoked_ms IS NULL",
            params![id_or_name, to_sql(now_ms())],
        )?)
    }

    /// Whether an unrevoked key has this hash (asked on every authenticated request).
    pub fn key_hash_is_active(&self, hash: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .prepare_cached("SELECT 1 FROM api_keys WHERE hash = ?1 AND revoked_ms IS NULL")?
            .query_row(params![hash], |_| Ok(()))
            .optional()?
            .is_some())
    }
}

struct RawRow {
    id: String,
    state: String,
    request: String,
    token_hash: String,
    live: Option<String>,
    created_ms: i64,
    deadline_ms: i64,
    egress: Option<String>,
    pause: Option<String>,
}

fn encode_pause(pause: Option<&PauseRecord>) -> Option<String> {
    pause.and_then(|pause| serde_json::to_string(pause).ok())
}

fn raw_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        id: row.get(0)?,
        state: row.get(1)?,
        request: row.get(2)?,
        token_hash: row.get(3)?,
        live: row.get(4)?,
        created_ms: row.get(5)?,
        deadline_ms: row.get(6)?,
        egress: row.get(7)?,
        pause: row.get(8)?,
    })
}

impl RawRow {
    fn parse(self) -> Result<SandboxRow, StoreError> {
        let request =
            serde_json::from_str(&self.request).map_err(|source| StoreError::Corrupt {
                id: self.id.clone(),
                source,
            })?;
        let pause = self
            .pause
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|source| StoreError::Corrupt {
                id: self.id.clone(),
                source,
            })?;
        Ok(SandboxRow {
            pause,
            state: RowState::parse(&self.state)?,
            id: self.id,
            request,
            token_hash: self.token_hash,
            live: self.live,
            created_ms: from_sql(self.created_ms),
            deadline_ms: from_sql(self.deadline_ms),
            egress: self.egress,
        })
    }
}

/// SQLite integers are signed; times and deadlines in ms fit comfortably.
/// Appends a lifecycle event, and logs it: the store's event log and the daemon's log tell the
/// same story.
fn insert_event(
    conn: &Connection,
    sandbox_id: Option<&str>,
    kind: &str,
    message: &str,
) -> rusqlite::Result<()> {
    run(
        conn,
        "INSERT INTO events (at_ms, sandbox_id, kind, message) VALUES (?1, ?2, ?3, ?4)",
        params![to_sql(now_ms()), sandbox_id, kind, message],
    )?;
    match sandbox_id {
        Some(sandbox_id) => tracing::info!(target: "airlock::event", sandbox_id, kind, message),
        None => tracing::info!(target: "airlock::event", kind, message),
    }
    Ok(())
}

/// Runs one statement through the connection's cache of prepared statements: the create and
/// delete paths run the same few statements for every sandbox, and parsing them again each time
/// was a visible share of the daemon's CPU under load.
fn run(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
