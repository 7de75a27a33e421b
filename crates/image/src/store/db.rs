//! The store's SQLite file (`<root>/images.db`): manifests with their configs and layer lists,
//! the names that refer to them, and leases held by running sandboxes. Reference counts are
//! derived by queries, never stored as counters, so a crash cannot make them drift.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::digest::Digest;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS manifests (
    digest TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    manifest BLOB NOT NULL,
    config_digest TEXT NOT NULL,
    config BLOB NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS manifest_layers (
    manifest TEXT NOT NULL REFERENCES manifests(digest) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    blob TEXT NOT NULL,
    blob_size_bytes INTEGER NOT NULL,
    media_type TEXT NOT NULL,
    diff_id TEXT NOT NULL,
    PRIMARY KEY (manifest, position)
);
CREATE INDEX IF NOT EXISTS manifest_layers_blob ON manifest_layers(blob);
CREATE INDEX IF NOT EXISTS manifest_layers_diff_id ON manifest_layers(diff_id);
CREATE TABLE IF NOT EXISTS refs (
    name TEXT PRIMARY KEY,
    manifest TEXT NOT NULL REFERENCES manifests(digest),
    index_digest TEXT,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    holder TEXT NOT NULL,
    manifest TEXT NOT NULL REFERENCES manifests(digest),
    PRIMARY KEY (holder, manifest)
);
CREATE VIEW IF NOT EXISTS manifest_refcounts AS
    SELECT m.digest AS digest,
        (SELECT count(*) FROM refs r WHERE r.manifest = m.digest)
        + (SELECT count(*) FROM leases l WHERE l.manifest = m.digest) AS refcount
    FROM manifests m;
CREATE VIEW IF NOT EXISTS layer_refcounts AS
    SELECT diff_id, count(DISTINCT manifest) AS refcount FROM manifest_layers
    WHERE manifest IN (SELECT digest FROM manifest_refcounts WHERE refcount > 0)
    GROUP BY diff_id;
";

/// One layer of a manifest, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayerRecord {
    pub blob: Digest,
    pub blob_size_bytes: u64,
    pub media_type: String,
    pub diff_id: Digest,
}

/// A manifest with its config and layers.
#[derive(Debug, Clone)]
pub(crate) struct ManifestRecord {
    pub digest: Digest,
    pub media_type: String,
    pub manifest: Vec<u8>,
    pub config_digest: Digest,
    pub config: Vec<u8>,
    pub layers: Vec<LayerRecord>,
}

/// A manifest as listed: its names and totals.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub digest: String,
    pub names: Vec<String>,
    pub layers: u64,
    pub size_bytes: u64,
    pub created_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn digest_column(text: String) -> rusqlite::Result<Digest> {
    Digest::parse(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

pub(crate) fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Switching a new file to WAL takes an exclusive lock that SQLite's busy handler does not
    // wait for: two processes opening a fresh store at once retry here instead of failing.
    let started = std::time::Instant::now();
    loop {
        match set_up(&conn) {
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if matches!(
                    failure.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && started.elapsed() < BUSY_TIMEOUT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.map(|()| conn),
        }
    }
}

/// How long a store waits for another process's write.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn set_up(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.execute_batch(SCHEMA)
}

/// A write transaction that takes the write lock at once: a deferred one that reads first
/// cannot wait for another process's writer when it upgrades, and fails with "locked".
fn write_transaction(conn: &mut Connection) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
}

/// Records a manifest (once) and points `names` at it, in one transaction. Called only after
/// every blob and layer directory it lists exists.
pub(crate) fn record_image(
    conn: &mut Connection,
    record: &ManifestRecord,
    names: &[String],
    index_digest: Option<&Digest>,
) -> rusqlite::Result<()> {
    let tx = write_transaction(conn)?;
    let inserted = tx.execute(
        "INSERT OR IGNORE INTO manifests (digest, media_type, manifest, config_digest, config, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            record.digest.as_str(),
            record.media_type,
            record.manifest,
            record.config_digest.as_str(),
            record.config,
            now_ms()
        ],
    )?;
    if inserted == 1 {
        for (position, layer) in record.layers.iter().enumerate() {
            tx.execute(
                "INSERT INTO manifest_layers (manifest, position, blob, blob_size_bytes, media_type, diff_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    record.digest.as_str(),
                    i64::try_from(position).unwrap_or(i64::MAX),
                    layer.blob.as_str(),
                    i64::try_from(layer.blob_size_bytes).unwrap_or(i64::MAX),
                    layer.media_type,
                    layer.diff_id.as_str()
                ],
            )?;
        }
    }
    for name in names {
        tx.execute(
            "INSERT INTO refs (name, manifest, index_digest, updated_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(name) DO UPDATE SET manifest = excluded.manifest,
                 index_digest = excluded.index_digest, updated_ms = excluded.updated_ms",
            params![
                name,
                record.digest.as_str(),
                index_digest.map(Digest::as_str),
                now_ms()
            ],
        )?;
    }
    tx.commit()
}

/// The manifest a name refers to.
pub(crate) fn find_name(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT manifest FROM refs WHERE name = ?1", [name], |r| {
        r.get(0)
    })
    .optional()
}

/// The manifest with this digest, or the one an index with this digest was resolved to.
pub(crate) fn find_digest(conn: &Connection, digest: &Digest) -> rusqlite::Result<Option<String>> {
    let direct: Option<String> = conn
        .query_row(
            "SELECT digest FROM manifests WHERE digest = ?1",
            [digest.as_str()],
            |r| r.get(0),
        )
        .optional()?;
    if direct.is_some() {
        return Ok(direct);
    }
    conn.query_row(
        "SELECT manifest FROM refs WHERE index_digest = ?1 LIMIT 1",
        [digest.as_str()],
        |r| r.get(0),
    )
    .optional()
}

pub(crate) fn load(conn: &Connection, digest: &str) -> rusqlite::Result<Option<ManifestRecord>> {
    let head = conn
        .query_row(
            "SELECT media_type, manifest, config_digest, config FROM manifests WHERE digest = ?1",
            [digest],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                ))
            },
        )
        .optional()?;
    let Some((media_type, manifest, config_digest, config)) = head else {
        return Ok(None);
    };
    let mut statement = conn.prepare(
        "SELECT blob, blob_size_bytes, media_type, diff_id FROM manifest_layers
         WHERE manifest = ?1 ORDER BY position",
    )?;
    let layers = statement
        .query_map([digest], |r| {
            Ok(LayerRecord {
                blob: digest_column(r.get(0)?)?,
                blob_size_bytes: r.get::<_, i64>(1)?.try_into().unwrap_or(0),
                media_type: r.get(2)?,
                diff_id: digest_column(r.get(3)?)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(ManifestRecord {
        digest: digest_column(digest.to_owned())?,
        media_type,
        manifest,
        config_digest: digest_column(config_digest)?,
        config,
        layers,
    }))
}

/// The names that refer to a manifest, and the index digest a pull resolved it from.
pub(crate) fn names_of(
    conn: &Connection,
    digest: &str,
) -> rusqlite::Result<(Vec<String>, Option<String>)> {
    let mut statement =
        conn.prepare("SELECT name, index_digest FROM refs WHERE manifest = ?1 ORDER BY name")?;
    let rows = statement
        .query_map([digest], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let index = rows.iter().find_map(|(_, index)| index.clone());
    Ok((rows.into_iter().map(|(name, _)| name).collect(), index))
}

pub(crate) fn refcount(conn: &Connection, digest: &str) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT refcount FROM manifest_refcounts WHERE digest = ?1",
        [digest],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.try_into().unwrap_or(0))
}

pub(crate) fn list(conn: &Connection) -> rusqlite::Result<Vec<Listed>> {
    let mut statement = conn.prepare(
        "SELECT m.digest, m.created_ms,
                (SELECT count(*) FROM manifest_layers l WHERE l.manifest = m.digest),
                (SELECT coalesce(sum(blob_size_bytes), 0) FROM manifest_layers l WHERE l.manifest = m.digest),
                (SELECT group_concat(name, char(10)) FROM (SELECT name FROM refs r WHERE r.manifest = m.digest ORDER BY name))
         FROM manifests m ORDER BY m.created_ms, m.digest",
    )?;
    statement
        .query_map([], |r| {
            let names: Option<String> = r.get(4)?;
            Ok(Listed {
                digest: r.get(0)?,
                created_ms: r.get(1)?,
                layers: r.get::<_, i64>(2)?.try_into().unwrap_or(0),
                size_bytes: r.get::<_, i64>(3)?.try_into().unwrap_or(0),
                names: names
                    .map(|n| n.lines().map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
        })?
        .collect()
}

/// Removes one name; returns whether it existed.
pub(crate) fn remove_name(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    Ok(conn.execute("DELETE FROM refs WHERE name = ?1", [name])? > 0)
}

/// Removes every name of a manifest; returns them.
pub(crate) fn remove_names_of(
    conn: &mut Connection,
    digest: &str,
) -> rusqlite::Result<Vec<String>> {
    let tx = write_transaction(conn)?;
    let names = {
        let mut statement =
            tx.prepare("SELECT name FROM refs WHERE manifest = ?1 ORDER BY name")?;
        statement
            .query_map([digest], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?
    };
    tx.execute("DELETE FROM refs WHERE manifest = ?1", [digest])?;
    tx.commit()?;
    Ok(names)
}

pub(crate) fn lease(conn: &Connection, holder: &str, digest: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR IGNORE INTO leases (holder, manifest) VALUES (?1, ?2)",
        [holder, digest],
    )?;
    Ok(())
}

pub(crate) fn holders(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut statement = conn.prepare("SELECT DISTINCT holder FROM leases ORDER BY holder")?;
    statement.query_map([], |r| r.get(0))?.collect()
}

pub(crate) fn release(conn: &Connection, holder: &str) -> rusqlite::Result<u64> {
    Ok(conn.execute("DELETE FROM leases WHERE holder = ?1", [holder])? as u64)
}

/// Deletes the manifests nothing refers to (no name, no lease); returns their digests and
/// what the remaining manifests still use: (blobs, diff ids).
pub(crate) fn prune(
    conn: &mut Connection,
) -> rusqlite::Result<(Vec<String>, Vec<String>, Vec<String>)> {
    let tx = write_transaction(conn)?;
    let removed = {
        let mut statement =
            tx.prepare("SELECT digest FROM manifest_refcounts WHERE refcount = 0 ORDER BY digest")?;
        statement
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?
    };
    for digest in &removed {
        tx.execute("DELETE FROM manifests WHERE digest = ?1", [digest])?;
    }
    let column = |sql: &str| -> rusqlite::Result<Vec<String>> {
        let mut statement = tx.prepare(sql)?;
        statement.query_map([], |r| r.get(0))?.collect()
    };
    let blobs = column("SELECT DISTINCT blob FROM manifest_layers")?;
    let layers = column("SELECT DISTINCT diff_id FROM manifest_layers")?;
    tx.commit()?;
    Ok((removed, blobs, layers))
}
