//! The runs table in the deployment's PostgreSQL (`snakebox_runs`): the SQLite table's
//! columns, plus the host of the server that recorded a run (`server_host`), because with
//! several fronts a server's pid means something only on its own host: a `running` row is
//! marked `interrupted` by the next server to start on the host that ran it. `seq` orders
//! rows as SQLite's `rowid` does.
//!
//! What a tenant keeps is bounded by the same code as in SQLite ([`super::RunsBudget`]): only
//! the tenant's own oldest finished rows are removed. Other fronts write the same rows, so
//! each tenant's holdings are read afresh at every batch ([`RunsTable::shared`]): from
//! `snakebox_runs_usage`, one row per tenant kept by a trigger on every insert, update and
//! delete of its runs (whichever front made them), so the read costs one row, not a count of
//! the tenant's runs.

use super::{Op, RunKind, RunQuery, RunRecord, RunsTable, TableError, server_gone, to_i64};
use crate::budget::Usage;
use crate::shared::PgStore;
use crate::shared::postgres::{host_name, pg_text};

/// The runs table of one PostgreSQL database.
pub(crate) struct PgRuns {
    store: PgStore,
    host: String,
}

impl PgRuns {
    pub(crate) fn new(store: PgStore) -> PgRuns {
        PgRuns {
            store,
            host: host_name(),
        }
    }
}

/// One write of a batch, owned (it crosses to the connections' runtime).
enum Write {
    Start {
        id: String,
        owner: String,
        kind: &'static str,
        session_id: Option<String>,
        started_at_ms: i64,
        dependencies: String,
        script: String,
        script_truncated: bool,
        script_bytes: i64,
        script_sha256: String,
        row_bytes: i64,
    },
    Finish {
        id: String,
        status: String,
        duration_ms: i64,
        setup_ms: i64,
        exit_code: Option<i32>,
        python_version: Option<String>,
        output: Option<String>,
        added_bytes: i64,
    },
}

fn write_of(op: &Op) -> Option<Write> {
    match op {
        Op::Started {
            id,
            owner,
            started_at_ms,
            start,
        } => Some(Write::Start {
            id: id.clone(),
            owner: owner.clone(),
            kind: start.kind.as_str(),
            session_id: start.session_id.as_deref().map(|s| pg_text(s).into_owned()),
            started_at_ms: to_i64(*started_at_ms),
            dependencies: start.dependencies_json(),
            script: pg_text(&start.script).into_owned(),
            script_truncated: (start.script.len() as u64) < start.script_bytes,
            script_bytes: to_i64(start.script_bytes),
            script_sha256: start.script_sha256.clone(),
            row_bytes: to_i64(start.row_bytes()),
        }),
        Op::Finished {
            ticket,
            status,
            duration_ms,
            setup_ms,
            exit_code,
            python_version,
            output,
            ..
        } => Some(Write::Finish {
            id: ticket.id.clone(),
            status: status.clone(),
            duration_ms: to_i64(*duration_ms),
            setup_ms: to_i64(*setup_ms),
            exit_code: *exit_code,
            python_version: python_version.as_deref().map(|s| pg_text(s).into_owned()),
            added_bytes: to_i64(output.as_ref().map_or(0, |o| o.len() as u64)),
            // JSON: a NUL is escaped in it.
            output: output.clone(),
        }),
        Op::Call { .. } => None,
    }
}

/// The columns a record is read from, in [`record_of`]'s order.
const COLUMNS: &str = "execution_id, kind, session_id, started_at_ms, status, duration_ms, setup_ms,
     exit_code, python_version, dependencies, script, script_truncated, script_bytes, script_sha256";

fn record_of(row: &tokio_postgres::Row) -> RunRecord {
    let kind: String = row.get(1);
    let dependencies: String = row.get(9);
    let unsigned = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    RunRecord {
        execution_id: row.get(0),
        kind: RunKind::parse(&kind),
        session_id: row.get(2),
        started_at_ms: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
        status: row.get(4),
        duration_ms: unsigned(row.get(5)),
        setup_ms: unsigned(row.get(6)),
        exit_code: row.get(7),
        python_version: row.get(8),
        dependencies: serde_json::from_str(&dependencies).unwrap_or_default(),
        script: row.get(10),
        script_truncated: row.get(11),
        script_bytes: unsigned(row.get(12)),
        script_sha256: row.get(13),
    }
}

impl RunsTable for PgRuns {
    fn mark_interrupted(&mut self) -> Result<usize, TableError> {
        let host = self.host.clone();
        let marked = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            let pids: Vec<i64> = client
                .query(
                    "SELECT DISTINCT server_pid FROM snakebox_runs
                     WHERE status = 'running' AND server_host = $1",
                    &[&host],
                )
                .await
                .map_err(|e| conn.failed(e))?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let mut marked = 0;
            for pid in pids.into_iter().filter(|pid| server_gone(*pid)) {
                marked += client
                    .execute(
                        "UPDATE snakebox_runs SET status = 'interrupted'
                         WHERE status = 'running' AND server_host = $1 AND server_pid = $2",
                        &[&host, &pid],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
            }
            Ok(usize::try_from(marked).unwrap_or(usize::MAX))
        })?;
        Ok(marked)
    }

    fn prune(&mut self, oldest_ms: u64) -> Result<(), TableError> {
        let oldest = to_i64(oldest_ms);
        self.store.block(move |conn| async move {
            let client = conn.client().await?;
            client
                .execute(
                    "DELETE FROM snakebox_runs WHERE started_at_ms < $1 AND status != 'running'",
                    &[&oldest],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(())
        })?;
        Ok(())
    }

    fn write(&mut self, batch: &[Op]) -> Result<(), TableError> {
        let writes: Vec<Write> = batch.iter().filter_map(write_of).collect();
        if writes.is_empty() {
            return Ok(());
        }
        let host = self.host.clone();
        let pid = i64::from(std::process::id());
        self.store.block(move |conn| async move {
            let mut client = conn.client().await?;
            let tx = client.transaction().await.map_err(|e| conn.failed(e))?;
            for write in &writes {
                match write {
                    Write::Start {
                        id,
                        owner,
                        kind,
                        session_id,
                        started_at_ms,
                        dependencies,
                        script,
                        script_truncated,
                        script_bytes,
                        script_sha256,
                        row_bytes,
                    } => {
                        tx.execute(
                            "INSERT INTO snakebox_runs (execution_id, owner, kind, session_id,
                                 started_at_ms, server_host, server_pid, status, dependencies,
                                 script, script_truncated, script_bytes, script_sha256, row_bytes)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, $9, $10, $11, $12, $13)
                             ON CONFLICT (execution_id) DO UPDATE SET owner = EXCLUDED.owner,
                                 kind = EXCLUDED.kind, session_id = EXCLUDED.session_id,
                                 started_at_ms = EXCLUDED.started_at_ms,
                                 server_host = EXCLUDED.server_host,
                                 server_pid = EXCLUDED.server_pid, status = 'running',
                                 duration_ms = NULL, setup_ms = NULL, exit_code = NULL,
                                 python_version = NULL, output = NULL,
                                 dependencies = EXCLUDED.dependencies, script = EXCLUDED.script,
                                 script_truncated = EXCLUDED.script_truncated,
                                 script_bytes = EXCLUDED.script_bytes,
                                 script_sha256 = EXCLUDED.script_sha256,
                                 row_bytes = EXCLUDED.row_bytes",
                            &[
                                id,
                                owner,
                                kind,
                                session_id,
                                started_at_ms,
                                &host,
                                &pid,
                                dependencies,
                                script,
                                script_truncated,
                                script_bytes,
                                script_sha256,
                                row_bytes,
                            ],
                        )
                        .await
                        .map_err(|e| conn.failed(e))?;
                    }
                    Write::Finish {
                        id,
                        status,
                        duration_ms,
                        setup_ms,
                        exit_code,
                        python_version,
                        output,
                        added_bytes,
                    } => {
                        tx.execute(
                            "UPDATE snakebox_runs SET status = $2, duration_ms = $3, setup_ms = $4,
                                 exit_code = $5, python_version = $6, output = $7,
                                 row_bytes = row_bytes + $8
                             WHERE execution_id = $1",
                            &[
                                id,
                                status,
                                duration_ms,
                                setup_ms,
                                exit_code,
                                python_version,
                                output,
                                added_bytes,
                            ],
                        )
                        .await
                        .map_err(|e| conn.failed(e))?;
                    }
                }
            }
            tx.commit().await.map_err(|e| conn.failed(e))
        })?;
        Ok(())
    }

    fn count(&mut self, owner: &str) -> Result<Usage, TableError> {
        let owner = owner.to_owned();
        let usage = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            let row = client
                .query_opt(
                    "SELECT items, bytes FROM snakebox_runs_usage WHERE owner = $1",
                    &[&owner],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(row.map_or(Usage::default(), |row| Usage {
                items: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                bytes: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
            }))
        })?;
        Ok(usage)
    }

    fn oldest_finished(
        &mut self,
        owner: &str,
        limit: i64,
    ) -> Result<Vec<(i64, Usage)>, TableError> {
        let owner = owner.to_owned();
        let oldest = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            let rows = client
                .query(
                    "SELECT seq, row_bytes FROM snakebox_runs
                     WHERE owner = $1 AND status != 'running'
                     ORDER BY started_at_ms, seq LIMIT $2",
                    &[&owner, &limit],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(rows
                .iter()
                .map(|row| {
                    (
                        row.get::<_, i64>(0),
                        Usage::one(u64::try_from(row.get::<_, i64>(1)).unwrap_or(0)),
                    )
                })
                .collect())
        })?;
        Ok(oldest)
    }

    fn delete(&mut self, rows: &[i64]) -> Result<(), TableError> {
        let rows = rows.to_vec();
        self.store.block(move |conn| async move {
            let client = conn.client().await?;
            client
                .execute("DELETE FROM snakebox_runs WHERE seq = ANY($1)", &[&rows])
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(())
        })?;
        Ok(())
    }

    fn list(&mut self, owner: &str, query: &RunQuery) -> Result<Vec<RunRecord>, TableError> {
        let owner = owner.to_owned();
        let query = query.clone();
        let records = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            // `before` names a run of the caller's: only runs older than it (the next page);
            // an unknown id compares with NULL, so the page is empty.
            let rows = client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM snakebox_runs WHERE owner = $1
                           AND ($2::TEXT IS NULL OR session_id = $2)
                           AND ($3::TEXT IS NULL OR (started_at_ms, seq) <
                                (SELECT started_at_ms, seq FROM snakebox_runs
                                 WHERE owner = $1 AND execution_id = $3))
                         ORDER BY started_at_ms DESC, seq DESC LIMIT $4"
                    ),
                    &[
                        &owner,
                        &query.session_id,
                        &query.before,
                        &i64::try_from(query.limit).unwrap_or(i64::MAX),
                    ],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(rows.iter().map(record_of).collect())
        })?;
        Ok(records)
    }

    fn get(&mut self, owner: &str, id: &str) -> Result<Option<RunRecord>, TableError> {
        let (owner, id) = (owner.to_owned(), id.to_owned());
        let record = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            let row = client
                .query_opt(
                    &format!(
                        "SELECT {COLUMNS} FROM snakebox_runs WHERE owner = $1 AND execution_id = $2"
                    ),
                    &[&owner, &id],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(row.as_ref().map(record_of))
        })?;
        Ok(record)
    }

    fn output(&mut self, owner: &str, id: &str) -> Result<Option<String>, TableError> {
        let (owner, id) = (owner.to_owned(), id.to_owned());
        let output = self.store.block(move |conn| async move {
            let client = conn.client().await?;
            let row = client
                .query_opt(
                    "SELECT output FROM snakebox_runs WHERE owner = $1 AND execution_id = $2",
                    &[&owner, &id],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(row.and_then(|row| row.get::<_, Option<String>>(0)))
        })?;
        Ok(output)
    }

    fn shared(&self) -> bool {
        true
    }
}
