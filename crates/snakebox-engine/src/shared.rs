//! The shared store: where what several fronts of one deployment must agree on lives — the
//! API keys, the runs table and the audit log.
//!
//! It exists so that a deployment can outgrow one host (DESIGN §7): by default these live in
//! the data directory (the SQLite store, `store.rs`, and the audit log's files, `audit.rs`),
//! as they always did; with `--database postgres://…` they live in one
//! PostgreSQL database that every front of the deployment connects to, so fronts keep no
//! state of their own. Sessions are not here: a session stays on the host (the agent) that
//! holds it, in that host's SQLite store. Tenants are not here either: they are the config
//! file's `[tenants]` and `[tenants.NAME]`, which every front reads.
//!
//! Each concern has its own seam, with one implementation per store: the keys' `KeyRows`
//! (`keys.rs`), the runs table's `RunsTable` (`history.rs`) and the audit log's `AuditSink`
//! (`audit.rs`); each uses this module, never the other way round.
//! What the rows mean (hashing keys, bounding rows, each tenant's budget) is written once, above
//! the seams, so a tenant over its budget loses only its own oldest rows in either store.

pub(crate) mod postgres;
#[cfg(test)]
pub(crate) mod test_cluster;

use std::path::{Path, PathBuf};

pub use postgres::{DatabaseUrl, PgError, PgStore};

use crate::error::{ErrorKind, Hint};
use crate::store::{Database, StoreError};

/// Where the shared rows live.
#[derive(Debug, Clone)]
pub enum SharedStore {
    /// The data directory's SQLite store (and the audit log's files beside it): one host.
    Sqlite(Database),
    /// A PostgreSQL database every front of a deployment shares.
    Postgres(PgStore),
}

/// Why the shared store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SharedStoreError {
    /// The data directory's store failed.
    #[error(transparent)]
    Sqlite(#[from] StoreError),
    /// PostgreSQL could not be reached or set up.
    #[error(transparent)]
    Postgres(#[from] PgError),
}

impl Hint for SharedStoreError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Internal
    }

    fn hint(&self) -> Option<String> {
        match self {
            SharedStoreError::Sqlite(err) => err.hint(),
            SharedStoreError::Postgres(err) => Some(err.hint()),
        }
    }
}

impl SharedStore {
    /// The store `database` names (`None`: the data directory's SQLite store), reachable and
    /// at the current schema. PostgreSQL stores are opened once per process and URL: every
    /// user of one gets the same pool of connections.
    ///
    /// Blocks while it connects (at most `postgres::CONNECT_TIMEOUT`): call it at start or
    /// off the async runtime's threads.
    ///
    /// # Errors
    /// The SQLite file cannot be made or migrated, or PostgreSQL cannot be reached, refuses
    /// the login, or its schema cannot be made.
    pub fn open(
        database: Option<&DatabaseUrl>,
        data_dir: &Path,
    ) -> Result<SharedStore, SharedStoreError> {
        match database {
            None => Ok(SharedStore::Sqlite(Database::open(data_dir)?)),
            Some(url) => Ok(SharedStore::Postgres(PgStore::open(url)?)),
        }
    }

    /// What the store is, for `snakebox check` and the server's log: the SQLite file's path,
    /// or the database's URL without its password.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            SharedStore::Sqlite(database) => format!("sqlite {}", database.path().display()),
            SharedStore::Postgres(store) => format!("postgresql {}", store.url().redacted()),
        }
    }

    /// The SQLite file, when the store is the data directory's.
    #[must_use]
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        match self {
            SharedStore::Sqlite(database) => Some(database.path().to_path_buf()),
            SharedStore::Postgres(_) => None,
        }
    }
}
