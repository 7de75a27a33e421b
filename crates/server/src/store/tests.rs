//! The store's unit tests.

use super::*;

/// A sandbox row with nothing started yet.
fn new_row(id: &str, state: RowState) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        state,
        request: CreateSandboxRequest::default(),
        token_hash: "h".into(),
        live: None,
        created_ms: 5,
        deadline_ms: 10,
        egress: None,
        pause: None,
    }
}

fn temp_store() -> (Store, PathBuf) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("airlock-store-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (Store::open(&dir.join("airlock.db")).unwrap(), dir)
}

#[test]
fn test_sandbox_rows_round_trip_through_states() {
    let (store, dir) = temp_store();
    let mut row = new_row("abc", RowState::Creating);
    store.insert_sandbox(&row).unwrap();
    assert!(store.insert_sandbox(&row).is_err(), "ids are unique");
    assert!(store.set_started("abc", "{}", 20, ("ready", "up")).unwrap());
    assert_eq!(
        store
            .events(Some("abc"), 10)
            .unwrap()
            .last()
            .map(|e| e.kind.as_str()),
        Some("ready")
    );
    row.state = RowState::Running;
    row.live = Some("{}".into());
    row.deadline_ms = 20;
    assert_eq!(store.get_sandbox("abc").unwrap(), Some(row.clone()));
    assert!(store.set_egress("abc", "{\"placeholders\":{}}").unwrap());
    row.egress = Some("{\"placeholders\":{}}".into());
    assert_eq!(store.get_sandbox("abc").unwrap(), Some(row.clone()));
    assert_eq!(store.list_sandboxes().unwrap(), vec![row]);
    store.delete_sandbox("abc").unwrap();
    assert_eq!(store.get_sandbox("abc").unwrap(), None);
    assert!(!store.set_deadline("abc", 1).unwrap());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn test_delete_sandbox_noting_removes_the_row_and_keeps_why() {
    let (store, dir) = temp_store();
    let row = new_row("gone", RowState::Deleting);
    store.insert_sandbox(&row).unwrap();
    store
        .delete_sandbox_noting("gone", "delete", "deleted through the API")
        .unwrap();
    assert_eq!(store.get_sandbox("gone").unwrap(), None);
    let events = store.events(Some("gone"), 10).unwrap();
    let last = events.last().map(|e| (e.kind.as_str(), e.message.as_str()));
    assert_eq!(last, Some(("delete", "deleted through the API")));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn test_reopen_keeps_data_and_seeds_base_once() {
    let (store, dir) = temp_store();
    store.insert_key("k1", "ci", "hash1").unwrap();
    store.record_event(Some("s1"), "create", "hello").unwrap();
    store.record_event(None, "start", "daemon").unwrap();
    drop(store);
    let store = Store::open(&dir.join("airlock.db")).unwrap();
    assert!(store.key_hash_is_active("hash1").unwrap());
    assert_eq!(store.revoke_key("ci").unwrap(), 1);
    assert_eq!(store.revoke_key("ci").unwrap(), 0);
    assert!(!store.key_hash_is_active("hash1").unwrap());
    let events = store.events(Some("s1"), 10).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "create");
    let names: Vec<String> = store
        .list_templates()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(
        names,
        [
            BASE_TEMPLATE,
            INTERPRETER_TEMPLATE,
            DESKTOP_TEMPLATE,
            WASM_JS_TEMPLATE,
            WASM_PYTHON_TEMPLATE
        ]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn test_version_1_store_is_migrated_in_place() {
    let (store, dir) = temp_store();
    drop(store);
    let path = dir.join("airlock.db");
    {
        // The version-1 table: no `egress` column.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE sandboxes;
             CREATE TABLE sandboxes (id TEXT PRIMARY KEY, state TEXT NOT NULL, request TEXT NOT NULL,
                token_hash TEXT NOT NULL, live TEXT, created_ms INTEGER NOT NULL,
                deadline_ms INTEGER NOT NULL);
             INSERT INTO sandboxes VALUES ('old', 'running', '{}', 'h', '{}', 1, 2);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let row = store.get_sandbox("old").unwrap().unwrap();
    assert_eq!((row.state, row.egress), (RowState::Running, None));
    assert!(store.set_egress("old", "{}").unwrap());
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.get_sandbox("old").unwrap().unwrap().egress.as_deref(),
        Some("{}")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn test_events_are_trimmed_by_age_and_by_count_oldest_first() {
    let (store, dir) = temp_store();
    for n in 0..2500 {
        store.record_event(Some("s1"), "k", &n.to_string()).unwrap();
    }
    // More than one batch goes, and the newest rows stay.
    assert_eq!(store.trim_events(0, 1200).unwrap(), 1300);
    let kept = store.events(Some("s1"), 10_000).unwrap();
    assert_eq!(kept.len(), 1200);
    assert_eq!(kept[0].message, "1300");
    assert_eq!(kept[1199].message, "2499");
    assert_eq!(
        store.trim_events(0, 1200).unwrap(),
        0,
        "nothing more to trim"
    );
    // By age: everything recorded before now + 1 ms.
    assert_eq!(store.trim_events(now_ms() + 1, u64::MAX).unwrap(), 1200);
    assert!(store.events(None, 10).unwrap().is_empty());
    assert_eq!(
        store.trim_events(now_ms() + 1, 0).unwrap(),
        0,
        "an empty log"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn test_newer_schema_is_refused() {
    let (store, dir) = temp_store();
    store
        .conn()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(store);
    let err = Store::open(&dir.join("airlock.db")).unwrap_err();
    assert!(matches!(err, StoreError::TooNew { .. }), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
