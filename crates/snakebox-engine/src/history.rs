//! The runs table: who ran what, when, and how it ended, for every tracked call (a one-shot
//! run, a session cell, a session command). The web UI's run list and the audit log read
//! it; nothing on the path of a call waits for it.
//!
//! One SQLite database, `<data>/store-v1.db` (WAL), shared by the servers of a data
//! directory. A call is recorded when it is admitted (`running`) and again when it returns
//! its record (its status, duration, exit code); a server killed in between leaves rows that
//! the next server to open the store marks `interrupted`. Writes go through one writer
//! thread that gathers what is queued into one transaction (after a call's start, for a few
//! milliseconds, so a short call's two writes are one), so a run pays a channel send, not a
//! disk write; reads (listing a caller's runs) use their own connection. Every row has an
//! owner, and every read filters by it.
//!
//! What is kept is bounded: the newest [`MAX_ROWS`] runs, none older than [`MAX_AGE`], and
//! of each script its first [`MAX_SCRIPT_BYTES`] bytes. A store that cannot be opened or
//! written (a full disk) costs the history, never a run: it is logged and skipped.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use schemars::JsonSchema;
use serde::Serialize;

use std::collections::HashMap;

use crate::audit::{AuditEntry, AuditLog};
use crate::caller::Caller;
use crate::result::ExecutionResult;

/// The database file under the data directory.
const STORE_FILE: &str = "store-v1.db";
/// The schema version written to `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 2;
/// Runs kept, newest first.
pub(crate) const MAX_ROWS: u64 = 100_000;
/// Runs older than this are forgotten.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The part of each script (or command) that is kept.
pub(crate) const MAX_SCRIPT_BYTES: usize = 64 * 1024;
/// Largest result kept with a run (stdout and stderr are already bounded by the runner).
const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// Writes between two prunings of old rows.
const PRUNE_EVERY_WRITES: u64 = 1000;
/// How long the writer waits, after a call's `started`, for more before it writes: a short
/// call's `started` and `finished` go into one transaction rather than two, the first of
/// them no longer competing with the run. A `finished` (or any other operation) ends the
/// wait, so a call's record is readable as soon as its reply is out. Bounded by
/// [`MAX_BATCH`]; a shutdown ([`History::close`]) writes at once.
const GATHER: Duration = Duration::from_millis(5);
/// Most operations written in one transaction.
const MAX_BATCH: usize = 256;

/// What kind of call a run was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// `execute_python` without a session: a fresh sandbox.
    Execute,
    /// `execute_python` in a session: a cell of its interpreter.
    SessionCell,
    /// `run_command` in a session.
    Command,
}

impl RunKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunKind::Execute => "execute",
            RunKind::SessionCell => "session_cell",
            RunKind::Command => "command",
        }
    }

    fn parse(text: &str) -> RunKind {
        match text {
            "session_cell" => RunKind::SessionCell,
            "command" => RunKind::Command,
            _ => RunKind::Execute,
        }
    }
}

/// What is known of a call when it is admitted.
#[derive(Debug, Clone)]
pub(crate) struct RunStart {
    pub(crate) kind: RunKind,
    pub(crate) session_id: Option<String>,
    /// The script, the cell's code or the shell command.
    pub(crate) script: String,
    /// The `dependencies` argument (the script's own block is in the script).
    pub(crate) dependencies: Vec<String>,
    /// The profile the call asked for (or the server's default); `None` for session calls.
    pub(crate) profile: Option<String>,
}

/// Which of a caller's runs to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// At most this many.
    pub limit: usize,
    /// Only those older than this run (an execution id of the caller's): the next page.
    pub before: Option<String>,
    /// Only the cells and commands of this session.
    pub session_id: Option<String>,
}

/// One run as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RunRecord {
    /// The run's execution id (its artifacts' URIs carry it).
    pub execution_id: String,
    /// What kind of call it was.
    pub kind: RunKind,
    /// The session it ran in, if any.
    pub session_id: Option<String>,
    /// When it was admitted, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// `running` while it runs, `interrupted` if its server died first, else the result's
    /// status (`ok`, `error`, `timeout`, ...).
    pub status: String,
    /// Wall-clock milliseconds of the run itself (absent while running).
    pub duration_ms: Option<u64>,
    /// Milliseconds spent preparing its environment.
    pub setup_ms: Option<u64>,
    /// The process's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The Python version it ran with, when one was chosen.
    pub python_version: Option<String>,
    /// The `dependencies` argument it was called with.
    pub dependencies: Vec<String>,
    /// The script (or the cell's code, or the command), cut at 64 KiB.
    pub script: String,
    /// Whether `script` was cut.
    pub script_truncated: bool,
}

/// What the writer thread does.
enum Op {
    Started {
        id: String,
        owner: String,
        started_at_ms: u64,
        start: RunStart,
    },
    Finished {
        id: String,
        status: String,
        duration_ms: u64,
        setup_ms: u64,
        exit_code: Option<i32>,
        python_version: Option<String>,
        /// The result as JSON, when it fits in [`MAX_OUTPUT_BYTES`].
        output: Option<String>,
        events: Vec<crate::SecurityEvent>,
        usage: crate::ResourceUse,
        profile: Option<String>,
    },
    /// A call of a tool that runs no code (`check_environment`, `list_sessions`, ...): one
    /// audit line, no row.
    Call {
        id: String,
        tenant: String,
        tool: String,
        status: String,
    },
}

/// The runs table of a data directory.
pub(crate) struct History {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Op>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    reader: Mutex<Option<Connection>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    // Scripts may hold what a caller would not show other users of the host: the file (and
    // the journal files SQLite makes with the same mode) is the server user's alone.
    {
        use fs_err::os::unix::fs::OpenOptionsExt;
        use std::os::unix::fs::PermissionsExt;
        let private = || -> std::io::Result<()> {
            fs_err::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(path)?;
            fs_err::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        };
        private().map_err(|err| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(err.to_string()),
            )
        })?;
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL;
         CREATE TABLE IF NOT EXISTS runs (
             execution_id TEXT PRIMARY KEY,
             owner TEXT NOT NULL,
             kind TEXT NOT NULL,
             session_id TEXT,
             started_at_ms INTEGER NOT NULL,
             server_pid INTEGER NOT NULL,
             status TEXT NOT NULL,
             duration_ms INTEGER,
             setup_ms INTEGER,
             exit_code INTEGER,
             python_version TEXT,
             dependencies TEXT NOT NULL,
             script TEXT NOT NULL,
             script_truncated INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS runs_by_owner ON runs (owner, started_at_ms DESC);",
    )?;
    // Version 2 keeps each finished run's whole record (what the web UI shows): a column
    // added in place, empty for the runs recorded before.
    let has_output: bool = conn.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('runs') WHERE name = 'output'",
        [],
        |row| row.get(0),
    )?;
    if !has_output {
        conn.execute_batch("ALTER TABLE runs ADD COLUMN output TEXT")?;
    }
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(conn)
}

/// `running` rows of servers that are gone become `interrupted`.
fn mark_interrupted(conn: &Connection) -> rusqlite::Result<usize> {
    let pids: Vec<i64> = {
        let mut statement =
            conn.prepare("SELECT DISTINCT server_pid FROM runs WHERE status = 'running'")?;
        statement
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?
    };
    let mut marked = 0;
    for pid in pids {
        let alive =
            pid != i64::from(std::process::id()) && Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            marked += conn.execute(
                "UPDATE runs SET status = 'interrupted' WHERE status = 'running' AND server_pid = ?1",
                [pid],
            )?;
        }
    }
    Ok(marked)
}

fn prune(conn: &Connection) -> rusqlite::Result<()> {
    let oldest = now_ms().saturating_sub(u64::try_from(MAX_AGE.as_millis()).unwrap_or(0));
    conn.execute(
        "DELETE FROM runs WHERE started_at_ms < ?1 AND status != 'running'",
        [i64::try_from(oldest).unwrap_or(0)],
    )?;
    conn.execute(
        "DELETE FROM runs WHERE execution_id IN (
             SELECT execution_id FROM runs ORDER BY started_at_ms DESC LIMIT -1 OFFSET ?1)",
        [i64::try_from(MAX_ROWS).unwrap_or(i64::MAX)],
    )?;
    Ok(())
}

fn apply(conn: &Connection, op: &Op) -> rusqlite::Result<()> {
    match op {
        Op::Started {
            id,
            owner,
            started_at_ms,
            start,
        } => {
            let mut cut = start.script.len().min(MAX_SCRIPT_BYTES);
            while !start.script.is_char_boundary(cut) {
                cut -= 1;
            }
            // Cached: the two statements of every call are compiled once per connection.
            conn.prepare_cached(
                "INSERT OR REPLACE INTO runs (execution_id, owner, kind, session_id, started_at_ms,
                     server_pid, status, dependencies, script, script_truncated)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?8, ?9)",
            )?
            .execute(params![
                id,
                owner,
                start.kind.as_str(),
                start.session_id,
                i64::try_from(*started_at_ms).unwrap_or(i64::MAX),
                std::process::id(),
                serde_json::to_string(&start.dependencies).unwrap_or_else(|_| "[]".into()),
                &start.script[..cut],
                cut < start.script.len(),
            ])?;
        }
        Op::Finished {
            id,
            status,
            duration_ms,
            setup_ms,
            exit_code,
            python_version,
            output,
            ..
        } => {
            conn.prepare_cached(
                "UPDATE runs SET status = ?2, duration_ms = ?3, setup_ms = ?4, exit_code = ?5,
                     python_version = ?6, output = ?7
                 WHERE execution_id = ?1",
            )?
            .execute(params![
                id,
                status,
                i64::try_from(*duration_ms).unwrap_or(i64::MAX),
                i64::try_from(*setup_ms).unwrap_or(i64::MAX),
                exit_code,
                python_version,
                output,
            ])?;
        }
        Op::Call { .. } => {}
    }
    Ok(())
}

/// Who made a call that has started and not finished, for its `finished` audit line.
struct Pending {
    tenant: String,
    kind: RunKind,
    session_id: Option<String>,
}

/// The audit log's line for `op` (see [`crate::audit`]).
fn audit_entry(op: &Op, pending: &mut HashMap<String, Pending>) -> AuditEntry {
    match op {
        Op::Started {
            id,
            owner,
            started_at_ms,
            start,
        } => {
            pending.insert(
                id.clone(),
                Pending {
                    tenant: owner.clone(),
                    kind: start.kind,
                    session_id: start.session_id.clone(),
                },
            );
            AuditEntry {
                at_ms: *started_at_ms,
                phase: "started".into(),
                execution_id: id.clone(),
                tenant: owner.clone(),
                kind: start.kind.as_str().into(),
                session_id: start.session_id.clone(),
                code_sha256: Some(crate::audit::code_hash(&start.script)),
                code_bytes: Some(start.script.len() as u64),
                dependencies: start.dependencies.clone(),
                profile: start.profile.clone(),
                ..AuditEntry::default()
            }
        }
        Op::Finished {
            id,
            status,
            duration_ms,
            setup_ms,
            exit_code,
            python_version,
            events,
            usage,
            profile,
            ..
        } => {
            let who = pending.remove(id);
            AuditEntry {
                at_ms: now_ms(),
                phase: "finished".into(),
                execution_id: id.clone(),
                tenant: who.as_ref().map(|w| w.tenant.clone()).unwrap_or_default(),
                kind: who
                    .as_ref()
                    .map(|w| w.kind.as_str().to_owned())
                    .unwrap_or_default(),
                session_id: who.and_then(|w| w.session_id),
                status: Some(status.clone()),
                duration_ms: Some(*duration_ms),
                setup_ms: Some(*setup_ms),
                exit_code: *exit_code,
                python_version: python_version.clone(),
                resource_usage: Some(*usage)
                    .filter(|usage| *usage != crate::ResourceUse::default()),
                events: events.clone(),
                profile: profile.clone(),
                ..AuditEntry::default()
            }
        }
        Op::Call {
            id,
            tenant,
            tool,
            status,
        } => AuditEntry {
            at_ms: now_ms(),
            phase: "call".into(),
            execution_id: id.clone(),
            tenant: tenant.clone(),
            kind: "tool".into(),
            tool: Some(tool.clone()),
            status: Some(status.clone()),
            ..AuditEntry::default()
        },
    }
}

/// The writer: waits for an operation, then appends it to the audit log and applies it to
/// the runs table with everything queued behind it in one transaction. Ends when every
/// sender is gone. Without a runs table (it could not be opened) the audit log is still
/// written.
fn write_loop(mut conn: Option<Connection>, mut audit: AuditLog, ops: mpsc::Receiver<Op>) {
    let mut writes = 0u64;
    let mut pending = HashMap::new();
    while let Ok(first) = ops.recv() {
        let mut batch = vec![first];
        let until = std::time::Instant::now() + GATHER;
        // Gather only while the batch holds nothing but calls' starts: an end (or any other
        // write) is what a reader looks for next (a run's page right after its reply), so it
        // is written at once, with the starts gathered before it.
        while batch.len() < MAX_BATCH && batch.iter().all(|op| matches!(op, Op::Started { .. })) {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match ops.recv_timeout(left) {
                Ok(more) => batch.push(more),
                // Timed out, or every sender is gone (closing): write what there is.
                Err(_) => break,
            }
        }
        for op in &batch {
            audit.append(&audit_entry(op, &mut pending));
        }
        let Some(conn) = conn.as_mut() else {
            continue;
        };
        let written = conn.transaction().and_then(|tx| {
            for op in &batch {
                apply(&tx, op)?;
            }
            tx.commit()
        });
        if let Err(err) = written {
            tracing::warn!(%err, lost = batch.len(), "could not record runs in the store");
        }
        writes += batch.len() as u64;
        if writes >= PRUNE_EVERY_WRITES {
            writes = 0;
            if let Err(err) = prune(conn) {
                tracing::warn!(%err, "could not prune the runs table");
            }
        }
    }
}

fn record_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let dependencies: String = row.get("dependencies")?;
    let kind: String = row.get("kind")?;
    Ok(RunRecord {
        execution_id: row.get("execution_id")?,
        kind: RunKind::parse(&kind),
        session_id: row.get("session_id")?,
        started_at_ms: row
            .get::<_, i64>("started_at_ms")
            .map(|v| u64::try_from(v).unwrap_or(0))?,
        status: row.get("status")?,
        duration_ms: row
            .get::<_, Option<i64>>("duration_ms")?
            .and_then(|v| u64::try_from(v).ok()),
        setup_ms: row
            .get::<_, Option<i64>>("setup_ms")?
            .and_then(|v| u64::try_from(v).ok()),
        exit_code: row.get("exit_code")?,
        python_version: row.get("python_version")?,
        dependencies: serde_json::from_str(&dependencies).unwrap_or_default(),
        script: row.get("script")?,
        script_truncated: row.get("script_truncated")?,
    })
}

impl History {
    /// Open the store of `data_dir`, marking the runs of dead servers `interrupted`. Never
    /// fails: without a store, runs are not recorded (and that is logged).
    pub(crate) fn open(data_dir: &Path) -> History {
        let path = data_dir.join(STORE_FILE);
        let history = History {
            path: path.clone(),
            writer: Mutex::new(None),
            thread: Mutex::new(None),
            reader: Mutex::new(None),
        };
        let opened = fs_err::create_dir_all(data_dir)
            .map_err(|err| err.to_string())
            .and_then(|()| open(&path).map_err(|err| err.to_string()))
            .and_then(|conn| {
                mark_interrupted(&conn).map_err(|err| err.to_string())?;
                prune(&conn).map_err(|err| err.to_string())?;
                Ok(conn)
            });
        let writer = match opened {
            Ok(conn) => Some(conn),
            Err(err) => {
                tracing::warn!(%err, path = %path.display(), "the runs table is not available; runs are not recorded (the audit log still is)");
                None
            }
        };
        let audit = AuditLog::new(data_dir);
        let (send, receive) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("snakebox-history".into())
            .spawn(move || write_loop(writer, audit, receive));
        match thread {
            Ok(thread) => {
                *lock(&history.writer) = Some(send);
                *lock(&history.thread) = Some(thread);
            }
            Err(err) => tracing::warn!(%err, "could not start the runs table's writer"),
        }
        history
    }

    fn send(&self, op: Op) {
        if let Some(writer) = lock(&self.writer).as_ref() {
            // The writer only ends after `close`; a send after that is dropped.
            let _ = writer.send(op);
        }
    }

    /// A call was admitted.
    pub(crate) fn started(&self, id: &str, caller: &Caller, start: RunStart) {
        self.send(Op::Started {
            id: id.to_owned(),
            owner: caller.id().to_owned(),
            started_at_ms: now_ms(),
            start,
        });
    }

    /// A call returned its record.
    pub(crate) fn finished(&self, result: &ExecutionResult) {
        self.send(Op::Finished {
            id: result.execution_id.clone(),
            status: result.status.as_str().to_owned(),
            duration_ms: result.duration_ms,
            setup_ms: result.setup_ms,
            exit_code: result.exit_code,
            python_version: result.python_version.clone(),
            output: serde_json::to_string(result)
                .ok()
                .filter(|json| json.len() <= MAX_OUTPUT_BYTES),
            events: result.events.clone(),
            usage: result.resource_usage,
            profile: result.profile.clone(),
        });
    }

    /// Record a call of a tool that runs no code: an audit line (when, tenant, tool, status).
    pub(crate) fn tool_call(&self, caller: &Caller, tool: &str, status: &str) {
        self.send(Op::Call {
            id: crate::ids::execution_id(),
            tenant: caller.id().to_owned(),
            tool: tool.to_owned(),
            status: status.to_owned(),
        });
    }

    /// Write what is queued and stop the writer (bounded: the writer applies what it has).
    pub(crate) fn close(&self) {
        drop(lock(&self.writer).take());
        if let Some(thread) = lock(&self.thread).take()
            && thread.join().is_err()
        {
            tracing::warn!("the runs table's writer panicked");
        }
    }

    fn read<T>(&self, query: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        let mut reader = lock(&self.reader);
        if reader.is_none() {
            *reader = Connection::open(&self.path)
                .and_then(|conn| {
                    conn.busy_timeout(Duration::from_secs(5))?;
                    Ok(conn)
                })
                .map_err(|err| tracing::debug!(%err, "the runs table cannot be read"))
                .ok();
        }
        let conn = reader.as_ref()?;
        query(conn)
            .map_err(|err| tracing::warn!(%err, "could not read the runs table"))
            .ok()
    }

    /// `caller`'s newest runs, newest first.
    pub(crate) fn list(&self, caller: &Caller, query: &RunQuery) -> Vec<RunRecord> {
        self.read(|conn| {
            // `before` names a run of the caller's: only runs older than it (the next page);
            // an unknown id compares with NULL, so the page is empty.
            let mut statement = conn.prepare(
                "SELECT * FROM runs WHERE owner = ?1
                   AND (?2 IS NULL OR session_id = ?2)
                   AND (?3 IS NULL OR (started_at_ms, rowid) <
                        (SELECT started_at_ms, rowid FROM runs WHERE owner = ?1 AND execution_id = ?3))
                 ORDER BY started_at_ms DESC, rowid DESC LIMIT ?4",
            )?;
            statement
                .query_map(
                    params![
                        caller.id(),
                        query.session_id,
                        query.before,
                        i64::try_from(query.limit).unwrap_or(i64::MAX)
                    ],
                    record_of,
                )?
                .collect()
        })
        .unwrap_or_default()
    }

    /// The result a finished run of `caller`'s returned, as JSON (`None` for another
    /// caller's run, one still running, one recorded before results were kept, or one whose
    /// result was larger than [`MAX_OUTPUT_BYTES`]).
    pub(crate) fn output(&self, caller: &Caller, id: &str) -> Option<String> {
        self.read(|conn| {
            conn.query_row(
                "SELECT output FROM runs WHERE owner = ?1 AND execution_id = ?2",
                params![caller.id(), id],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()
        })
        .flatten()
        .flatten()
    }

    /// One of `caller`'s runs (another caller's is `None`, as if it did not exist).
    pub(crate) fn get(&self, caller: &Caller, id: &str) -> Option<RunRecord> {
        self.read(|conn| {
            conn.query_row(
                "SELECT * FROM runs WHERE owner = ?1 AND execution_id = ?2",
                params![caller.id(), id],
                record_of,
            )
            .optional()
        })
        .flatten()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Status;

    fn start(script: &str) -> RunStart {
        RunStart {
            kind: RunKind::Execute,
            session_id: None,
            script: script.into(),
            dependencies: vec!["six==1.16.0".into()],
            profile: None,
        }
    }

    fn newest(limit: usize) -> RunQuery {
        RunQuery {
            limit,
            ..RunQuery::default()
        }
    }

    #[test]
    fn pages_go_back_in_time_and_a_session_lists_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let history = History::open(dir.path());
        let a = Caller::tenant("a").unwrap();
        for i in 0..5 {
            let mut run = start("1");
            if i % 2 == 0 {
                run.session_id = Some("s-1".into());
            }
            history.started(&format!("r{i}"), &a, run);
        }
        history.close();
        let ids = |query: RunQuery| -> Vec<String> {
            history
                .list(&a, &query)
                .into_iter()
                .map(|r| r.execution_id)
                .collect()
        };
        assert_eq!(ids(newest(2)), ["r4", "r3"]);
        let next = RunQuery {
            before: Some("r3".into()),
            ..newest(2)
        };
        assert_eq!(ids(next), ["r2", "r1"]);
        let last = RunQuery {
            before: Some("r1".into()),
            ..newest(2)
        };
        assert_eq!(ids(last), ["r0"]);
        let session = RunQuery {
            session_id: Some("s-1".into()),
            ..newest(10)
        };
        assert_eq!(ids(session), ["r4", "r2", "r0"]);
        // Another caller's run as the cursor: nothing (it is not found for this caller).
        let b = Caller::tenant("b").unwrap();
        assert!(
            history
                .list(
                    &b,
                    &RunQuery {
                        before: Some("r3".into()),
                        ..newest(10)
                    }
                )
                .is_empty()
        );
    }

    #[test]
    fn records_a_run_from_start_to_end_for_its_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let history = History::open(dir.path());
        let a = Caller::tenant("a").unwrap();
        let b = Caller::tenant("b").unwrap();
        history.started("r1", &a, start("print(1)"));
        let mut result = ExecutionResult::new("r1".into(), Status::Ok);
        result.duration_ms = 12;
        result.exit_code = Some(0);
        result.python_version = Some("3.11.2".into());
        result.stdout = "1\n".into();
        history.finished(&result);
        history.started("r2", &a, start(&"é".repeat(MAX_SCRIPT_BYTES)));
        history.close();

        let listed = history.list(&a, &newest(10));
        assert_eq!(listed.len(), 2, "{listed:?}");
        let r1 = history.get(&a, "r1").unwrap();
        assert_eq!(r1.status, "ok");
        assert_eq!(r1.duration_ms, Some(12));
        assert_eq!(r1.exit_code, Some(0));
        assert_eq!(r1.dependencies, vec!["six==1.16.0".to_owned()]);
        let r2 = history.get(&a, "r2").unwrap();
        assert_eq!(r2.status, "running");
        assert!(r2.script_truncated && r2.script.len() <= MAX_SCRIPT_BYTES);
        // The whole result is kept once it ends.
        let output: serde_json::Value =
            serde_json::from_str(&history.output(&a, "r1").unwrap()).unwrap();
        assert_eq!(output["stdout"], "1\n");
        assert!(history.output(&a, "r2").is_none());
        // Another caller sees nothing, and gets nothing by id.
        assert!(history.list(&b, &newest(10)).is_empty());
        assert!(history.get(&b, "r1").is_none());
        assert!(history.output(&b, "r1").is_none());
    }

    #[test]
    fn running_rows_of_a_dead_server_are_interrupted_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join(STORE_FILE)).unwrap();
        conn.execute(
            "INSERT INTO runs (execution_id, owner, kind, started_at_ms, server_pid, status,
                 dependencies, script, script_truncated)
             VALUES ('dead', 'local', 'execute', ?1, ?2, 'running', '[]', 'x', 0)",
            params![i64::try_from(now_ms()).unwrap(), i64::from(i32::MAX)],
        )
        .unwrap();
        drop(conn);
        let history = History::open(dir.path());
        let record = history.get(&Caller::local(), "dead").unwrap();
        assert_eq!(record.status, "interrupted");
    }

    #[test]
    fn a_version_1_store_gains_the_output_column() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join(STORE_FILE)).unwrap();
        conn.execute_batch(
            "CREATE TABLE runs (execution_id TEXT PRIMARY KEY, owner TEXT NOT NULL,
                 kind TEXT NOT NULL, session_id TEXT, started_at_ms INTEGER NOT NULL,
                 server_pid INTEGER NOT NULL, status TEXT NOT NULL, duration_ms INTEGER,
                 setup_ms INTEGER, exit_code INTEGER, python_version TEXT,
                 dependencies TEXT NOT NULL, script TEXT NOT NULL,
                 script_truncated INTEGER NOT NULL);
",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (execution_id, owner, kind, started_at_ms, server_pid, status,
                 dependencies, script, script_truncated)
             VALUES ('old', 'local', 'execute', ?1, 1, 'ok', '[]', 'x', 0)",
            params![i64::try_from(now_ms()).unwrap()],
        )
        .unwrap();
        drop(conn);
        let history = History::open(dir.path());
        assert_eq!(history.get(&Caller::local(), "old").unwrap().status, "ok");
        assert!(history.output(&Caller::local(), "old").is_none());
        history.started("new", &Caller::local(), start("print(1)"));
        history.finished(&ExecutionResult::new("new".into(), Status::Ok));
        history.close();
        assert!(history.output(&Caller::local(), "new").is_some());
    }

    #[test]
    fn the_store_is_private_to_the_server_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let history = History::open(dir.path());
        history.started("r1", &Caller::local(), start("secret = 1"));
        history.close();
        let mode = fs_err::metadata(dir.path().join(STORE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    #[test]
    fn an_unwritable_store_costs_the_history_not_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        // The store's path is a directory: it cannot be opened.
        fs_err::create_dir_all(dir.path().join(STORE_FILE)).unwrap();
        let history = History::open(dir.path());
        history.started("r1", &Caller::local(), start("print(1)"));
        history.close();
        assert!(history.list(&Caller::local(), &newest(10)).is_empty());
    }
}
