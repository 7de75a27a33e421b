//! The `pools` table: each template's warm-pool size, so that `PUT /v1/templates/{name}/pool`
//! survives a restart. Members themselves are never stored: they die with the daemon that
//! started them, and the next one sweeps what they left (see `lifecycle::pool`).

use rusqlite::params;

use super::{Store, StoreError};

/// Added without a version bump: an older store simply has no pools.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pools (
    template    TEXT PRIMARY KEY,
    size        INTEGER NOT NULL CHECK (size > 0)
);";

impl Store {
    /// Every stored pool, by template name.
    pub fn list_pools(&self) -> Result<Vec<(String, u32)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT template, size FROM pools ORDER BY template")?;
        let rows = stmt.query_map([], |row| {
            let size: i64 = row.get(1)?;
            Ok((row.get(0)?, u32::try_from(size).unwrap_or(u32::MAX)))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Records a template's pool size; 0 removes it.
    pub fn set_pool(&self, template: &str, size: u32) -> Result<(), StoreError> {
        let conn = self.conn();
        if size == 0 {
            conn.execute("DELETE FROM pools WHERE template = ?1", params![template])?;
        } else {
            conn.execute(
                "INSERT INTO pools (template, size) VALUES (?1, ?2)
                 ON CONFLICT (template) DO UPDATE SET size = excluded.size",
                params![template, i64::from(size)],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pools_set_replace_and_remove_round_trip() {
        let dir = std::env::temp_dir().join(format!("airlock-pools-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(&dir.join("airlock.db")).unwrap();
        assert!(store.list_pools().unwrap().is_empty());
        store.set_pool("base", 3).unwrap();
        store.set_pool("other", 1).unwrap();
        store.set_pool("base", 5).unwrap();
        assert_eq!(
            store.list_pools().unwrap(),
            vec![("base".to_owned(), 5), ("other".to_owned(), 1)]
        );
        store.set_pool("base", 0).unwrap();
        assert_eq!(store.list_pools().unwrap(), vec![("other".to_owned(), 1)]);
        drop(store);
        let store = Store::open(&dir.join("airlock.db")).unwrap();
        assert_eq!(store.list_pools().unwrap(), vec![("other".to_owned(), 1)]);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
