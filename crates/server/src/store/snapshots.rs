//! The `snapshots` table: a snapshot row is inserted incomplete before its files are made and
//! completed after, so a crash in between leaves a row that start-up removes (with whatever
//! files it got); only complete snapshots are ever listed or used.

use airlock_api::v1::CreateSandboxRequest;
use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError, from_sql, insert_event, now_ms, to_sql};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: String,
    pub name: Option<String>,
    pub source_id: String,
    /// The source's create request: new sandboxes from the snapshot take its template,
    /// resources, environment and policy as defaults.
    pub request: CreateSandboxRequest,
    pub created_ms: u64,
}

type Raw = (String, Option<String>, String, String, i64);

fn raw(row: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

fn parse((id, name, source_id, request, created_ms): Raw) -> Result<SnapshotRow, StoreError> {
    let request = serde_json::from_str(&request).map_err(|source| StoreError::Corrupt {
        id: id.clone(),
        source,
    })?;
    Ok(SnapshotRow {
        id,
        name,
        source_id,
        request,
        created_ms: from_sql(created_ms),
    })
}

impl Store {
    /// Inserts an incomplete snapshot. Fails if the id or the name is taken.
    pub fn insert_snapshot(&self, row: &SnapshotRow) -> Result<(), StoreError> {
        let request =
            serde_json::to_string(&row.request).map_err(|source| StoreError::Corrupt {
                id: row.id.clone(),
                source,
            })?;
        self.conn().execute(
            "INSERT INTO snapshots (id, name, source_id, request, created_ms, complete)
             VALUES (?1, ?2, ?3, ?4, ?5, 0)",
            params![row.id, row.name, row.source_id, request, to_sql(now_ms())],
        )?;
        Ok(())
    }

    /// Whether a snapshot of this name exists (complete or not).
    pub fn snapshot_name_taken(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM snapshots WHERE name = ?1",
                params![name],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Marks a snapshot complete, with an event for its source. Returns false if it is gone.
    pub fn complete_snapshot(&self, id: &str, source_id: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let changed = tx.execute(
            "UPDATE snapshots SET complete = 1 WHERE id = ?1",
            params![id],
        )?;
        insert_event(
            &tx,
            Some(source_id),
            "snapshot",
            &format!("snapshot {id} taken"),
        )?;
        tx.commit()?;
        Ok(changed == 1)
    }

    /// A complete snapshot by id or by name.
    pub fn get_snapshot(&self, id_or_name: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let raw = self
            .conn()
            .query_row(
                "SELECT id, name, source_id, request, created_ms FROM snapshots
                 WHERE (id = ?1 OR name = ?1) AND complete = 1",
                params![id_or_name],
                raw,
            )
            .optional()?;
        raw.map(parse).transpose()
    }

    /// The complete snapshots, oldest first.
    pub fn list_snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare(
                "SELECT id, name, source_id, request, created_ms FROM snapshots
                 WHERE complete = 1 ORDER BY created_ms, id",
            )?;
            let rows = stmt.query_map([], raw)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(parse).collect()
    }

    /// The ids of every snapshot, complete or not (for start-up's reconciliation).
    pub fn all_snapshot_ids(&self) -> Result<Vec<(String, bool)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id, complete FROM snapshots")?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? != 0)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM snapshots WHERE id = ?1", params![id])?
            == 1)
    }
}
