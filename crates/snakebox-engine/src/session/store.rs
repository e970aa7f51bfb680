//! The session record: the `sessions` and `shares` tables of the data directory's store
//! ([`crate::store`]), so sessions outlive the server, even a SIGKILL (every change is one
//! committed statement; WAL journal).
//!
//! Only facts that must survive a restart live here: who the session is (id, name, Python),
//! what it asked for, what is installed, sizes and times, and which share of the sessions'
//! disk each tenant holds (its slot, which names its image, so that it never changes while
//! the tenant has sessions and never names two tenants' files). Live state (the
//! interpreter, an install in progress) is in memory only.

use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use crate::store::{Database, StoreError};

/// One session as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionRow {
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    /// Host path of the base interpreter the venv was made from.
    pub(crate) interpreter: String,
    pub(crate) python_version: String,
    /// Requirements given at creation (kept by `reset`).
    pub(crate) base_requirements: Vec<String>,
    /// Every requirement asked for since (creation and installs), in order.
    pub(crate) requirements: Vec<String>,
    /// `(name, version)` of what is installed, as of the last install.
    pub(crate) packages: Vec<(String, String)>,
    pub(crate) venv_bytes: u64,
    pub(crate) work_bytes: u64,
    pub(crate) created_at: u64,
    pub(crate) last_used_at: u64,
    /// Cells run so far (all interpreters).
    pub(crate) executions: u64,
    /// Whether the session was created with network (it still needs the server to allow it
    /// when its interpreter starts). Sessions recorded before this column: off.
    pub(crate) network: bool,
    /// The names it was narrowed to at creation (`allowed_domains`); empty: the server's
    /// whole policy. Sessions recorded before this column: the server's whole policy.
    pub(crate) network_names: Vec<String>,
    /// The tenant it belongs to ([`crate::Caller`]); sessions recorded before this column:
    /// [`crate::LOCAL_TENANT`].
    pub(crate) owner: String,
    /// The profile it was created under; sessions recorded before this column: none (the
    /// server's own settings, as `standard`).
    pub(crate) profile: Option<String>,
}

/// One tenant's share of the sessions' disk, as recorded: its files are in
/// `sessions-v1/shares/<slot>` (an image of `bytes`, or a directory), reserved for it while it
/// has sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareRow {
    /// Never reused (AUTOINCREMENT): a slot names one tenant's share only, ever.
    pub(crate) slot: i64,
    pub(crate) tenant: String,
    /// What the share reserves of `--sessions-max-disk` (its image's size).
    pub(crate) bytes: u64,
}

impl SessionRow {
    /// The name of the profile the session is held to (`standard` for sessions recorded
    /// before profiles).
    pub(crate) fn profile_name(&self) -> String {
        self.profile
            .clone()
            .unwrap_or_else(|| crate::STANDARD_PROFILE.to_owned())
    }
}

/// The database, behind a mutex (every statement is short).
#[derive(Debug)]
pub(crate) struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// The sessions' tables of the data directory's store ([`crate::store`]).
    pub(crate) fn open(database: &Database) -> Result<Store, StoreError> {
        Ok(Store {
            conn: Mutex::new(database.connect()?),
        })
    }

    /// A file of its own at `path` with the store's schema: a session file as earlier
    /// versions kept it (tests).
    #[cfg(test)]
    pub(crate) fn at(path: &std::path::Path) -> Store {
        let mut conn = Connection::open(path).unwrap();
        crate::store::migrate(&mut conn).unwrap();
        Store {
            conn: Mutex::new(conn),
        }
    }

    /// An in-memory store (tests).
    #[cfg(test)]
    pub(crate) fn in_memory() -> rusqlite::Result<Store> {
        Ok(Store {
            conn: Mutex::new(crate::store::in_memory()?),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&conn)
    }

    pub(crate) fn insert(&self, row: &SessionRow) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.execute(
                "INSERT INTO sessions (id, name, interpreter, python_version, base_requirements,
                     requirements, packages, venv_bytes, work_bytes, created_at, last_used_at,
                     executions, network, owner, network_names, profile)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                params![
                    row.id,
                    row.name,
                    row.interpreter,
                    row.python_version,
                    to_json(&row.base_requirements),
                    to_json(&row.requirements),
                    to_json(&row.packages),
                    to_i64(row.venv_bytes),
                    to_i64(row.work_bytes),
                    to_i64(row.created_at),
                    to_i64(row.last_used_at),
                    to_i64(row.executions),
                    row.network,
                    row.owner,
                    to_json(&row.network_names),
                    row.profile,
                ],
            )
            .map(|_| ())
        })
    }

    pub(crate) fn get(&self, id: &str) -> rusqlite::Result<Option<SessionRow>> {
        self.with(|conn| {
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM sessions WHERE id = ?1"))?
                .query_row([id], from_row)
                .optional()
        })
    }

    /// Every session, most recently used first.
    pub(crate) fn list(&self) -> rusqlite::Result<Vec<SessionRow>> {
        self.with(|conn| {
            let mut statement = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM sessions ORDER BY last_used_at DESC, id"
            ))?;
            statement.query_map([], from_row)?.collect()
        })
    }

    pub(crate) fn count(&self) -> rusqlite::Result<u64> {
        self.with(|conn| {
            conn.query_row("SELECT COUNT(*) FROM sessions", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(from_i64)
        })
    }

    /// Sessions of one owner.
    pub(crate) fn count_owned(&self, owner: &str) -> rusqlite::Result<u64> {
        self.with(|conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM sessions WHERE owner = ?1",
                [owner],
                |row| row.get::<_, i64>(0),
            )
            .map(from_i64)
        })
    }

    /// Bytes of one owner's sessions' venvs and workspaces, as last measured.
    pub(crate) fn owned_bytes(&self, owner: &str) -> rusqlite::Result<u64> {
        self.with(|conn| {
            conn.prepare_cached(
                "SELECT COALESCE(SUM(venv_bytes + work_bytes), 0) FROM sessions WHERE owner = ?1",
            )?
            .query_row([owner], |row| row.get::<_, i64>(0))
            .map(from_i64)
        })
    }

    /// Every tenant's share, by slot.
    pub(crate) fn shares(&self) -> rusqlite::Result<Vec<ShareRow>> {
        self.with(|conn| {
            let mut statement =
                conn.prepare_cached("SELECT slot, tenant, bytes FROM shares ORDER BY slot")?;
            statement.query_map([], share_from_row)?.collect()
        })
    }

    /// The share of `tenant`, if it holds one.
    pub(crate) fn share_of(&self, tenant: &str) -> rusqlite::Result<Option<ShareRow>> {
        self.with(|conn| {
            conn.prepare_cached("SELECT slot, tenant, bytes FROM shares WHERE tenant = ?1")?
                .query_row([tenant], share_from_row)
                .optional()
        })
    }

    /// Record a share of `bytes` for `tenant`, in one statement with the check that every
    /// share together stays within `total` (`None`: no check, for sessions moved in from
    /// before shares). `None` when it would not fit. Concurrent servers of one data
    /// directory cannot pass the total together: SQLite runs one writer at a time.
    pub(crate) fn add_share(
        &self,
        tenant: &str,
        bytes: u64,
        total: Option<u64>,
    ) -> rusqlite::Result<Option<ShareRow>> {
        self.with(|conn| {
            let added = conn.execute(
                "INSERT INTO shares (tenant, bytes)
                 SELECT ?1, ?2
                 WHERE ?3 IS NULL OR (SELECT COALESCE(SUM(bytes), 0) FROM shares) + ?2 <= ?3",
                params![tenant, to_i64(bytes), total.map(to_i64)],
            )?;
            if added == 0 {
                return Ok(None);
            }
            conn.query_row(
                "SELECT slot, tenant, bytes FROM shares WHERE tenant = ?1",
                [tenant],
                share_from_row,
            )
            .map(Some)
        })
    }

    /// A share's image now has `bytes` (it was resized, or kept its size).
    pub(crate) fn set_share_bytes(&self, slot: i64, bytes: u64) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.execute(
                "UPDATE shares SET bytes = ?2 WHERE slot = ?1",
                params![slot, to_i64(bytes)],
            )
            .map(|_| ())
        })
    }

    /// The share is given back (its tenant has no session left).
    pub(crate) fn remove_share(&self, slot: i64) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.execute("DELETE FROM shares WHERE slot = ?1", [slot])
                .map(|_| ())
        })
    }

    /// What every share together reserves.
    pub(crate) fn reserved_bytes(&self) -> rusqlite::Result<u64> {
        self.with(|conn| {
            conn.query_row("SELECT COALESCE(SUM(bytes), 0) FROM shares", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(from_i64)
        })
    }

    /// Bytes of every session's venv and workspace, as last measured.
    pub(crate) fn total_bytes(&self) -> rusqlite::Result<u64> {
        self.with(|conn| {
            conn.prepare_cached("SELECT COALESCE(SUM(venv_bytes + work_bytes), 0) FROM sessions")?
                .query_row([], |row| row.get::<_, i64>(0))
                .map(from_i64)
        })
    }

    pub(crate) fn delete(&self, id: &str) -> rusqlite::Result<bool> {
        self.with(|conn| Ok(conn.execute("DELETE FROM sessions WHERE id = ?1", [id])? > 0))
    }

    /// The end of every call: the session's last use, one more cell (`ran_cell`) and the
    /// workspace's size, in one statement.
    pub(crate) fn touch_measured(
        &self,
        id: &str,
        now: u64,
        ran_cell: bool,
        work_bytes: u64,
    ) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.prepare_cached(
                "UPDATE sessions SET last_used_at = ?2, executions = executions + ?3, work_bytes = ?4 WHERE id = ?1",
            )?
            .execute(params![id, to_i64(now), i64::from(ran_cell), to_i64(work_bytes)])
            .map(|_| ())
        })
    }

    /// After an install: what was asked, what is there, how big the venv is.
    pub(crate) fn set_packages(
        &self,
        id: &str,
        requirements: &[String],
        packages: &[(String, String)],
        venv_bytes: u64,
    ) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.execute(
                "UPDATE sessions SET requirements = ?2, packages = ?3, venv_bytes = ?4 WHERE id = ?1",
                params![id, to_json(&requirements), to_json(&packages), to_i64(venv_bytes)],
            )
            .map(|_| ())
        })
    }

    /// Back to the state of a new session (reset): counters and installs cleared.
    pub(crate) fn reset(&self, id: &str, now: u64) -> rusqlite::Result<()> {
        self.with(|conn| {
            conn.execute(
                "UPDATE sessions SET requirements = base_requirements, packages = '[]',
                     venv_bytes = 0, work_bytes = 0, executions = 0, last_used_at = ?2
                 WHERE id = ?1",
                params![id, to_i64(now)],
            )
            .map(|_| ())
        })
    }
}

const COLUMNS: &str = "id, name, interpreter, python_version, base_requirements, requirements, \
                       packages, venv_bytes, work_bytes, created_at, last_used_at, executions, \
                       network, owner, network_names, profile";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: row.get(0)?,
        name: row.get(1)?,
        interpreter: row.get(2)?,
        python_version: row.get(3)?,
        base_requirements: from_json(&row.get::<_, String>(4)?),
        requirements: from_json(&row.get::<_, String>(5)?),
        packages: from_json(&row.get::<_, String>(6)?),
        venv_bytes: from_i64(row.get(7)?),
        work_bytes: from_i64(row.get(8)?),
        created_at: from_i64(row.get(9)?),
        last_used_at: from_i64(row.get(10)?),
        executions: from_i64(row.get(11)?),
        network: row.get(12)?,
        owner: row.get(13)?,
        network_names: from_json(&row.get::<_, String>(14)?),
        profile: row.get(15)?,
    })
}

fn share_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ShareRow> {
    Ok(ShareRow {
        slot: row.get(0)?,
        tenant: row.get(1)?,
        bytes: from_i64(row.get(2)?),
    })
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "[]".into())
}

fn from_json<T: serde::de::DeserializeOwned + Default>(text: &str) -> T {
    serde_json::from_str(text).unwrap_or_default()
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_i64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // See: issue 10 (S-03). Sessions recorded before the network column get none.
    #[test]
    fn a_schema_1_database_gains_the_network_column_off() {
        let dir = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(dir.path().join("sessions-v1")).unwrap();
        let old = Connection::open(dir.path().join("sessions-v1/sessions.db")).unwrap();
        old.execute_batch(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT, interpreter TEXT NOT NULL,
                 python_version TEXT NOT NULL, base_requirements TEXT NOT NULL,
                 requirements TEXT NOT NULL, packages TEXT NOT NULL,
                 venv_bytes INTEGER NOT NULL DEFAULT 0, work_bytes INTEGER NOT NULL DEFAULT 0,
                 created_at INTEGER NOT NULL, last_used_at INTEGER NOT NULL,
                 executions INTEGER NOT NULL DEFAULT 0);
             INSERT INTO sessions VALUES ('s-old', NULL, '/usr/bin/python3', '3.11.2', '[]', '[]',
                 '[]', 0, 0, 1, 1, 0);",
        )
        .unwrap();
        drop(old);
        let store = Store::open(&Database::open(dir.path()).unwrap()).unwrap();
        let old = store.get("s-old").unwrap().unwrap();
        assert!(!old.network);
        // ... and the owner column, the local tenant's (schema 3).
        assert_eq!(old.owner, crate::LOCAL_TENANT);
        let mut new = row("s-new", 2);
        new.network = true;
        store.insert(&new).unwrap();
        assert!(store.get("s-new").unwrap().unwrap().network);
        drop(store);
        // Opening again is a no-op.
        let again = Store::open(&Database::open(dir.path()).unwrap()).unwrap();
        assert!(again.get("s-new").unwrap().unwrap().network);
        assert_eq!(again.count().unwrap(), 2);
    }

    fn row(id: &str, last_used_at: u64) -> SessionRow {
        SessionRow {
            id: id.into(),
            name: Some("analysis".into()),
            interpreter: "/usr/bin/python3.11".into(),
            python_version: "3.11.2".into(),
            base_requirements: vec!["six==1.16.0".into()],
            requirements: vec!["six==1.16.0".into()],
            packages: vec![("six".into(), "1.16.0".into())],
            venv_bytes: 1000,
            work_bytes: 24,
            created_at: 10,
            last_used_at,
            executions: 0,
            network: false,
            network_names: Vec::new(),
            owner: crate::LOCAL_TENANT.into(),
            profile: None,
        }
    }

    #[test]
    fn insert_get_list_delete() {
        let store = Store::in_memory().unwrap();
        store.insert(&row("a", 100)).unwrap();
        store.insert(&row("b", 200)).unwrap();
        assert_eq!(store.get("a").unwrap(), Some(row("a", 100)));
        assert_eq!(store.get("zz").unwrap(), None);
        let ids: Vec<String> = store.list().unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["b", "a"], "most recently used first");
        assert_eq!(store.count().unwrap(), 2);
        assert_eq!(store.total_bytes().unwrap(), 2 * 1024);
        assert!(store.delete("a").unwrap());
        assert!(!store.delete("a").unwrap());
        assert_eq!(store.count().unwrap(), 1);
    }

    #[test]
    fn touch_install_and_reset() {
        let store = Store::in_memory().unwrap();
        store.insert(&row("a", 100)).unwrap();
        store.touch_measured("a", 150, true, 24).unwrap();
        store.touch_measured("a", 160, false, 24).unwrap();
        store
            .set_packages(
                "a",
                &["six==1.16.0".into(), "attrs".into()],
                &[
                    ("attrs".into(), "24.2.0".into()),
                    ("six".into(), "1.16.0".into()),
                ],
                5000,
            )
            .unwrap();
        store.touch_measured("a", 160, false, 77).unwrap();
        let got = store.get("a").unwrap().unwrap();
        assert_eq!((got.last_used_at, got.executions), (160, 1));
        assert_eq!(got.requirements.len(), 2);
        assert_eq!(got.packages.len(), 2);
        assert_eq!((got.venv_bytes, got.work_bytes), (5000, 77));
        store.reset("a", 170).unwrap();
        let got = store.get("a").unwrap().unwrap();
        assert_eq!(got.requirements, ["six==1.16.0"]);
        assert!(got.packages.is_empty());
        assert_eq!((got.executions, got.last_used_at), (0, 170));
    }

    #[test]
    fn shares_stay_within_the_total_and_slots_are_never_reused() {
        let store = Store::in_memory().unwrap();
        let a = store.add_share("a", 60, Some(100)).unwrap().unwrap();
        assert_eq!(store.share_of("a").unwrap(), Some(a.clone()));
        // 60 + 50 > 100: no room for b.
        assert_eq!(store.add_share("b", 50, Some(100)).unwrap(), None);
        let b = store.add_share("b", 40, Some(100)).unwrap().unwrap();
        assert_eq!(store.reserved_bytes().unwrap(), 100);
        // One share per tenant.
        assert!(store.add_share("a", 1, None).is_err());
        // Sessions from before shares may pass the total (nothing is ever refused its files).
        let c = store.add_share("c", 500, None).unwrap().unwrap();
        store.remove_share(a.slot).unwrap();
        let again = store.add_share("a", 10, None).unwrap().unwrap();
        assert!(
            again.slot > c.slot && c.slot > b.slot,
            "{again:?} {c:?} {b:?}"
        );
        store.set_share_bytes(again.slot, 20).unwrap();
        assert_eq!(store.share_of("a").unwrap().unwrap().bytes, 20);
        let slots: Vec<i64> = store.shares().unwrap().iter().map(|s| s.slot).collect();
        assert_eq!(slots, [b.slot, c.slot, again.slot]);
        let mut mine = row("x", 1);
        mine.owner = "a".into();
        store.insert(&mine).unwrap();
        store.insert(&row("y", 1)).unwrap();
        assert_eq!(store.owned_bytes("a").unwrap(), 1024);
        assert_eq!(store.owned_bytes("nobody").unwrap(), 0);
    }

    #[test]
    fn survives_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let open = || Store::open(&Database::open(dir.path()).unwrap()).unwrap();
        open().insert(&row("a", 1)).unwrap();
        let again = open();
        assert_eq!(again.get("a").unwrap(), Some(row("a", 1)));
    }
}
