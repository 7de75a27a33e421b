//! Templates and their builds: the `templates` table (schema version 4 added the built
//! templates' image, build and sandbox defaults), `builds` (one row per build, its progress as
//! JSON), `build_logs` (each build's log, bounded) and `build_cache` (a step's cache key and
//! the image it made).

use airlock_api::v1::{
    BuildFailure, BuildLogEntry, BuildState, BuildTemplateRequest, LogLevel, Resources, Template,
    TemplateBuild,
};
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, from_sql, now_ms, to_sql};

/// The most log lines one build keeps; later ones are dropped (the last line says so).
pub const MAX_LOG_LINES: u64 = 20_000;

/// A built template's sandbox defaults, stored as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    #[serde(default)]
    start_cmd: Option<String>,
    #[serde(default)]
    ready_cmd: Option<String>,
    #[serde(default)]
    ready_timeout_ms: Option<u64>,
    #[serde(default)]
    resources: Resources,
    #[serde(default)]
    policy: Option<Box<airlock_api::policy::PolicyDocument>>,
}

/// A template as stored: [`Template`] plus its family (the name without its tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRow {
    pub template: Template,
    pub family: String,
}

/// A build as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRow {
    pub build: TemplateBuild,
    pub request: BuildTemplateRequest,
}

/// What `builds.progress` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Progress {
    steps_done: u64,
    steps_cached: u64,
    steps_total: u64,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    reason: Option<BuildFailure>,
}

const TEMPLATE_COLUMNS: &str =
    "name, description, rootfs, builtin, family, image, build_id, spec, updated_ms";

fn template_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(TemplateRow, Option<String>)> {
    let name: String = row.get(0)?;
    let family: Option<String> = row.get(4)?;
    Ok((
        TemplateRow {
            family: family.unwrap_or_else(|| name.clone()),
            template: Template {
                name,
                description: row.get(1)?,
                rootfs: row.get(2)?,
                builtin: row.get::<_, i64>(3)? != 0,
                image: row.get(5)?,
                build_id: row.get(6)?,
                updated_at_ms: from_sql(row.get(8)?),
                ..Template::default()
            },
        },
        row.get(7)?,
    ))
}

fn with_spec((mut row, spec): (TemplateRow, Option<String>)) -> Result<TemplateRow, StoreError> {
    if let Some(spec) = spec {
        let spec: Spec = serde_json::from_str(&spec).map_err(|source| StoreError::Corrupt {
            id: row.template.name.clone(),
            source,
        })?;
        let t = &mut row.template;
        t.start_cmd = spec.start_cmd;
        t.ready_cmd = spec.ready_cmd;
        t.ready_timeout_ms = spec.ready_timeout_ms;
        t.resources = spec.resources;
        t.policy = spec.policy;
    }
    Ok(row)
}

fn build_state(text: &str) -> Result<BuildState, StoreError> {
    match text {
        "waiting" => Ok(BuildState::Waiting),
        "building" => Ok(BuildState::Building),
        "ready" => Ok(BuildState::Ready),
        "error" => Ok(BuildState::Error),
        other => Err(StoreError::BadState(other.to_owned())),
    }
}

type RawBuild = (String, String, String, String, String, i64, Option<i64>);

fn raw_build(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawBuild> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

fn parse_build(
    (id, template, state, request, progress, created_ms, finished_ms): RawBuild,
) -> Result<BuildRow, StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        id: id.clone(),
        source,
    };
    let request: BuildTemplateRequest = serde_json::from_str(&request).map_err(corrupt)?;
    let progress: Progress = serde_json::from_str(&progress).map_err(corrupt)?;
    Ok(BuildRow {
        build: TemplateBuild {
            template,
            state: build_state(&state)?,
            steps_done: progress.steps_done,
            steps_cached: progress.steps_cached,
            steps_total: progress.steps_total,
            image: progress.image,
            reason: progress.reason,
            created_at_ms: from_sql(created_ms),
            finished_at_ms: finished_ms.map(from_sql),
            id,
        },
        request,
    })
}

fn level(text: &str) -> LogLevel {
    match text {
        "debug" => LogLevel::Debug,
        "warn" => LogLevel::Warn,
        "error" => LogLevel::Error,
        _ => LogLevel::Info,
    }
}

impl Store {
    // --- templates ---

    /// A template by its exact name (`base`, `NAME:TAG`).
    pub fn get_template(&self, name: &str) -> Result<Option<Template>, StoreError> {
        Ok(self.get_template_row(name)?.map(|row| row.template))
    }

    pub fn get_template_row(&self, name: &str) -> Result<Option<TemplateRow>, StoreError> {
        // Once per create: through the statement cache, like the create path's writes.
        let raw = self
            .conn()
            .prepare_cached(&format!(
                "SELECT {TEMPLATE_COLUMNS} FROM templates WHERE name = ?1"
            ))?
            .query_row(params![name], template_row)
            .optional()?;
        raw.map(with_spec).transpose()
    }

    /// Every template, by name.
    pub fn list_templates(&self) -> Result<Vec<Template>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare(&format!(
                "SELECT {TEMPLATE_COLUMNS} FROM templates ORDER BY name"
            ))?;
            let rows = stmt.query_map([], template_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter()
            .map(|raw| with_spec(raw).map(|row| row.template))
            .collect()
    }

    /// The templates of a family (its tags), newest first.
    pub fn family_templates(&self, family: &str) -> Result<Vec<Template>, StoreError> {
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare(&format!(
                "SELECT {TEMPLATE_COLUMNS} FROM templates WHERE family = ?1 AND builtin = 0
                 ORDER BY updated_ms DESC, name"
            ))?;
            let rows = stmt.query_map(params![family], template_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter()
            .map(|raw| with_spec(raw).map(|row| row.template))
            .collect()
    }

    /// Inserts or replaces a built template.
    pub fn put_template(&self, template: &Template, family: &str) -> Result<(), StoreError> {
        let spec = Spec {
            start_cmd: template.start_cmd.clone(),
            ready_cmd: template.ready_cmd.clone(),
            ready_timeout_ms: template.ready_timeout_ms,
            resources: template.resources,
            policy: template.policy.clone(),
        };
        let spec = serde_json::to_string(&spec).map_err(|source| StoreError::Corrupt {
            id: template.name.clone(),
            source,
        })?;
        self.conn().execute(
            "INSERT INTO templates (name, description, rootfs, builtin, family, image, build_id, spec, updated_ms)
             VALUES (?1, ?2, NULL, 0, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(name) DO UPDATE SET description = excluded.description,
                 family = excluded.family, image = excluded.image, build_id = excluded.build_id,
                 spec = excluded.spec, updated_ms = excluded.updated_ms",
            params![
                template.name,
                template.description,
                family,
                template.image,
                template.build_id,
                spec,
                to_sql(template.updated_at_ms)
            ],
        )?;
        Ok(())
    }

    /// Deletes a built template (never a built-in one); returns whether it existed.
    pub fn delete_template(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.conn().execute(
            "DELETE FROM templates WHERE name = ?1 AND builtin = 0",
            params![name],
        )? == 1)
    }

    // --- builds ---

    pub fn insert_build(&self, row: &BuildRow) -> Result<(), StoreError> {
        let corrupt = |source| StoreError::Corrupt {
            id: row.build.id.clone(),
            source,
        };
        let request = serde_json::to_string(&row.request).map_err(corrupt)?;
        let progress = serde_json::to_string(&Progress {
            steps_total: row.build.steps_total,
            ..Progress::default()
        })
        .map_err(corrupt)?;
        self.conn().execute(
            "INSERT INTO builds (id, template, state, request, progress, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                row.build.id,
                row.build.template,
                row.build.state.as_str(),
                request,
                progress,
                to_sql(row.build.created_at_ms)
            ],
        )?;
        Ok(())
    }

    /// Stores the steps of a build accepted before them (E2B's trigger).
    pub fn set_build_request(
        &self,
        id: &str,
        request: &BuildTemplateRequest,
    ) -> Result<bool, StoreError> {
        let request = serde_json::to_string(request).map_err(|source| StoreError::Corrupt {
            id: id.to_owned(),
            source,
        })?;
        Ok(self.conn().execute(
            "UPDATE builds SET request = ?2 WHERE id = ?1",
            params![id, request],
        )? == 1)
    }

    /// Stores a build's state and progress (and its end, once finished).
    pub fn update_build(&self, build: &TemplateBuild) -> Result<(), StoreError> {
        let progress = serde_json::to_string(&Progress {
            steps_done: build.steps_done,
            steps_cached: build.steps_cached,
            steps_total: build.steps_total,
            image: build.image.clone(),
            reason: build.reason.clone(),
        })
        .map_err(|source| StoreError::Corrupt {
            id: build.id.clone(),
            source,
        })?;
        self.conn().execute(
            "UPDATE builds SET state = ?2, progress = ?3, finished_ms = ?4 WHERE id = ?1",
            params![
                build.id,
                build.state.as_str(),
                progress,
                build.finished_at_ms.map(to_sql)
            ],
        )?;
        Ok(())
    }

    pub fn get_build(&self, id: &str) -> Result<Option<BuildRow>, StoreError> {
        let raw = self
            .conn()
            .query_row(
                "SELECT id, template, state, request, progress, created_ms, finished_ms
                 FROM builds WHERE id = ?1",
                params![id],
                raw_build,
            )
            .optional()?;
        raw.map(parse_build).transpose()
    }

    /// Builds a daemon left unfinished: they fail, with a log line that says why.
    pub fn interrupt_builds(&self, message: &str) -> Result<Vec<String>, StoreError> {
        let ids: Vec<String> = {
            let conn = self.conn();
            let mut stmt =
                conn.prepare("SELECT id FROM builds WHERE state IN ('waiting', 'building')")?;
            let rows = stmt.query_map([], |row| row.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for id in &ids {
            if let Some(mut row) = self.get_build(id)? {
                row.build.state = BuildState::Error;
                row.build.finished_at_ms = Some(now_ms());
                row.build.reason = Some(BuildFailure {
                    message: message.to_owned(),
                    step: None,
                });
                self.update_build(&row.build)?;
                self.append_build_log(id, LogLevel::Error, None, message)?;
            }
        }
        Ok(ids)
    }

    /// Appends a line to a build's log; past [`MAX_LOG_LINES`] lines only the first that
    /// does not fit is kept, saying so.
    pub fn append_build_log(
        &self,
        build_id: &str,
        level: LogLevel,
        step: Option<&str>,
        message: &str,
    ) -> Result<(), StoreError> {
        let conn = self.conn();
        let next: i64 = conn.query_row(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM build_logs WHERE build_id = ?1",
            params![build_id],
            |row| row.get(0),
        )?;
        let next = from_sql(next);
        if next > MAX_LOG_LINES {
            return Ok(());
        }
        let (level, message) = if next == MAX_LOG_LINES {
            (
                LogLevel::Warn,
                "the build's log is full: later lines are dropped",
            )
        } else {
            (level, message)
        };
        conn.execute(
            "INSERT INTO build_logs (build_id, seq, at_ms, level, step, message)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                build_id,
                to_sql(next),
                to_sql(now_ms()),
                level.as_str(),
                step,
                message
            ],
        )?;
        Ok(())
    }

    /// At most `limit` lines of a build's log from `offset` on.
    pub fn build_logs(
        &self,
        build_id: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<BuildLogEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT seq, at_ms, level, step, message FROM build_logs
             WHERE build_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![build_id, to_sql(offset), to_sql(limit)], |row| {
            Ok(BuildLogEntry {
                offset: from_sql(row.get(0)?),
                at_ms: from_sql(row.get(1)?),
                level: level(&row.get::<_, String>(2)?),
                step: row.get(3)?,
                message: row.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // --- the build cache ---

    pub fn cached_step(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT image FROM build_cache WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .optional()?)
    }

    pub fn cache_step(&self, key: &str, image: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO build_cache (key, image, created_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(key) DO UPDATE SET image = excluded.image, created_ms = excluded.created_ms",
            params![key, image, to_sql(now_ms())],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "airlock-store-templates-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn test_version_3_store_is_migrated_to_built_templates() {
        let dir = temp_dir("v3");
        let path = dir.join("airlock.db");
        {
            // The version-3 templates table, with the seeded base row.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE templates (name TEXT PRIMARY KEY, description TEXT NOT NULL,
                    rootfs TEXT, builtin INTEGER NOT NULL);
                 INSERT INTO templates VALUES ('base', 'The host root, read-only', NULL, 1);
                 INSERT INTO templates VALUES ('old', 'a rootfs template', '/srv/root', 0);
                 PRAGMA user_version = 3;",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let old = store.get_template_row("old").unwrap().unwrap();
        assert_eq!(old.family, "old");
        assert_eq!(old.template.rootfs.as_deref(), Some("/srv/root"));
        assert_eq!(old.template.image, None);
        let built = Template {
            name: "web:v1".into(),
            description: "built".into(),
            image: Some("sha256:ab".into()),
            build_id: Some("b1".into()),
            start_cmd: Some("serve".into()),
            ready_cmd: Some("true".into()),
            resources: Resources {
                memory_bytes: Some(1 << 30),
                ..Resources::default()
            },
            updated_at_ms: 7,
            ..Template::default()
        };
        store.put_template(&built, "web").unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get_template("web:v1").unwrap(), Some(built.clone()));
        assert_eq!(store.family_templates("web").unwrap(), vec![built]);
        assert!(!store.delete_template("base").unwrap(), "built-in");
        assert!(store.delete_template("web:v1").unwrap());
        let version: i64 = store
            .conn()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, 4);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn test_builds_logs_and_cache_round_trip_and_unfinished_builds_fail_on_reopen() {
        let dir = temp_dir("builds");
        let path = dir.join("airlock.db");
        let store = Store::open(&path).unwrap();
        let mut row = BuildRow {
            build: TemplateBuild {
                id: "b1".into(),
                template: "web:latest".into(),
                state: BuildState::Building,
                steps_done: 0,
                steps_cached: 0,
                steps_total: 3,
                image: None,
                reason: None,
                created_at_ms: 5,
                finished_at_ms: None,
            },
            request: BuildTemplateRequest {
                name: "web".into(),
                ..BuildTemplateRequest::default()
            },
        };
        store.insert_build(&row).unwrap();
        row.build.steps_done = 2;
        row.build.steps_cached = 1;
        store.update_build(&row.build).unwrap();
        assert_eq!(store.get_build("b1").unwrap(), Some(row.clone()));
        for n in 0..3 {
            store
                .append_build_log("b1", LogLevel::Info, Some("1"), &format!("line {n}"))
                .unwrap();
        }
        let tail = store.build_logs("b1", 1, 10).unwrap();
        assert_eq!(tail.len(), 2);
        assert_eq!((tail[0].offset, tail[0].message.as_str()), (1, "line 1"));
        assert_eq!(tail[0].step.as_deref(), Some("1"));
        store.cache_step("k", "sha256:1").unwrap();
        store.cache_step("k", "sha256:2").unwrap();
        assert_eq!(store.cached_step("k").unwrap().as_deref(), Some("sha256:2"));
        assert_eq!(store.cached_step("other").unwrap(), None);
        let interrupted = store.interrupt_builds("interrupted").unwrap();
        assert_eq!(interrupted, vec!["b1".to_owned()]);
        let failed = store.get_build("b1").unwrap().unwrap().build;
        assert_eq!(failed.state, BuildState::Error);
        assert_eq!(failed.reason.unwrap().message, "interrupted");
        assert_eq!(store.build_logs("b1", 0, 10).unwrap().len(), 4);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
