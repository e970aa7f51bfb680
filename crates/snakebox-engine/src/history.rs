//! The runs table: who ran what, when, and how it ended, for every tracked call (a one-shot
//! run, a session cell, a session command). The web UI's run list and the audit log read
//! it; nothing on the path of a call waits for it.
//!
//! One SQLite database, `<data>/store-v1.db` (WAL), shared by the servers of a data
//! directory; or, with `--database postgres://…`, the deployment's PostgreSQL, shared by
//! every front ([`crate::shared`]; the table behind the [`RunsTable`] seam, the rest here). A call is recorded when it is admitted (`running`) and again when it returns
//! its record (its status, duration, exit code); a server killed in between leaves rows that
//! the next server to open the store marks `interrupted`. Writes go through one writer
//! thread that gathers what is queued into one transaction (after a call's start, for a few
//! milliseconds, so a short call's two writes are one), so a run pays a queue push, not a
//! disk write; reads (listing a caller's runs) use their own connection. Every row has an
//! owner, and every read filters by it.
//!
//! Every row is bounded, whatever the call carried: of its script (or command) the first
//! [`MAX_SCRIPT_BYTES`] with the whole script's size and SHA-256, its dependencies and session
//! id cut as the audit log cuts them ([`crate::audit::cap_text`]), its result only when it
//! fits in [`MAX_OUTPUT_BYTES`]. What is kept is bounded per tenant
//! ([`crate::StoreBudgets::history`]: rows and bytes): past it, the tenant's own oldest
//! finished runs are removed, never another tenant's ([`crate::budget`]); and none older than
//! [`MAX_AGE`].
//!
//! The queue to the writer (it also writes the audit log, [`crate::audit`]) is bounded too
//! ([`crate::StoreBudgets::audit_queue_bytes`]): each tenant has its own queue, the writer takes
//! from each in turn, and when the queue is full the tenant with the most queued loses its
//! own newest record, so a tenant flooding it (or a stalled disk) never costs another
//! tenant's lines first. Every drop is counted for its tenant (`check_environment`), in
//! `/metrics` and in the server's log. A store that cannot be opened or written (a full
//! disk) costs the history, never a run: it is logged and skipped.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::audit::{
    AuditEntry, AuditLog, AuditSink, MAX_DEPENDENCIES, MAX_FIELD_BYTES, cap_list, cap_text,
};
use crate::budget::PerTenant;
use crate::budget::{Budget, Ledger, Store, StoreBudgets, Usage};
use crate::caller::Caller;
use crate::result::ExecutionResult;
use crate::shared::SharedStore;

mod pg;

/// Why the runs table could not be read or written (logged: it costs the history, never a
/// call).
pub(crate) type TableError = Box<dyn std::error::Error + Send + Sync>;

/// The runs table as its writer and readers use it: the seam between what is kept and how
/// it is bounded (this module) and where it is kept, the data directory's SQLite store
/// ([`SqliteRuns`]) or the deployment's PostgreSQL ([`pg::PgRuns`]). A row's key (`rowid`,
/// `seq`) orders rows started in the same millisecond.
pub(crate) trait RunsTable: Send {
    /// `running` rows of this host's servers that are gone become `interrupted`.
    fn mark_interrupted(&mut self) -> Result<usize, TableError>;
    /// Forget finished runs started before `oldest_ms`.
    fn prune(&mut self, oldest_ms: u64) -> Result<(), TableError>;
    /// Apply a batch of the writer's operations in one transaction.
    fn write(&mut self, batch: &[Op]) -> Result<(), TableError>;
    /// What `owner` holds.
    fn count(&mut self, owner: &str) -> Result<Usage, TableError>;
    /// `owner`'s oldest finished runs (key, cost), at most `limit`.
    fn oldest_finished(&mut self, owner: &str, limit: i64)
    -> Result<Vec<(i64, Usage)>, TableError>;
    /// Remove these rows.
    fn delete(&mut self, rows: &[i64]) -> Result<(), TableError>;
    /// `owner`'s runs as `query` asks, newest first.
    fn list(&mut self, owner: &str, query: &RunQuery) -> Result<Vec<RunRecord>, TableError>;
    /// One of `owner`'s runs.
    fn get(&mut self, owner: &str, id: &str) -> Result<Option<RunRecord>, TableError>;
    /// The result one of `owner`'s finished runs returned, as JSON.
    fn output(&mut self, owner: &str, id: &str) -> Result<Option<String>, TableError>;
    /// Whether other processes write the same rows (other fronts): each tenant's holdings are
    /// then recounted at every batch rather than kept up to date by this writer alone.
    fn shared(&self) -> bool {
        false
    }
}

/// Runs older than this are forgotten.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The part of each script (or command) that is kept.
pub(crate) const MAX_SCRIPT_BYTES: usize = 64 * 1024;
/// Largest result kept with a run (stdout and stderr are already bounded by the runner).
const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// What a row costs besides its script, dependencies and result (its other columns and the
/// indexes), counted against its tenant's budget.
const ROW_OVERHEAD_BYTES: u64 = 256;
/// Writes between two prunings of old rows (and recounts of what each tenant holds).
const PRUNE_EVERY_WRITES: u64 = 1000;
/// Oldest rows of a tenant examined at a time when it is over its budget.
const EVICT_CHUNK: i64 = 256;
/// How long the writer waits, after a call's `started`, for more before it writes: a short
/// call's `started` and `finished` go into one transaction rather than two, the first of
/// them no longer competing with the run. A `finished` (or any other operation) ends the
/// wait, so a call's record is readable as soon as its reply is out. Bounded by
/// [`MAX_BATCH`]; a shutdown ([`History::close`]) writes at once.
const GATHER: Duration = Duration::from_millis(5);
/// Most operations written in one transaction.
const MAX_BATCH: usize = 256;
/// What a queued record costs besides its text (its fields, the queue's bookkeeping).
const QUEUED_OVERHEAD_BYTES: u64 = 512;

/// What kind of call a run was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

/// A call's start as it is queued and kept: every value a caller chose cut to its bound, and
/// of the script its start, its size and its hash.
#[derive(Debug, Clone)]
pub(crate) struct StartRecord {
    kind: RunKind,
    session_id: Option<String>,
    /// The first [`MAX_SCRIPT_BYTES`] of the script.
    script: String,
    script_bytes: u64,
    script_sha256: String,
    dependencies: Vec<String>,
    profile: Option<String>,
}

impl StartRecord {
    fn of(start: RunStart) -> StartRecord {
        let mut cut = start.script.len().min(MAX_SCRIPT_BYTES);
        while !start.script.is_char_boundary(cut) {
            cut -= 1;
        }
        StartRecord {
            kind: start.kind,
            session_id: start.session_id.map(|id| cap_text(&id, MAX_FIELD_BYTES)),
            script_bytes: start.script.len() as u64,
            script_sha256: crate::audit::code_hash(&start.script),
            script: start.script[..cut].to_owned(),
            dependencies: cap_list(&start.dependencies, MAX_DEPENDENCIES, MAX_FIELD_BYTES),
            profile: start.profile.map(|name| cap_text(&name, MAX_FIELD_BYTES)),
        }
    }

    fn dependencies_json(&self) -> String {
        serde_json::to_string(&self.dependencies).unwrap_or_else(|_| "[]".into())
    }

    /// What its row costs against its tenant's budget (before its result).
    fn row_bytes(&self) -> u64 {
        ROW_OVERHEAD_BYTES
            + self.script.len() as u64
            + self.dependencies_json().len() as u64
            + self.session_id.as_ref().map_or(0, |id| id.len() as u64)
    }
}

/// What a call refused before it ran sent, as the audit log keeps it: its size and hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestDigest {
    pub(crate) bytes: u64,
    pub(crate) sha256: String,
}

impl RequestDigest {
    /// The digest of `text` (what was sent, as JSON).
    pub(crate) fn of(text: &str) -> RequestDigest {
        RequestDigest {
            bytes: text.len() as u64,
            sha256: crate::audit::code_hash(text),
        }
    }
}

/// Which of a caller's runs to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunQuery {
    /// At most this many.
    pub limit: usize,
    /// Only those older than this run (an execution id of the caller's): the next page.
    pub before: Option<String>,
    /// Only the cells and commands of this session.
    pub session_id: Option<String>,
}

/// One run as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// The `dependencies` argument it was called with (at most 24, each cut at 200 bytes;
    /// a cut one ends with its size and hash, the rest are one entry that counts them).
    pub dependencies: Vec<String>,
    /// The script (or the cell's code, or the command), cut at 64 KiB.
    pub script: String,
    /// Whether `script` was cut.
    pub script_truncated: bool,
    /// The whole script's size in bytes (absent for runs recorded before it was kept).
    pub script_bytes: Option<u64>,
    /// The whole script's SHA-256 (as in the audit log).
    pub script_sha256: Option<String>,
}

/// Who made a call and what it was, from its start to its end (returned by
/// [`History::started`], handed back to [`History::finished`]).
#[derive(Debug, Clone)]
pub(crate) struct RunTicket {
    id: String,
    owner: String,
    kind: RunKind,
    session_id: Option<String>,
}

/// What the writer thread does.
pub(crate) enum Op {
    Started {
        id: String,
        owner: String,
        started_at_ms: u64,
        start: StartRecord,
    },
    Finished {
        ticket: RunTicket,
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
    /// A call of a tool that runs no code (`check_environment`, `list_sessions`, ...), or
    /// of any tool refused before it ran: one audit line, no row.
    Call {
        id: String,
        tenant: String,
        tool: String,
        status: String,
        request: Option<RequestDigest>,
    },
}

impl Op {
    fn tenant(&self) -> &str {
        match self {
            Op::Started { owner, .. } => owner,
            Op::Finished { ticket, .. } => &ticket.owner,
            Op::Call { tenant, .. } => tenant,
        }
    }

    /// Bytes it takes in the writer's queue.
    fn queued_bytes(&self) -> u64 {
        QUEUED_OVERHEAD_BYTES
            + match self {
                Op::Started { start, .. } => start.row_bytes(),
                Op::Finished { output, events, .. } => {
                    output.as_ref().map_or(0, |o| o.len() as u64)
                        + events.iter().map(|e| e.detail.len() as u64).sum::<u64>()
                }
                Op::Call { tool, .. } => tool.len() as u64,
            }
    }
}

/// One tenant's part of the writer's queue.
#[derive(Default)]
struct TenantQueue {
    ops: VecDeque<(Op, u64)>,
    bytes: u64,
}

#[derive(Default)]
struct QueueState {
    tenants: HashMap<String, TenantQueue>,
    /// The tenants with something queued, in the order the writer serves them.
    turn: VecDeque<String>,
    bytes: u64,
    closed: bool,
}

impl QueueState {
    /// Drop the newest record of `tenant` (counted in `ledger`).
    fn drop_newest(&mut self, tenant: &str, ledger: &Ledger) {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return;
        };
        if let Some((_, bytes)) = queue.ops.pop_back() {
            queue.bytes -= bytes;
            self.bytes -= bytes;
            ledger.dropped(tenant);
        }
        if queue.ops.is_empty() {
            self.tenants.remove(tenant);
            self.turn.retain(|t| t != tenant);
        }
    }

    /// Up to `max` records, one from each tenant in turn.
    fn take(&mut self, max: usize, into: &mut Vec<Op>) {
        while into.len() < max {
            let Some(tenant) = self.turn.pop_front() else {
                break;
            };
            let Some(queue) = self.tenants.get_mut(&tenant) else {
                continue;
            };
            if let Some((op, bytes)) = queue.ops.pop_front() {
                queue.bytes -= bytes;
                self.bytes -= bytes;
                into.push(op);
            }
            if queue.ops.is_empty() {
                self.tenants.remove(&tenant);
            } else {
                self.turn.push_back(tenant);
            }
        }
    }
}

/// The queue to the writer: one part per tenant, bounded in bytes together.
struct WriteQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
    max_bytes: u64,
    ledger: Arc<Ledger>,
}

impl WriteQueue {
    fn new(max_bytes: u64, ledger: Arc<Ledger>) -> WriteQueue {
        WriteQueue {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            max_bytes,
            ledger,
        }
    }

    /// Queue `op` for its tenant. When the queue is full, the tenant holding the most bytes
    /// in it loses its newest record: the pushing tenant itself when it holds the most (its
    /// new record is dropped), else the one that does. Never blocks.
    fn push(&self, mut op: Op) {
        let mut cost = op.queued_bytes();
        // A result larger than a quarter of the queue is not kept with its row (the row and
        // its audit line are).
        if cost > self.max_bytes / 4
            && let Op::Finished { output, .. } = &mut op
        {
            *output = None;
            cost = op.queued_bytes();
        }
        let tenant = op.tenant().to_owned();
        let mut state = lock(&self.state);
        if state.closed {
            return;
        }
        while state.bytes + cost > self.max_bytes {
            let mine = state.tenants.get(&tenant).map_or(0, |q| q.bytes);
            let most = state
                .tenants
                .iter()
                .max_by_key(|(_, queue)| queue.bytes)
                .map(|(name, queue)| (name.clone(), queue.bytes));
            match most {
                Some((other, bytes)) if bytes > mine && other != tenant => {
                    state.drop_newest(&other, &self.ledger);
                }
                _ => {
                    self.ledger.dropped(&tenant);
                    return;
                }
            }
        }
        let queue = state.tenants.entry(tenant.clone()).or_default();
        let first = queue.ops.is_empty();
        queue.ops.push_back((op, cost));
        queue.bytes += cost;
        state.bytes += cost;
        if first {
            state.turn.push_back(tenant);
        }
        drop(state);
        self.ready.notify_one();
    }

    /// The next batch to write: waits for a record (`None` once closed and empty), then,
    /// while the batch holds nothing but calls' starts, for more during [`GATHER`].
    fn next_batch(&self) -> Option<Vec<Op>> {
        let mut state = lock(&self.state);
        while state.bytes == 0 && state.turn.is_empty() {
            if state.closed {
                return None;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let mut batch = Vec::new();
        state.take(MAX_BATCH, &mut batch);
        // Gather only while the batch holds nothing but calls' starts: an end (or any other
        // write) is what a reader looks for next (a run's page right after its reply), so it
        // is written at once, with the starts gathered before it.
        let until = Instant::now() + GATHER;
        while batch.len() < MAX_BATCH
            && !state.closed
            && batch.iter().all(|op| matches!(op, Op::Started { .. }))
        {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .ready
                .wait_timeout(state, left)
                .map(|(state, _)| state)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
            state.take(MAX_BATCH, &mut batch);
        }
        Some(batch)
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
    }

    fn queued_bytes(&self) -> u64 {
        lock(&self.state).bytes
    }
}

/// What the runs table and the audit log keep of each tenant, and the writer's queue.
#[derive(Debug, Clone)]
pub(crate) struct HistoryLimits {
    /// Each tenant's runs kept (rows and bytes).
    pub(crate) runs: PerTenant<Budget>,
    /// Each tenant's bytes of audit log.
    pub(crate) audit_bytes: PerTenant<u64>,
    /// Bytes of the writer's queue, every tenant's together.
    pub(crate) queue_bytes: u64,
}

impl From<StoreBudgets> for HistoryLimits {
    /// The same budgets for every tenant.
    fn from(budgets: StoreBudgets) -> HistoryLimits {
        HistoryLimits {
            runs: PerTenant::uniform(budgets.history),
            audit_bytes: PerTenant::uniform(budgets.audit_bytes),
            queue_bytes: budgets.audit_queue_bytes,
        }
    }
}

/// The runs table of a data directory.
pub(crate) struct History {
    /// The store (`None`: it could not be opened).
    store: Option<SharedStore>,
    data_dir: PathBuf,
    limits: HistoryLimits,
    ledger: Arc<Ledger>,
    queue: Mutex<Option<Arc<WriteQueue>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    reader: Mutex<Option<Box<dyn RunsTable>>>,
}

/// A new handle on the runs table of `store` (a connection of its own for SQLite).
fn connect(store: &SharedStore) -> Result<Box<dyn RunsTable>, String> {
    match store {
        SharedStore::Sqlite(database) => database
            .connect()
            .map(|conn| Box::new(SqliteRuns(conn)) as Box<dyn RunsTable>)
            .map_err(|err| crate::error::describe(&err)),
        SharedStore::Postgres(store) => Ok(Box::new(pg::PgRuns::new(store.clone()))),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The runs table in the data directory's SQLite store (one connection).
pub(crate) struct SqliteRuns(Connection);

/// Whether the server of `pid` (on this host) is gone.
pub(crate) fn server_gone(pid: i64) -> bool {
    pid == i64::from(std::process::id()) || !Path::new(&format!("/proc/{pid}")).exists()
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
        if server_gone(pid) {
            marked += conn.execute(
                "UPDATE runs SET status = 'interrupted' WHERE status = 'running' AND server_pid = ?1",
                [pid],
            )?;
        }
    }
    Ok(marked)
}

/// The oldest start kept: runs older than [`MAX_AGE`] are forgotten.
fn oldest_kept_ms() -> u64 {
    now_ms().saturating_sub(u64::try_from(MAX_AGE.as_millis()).unwrap_or(0))
}

/// Forget runs started before `oldest` (every tenant's: age is not another tenant's use).
fn prune(conn: &Connection, oldest: u64) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM runs WHERE started_at_ms < ?1 AND status != 'running'",
        [to_i64(oldest)],
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
            // Cached: the two statements of every call are compiled once per connection.
            conn.prepare_cached(
                "INSERT OR REPLACE INTO runs (execution_id, owner, kind, session_id, started_at_ms,
                     server_pid, status, dependencies, script, script_truncated, script_bytes,
                     script_sha256, row_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                id,
                owner,
                start.kind.as_str(),
                start.session_id,
                to_i64(*started_at_ms),
                std::process::id(),
                start.dependencies_json(),
                start.script,
                (start.script.len() as u64) < start.script_bytes,
                to_i64(start.script_bytes),
                start.script_sha256,
                to_i64(start.row_bytes()),
            ])?;
        }
        Op::Finished {
            ticket,
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
                     python_version = ?6, output = ?7, row_bytes = row_bytes + ?8
                 WHERE execution_id = ?1",
            )?
            .execute(params![
                ticket.id,
                status,
                to_i64(*duration_ms),
                to_i64(*setup_ms),
                exit_code,
                python_version,
                output,
                to_i64(output.as_ref().map_or(0, |o| o.len() as u64)),
            ])?;
        }
        Op::Call { .. } => {}
    }
    Ok(())
}

/// The audit log's line for `op` (see [`crate::audit`]).
fn audit_entry(op: &Op) -> AuditEntry {
    match op {
        Op::Started {
            id,
            owner,
            started_at_ms,
            start,
        } => AuditEntry {
            at_ms: *started_at_ms,
            phase: "started".into(),
            execution_id: id.clone(),
            tenant: owner.clone(),
            kind: start.kind.as_str().into(),
            session_id: start.session_id.clone(),
            code_sha256: Some(start.script_sha256.clone()),
            code_bytes: Some(start.script_bytes),
            dependencies: start.dependencies.clone(),
            profile: start.profile.clone(),
            ..AuditEntry::default()
        },
        Op::Finished {
            ticket,
            status,
            duration_ms,
            setup_ms,
            exit_code,
            python_version,
            events,
            usage,
            profile,
            ..
        } => AuditEntry {
            at_ms: now_ms(),
            phase: "finished".into(),
            execution_id: ticket.id.clone(),
            tenant: ticket.owner.clone(),
            kind: ticket.kind.as_str().to_owned(),
            session_id: ticket.session_id.clone(),
            status: Some(status.clone()),
            duration_ms: Some(*duration_ms),
            setup_ms: Some(*setup_ms),
            exit_code: *exit_code,
            python_version: python_version.clone(),
            resource_usage: Some(*usage).filter(|usage| *usage != crate::ResourceUse::default()),
            events: events.clone(),
            profile: profile.clone(),
            ..AuditEntry::default()
        },
        Op::Call {
            id,
            tenant,
            tool,
            status,
            request,
        } => AuditEntry {
            at_ms: now_ms(),
            phase: "call".into(),
            execution_id: id.clone(),
            tenant: tenant.clone(),
            kind: "tool".into(),
            tool: Some(tool.clone()),
            status: Some(status.clone()),
            request_bytes: request.as_ref().map(|r| r.bytes),
            request_sha256: request.as_ref().map(|r| r.sha256.clone()),
            ..AuditEntry::default()
        },
    }
}

/// Each tenant's runs against its budget, applied by the writer after each batch.
struct RunsBudget {
    budget: PerTenant<Budget>,
    /// What each tenant seen since the last recount holds (rows, bytes), kept up to date
    /// with what this writer adds; recounted from the table every [`PRUNE_EVERY_WRITES`]
    /// (other servers of the data directory write too).
    held: HashMap<String, Usage>,
    ledger: Arc<Ledger>,
}

impl RunsBudget {
    fn held(&mut self, conn: &mut dyn RunsTable, owner: &str) -> Result<&mut Usage, TableError> {
        if !self.held.contains_key(owner) {
            let usage = conn.count(owner)?;
            self.held.insert(owner.to_owned(), usage);
        }
        Ok(self.held.entry(owner.to_owned()).or_default())
    }

    /// Count what `batch` added (it has been written), then bring every tenant it touched
    /// back within its budget by removing that tenant's own oldest finished runs.
    fn apply(&mut self, conn: &mut dyn RunsTable, batch: &[Op]) -> Result<(), TableError> {
        if conn.shared() {
            // Other fronts write the same rows: what each tenant holds is read afresh.
            self.held.clear();
        }
        let mut touched: Vec<&str> = Vec::new();
        let mut counted: Vec<&str> = Vec::new();
        for op in batch {
            let (owner, added) = match op {
                Op::Started { owner, start, .. } => (owner.as_str(), Usage::one(start.row_bytes())),
                Op::Finished { ticket, output, .. } => (
                    ticket.owner.as_str(),
                    Usage {
                        items: 0,
                        bytes: output.as_ref().map_or(0, |o| o.len() as u64),
                    },
                ),
                Op::Call { .. } => continue,
            };
            if !touched.contains(&owner) {
                touched.push(owner);
                if !self.held.contains_key(owner) {
                    // First seen: counted from the table, this batch included.
                    self.held(conn, owner)?;
                    counted.push(owner);
                }
            }
            if !counted.contains(&owner) {
                self.held(conn, owner)?.add(added);
            }
        }
        for owner in touched {
            self.evict(conn, owner)?;
        }
        Ok(())
    }

    fn evict(&mut self, conn: &mut dyn RunsTable, owner: &str) -> Result<(), TableError> {
        let budget = self.budget.of(owner);
        let mut removed = 0u64;
        loop {
            let held = *self.held(conn, owner)?;
            if budget.holds(held) {
                break;
            }
            // The tenant's oldest finished runs (a running one is finished first).
            let oldest = conn.oldest_finished(owner, EVICT_CHUNK)?;
            let listed = oldest.len();
            let (gone, freed) = crate::budget::excess(held, budget, oldest);
            if gone.is_empty() {
                break;
            }
            conn.delete(&gone)?;
            removed += gone.len() as u64;
            self.held(conn, owner)?.sub(freed);
            if gone.len() < listed {
                break;
            }
        }
        self.ledger
            .removed(Store::Runs, owner, removed, &budget.describe("runs"));
        Ok(())
    }
}

/// What `owner` holds in the runs table (read from the budget's index alone).
fn count(conn: &Connection, owner: &str) -> rusqlite::Result<Usage> {
    conn.prepare_cached(
        "SELECT COUNT(*), IFNULL(SUM(row_bytes), 0) FROM runs INDEXED BY runs_budget WHERE owner = ?1",
    )?
    .query_row([owner], |row| {
        Ok(Usage {
            items: u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
            bytes: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
        })
    })
}

/// The writer: takes a batch from the queue, appends it to the audit log and applies it to
/// the runs table in one transaction, then holds each tenant it touched to its budget. Ends
/// when the queue is closed and empty. Without a runs table (it could not be opened) the
/// audit log is still written.
fn write_loop(
    mut table: Option<Box<dyn RunsTable>>,
    mut audit: AuditSink,
    queue: &WriteQueue,
    mut budget: RunsBudget,
) {
    let mut writes = 0u64;
    while let Some(batch) = queue.next_batch() {
        let entries: Vec<AuditEntry> = batch.iter().map(audit_entry).collect();
        audit.append_batch(&entries);
        let Some(table) = table.as_deref_mut() else {
            continue;
        };
        match table.write(&batch) {
            Ok(()) => {
                if let Err(err) = budget.apply(table, &batch) {
                    tracing::warn!(%err, "could not hold the runs table to its tenants' budgets");
                    budget.held.clear();
                }
            }
            Err(err) => {
                tracing::warn!(%err, lost = batch.len(), "could not record runs in the store");
            }
        }
        writes += batch.len() as u64;
        if writes >= PRUNE_EVERY_WRITES {
            writes = 0;
            if let Err(err) = table.prune(oldest_kept_ms()) {
                tracing::warn!(%err, "could not prune the runs table");
            }
            budget.held.clear();
        }
    }
}

impl RunsTable for SqliteRuns {
    fn mark_interrupted(&mut self) -> Result<usize, TableError> {
        Ok(mark_interrupted(&self.0)?)
    }

    fn prune(&mut self, oldest_ms: u64) -> Result<(), TableError> {
        Ok(prune(&self.0, oldest_ms)?)
    }

    fn write(&mut self, batch: &[Op]) -> Result<(), TableError> {
        let tx = self.0.transaction()?;
        for op in batch {
            apply(&tx, op)?;
        }
        Ok(tx.commit()?)
    }

    fn count(&mut self, owner: &str) -> Result<Usage, TableError> {
        Ok(count(&self.0, owner)?)
    }

    fn oldest_finished(
        &mut self,
        owner: &str,
        limit: i64,
    ) -> Result<Vec<(i64, Usage)>, TableError> {
        let oldest = self
            .0
            .prepare_cached(
                "SELECT rowid, row_bytes FROM runs INDEXED BY runs_budget
                 WHERE owner = ?1 AND status != 'running'
                 ORDER BY started_at_ms, rowid LIMIT ?2",
            )?
            .query_map(params![owner, limit], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    Usage::one(u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0)),
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(oldest)
    }

    fn delete(&mut self, rows: &[i64]) -> Result<(), TableError> {
        let mut delete = self.0.prepare_cached("DELETE FROM runs WHERE rowid = ?1")?;
        for rowid in rows {
            delete.execute([rowid])?;
        }
        Ok(())
    }

    fn list(&mut self, owner: &str, query: &RunQuery) -> Result<Vec<RunRecord>, TableError> {
        // `before` names a run of the caller's: only runs older than it (the next page);
        // an unknown id compares with NULL, so the page is empty.
        let mut statement = self.0.prepare(
            "SELECT * FROM runs WHERE owner = ?1
               AND (?2 IS NULL OR session_id = ?2)
               AND (?3 IS NULL OR (started_at_ms, rowid) <
                    (SELECT started_at_ms, rowid FROM runs WHERE owner = ?1 AND execution_id = ?3))
             ORDER BY started_at_ms DESC, rowid DESC LIMIT ?4",
        )?;
        let rows = statement
            .query_map(
                params![
                    owner,
                    query.session_id,
                    query.before,
                    i64::try_from(query.limit).unwrap_or(i64::MAX)
                ],
                record_of,
            )?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn get(&mut self, owner: &str, id: &str) -> Result<Option<RunRecord>, TableError> {
        Ok(self
            .0
            .query_row(
                "SELECT * FROM runs WHERE owner = ?1 AND execution_id = ?2",
                params![owner, id],
                record_of,
            )
            .optional()?)
    }

    fn output(&mut self, owner: &str, id: &str) -> Result<Option<String>, TableError> {
        Ok(self
            .0
            .query_row(
                "SELECT output FROM runs WHERE owner = ?1 AND execution_id = ?2",
                params![owner, id],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten())
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
        script_bytes: row
            .get::<_, Option<i64>>("script_bytes")?
            .and_then(|v| u64::try_from(v).ok()),
        script_sha256: row.get("script_sha256")?,
    })
}

impl History {
    /// The runs table of `data_dir`'s store (`None`: the store could not be opened), marking
    /// the runs of dead servers `interrupted`, with each tenant's budgets. Never fails:
    /// without a store, runs are not recorded (and that is logged); the audit log still is.
    pub(crate) fn open(
        data_dir: &Path,
        store: Option<&SharedStore>,
        limits: impl Into<HistoryLimits>,
        ledger: Arc<Ledger>,
    ) -> History {
        let limits = limits.into();
        let history = History {
            store: store.cloned(),
            data_dir: data_dir.to_path_buf(),
            ledger: Arc::clone(&ledger),
            queue: Mutex::new(None),
            thread: Mutex::new(None),
            reader: Mutex::new(None),
            limits: limits.clone(),
        };
        let opened = match store {
            Some(store) => connect(store).and_then(|mut table| {
                table.mark_interrupted().map_err(|err| err.to_string())?;
                table
                    .prune(oldest_kept_ms())
                    .map_err(|err| err.to_string())?;
                Ok(table)
            }),
            None => Err("the store could not be opened".to_owned()),
        };
        let writer = match opened {
            Ok(conn) => Some(conn),
            Err(err) => {
                tracing::warn!(%err, data_dir = %data_dir.display(), "the runs table is not available; runs are not recorded (the audit log still is)");
                None
            }
        };
        let audit = match store {
            Some(SharedStore::Postgres(store)) => AuditSink::Table(crate::audit::PgAudit::new(
                store.clone(),
                limits.audit_bytes.clone(),
                Arc::clone(&ledger),
            )),
            _ => AuditSink::Files(AuditLog::new(
                data_dir,
                limits.audit_bytes.clone(),
                Arc::clone(&ledger),
            )),
        };
        let runs_budget = RunsBudget {
            budget: limits.runs,
            held: HashMap::new(),
            ledger: Arc::clone(&ledger),
        };
        let queue = Arc::new(WriteQueue::new(limits.queue_bytes, ledger));
        let writer_queue = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name("snakebox-history".into())
            .spawn(move || write_loop(writer, audit, &writer_queue, runs_budget));
        match thread {
            Ok(thread) => {
                *lock(&history.queue) = Some(queue);
                *lock(&history.thread) = Some(thread);
            }
            Err(err) => tracing::warn!(%err, "could not start the runs table's writer"),
        }
        history
    }

    fn send(&self, op: Op) {
        // After `close` (or without a writer) the queue is gone and the record is dropped.
        if let Some(queue) = lock(&self.queue).as_ref() {
            queue.push(op);
        }
    }

    /// A call was admitted: its ticket goes back to [`History::finished`].
    pub(crate) fn started(&self, id: &str, caller: &Caller, start: RunStart) -> RunTicket {
        let start = StartRecord::of(start);
        let ticket = RunTicket {
            id: id.to_owned(),
            owner: caller.id().to_owned(),
            kind: start.kind,
            session_id: start.session_id.clone(),
        };
        self.send(Op::Started {
            id: id.to_owned(),
            owner: caller.id().to_owned(),
            started_at_ms: now_ms(),
            start,
        });
        ticket
    }

    /// The call of `ticket` returned its record.
    pub(crate) fn finished(&self, ticket: &RunTicket, result: &ExecutionResult) {
        self.send(Op::Finished {
            ticket: ticket.clone(),
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

    /// Record a call of a tool that runs no code, or of any tool refused before it ran: an
    /// audit line (when, tenant, tool, status; for a refusal, the size and hash of what was
    /// sent).
    pub(crate) fn tool_call(
        &self,
        caller: &Caller,
        tool: &str,
        status: &str,
        request: Option<RequestDigest>,
    ) {
        self.send(Op::Call {
            id: crate::ids::execution_id(),
            tenant: caller.id().to_owned(),
            tool: cap_text(tool, MAX_FIELD_BYTES),
            status: status.to_owned(),
            request,
        });
    }

    /// Write what is queued and stop the writer (bounded: the writer applies what it has).
    pub(crate) fn close(&self) {
        if let Some(queue) = lock(&self.queue).take() {
            queue.close();
        }
        if let Some(thread) = lock(&self.thread).take()
            && thread.join().is_err()
        {
            tracing::warn!("the runs table's writer panicked");
        }
    }

    /// Bytes queued for the writer now (every tenant's together).
    pub(crate) fn queued_bytes(&self) -> u64 {
        lock(&self.queue).as_ref().map_or(0, |q| q.queued_bytes())
    }

    /// What `caller`'s tenant holds in the runs table and the audit log, its budgets there,
    /// and what they removed and the queue dropped (see [`crate::budget`]); `None`: the
    /// budgets alone, for the operator.
    pub(crate) fn report(
        &self,
        viewer: Option<&Caller>,
    ) -> (
        crate::budget::StoreReport,
        crate::budget::StoreReport,
        crate::budget::WriteQueueReport,
    ) {
        let counts = viewer
            .map(|c| self.ledger.counts(c.id()))
            .unwrap_or_default();
        let runs_used = viewer.map(|caller| {
            self.read(|table| table.count(caller.id()))
                .unwrap_or_default()
        });
        let audit_used = viewer.map(|caller| match &self.store {
            Some(SharedStore::Postgres(store)) => crate::audit::pg_tenant_bytes(store, caller.id()),
            _ => crate::audit::tenant_bytes(&self.data_dir, caller.id()),
        });
        let in_table = matches!(self.store, Some(SharedStore::Postgres(_)));
        let (history, audit_bytes) = match viewer {
            Some(caller) => (
                self.limits.runs.of(caller.id()),
                self.limits.audit_bytes.of(caller.id()),
            ),
            None => (
                self.limits.runs.default_value(),
                self.limits.audit_bytes.default_value(),
            ),
        };
        let runs = crate::budget::StoreReport {
            budget: format!(
                "{} per tenant; past it, the tenant's own oldest finished runs are removed (and any older than {} days)",
                history.describe("runs"),
                MAX_AGE.as_secs() / 86_400
            ),
            max_items: history.items,
            max_bytes: history.bytes,
            used_items: runs_used.map(|u| u.items),
            used_bytes: runs_used.map(|u| u.bytes),
            removed: counts.runs_removed,
        };
        let audit = crate::budget::StoreReport {
            budget: if in_table {
                format!(
                    "{} per tenant, in the database; past it, the tenant's own oldest lines are removed",
                    crate::ids::human_bytes(audit_bytes)
                )
            } else {
                format!(
                    "{} per tenant, in up to 5 files; past it, the tenant's own oldest file is removed",
                    crate::ids::human_bytes(audit_bytes)
                )
            },
            max_items: None,
            max_bytes: Some(audit_bytes),
            used_items: None,
            used_bytes: audit_used,
            removed: counts.audit_files_removed,
        };
        let queue = crate::budget::WriteQueueReport {
            max_bytes: self.limits.queue_bytes,
            queued_bytes: self.queued_bytes(),
            dropped: counts.dropped,
        };
        (runs, audit, queue)
    }

    fn read<T>(
        &self,
        query: impl FnOnce(&mut dyn RunsTable) -> Result<T, TableError>,
    ) -> Option<T> {
        let mut reader = lock(&self.reader);
        if reader.is_none() {
            *reader = self.store.as_ref().and_then(|store| {
                connect(store)
                    .map_err(|err| tracing::debug!(%err, "the runs table cannot be read"))
                    .ok()
            });
        }
        let table = reader.as_deref_mut()?;
        query(table)
            .map_err(|err| tracing::warn!(%err, "could not read the runs table"))
            .ok()
    }

    /// `caller`'s newest runs, newest first.
    pub(crate) fn list(&self, caller: &Caller, query: &RunQuery) -> Vec<RunRecord> {
        self.read(|table| table.list(caller.id(), query))
            .unwrap_or_default()
    }

    /// The result a finished run of `caller`'s returned, as JSON (`None` for another
    /// caller's run, one still running, one recorded before results were kept, or one whose
    /// result was larger than [`MAX_OUTPUT_BYTES`]).
    pub(crate) fn output(&self, caller: &Caller, id: &str) -> Option<String> {
        self.read(|table| table.output(caller.id(), id)).flatten()
    }

    /// One of `caller`'s runs (another caller's is `None`, as if it did not exist).
    pub(crate) fn get(&self, caller: &Caller, id: &str) -> Option<RunRecord> {
        self.read(|table| table.get(caller.id(), id)).flatten()
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
    use crate::store::Database;

    fn start(script: &str) -> RunStart {
        RunStart {
            kind: RunKind::Execute,
            session_id: None,
            script: script.into(),
            dependencies: vec!["six==1.16.0".into()],
            profile: None,
        }
    }

    /// Opens a runs table in a data directory: the same test bodies run against the data
    /// directory's SQLite store and against PostgreSQL (`mod postgres` below).
    type Opener = dyn Fn(&Path, StoreBudgets) -> (History, Arc<Ledger>);

    fn open_with(dir: &Path, budgets: StoreBudgets) -> (History, Arc<Ledger>) {
        let store = Database::open(dir).ok().map(SharedStore::Sqlite);
        open_in(store.as_ref(), dir, budgets)
    }

    fn open_in(
        store: Option<&SharedStore>,
        dir: &Path,
        budgets: StoreBudgets,
    ) -> (History, Arc<Ledger>) {
        let ledger = Arc::new(Ledger::default());
        (
            History::open(dir, store, budgets, Arc::clone(&ledger)),
            ledger,
        )
    }

    /// The same bodies against PostgreSQL: a throwaway cluster per test (skipped, saying
    /// so, where PostgreSQL is not installed).
    mod postgres {
        use super::*;
        use crate::shared::PgStore;
        use crate::shared::test_cluster::TestCluster;

        fn with_cluster(body: impl FnOnce(&Opener)) {
            let Some(cluster) = TestCluster::start() else {
                return;
            };
            let store = SharedStore::Postgres(PgStore::open(&cluster.url).unwrap());
            body(&move |dir: &Path, budgets: StoreBudgets| open_in(Some(&store), dir, budgets));
        }

        #[test]
        fn pages_go_back_in_time_and_a_session_lists_its_own() {
            with_cluster(|open| super::pages_go_back_in_time_and_a_session_lists_its_own_in(open));
        }

        #[test]
        fn records_a_run_from_start_to_end_for_its_owner_only() {
            with_cluster(|open| super::records_a_run_from_start_to_end_for_its_owner_only_in(open));
        }

        #[test]
        fn a_tenant_over_its_runs_budget_loses_its_own_oldest_only() {
            with_cluster(|open| {
                super::a_tenant_over_its_runs_budget_loses_its_own_oldest_only_in(open)
            });
        }

        #[test]
        fn running_rows_of_a_dead_server_of_this_host_only_are_interrupted_at_open() {
            let Some(cluster) = TestCluster::start() else {
                return;
            };
            let pg = PgStore::open(&cluster.url).unwrap();
            let here = crate::shared::postgres::host_name();
            let dead = i64::from(i32::MAX);
            pg.block(move |conn| async move {
                let client = conn.client().await?;
                for (id, host) in [("dead-here", here.as_str()), ("elsewhere", "another-host")] {
                    client
                        .execute(
                            "INSERT INTO snakebox_runs (execution_id, owner, kind, started_at_ms,
                                 server_host, server_pid, status, dependencies, script,
                                 script_truncated)
                             VALUES ($1, 'local', 'execute', $2, $3, $4, 'running', '[]', 'x', false)",
                            &[&id, &i64::try_from(now_ms()).unwrap(), &host, &dead],
                        )
                        .await
                        .map_err(|e| conn.failed(e))?;
                }
                Ok(())
            })
            .unwrap();
            let dir = tempfile::tempdir().unwrap();
            let store = SharedStore::Postgres(pg);
            let (history, _) = open_in(Some(&store), dir.path(), StoreBudgets::default());
            let status = |id| history.get(&Caller::local(), id).unwrap().status;
            // Its pid is dead on this host; on another host it means nothing here.
            assert_eq!(status("dead-here"), "interrupted");
            assert_eq!(status("elsewhere"), "running");
        }

        #[test]
        fn what_each_tenant_holds_is_kept_by_the_table_itself() {
            let Some(cluster) = TestCluster::start() else {
                return;
            };
            let pg = PgStore::open(&cluster.url).unwrap();
            let store = SharedStore::Postgres(pg.clone());
            let dir = tempfile::tempdir().unwrap();
            let budgets = StoreBudgets {
                history: Budget {
                    items: Some(4),
                    bytes: None,
                },
                ..StoreBudgets::default()
            };
            let (history, _) = open_in(Some(&store), dir.path(), budgets);
            for (tenant, n) in [("a", 9), ("b", 2)] {
                let caller = Caller::tenant(tenant).unwrap();
                for i in 0..n {
                    let ticket = history.started(&format!("{tenant}{i}"), &caller, start("1"));
                    finish(&history, &ticket);
                }
            }
            // A row replaced (the same execution id again) counts once.
            history.started("b1", &Caller::tenant("b").unwrap(), start("22"));
            history.close();
            let (kept, counted) = pg
                .block(|conn| async move {
                    let client = conn.client().await?;
                    let query = |sql: &'static str| {
                        let client = &client;
                        let conn = &conn;
                        async move {
                            let rows = client.query(sql, &[]).await.map_err(|e| conn.failed(e))?;
                            Ok::<_, crate::shared::PgError>(
                                rows.iter()
                                    .map(|row| {
                                        (
                                            row.get::<_, String>(0),
                                            row.get::<_, i64>(1),
                                            row.get::<_, i64>(2),
                                        )
                                    })
                                    .collect::<Vec<_>>(),
                            )
                        }
                    };
                    let kept =
                        query("SELECT owner, items, bytes FROM snakebox_runs_usage ORDER BY owner")
                            .await?;
                    let counted = query(
                        "SELECT owner, COUNT(*), SUM(row_bytes)::BIGINT FROM snakebox_runs
                         GROUP BY owner ORDER BY owner",
                    )
                    .await?;
                    Ok((kept, counted))
                })
                .unwrap();
            assert_eq!(kept, counted);
            assert_eq!(kept.iter().map(|k| k.1).collect::<Vec<_>>(), [4, 2]);
        }

        #[test]
        fn a_tenant_over_its_audit_budget_loses_its_own_oldest_lines_only() {
            with_cluster(|open| {
                let dir = tempfile::tempdir().unwrap();
                let budgets = StoreBudgets {
                    audit_bytes: 5000,
                    ..StoreBudgets::default()
                };
                let (history, ledger) = open(dir.path(), budgets);
                let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
                history.tool_call(&b, "list_sessions", "ok", None);
                for _ in 0..200 {
                    history.tool_call(&a, "list_sessions", "ok", None);
                }
                history.close();
                let (runs_a, audit_a, _) = history.report(Some(&a));
                assert!(audit_a.used_bytes.unwrap() <= 5000, "{audit_a:?}");
                assert!(audit_a.used_bytes.unwrap() > 4000, "{audit_a:?}");
                assert!(ledger.counts("a").audit_files_removed > 0);
                assert_eq!(ledger.counts("b").audit_files_removed, 0);
                assert_eq!(runs_a.used_items, Some(0));
                let (_, audit_b, _) = history.report(Some(&b));
                assert!(audit_b.used_bytes.unwrap() > 0);
                // Nothing was written to the data directory: the lines are in the database.
                assert!(!dir.path().join(crate::audit::AUDIT_DIR).exists());
            });
        }
    }

    fn open_default(dir: &Path) -> History {
        open_with(dir, StoreBudgets::default()).0
    }

    fn newest(limit: usize) -> RunQuery {
        RunQuery {
            limit,
            ..RunQuery::default()
        }
    }

    #[test]
    fn pages_go_back_in_time_and_a_session_lists_its_own() {
        pages_go_back_in_time_and_a_session_lists_its_own_in(&open_with);
    }

    fn pages_go_back_in_time_and_a_session_lists_its_own_in(open_with: &Opener) {
        let dir = tempfile::tempdir().unwrap();
        let history = open_with(dir.path(), StoreBudgets::default()).0;
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
        records_a_run_from_start_to_end_for_its_owner_only_in(&open_with);
    }

    fn records_a_run_from_start_to_end_for_its_owner_only_in(open_with: &Opener) {
        let dir = tempfile::tempdir().unwrap();
        let history = open_with(dir.path(), StoreBudgets::default()).0;
        let a = Caller::tenant("a").unwrap();
        let b = Caller::tenant("b").unwrap();
        let r1 = history.started("r1", &a, start("print(1)"));
        let mut result = ExecutionResult::new("r1".into(), Status::Ok);
        result.duration_ms = 12;
        result.exit_code = Some(0);
        result.python_version = Some("3.11.2".into());
        result.stdout = "1\n".into();
        history.finished(&r1, &result);
        let long = "é".repeat(MAX_SCRIPT_BYTES);
        history.started("r2", &a, start(&long));
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
        // The whole script's size and hash (as in the audit log) are kept with its start.
        assert_eq!(r2.script_bytes, Some(long.len() as u64));
        assert_eq!(r2.script_sha256, Some(crate::audit::code_hash(&long)));
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
        let conn = Database::open(dir.path()).unwrap().connect().unwrap();
        conn.execute(
            "INSERT INTO runs (execution_id, owner, kind, started_at_ms, server_pid, status,
                 dependencies, script, script_truncated)
             VALUES ('dead', 'local', 'execute', ?1, ?2, 'running', '[]', 'x', 0)",
            params![i64::try_from(now_ms()).unwrap(), i64::from(i32::MAX)],
        )
        .unwrap();
        drop(conn);
        let history = open_default(dir.path());
        let record = history.get(&Caller::local(), "dead").unwrap();
        assert_eq!(record.status, "interrupted");
    }

    #[test]
    fn a_version_1_store_gains_the_columns_of_later_versions() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join(crate::store::STORE_FILE)).unwrap();
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
        let history = open_default(dir.path());
        assert_eq!(history.get(&Caller::local(), "old").unwrap().status, "ok");
        assert!(history.output(&Caller::local(), "old").is_none());
        let new = history.started("new", &Caller::local(), start("print(1)"));
        history.finished(&new, &ExecutionResult::new("new".into(), Status::Ok));
        history.close();
        assert!(history.output(&Caller::local(), "new").is_some());
    }

    #[test]
    fn the_store_is_private_to_the_server_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let history = open_default(dir.path());
        history.started("r1", &Caller::local(), start("secret = 1"));
        history.close();
        let mode = fs_err::metadata(dir.path().join(crate::store::STORE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    #[test]
    fn an_unwritable_store_costs_the_history_not_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        // The store's path is a directory: it cannot be opened.
        fs_err::create_dir_all(dir.path().join(crate::store::STORE_FILE)).unwrap();
        let history = open_default(dir.path());
        history.started("r1", &Caller::local(), start("print(1)"));
        history.close();
        assert!(history.list(&Caller::local(), &newest(10)).is_empty());
    }

    fn finish(history: &History, ticket: &RunTicket) {
        history.finished(ticket, &ExecutionResult::new(ticket.id.clone(), Status::Ok));
    }

    #[test]
    fn a_tenant_over_its_runs_budget_loses_its_own_oldest_only() {
        a_tenant_over_its_runs_budget_loses_its_own_oldest_only_in(&open_with);
    }

    fn a_tenant_over_its_runs_budget_loses_its_own_oldest_only_in(open_with: &Opener) {
        let dir = tempfile::tempdir().unwrap();
        let budgets = StoreBudgets {
            history: Budget {
                items: Some(5),
                bytes: Some(64 * 1024),
            },
            ..StoreBudgets::default()
        };
        let (history, ledger) = open_with(dir.path(), budgets.clone());
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        for i in 0..3 {
            let ticket = history.started(&format!("b{i}"), &b, start("1"));
            finish(&history, &ticket);
        }
        for i in 0..40 {
            let ticket = history.started(&format!("a{i:02}"), &a, start("1"));
            finish(&history, &ticket);
        }
        history.close();
        let ids = |caller: &Caller| -> Vec<String> {
            history
                .list(caller, &newest(100))
                .into_iter()
                .map(|r| r.execution_id)
                .collect()
        };
        assert_eq!(ids(&a), ["a39", "a38", "a37", "a36", "a35"]);
        assert_eq!(ids(&b), ["b2", "b1", "b0"]);
        assert_eq!(ledger.counts("a").runs_removed, 35);
        assert_eq!(ledger.counts("b").runs_removed, 0);

        // Bytes too: four scripts of 20 KiB do not fit in 64 KiB, so b's oldest go (its
        // small runs first, then the oldest big one); a restarted writer counts what the
        // table holds.
        let (history, ledger) = open_with(dir.path(), budgets);
        for i in 0..4 {
            let ticket = history.started(&format!("big{i}"), &b, start(&"x".repeat(20 << 10)));
            finish(&history, &ticket);
        }
        history.close();
        assert_eq!(ids(&b), ["big3", "big2", "big1"]);
        assert_eq!(ledger.counts("b").runs_removed, 4);
        assert_eq!(ids(&a).len(), 5, "a's runs are a's budget alone");
        let (runs, _, _) = history.report(Some(&b));
        assert_eq!(runs.used_items, Some(3));
        assert!(runs.used_bytes.unwrap() <= 64 * 1024, "{runs:?}");
        assert_eq!(runs.removed, 4);
    }

    #[test]
    fn a_row_is_bounded_whatever_the_call_carried() {
        let dir = tempfile::tempdir().unwrap();
        let history = open_default(dir.path());
        let huge = "d".repeat(1 << 20);
        let run = RunStart {
            kind: RunKind::Execute,
            session_id: Some(huge.clone()),
            script: "s".repeat(4 << 20),
            dependencies: (0..300)
                .map(|n| format!("{}{n}", &huge[..64 << 10]))
                .collect(),
            profile: Some(huge.clone()),
        };
        history.started("big", &Caller::local(), run);
        history.close();
        let conn = Connection::open(dir.path().join(crate::store::STORE_FILE)).unwrap();
        let row_bytes: i64 = conn
            .query_row(
                "SELECT length(CAST(script AS BLOB)) + length(CAST(dependencies AS BLOB))
                     + length(CAST(session_id AS BLOB)) FROM runs",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert!(
            row_bytes <= (MAX_SCRIPT_BYTES + 16 * 1024) as i64,
            "{row_bytes}"
        );
        let record = history.get(&Caller::local(), "big").unwrap();
        assert_eq!(record.script_bytes, Some(4 << 20));
        assert_eq!(record.dependencies.len(), MAX_DEPENDENCIES + 1);
        assert!(record.dependencies[MAX_DEPENDENCIES].starts_with("… and 276 more"));
        // The audit line is bounded too.
        let (entries, _) = crate::audit::read_audit(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        let line = serde_json::to_vec(&entries[0]).unwrap();
        assert!(line.len() <= crate::audit::MAX_LINE_BYTES, "{}", line.len());
        assert_eq!(entries[0].code_bytes, Some(4 << 20));
    }

    fn call(tenant: &str, n: usize) -> Op {
        Op::Call {
            id: format!("{tenant}-{n}"),
            tenant: tenant.into(),
            tool: "list_sessions".into(),
            status: "ok".into(),
            request: None,
        }
    }

    fn ids(batch: &[Op]) -> Vec<String> {
        batch
            .iter()
            .map(|op| match op {
                Op::Call { id, .. } => id.clone(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn a_full_queue_drops_the_flooding_tenants_records_and_serves_tenants_in_turn() {
        let ledger = Arc::new(Ledger::default());
        let one = call("a", 0).queued_bytes();
        let queue = WriteQueue::new(one * 10, Arc::clone(&ledger));
        // Tenant a fills the queue (nobody is writing: a stalled disk).
        for n in 0..25 {
            queue.push(call("a", n));
        }
        assert_eq!(ledger.counts("a").dropped, 15, "a lost its own newest");
        // b's records get in: a, holding the most, loses its newest for each.
        for n in 0..3 {
            queue.push(call("b", n));
        }
        assert_eq!(ledger.counts("b").dropped, 0);
        assert_eq!(ledger.counts("a").dropped, 18);
        // c too; and once b holds as much as a... nobody's share goes below the others'.
        queue.push(call("c", 0));
        assert_eq!(ledger.counts("c").dropped, 0);
        queue.close();
        let batch = queue.next_batch().unwrap();
        // One of each tenant in turn, each in its own order.
        assert_eq!(
            ids(&batch),
            [
                "a-0", "b-0", "c-0", "a-1", "b-1", "a-2", "b-2", "a-3", "a-4", "a-5"
            ]
        );
        assert!(queue.next_batch().is_none(), "closed and empty");
        assert_eq!(queue.queued_bytes(), 0);
        // Closed: nothing more is queued.
        queue.push(call("a", 99));
        assert_eq!(queue.queued_bytes(), 0);
    }

    #[test]
    fn a_result_larger_than_a_quarter_of_the_queue_is_not_queued_with_its_row() {
        let ledger = Arc::new(Ledger::default());
        let queue = WriteQueue::new(64 * 1024, Arc::clone(&ledger));
        let ticket = RunTicket {
            id: "r".into(),
            owner: "a".into(),
            kind: RunKind::Execute,
            session_id: None,
        };
        let mut result = ExecutionResult::new("r".into(), Status::Ok);
        result.stdout = "y".repeat(100 * 1024);
        queue.push(Op::Finished {
            ticket,
            status: "ok".into(),
            duration_ms: 1,
            setup_ms: 0,
            exit_code: Some(0),
            python_version: None,
            output: serde_json::to_string(&result).ok(),
            events: Vec::new(),
            usage: crate::ResourceUse::default(),
            profile: None,
        });
        assert_eq!(ledger.counts("a").dropped, 0);
        queue.close();
        let batch = queue.next_batch().unwrap();
        assert!(matches!(&batch[0], Op::Finished { output: None, .. }));
    }
}
