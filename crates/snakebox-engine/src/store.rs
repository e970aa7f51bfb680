//! The store: the one SQLite file of a data directory (`<data>/store-v1.db`, WAL, private to
//! the server user) that holds what must outlive a server: the runs table
//! (`history`), the sessions and the tenants' shares of their disk (`session::store`) and
//! the API keys (`keys`). With `--database postgres://…` the keys and the runs are kept in
//! the deployment's PostgreSQL instead (`shared.rs`); the sessions stay here.
//!
//! It exists so that opening the file, its pragmas and its schema are written once: every
//! connection comes from `Database::connect`, and the schema is one ordered list of
//! migrations (`MIGRATIONS`), applied in one transaction and recorded in the file's own
//! `migrations` table (not `PRAGMA user_version`, which a server of an earlier version of
//! this file, which held the runs table only, still writes).
//!
//! Earlier versions kept sessions in `<data>/sessions-v1/sessions.db` and keys in
//! `<data>/keys-v1.db`. When one of those files is there, opening the store copies its rows in,
//! in one transaction with the check that the file is still there (two servers starting
//! together import it once), and then renames it to `<name>.imported`: nothing reads it
//! again, and an operator going back to an earlier version can rename it back. A file that
//! cannot be read is left where it was, and opening fails with the reason (nothing is lost;
//! the next start tries again).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::{ErrorKind, Hint};

/// The store's file under the data directory.
pub const STORE_FILE: &str = "store-v1.db";
/// What an imported file of an earlier version is renamed to: `<name>` + this.
pub const IMPORTED_SUFFIX: &str = ".imported";
/// Where earlier versions kept the API keys (under the data directory).
const OLD_KEYS_FILE: &str = "keys-v1.db";
/// Where earlier versions kept the sessions (under the data directory).
const OLD_SESSIONS_FILE: &str = "sessions-v1/sessions.db";
/// How long a connection waits for another's write.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be made, or made private.
    #[error("Failed to make the store `{}` (private to the server user)", path.display())]
    Private {
        /// The store's file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite failed (opening, a migration).
    #[error("Failed to use the store `{}`", path.display())]
    Sqlite {
        /// The store's file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A file of an earlier version could not be copied in.
    #[error("Failed to copy `{}` (an earlier version's file) into the store", path.display())]
    Import {
        /// The earlier version's file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
}

impl Hint for StoreError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Internal
    }

    fn hint(&self) -> Option<String> {
        Some(match self {
            StoreError::Private { .. } | StoreError::Sqlite { .. } => {
                "check that the data directory (--data-dir) is writable by the server user".into()
            }
            StoreError::Import { .. } => {
                "nothing was removed: the file is still where it was and the next start tries again; check that it is readable by the server user and not damaged (`sqlite3 FILE 'PRAGMA integrity_check'`)".into()
            }
        })
    }
}

/// One step of the schema. Steps are applied in order, each once per file; a step must also
/// hold on a file that already has what it makes (the first three describe the runs table as
/// earlier versions made it, and find it made).
struct Migration {
    id: i64,
    name: &'static str,
    apply: fn(&Transaction<'_>) -> rusqlite::Result<()>,
}

/// The schema, in order. Append only: a step once released is never changed.
const MIGRATIONS: &[Migration] = &[
    Migration {
        id: 1,
        name: "runs",
        apply: runs_table,
    },
    Migration {
        id: 2,
        name: "runs: each finished run's result",
        apply: runs_output,
    },
    Migration {
        id: 3,
        name: "runs: script size and hash, each row's cost",
        apply: runs_budget,
    },
    Migration {
        id: 4,
        name: "sessions and tenants' shares",
        apply: sessions_tables,
    },
    Migration {
        id: 5,
        name: "API keys",
        apply: keys_table,
    },
];

fn runs_table(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS runs (
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
    )
}

fn has_column(tx: &Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |row| row.get(0),
    )
}

/// Each finished run's whole record (what the web UI shows); empty for runs before it.
fn runs_output(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    if !has_column(tx, "runs", "output")? {
        tx.execute_batch("ALTER TABLE runs ADD COLUMN output TEXT")?;
    }
    Ok(())
}

/// Each script's size and hash, and what each row costs its tenant's budget (an index covers
/// what the budget reads, so no row is read whole for it); earlier rows are measured once,
/// each with the 256 bytes of its other columns and indexes (`history::ROW_OVERHEAD_BYTES`
/// when this step was written; a step is never changed).
fn runs_budget(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    if !has_column(tx, "runs", "row_bytes")? {
        tx.execute_batch(
            "ALTER TABLE runs ADD COLUMN script_bytes INTEGER;
             ALTER TABLE runs ADD COLUMN script_sha256 TEXT;
             ALTER TABLE runs ADD COLUMN row_bytes INTEGER NOT NULL DEFAULT 0;
             UPDATE runs SET row_bytes = 256 + length(CAST(script AS BLOB))
                 + length(CAST(dependencies AS BLOB)) + IFNULL(length(CAST(output AS BLOB)), 0)
                 + IFNULL(length(CAST(session_id AS BLOB)), 0);",
        )?;
    }
    tx.execute_batch(
        "CREATE INDEX IF NOT EXISTS runs_budget ON runs (owner, started_at_ms, row_bytes)",
    )
}

fn sessions_tables(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS sessions (
             id TEXT PRIMARY KEY,
             name TEXT,
             interpreter TEXT NOT NULL,
             python_version TEXT NOT NULL,
             base_requirements TEXT NOT NULL,
             requirements TEXT NOT NULL,
             packages TEXT NOT NULL,
             venv_bytes INTEGER NOT NULL DEFAULT 0,
             work_bytes INTEGER NOT NULL DEFAULT 0,
             created_at INTEGER NOT NULL,
             last_used_at INTEGER NOT NULL,
             executions INTEGER NOT NULL DEFAULT 0,
             network INTEGER NOT NULL DEFAULT 0,
             owner TEXT NOT NULL DEFAULT 'local',
             network_names TEXT NOT NULL DEFAULT '[]',
             profile TEXT
         );
         CREATE TABLE IF NOT EXISTS shares (
             slot INTEGER PRIMARY KEY AUTOINCREMENT,
             tenant TEXT NOT NULL UNIQUE,
             bytes INTEGER NOT NULL
         );",
    )
}

fn keys_table(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS keys (
             id TEXT PRIMARY KEY,
             tenant TEXT NOT NULL,
             hash BLOB NOT NULL,
             masked TEXT NOT NULL,
             created_at INTEGER NOT NULL,
             revoked_at INTEGER
         );",
    )
}

/// The last step of [`MIGRATIONS`].
fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.id)
}

/// The steps this file has had (0: none; a file of an earlier version has no `migrations`
/// table).
fn applied(conn: &Connection) -> i64 {
    conn.query_row("SELECT IFNULL(MAX(id), 0) FROM migrations", [], |row| {
        row.get(0)
    })
    .unwrap_or(0)
}

/// Apply the steps `conn`'s file has not had, in one transaction (another server applying
/// them at the same time waits, then finds them applied).
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    if applied(conn) >= latest() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS migrations (
             id INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             applied_at_ms INTEGER NOT NULL
         );",
    )?;
    let done = applied(&tx);
    for step in MIGRATIONS.iter().filter(|m| m.id > done) {
        (step.apply)(&tx)?;
        tx.execute(
            "INSERT INTO migrations (id, name, applied_at_ms) VALUES (?1, ?2, ?3)",
            rusqlite::params![step.id, step.name, now_ms()],
        )?;
    }
    tx.commit()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A table of an earlier version's file and how its rows come in: each column with what a
/// row gets when the file predates that column (SQL).
struct OldTable {
    name: &'static str,
    columns: &'static [(&'static str, &'static str)],
}

/// What `keys-v1.db` held.
const OLD_KEYS: &[OldTable] = &[OldTable {
    name: "keys",
    columns: &[
        ("id", "NULL"),
        ("tenant", "NULL"),
        ("hash", "NULL"),
        ("masked", "NULL"),
        ("created_at", "NULL"),
        ("revoked_at", "NULL"),
    ],
}];

/// What `sessions-v1/sessions.db` held, with the defaults its own upgrades gave older rows:
/// no network (fail closed), the local tenant's, the server's whole network policy, no
/// profile.
const OLD_SESSIONS: &[OldTable] = &[
    OldTable {
        name: "sessions",
        columns: &[
            ("id", "NULL"),
            ("name", "NULL"),
            ("interpreter", "NULL"),
            ("python_version", "NULL"),
            ("base_requirements", "'[]'"),
            ("requirements", "'[]'"),
            ("packages", "'[]'"),
            ("venv_bytes", "0"),
            ("work_bytes", "0"),
            ("created_at", "0"),
            ("last_used_at", "0"),
            ("executions", "0"),
            ("network", "0"),
            ("owner", "'local'"),
            ("network_names", "'[]'"),
            ("profile", "NULL"),
        ],
    },
    OldTable {
        name: "shares",
        columns: &[("slot", "NULL"), ("tenant", "NULL"), ("bytes", "0")],
    },
];

/// Copy the rows of `table` from `old` into `tx` (a row already there, by key, is kept).
fn copy_table(old: &Connection, tx: &Transaction<'_>, table: &OldTable) -> rusqlite::Result<usize> {
    let present: Vec<String> = old
        .prepare("SELECT name FROM pragma_table_info(?1)")?
        .query_map([table.name], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if present.is_empty() {
        return Ok(0);
    }
    let select: Vec<&str> = table
        .columns
        .iter()
        .map(|(column, default)| {
            if present.iter().any(|p| p == column) {
                *column
            } else {
                *default
            }
        })
        .collect();
    let names: Vec<&str> = table.columns.iter().map(|(column, _)| *column).collect();
    let marks = vec!["?"; names.len()].join(", ");
    let mut insert = tx.prepare(&format!(
        "INSERT OR IGNORE INTO {} ({}) VALUES ({marks})",
        table.name,
        names.join(", ")
    ))?;
    let mut read = old.prepare(&format!("SELECT {} FROM {}", select.join(", "), table.name))?;
    let mut rows = read.query([])?;
    let mut copied = 0;
    while let Some(row) = rows.next()? {
        let values: Vec<Value> = (0..names.len())
            .map(|i| row.get::<_, Value>(i))
            .collect::<rusqlite::Result<_>>()?;
        copied += insert.execute(rusqlite::params_from_iter(values))?;
    }
    Ok(copied)
}

/// A share's slot names its files and is never reused: the old file's counter comes too.
fn copy_share_counter(old: &Connection, tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let seq: Option<i64> = old
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'shares'",
            [],
            |row| row.get(0),
        )
        .unwrap_or(None);
    if let Some(seq) = seq {
        let updated = tx.execute(
            "UPDATE sqlite_sequence SET seq = MAX(seq, ?1) WHERE name = 'shares'",
            [seq],
        )?;
        if updated == 0 {
            tx.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('shares', ?1)",
                [seq],
            )?;
        }
    }
    Ok(())
}

/// The one store of a data directory (a path: every user opens its own connections).
#[derive(Debug, Clone)]
pub struct Database {
    path: PathBuf,
    data_dir: PathBuf,
}

impl Database {
    /// Open the store of `data_dir`: made (private to the server user) if it is not there,
    /// brought to the current schema, and the files of earlier versions imported.
    ///
    /// # Errors
    /// The file cannot be made, opened or migrated, or an earlier version's file cannot be
    /// read (it is then left where it was).
    pub fn open(data_dir: &Path) -> Result<Database, StoreError> {
        Self::open_connected(data_dir).map(|(database, _)| database)
    }

    /// [`Database::open`], keeping the connection it opened.
    pub(crate) fn open_connected(data_dir: &Path) -> Result<(Database, Connection), StoreError> {
        let database = Database {
            path: data_dir.join(STORE_FILE),
            data_dir: data_dir.to_path_buf(),
        };
        database.make_private()?;
        let mut conn = database.connect()?;
        migrate(&mut conn).map_err(|source| database.sqlite(source))?;
        database.import_old_files(&mut conn)?;
        Ok((database, conn))
    }

    /// The store's file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The data directory it is the store of.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn sqlite(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// What runs, sessions and keys hold (scripts, who has which session, keys' hashes) is
    /// the server user's alone: the file is made 0600 before SQLite first opens it (the
    /// journal files SQLite makes take its mode), and set so again each time.
    ///
    /// The file is opened here only to make it: closing a descriptor of a file releases every
    /// POSIX lock this process holds on it, SQLite's included, so opening and closing the
    /// file of a store in use would take the locks from under this process's connections.
    fn make_private(&self) -> Result<(), StoreError> {
        use fs_err::os::unix::fs::OpenOptionsExt;
        use std::os::unix::fs::PermissionsExt;
        let private = || -> std::io::Result<()> {
            if let Some(parent) = self.path.parent() {
                fs_err::create_dir_all(parent)?;
            }
            match fs_err::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&self.path)
            {
                // Made now: no connection has it open yet.
                Ok(made) => drop(made),
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err),
            }
            fs_err::set_permissions(&self.path, std::fs::Permissions::from_mode(0o600))
        };
        private().map_err(|source| StoreError::Private {
            path: self.path.clone(),
            source,
        })
    }

    /// A new connection to the store, with its pragmas: a wait for another's write, WAL (a
    /// reader never waits for a writer; a crash loses at most the last transaction).
    ///
    /// # Errors
    /// The file cannot be opened.
    pub(crate) fn connect(&self) -> Result<Connection, StoreError> {
        let conn = Connection::open(&self.path).map_err(|source| self.sqlite(source))?;
        configure(&conn).map_err(|source| self.sqlite(source))?;
        Ok(conn)
    }

    /// Copy in the sessions and keys files of earlier versions that are still there, then
    /// rename them (see the module's documentation). Also called when the sessions' file
    /// appears later (taken out of the image an earlier version kept sessions in).
    ///
    /// # Errors
    /// An old file that cannot be read or copied (left where it was).
    pub(crate) fn import_old_files(&self, conn: &mut Connection) -> Result<(), StoreError> {
        let sources: [(PathBuf, &[OldTable]); 2] = [
            (self.data_dir.join(OLD_KEYS_FILE), OLD_KEYS),
            (self.data_dir.join(OLD_SESSIONS_FILE), OLD_SESSIONS),
        ];
        if !sources.iter().any(|(path, _)| path.exists()) {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|source| self.sqlite(source))?;
        // Checked again holding the store's write lock. A server that imported a file renames
        // it right after its commit, before it serves anything: one that takes the lock in
        // between copies the same rows again, and a row already there is kept (`INSERT OR
        // IGNORE`), so nothing doubles; any later change (a revocation, a deletion) needs
        // the lock too, so it comes after, and an old row never comes back over it.
        let mut imported = Vec::new();
        for (path, tables) in &sources {
            if !path.exists() {
                continue;
            }
            let failed = |source| StoreError::Import {
                path: path.clone(),
                source,
            };
            let old = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
                .map_err(failed)?;
            old.busy_timeout(BUSY_TIMEOUT).map_err(failed)?;
            let mut copied = 0;
            for table in *tables {
                copied += copy_table(&old, &tx, table).map_err(failed)?;
            }
            if tables.iter().any(|t| t.name == "shares") {
                copy_share_counter(&old, &tx).map_err(failed)?;
            }
            imported.push((path.clone(), old, copied));
        }
        tx.commit().map_err(|source| self.sqlite(source))?;
        for (path, old, copied) in imported {
            // Closed first: the last connection to a WAL file folds its journal back in.
            drop(old);
            rename_imported(&path);
            tracing::info!(
                from = %path.display(),
                into = %self.path.display(),
                rows = copied,
                "copied an earlier version's file into the store; it is kept as {}{IMPORTED_SUFFIX}",
                path.display()
            );
        }
        Ok(())
    }
}

/// The pragmas of every connection.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL;")
}

/// Rename an imported file (and its journal files, if a server of an earlier version still
/// holds it open) to `<name>.imported`. A failure is logged: the next start imports the file
/// again, and a row already in the store is kept, not doubled.
fn rename_imported(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", path.display()));
        if !from.exists() {
            continue;
        }
        if suffix == "-wal" {
            tracing::warn!(
                file = %path.display(),
                "another process still has an earlier version's file open (a server of an earlier version on this data directory?): what it writes from now on is not seen; stop it"
            );
        }
        let to = PathBuf::from(format!("{}{IMPORTED_SUFFIX}{suffix}", path.display()));
        if let Err(err) = fs_err::rename(&from, &to) {
            tracing::warn!(%err, "could not rename an imported file; the next start imports it again");
        }
    }
}

/// An in-memory store at the current schema (tests).
#[cfg(test)]
pub(crate) fn in_memory() -> rusqlite::Result<Connection> {
    let mut conn = Connection::open_in_memory()?;
    migrate(&mut conn)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three files of the version before the one store, as it made them (schemas as
    /// released: the runs table at version 3, sessions at 5, keys), with a row each.
    fn old_data_dir(dir: &Path) {
        let runs = Connection::open(dir.join(STORE_FILE)).unwrap();
        runs.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE runs (execution_id TEXT PRIMARY KEY, owner TEXT NOT NULL,
                 kind TEXT NOT NULL, session_id TEXT, started_at_ms INTEGER NOT NULL,
                 server_pid INTEGER NOT NULL, status TEXT NOT NULL, duration_ms INTEGER,
                 setup_ms INTEGER, exit_code INTEGER, python_version TEXT,
                 dependencies TEXT NOT NULL, script TEXT NOT NULL,
                 script_truncated INTEGER NOT NULL, output TEXT, script_bytes INTEGER,
                 script_sha256 TEXT, row_bytes INTEGER NOT NULL DEFAULT 0);
             CREATE INDEX runs_by_owner ON runs (owner, started_at_ms DESC);
             CREATE INDEX runs_budget ON runs (owner, started_at_ms, row_bytes);
             INSERT INTO runs (execution_id, owner, kind, started_at_ms, server_pid, status,
                 dependencies, script, script_truncated, row_bytes)
                 VALUES ('e-old', 'team-a', 'execute', 1, 1, 'ok', '[]', 'print(1)', 0, 300);
             PRAGMA user_version = 3;",
        )
        .unwrap();
        fs_err::create_dir_all(dir.join("sessions-v1")).unwrap();
        let sessions = Connection::open(dir.join(OLD_SESSIONS_FILE)).unwrap();
        // Schema 1 of sessions (no network, owner, network_names, profile), with a share
        // table as later versions added it, and a slot counter past the slots left.
        sessions
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT, interpreter TEXT NOT NULL,
                     python_version TEXT NOT NULL, base_requirements TEXT NOT NULL,
                     requirements TEXT NOT NULL, packages TEXT NOT NULL,
                     venv_bytes INTEGER NOT NULL DEFAULT 0, work_bytes INTEGER NOT NULL DEFAULT 0,
                     created_at INTEGER NOT NULL, last_used_at INTEGER NOT NULL,
                     executions INTEGER NOT NULL DEFAULT 0);
                 CREATE TABLE shares (slot INTEGER PRIMARY KEY AUTOINCREMENT,
                     tenant TEXT NOT NULL UNIQUE, bytes INTEGER NOT NULL);
                 INSERT INTO sessions VALUES ('s-old', 'analysis', '/usr/bin/python3', '3.11.2',
                     '[]', '[\"six\"]', '[]', 10, 20, 1, 2, 3);
                 INSERT INTO shares (slot, tenant, bytes) VALUES (7, 'local', 1000);
                 INSERT INTO shares (slot, tenant, bytes) VALUES (9, 'gone', 1000);
                 DELETE FROM shares WHERE slot = 9;
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        let keys = Connection::open(dir.join(OLD_KEYS_FILE)).unwrap();
        keys.execute_batch(
            "CREATE TABLE keys (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, hash BLOB NOT NULL,
                 masked TEXT NOT NULL, created_at INTEGER NOT NULL, revoked_at INTEGER);
             INSERT INTO keys VALUES ('k-live', 'team-a', x'00', 'sbx_1…2', 5, NULL);
             INSERT INTO keys VALUES ('k-gone', 'team-b', x'01', 'sbx_3…4', 6, 7);",
        )
        .unwrap();
        // Closed with their journals still there, as a server killed mid-way leaves them.
        std::mem::forget(runs);
        std::mem::forget(sessions);
    }

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |row| row.get(0)).unwrap()
    }

    #[test]
    fn the_files_of_the_earlier_version_are_copied_in_once_and_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        old_data_dir(dir.path());
        let (_, conn) = Database::open_connected(dir.path()).unwrap();
        // The runs stay where they were; sessions (with the defaults of their missing
        // columns), shares and keys came in.
        assert_eq!(
            count(
                &conn,
                "SELECT COUNT(*) FROM runs WHERE execution_id = 'e-old'"
            ),
            1
        );
        let (owner, network, names, executions): (String, bool, String, i64) = conn
            .query_row(
                "SELECT owner, network, network_names, executions FROM sessions WHERE id = 's-old'",
                [],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            (owner.as_str(), network, names.as_str(), executions),
            ("local", false, "[]", 3)
        );
        assert_eq!(
            count(&conn, "SELECT slot FROM shares WHERE tenant = 'local'"),
            7
        );
        assert_eq!(
            count(&conn, "SELECT COUNT(*) FROM keys WHERE revoked_at IS NULL"),
            1
        );
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM keys"), 2);
        // A slot is never reused: the next share comes after the old file's counter.
        conn.execute("INSERT INTO shares (tenant, bytes) VALUES ('new', 1)", [])
            .unwrap();
        assert_eq!(
            count(&conn, "SELECT slot FROM shares WHERE tenant = 'new'"),
            10
        );
        // The old files are kept aside, renamed; nothing reads them again.
        for old in [OLD_KEYS_FILE, OLD_SESSIONS_FILE] {
            assert!(!dir.path().join(old).exists(), "{old}");
            assert!(
                dir.path().join(format!("{old}{IMPORTED_SUFFIX}")).exists(),
                "{old}"
            );
        }
        // A session deleted since stays deleted at the next start.
        conn.execute("DELETE FROM sessions WHERE id = 's-old'", [])
            .unwrap();
        drop(conn);
        let (_, conn) = Database::open_connected(dir.path()).unwrap();
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM sessions"), 0);
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM migrations"), latest());
    }

    #[test]
    fn a_file_imported_again_adds_nothing_twice() {
        // A start that copied the rows and stopped before the rename: the next one copies
        // again, and keeps what is there.
        let dir = tempfile::tempdir().unwrap();
        old_data_dir(dir.path());
        let (_, conn) = Database::open_connected(dir.path()).unwrap();
        conn.execute("UPDATE keys SET revoked_at = 99 WHERE id = 'k-live'", [])
            .unwrap();
        drop(conn);
        let keys = dir.path().join(OLD_KEYS_FILE);
        fs_err::rename(format!("{}{IMPORTED_SUFFIX}", keys.display()), &keys).unwrap();
        let (_, conn) = Database::open_connected(dir.path()).unwrap();
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM keys"), 2);
        assert_eq!(
            count(&conn, "SELECT revoked_at FROM keys WHERE id = 'k-live'"),
            99
        );
    }

    #[test]
    fn an_unreadable_old_file_is_left_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        fs_err::write(
            dir.path().join(OLD_KEYS_FILE),
            b"not a database, not at all",
        )
        .unwrap();
        let err = Database::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Import { .. }), "{err:?}");
        assert!(err.hint().unwrap().contains("nothing was removed"));
        assert!(dir.path().join(OLD_KEYS_FILE).exists());
    }

    #[test]
    fn the_store_is_private_and_a_new_one_has_every_step() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (database, conn) = Database::open_connected(&dir.path().join("data")).unwrap();
        let mode = fs_err::metadata(database.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        for table in ["runs", "sessions", "shares", "keys"] {
            assert_eq!(
                count(
                    &conn,
                    &format!("SELECT COUNT(*) FROM sqlite_master WHERE name = '{table}'")
                ),
                1,
                "{table}"
            );
        }
        let ids: Vec<i64> = MIGRATIONS.iter().map(|m| m.id).collect();
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1) && ids[0] == 1,
            "{ids:?}"
        );
    }
}
