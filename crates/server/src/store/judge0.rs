//! The `judge0_submissions` table (additive: created if missing, no schema version of its own): the Judge0 API's submissions, which
//! are also its queue. A submission is inserted `In Queue` (1), claimed `Processing` (2) by a
//! worker in one transaction, and finished with its outcome; a daemon that starts puts every
//! `Processing` row back in the queue (its sandbox is gone or about to be), so the queue
//! survives any restart. Texts are BLOBs (programs may print any bytes).

use rusqlite::{OptionalExtension, Row, params};

use super::{Store, StoreError, from_sql, to_sql};
use crate::judge0::status::Status;
use crate::judge0::submission::{Outcome, Params, Submission, Texts};

/// Run at every open; `IF NOT EXISTS` makes it safe on any store of version 3.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS judge0_submissions (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    token            TEXT NOT NULL UNIQUE,
    status_id        INTEGER NOT NULL,
    params           TEXT NOT NULL,
    outcome          TEXT NOT NULL,
    source_code      BLOB,
    stdin            BLOB,
    expected_output  BLOB,
    additional_files BLOB,
    stdout           BLOB,
    stderr           BLOB,
    compile_output   BLOB,
    sandbox_id       TEXT,
    created_ms       INTEGER NOT NULL,
    finished_ms      INTEGER
);
CREATE INDEX IF NOT EXISTS judge0_by_status ON judge0_submissions (status_id, seq);
";

const COLUMNS: &str = "token, status_id, params, outcome, source_code, stdin, expected_output,
    additional_files, stdout, stderr, compile_output, created_ms, finished_ms";

/// Rows one trimming statement deletes at most.
const TRIM_BATCH: i64 = 500;

type Raw = (
    String,
    i64,
    String,
    String,
    [Option<Vec<u8>>; 7],
    i64,
    Option<i64>,
);

fn raw(row: &Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        [
            row.get(4)?,
            row.get(5)?,
            row.get(6)?,
            row.get(7)?,
            row.get(8)?,
            row.get(9)?,
            row.get(10)?,
        ],
        row.get(11)?,
        row.get(12)?,
    ))
}

fn parse(
    (token, status_id, params, outcome, texts, created_ms, finished_ms): Raw,
) -> Result<Submission, StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        id: token.clone(),
        source,
    };
    let params: Params = serde_json::from_str(&params).map_err(corrupt)?;
    let outcome: Outcome = serde_json::from_str(&outcome).map_err(corrupt)?;
    let status = Status::from_id(status_id)
        .ok_or_else(|| StoreError::BadState(format!("judge0 status {status_id}")))?;
    let [
        source_code,
        stdin,
        expected_output,
        additional_files,
        stdout,
        stderr,
        compile_output,
    ] = texts;
    Ok(Submission {
        token,
        status,
        params,
        texts: Texts {
            source_code,
            stdin,
            expected_output,
            additional_files,
            stdout,
            stderr,
            compile_output,
        },
        outcome,
        created_ms: from_sql(created_ms),
        finished_ms: finished_ms.map(from_sql),
    })
}

fn encode<T: serde::Serialize>(token: &str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Corrupt {
        id: token.to_owned(),
        source,
    })
}

impl Store {
    /// Queues `submissions` in one transaction unless the queue would then hold more than
    /// `max_queued`; returns whether they were queued.
    pub fn judge0_enqueue(
        &self,
        submissions: &[Submission],
        max_queued: u64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let queued: i64 = tx.query_row(
            "SELECT COUNT(*) FROM judge0_submissions WHERE status_id = 1",
            [],
            |row| row.get(0),
        )?;
        let wanted = from_sql(queued).saturating_add(submissions.len() as u64);
        if wanted > max_queued {
            return Ok(false);
        }
        for s in submissions {
            let t = &s.texts;
            tx.execute(
                "INSERT INTO judge0_submissions (token, status_id, params, outcome, source_code,
                    stdin, expected_output, additional_files, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    s.token,
                    s.status.id(),
                    encode(&s.token, &s.params)?,
                    encode(&s.token, &s.outcome)?,
                    t.source_code,
                    t.stdin,
                    t.expected_output,
                    t.additional_files,
                    to_sql(s.created_ms)
                ],
            )?;
        }
        tx.commit()?;
        Ok(true)
    }

    /// Takes the oldest queued submission and marks it `Processing`.
    pub fn judge0_claim(&self) -> Result<Option<Submission>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let found = tx
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM judge0_submissions WHERE status_id = 1
                     ORDER BY seq LIMIT 1"
                ),
                [],
                raw,
            )
            .optional()?;
        let Some(found) = found else {
            return Ok(None);
        };
        tx.execute(
            "UPDATE judge0_submissions SET status_id = 2 WHERE token = ?1",
            params![found.0],
        )?;
        tx.commit()?;
        let mut submission = parse(found)?;
        submission.status = Status::Processing;
        Ok(Some(submission))
    }

    /// Records the sandbox a `Processing` submission runs in (or none any more).
    pub fn judge0_set_sandbox(&self, token: &str, sandbox: Option<&str>) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE judge0_submissions SET sandbox_id = ?2 WHERE token = ?1",
            params![token, sandbox],
        )?;
        Ok(())
    }

    /// Stores a finished submission's status, outcome and outputs.
    pub fn judge0_finish(&self, s: &Submission) -> Result<(), StoreError> {
        let t = &s.texts;
        self.conn().execute(
            "UPDATE judge0_submissions SET status_id = ?2, outcome = ?3, stdout = ?4,
                stderr = ?5, compile_output = ?6, finished_ms = ?7, sandbox_id = NULL
             WHERE token = ?1",
            params![
                s.token,
                s.status.id(),
                encode(&s.token, &s.outcome)?,
                t.stdout,
                t.stderr,
                t.compile_output,
                s.finished_ms.map(to_sql)
            ],
        )?;
        Ok(())
    }

    pub fn judge0_get(&self, token: &str) -> Result<Option<Submission>, StoreError> {
        let found = self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM judge0_submissions WHERE token = ?1"),
                params![token],
                raw,
            )
            .optional()?;
        found.map(parse).transpose()
    }

    /// A page of submissions, newest first, and how many there are.
    pub fn judge0_list(
        &self,
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<Submission>, u64), StoreError> {
        let (raws, total) = {
            let conn = self.conn();
            let total: i64 =
                conn.query_row("SELECT COUNT(*) FROM judge0_submissions", [], |r| r.get(0))?;
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM judge0_submissions ORDER BY seq DESC LIMIT ?1 OFFSET ?2"
            ))?;
            let rows = stmt.query_map(params![to_sql(limit), to_sql(offset)], raw)?;
            (rows.collect::<Result<Vec<_>, _>>()?, total)
        };
        let submissions = raws.into_iter().map(parse).collect::<Result<_, _>>()?;
        Ok((submissions, from_sql(total)))
    }

    /// Puts every `Processing` submission back in the queue (at start-up: no worker runs
    /// yet) and returns their tokens and the sandboxes they were recorded to run in.
    pub fn judge0_requeue(&self) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let rows = {
            let mut stmt =
                tx.prepare("SELECT token, sandbox_id FROM judge0_submissions WHERE status_id = 2")?;
            let rows = stmt.query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        tx.execute(
            "UPDATE judge0_submissions SET status_id = 1, sandbox_id = NULL WHERE status_id = 2",
            [],
        )?;
        tx.commit()?;
        let sandboxes = rows.iter().filter_map(|(_, s)| s.clone()).collect();
        Ok((rows.into_iter().map(|(t, _)| t).collect(), sandboxes))
    }

    /// How many submissions wait and how many run.
    pub fn judge0_counts(&self) -> Result<(u64, u64), StoreError> {
        let conn = self.conn();
        let count = |status: i64| -> Result<u64, StoreError> {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM judge0_submissions WHERE status_id = ?1",
                params![status],
                |row| row.get(0),
            )?;
            Ok(from_sql(n))
        };
        Ok((count(1)?, count(2)?))
    }

    /// Deletes finished submissions that finished before `older_than_ms`, a batch at a time;
    /// returns how many went.
    pub fn judge0_trim(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        let mut deleted = 0;
        loop {
            let changed = self.conn().execute(
                "DELETE FROM judge0_submissions WHERE seq IN (
                     SELECT seq FROM judge0_submissions
                     WHERE status_id > 2 AND finished_ms < ?1 ORDER BY seq LIMIT ?2)",
                params![to_sql(older_than_ms), TRIM_BATCH],
            )?;
            deleted += changed as u64;
            if changed == 0 {
                return Ok(deleted);
            }
        }
    }
}
