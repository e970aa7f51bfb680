//! API keys: `Authorization: Bearer sbx_…` → the tenant the key was made for.
//!
//! The HTTP face checks presented keys with it; the CLI (`snakebox keys`) makes, lists and
//! revokes them. It lives in the engine because its table is in the shared store
//! ([`crate::shared`]): the data directory's one store ([`crate::store`]), or the deployment's
//! PostgreSQL, so a key made or revoked through one front holds on every front.
//!
//! A key is `sbx_` and 64 hex digits (256 random bits from the kernel); it is shown once, when
//! it is made, and never stored: the store's `keys` table keeps its SHA-256 and a masked form (`sbx_1a2b…9f0e`) for listing. A key this long
//! needs no slow hash: nobody can guess one, so the hash only has to make a stolen store
//! useless. Checking a presented key compares its hash with every live key's in constant time,
//! and reads the store each time, so a revocation holds from the next request on; responses
//! still streaming for a revoked key are ended by the HTTP face.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Caller;
use crate::shared::{DatabaseUrl, PgError, PgStore, SharedStore};
use crate::store::{Database, StoreError};

mod pg;

/// The prefix of every key, so a leaked one is recognisable (secret scanners, logs).
pub const KEY_PREFIX: &str = "sbx_";

/// Why the key store failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The store could not be opened.
    #[error("Failed to open the API keys")]
    Open(#[source] StoreError),
    /// The store could not be read or written.
    #[error("Failed to use the API keys in `{}`", path.display())]
    Store {
        /// The store's file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The deployment's PostgreSQL could not be used.
    #[error("Failed to use the API keys")]
    Database(#[source] PgError),
    /// The check was cut short (its thread ended before answering).
    #[error("Failed to check the API key: the check was interrupted")]
    Interrupted,
    /// The kernel's random source could not be read.
    #[error("Failed to read random bytes for a new key")]
    Random(#[source] std::io::Error),
    /// No live key has this id.
    #[error("No API key `{0}`")]
    NotFound(String),
    /// The tenant name is not valid.
    #[error("`{0}` is not a valid tenant name")]
    Tenant(String),
}

impl KeyError {
    /// What failed with its causes (`what failed: because`), for the server's log.
    #[must_use]
    pub fn describe(&self) -> String {
        crate::error::describe(self)
    }

    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            KeyError::Random(_) => "check that /dev/urandom is readable".into(),
            KeyError::Interrupted => "try again; the server's log says more".into(),
            KeyError::Open(err) => crate::Hint::hint(err).unwrap_or_default(),
            KeyError::Database(err) => err.hint(),
            KeyError::Store { .. } => {
                "check that the data directory (--data-dir) is writable by the server user".into()
            }
            KeyError::NotFound(_) => "`snakebox keys list` shows the keys and their ids".into(),
            KeyError::Tenant(_) => {
                "use 1 to 64 characters of lowercase letters, digits, `-` and `_`".into()
            }
        }
    }
}

/// A key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The key's id, for `keys revoke`.
    pub id: String,
    /// The tenant its calls are for.
    pub tenant: String,
    /// The key, masked: its prefix, first and last hex digits.
    pub masked: String,
    /// When it was made (Unix seconds).
    pub created_at: u64,
    /// When it was revoked (Unix seconds), if it was.
    pub revoked_at: Option<u64>,
}

/// A key just made: shown once.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// What `keys list` and `keys revoke` call it.
    pub info: KeyInfo,
    /// The key itself: give it to the tenant's clients; it is not stored.
    pub key: String,
}

/// Where the keys' rows are kept: the seam between what a key is (made, hashed, compared,
/// above) and the store that keeps its row — the data directory's SQLite store
/// ([`SqliteKeys`]) or the deployment's PostgreSQL ([`pg::PgKeys`]). Every method reads or
/// writes the store as it is now: another process (another front, `snakebox keys`) changes it.
pub(crate) trait KeyRows: std::fmt::Debug + Send + Sync {
    /// Keep a new key's row (its hash, never the key).
    fn insert(&self, info: &KeyInfo, hash: &[u8; 32]) -> Result<(), KeyError>;
    /// Every key, live and revoked, oldest first.
    fn list(&self) -> Result<Vec<KeyInfo>, KeyError>;
    /// Mark the live key `id` revoked at `at`; whether there was one.
    fn revoke(&self, id: &str, at: u64) -> Result<bool, KeyError>;
    /// The key with this id.
    fn get(&self, id: &str) -> Result<Option<KeyInfo>, KeyError>;
    /// Whether any key is live.
    fn any_live(&self) -> Result<bool, KeyError>;
    /// The tenant and hash of every live key.
    fn live(&self) -> Result<Vec<(String, Vec<u8>)>, KeyError>;
}

/// The API keys: made, listed, revoked, and checked when presented.
#[derive(Debug, Clone)]
pub struct KeyStore {
    rows: Arc<dyn KeyRows>,
}

/// The keys' rows in a data directory's SQLite store.
#[derive(Debug)]
struct SqliteKeys {
    data_dir: PathBuf,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A key as listed, from a row of `id, tenant, masked, created_at, revoked_at`.
fn key_info(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyInfo> {
    Ok(KeyInfo {
        id: row.get(0)?,
        tenant: row.get(1)?,
        masked: row.get(2)?,
        created_at: u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
        revoked_at: row
            .get::<_, Option<i64>>(4)?
            .and_then(|v| u64::try_from(v).ok()),
    })
}

/// `bytes` random bytes from the kernel, as hex (keys, key ids, SSE session ids).
///
/// # Errors
/// The kernel's random source cannot be read.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    fs_err::File::open("/dev/urandom")?.read_exact(&mut buffer)?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equal in time independent of where the first difference is.
fn same(a: &[u8; 32], b: &[u8]) -> bool {
    b.len() == a.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

fn masked(key: &str) -> String {
    let digits = key.strip_prefix(KEY_PREFIX).unwrap_or(key);
    let head: String = digits.chars().take(4).collect();
    let tail: String = digits
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{KEY_PREFIX}{head}…{tail}")
}

impl SqliteKeys {
    fn store_error(&self, source: rusqlite::Error) -> KeyError {
        KeyError::Store {
            path: self.data_dir.join(crate::store::STORE_FILE),
            source,
        }
    }

    /// A connection of its own for every use: what it reads is what the store holds now
    /// (another process revokes keys).
    fn open(&self) -> Result<Connection, KeyError> {
        Database::open_connected(&self.data_dir)
            .map(|(_, conn)| conn)
            .map_err(KeyError::Open)
    }
}

impl KeyRows for SqliteKeys {
    fn insert(&self, info: &KeyInfo, hash: &[u8; 32]) -> Result<(), KeyError> {
        let conn = self.open()?;
        conn.execute(
            "INSERT INTO keys (id, tenant, hash, masked, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                info.id,
                info.tenant,
                hash.to_vec(),
                info.masked,
                i64::try_from(info.created_at).unwrap_or(i64::MAX)
            ],
        )
        .map_err(|e| self.store_error(e))?;
        Ok(())
    }

    fn list(&self) -> Result<Vec<KeyInfo>, KeyError> {
        let conn = self.open()?;
        let mut statement = conn
            .prepare(
                "SELECT id, tenant, masked, created_at, revoked_at FROM keys ORDER BY created_at, id",
            )
            .map_err(|e| self.store_error(e))?;
        let rows = statement
            .query_map([], key_info)
            .and_then(Iterator::collect)
            .map_err(|e| self.store_error(e))?;
        Ok(rows)
    }

    fn revoke(&self, id: &str, at: u64) -> Result<bool, KeyError> {
        let conn = self.open()?;
        let changed = conn
            .execute(
                "UPDATE keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, i64::try_from(at).unwrap_or(i64::MAX)],
            )
            .map_err(|e| self.store_error(e))?;
        Ok(changed > 0)
    }

    fn get(&self, id: &str) -> Result<Option<KeyInfo>, KeyError> {
        let conn = self.open()?;
        conn.query_row(
            "SELECT id, tenant, masked, created_at, revoked_at FROM keys WHERE id = ?1",
            [id],
            key_info,
        )
        .optional()
        .map_err(|e| self.store_error(e))
    }

    fn any_live(&self) -> Result<bool, KeyError> {
        let conn = self.open()?;
        conn.query_row(
            "SELECT COUNT(*) FROM keys WHERE revoked_at IS NULL",
            [],
            |row| row.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .map_err(|e| self.store_error(e))
    }

    fn live(&self) -> Result<Vec<(String, Vec<u8>)>, KeyError> {
        let conn = self.open()?;
        let mut statement = conn
            .prepare("SELECT tenant, hash FROM keys WHERE revoked_at IS NULL")
            .map_err(|e| self.store_error(e))?;
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .and_then(Iterator::collect)
            .map_err(|e| self.store_error(e))
    }
}

impl KeyStore {
    /// The keys of `data_dir`'s SQLite store (made on first use).
    #[must_use]
    pub fn new(data_dir: &Path) -> KeyStore {
        KeyStore {
            rows: Arc::new(SqliteKeys {
                data_dir: data_dir.to_path_buf(),
            }),
        }
    }

    /// The keys of a shared store: the data directory's (as [`KeyStore::new`]) or the
    /// deployment's PostgreSQL.
    #[must_use]
    pub fn shared(store: &SharedStore) -> KeyStore {
        match store {
            SharedStore::Sqlite(database) => KeyStore::new(database.data_dir()),
            SharedStore::Postgres(store) => KeyStore {
                rows: Arc::new(pg::PgKeys::new(store.clone())),
            },
        }
    }

    /// The keys of the store `database` names (`None`: `data_dir`'s SQLite store, made on
    /// first use). A PostgreSQL database is connected to now (blocking: call it at start or
    /// off the async runtime's threads).
    ///
    /// # Errors
    /// The database cannot be reached or set up.
    pub fn open(database: Option<&DatabaseUrl>, data_dir: &Path) -> Result<KeyStore, KeyError> {
        match database {
            None => Ok(KeyStore::new(data_dir)),
            Some(url) => PgStore::open(url)
                .map(|store| KeyStore::shared(&SharedStore::Postgres(store)))
                .map_err(KeyError::Database),
        }
    }

    /// Make a key for `tenant`.
    ///
    /// # Errors
    /// An invalid tenant name, or a store that cannot be written.
    pub fn add(&self, tenant: &str) -> Result<NewKey, KeyError> {
        Caller::tenant(tenant).map_err(|_| KeyError::Tenant(tenant.to_owned()))?;
        let random = |bytes| random_hex(bytes).map_err(KeyError::Random);
        let key = format!("{KEY_PREFIX}{}", random(32)?);
        let info = KeyInfo {
            id: format!("k-{}", random(6)?),
            tenant: tenant.to_owned(),
            masked: masked(&key),
            created_at: now(),
            revoked_at: None,
        };
        self.rows.insert(&info, &hash(&key))?;
        Ok(NewKey { info, key })
    }

    /// Every key, live and revoked, oldest first.
    ///
    /// # Errors
    /// A store that cannot be read.
    pub fn list(&self) -> Result<Vec<KeyInfo>, KeyError> {
        self.rows.list()
    }

    /// Revoke a key by id: it stops working at the next request.
    ///
    /// # Errors
    /// No live key with this id, or a store that cannot be written.
    pub fn revoke(&self, id: &str) -> Result<KeyInfo, KeyError> {
        if !self.rows.revoke(id, now())? {
            return Err(KeyError::NotFound(id.to_owned()));
        }
        self.get(id)?
            .ok_or_else(|| KeyError::NotFound(id.to_owned()))
    }

    /// Whether any live key exists (a server with none may run without authentication on
    /// loopback only).
    ///
    /// # Errors
    /// A store that cannot be read.
    pub fn any_live(&self) -> Result<bool, KeyError> {
        self.rows.any_live()
    }

    /// The tenant of a presented key, if it is a live key.
    ///
    /// # Errors
    /// A store that cannot be read (the request is then refused, never let through).
    pub fn authenticate(&self, presented: &str) -> Result<Option<Caller>, KeyError> {
        if !presented.starts_with(KEY_PREFIX) {
            return Ok(None);
        }
        self.authenticate_hash(&hash(presented))
    }

    /// The SHA-256 of a presented key: what the store keeps, and what a web UI session keeps
    /// to check at each request that its key is still live.
    #[must_use]
    pub fn hash_of(presented: &str) -> [u8; 32] {
        hash(presented)
    }

    /// The tenant of the live key whose SHA-256 is `wanted`.
    ///
    /// # Errors
    /// A store that cannot be read.
    pub fn authenticate_hash(&self, wanted: &[u8; 32]) -> Result<Option<Caller>, KeyError> {
        let live = self.rows.live()?;
        // Every live key is compared, in constant time each: no early exit tells how close
        // a guess came.
        let mut found = None;
        for (tenant, stored) in &live {
            if same(wanted, stored) {
                found = Some(tenant.clone());
            }
        }
        Ok(found.and_then(|tenant| Caller::tenant(&tenant).ok()))
    }

    /// The SHA-256 of every live key: what the HTTP face watches for a revocation.
    ///
    /// # Errors
    /// A store that cannot be read.
    pub fn live_hashes(&self) -> Result<BTreeSet<[u8; 32]>, KeyError> {
        Ok(self
            .rows
            .live()?
            .into_iter()
            .filter_map(|(_, hash)| <[u8; 32]>::try_from(hash).ok())
            .collect())
    }

    /// The key with this id, if any.
    ///
    /// # Errors
    /// A store that cannot be read.
    pub fn get(&self, id: &str) -> Result<Option<KeyInfo>, KeyError> {
        self.rows.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same body for both stores.
    fn a_key_authenticates_its_tenant_until_revoked_in(store: &KeyStore) -> NewKey {
        assert!(!store.any_live().unwrap());
        let made = store.add("team-a").unwrap();
        assert!(made.key.starts_with("sbx_") && made.key.len() == 4 + 64);
        assert!(store.any_live().unwrap());
        let caller = store.authenticate(&made.key).unwrap().unwrap();
        assert_eq!(caller.id(), "team-a");
        assert_eq!(store.live_hashes().unwrap().len(), 1);
        // A near miss, another prefix, empty: nobody.
        let mut near = made.key.clone();
        near.pop();
        near.push('x');
        for wrong in [near.as_str(), "Bearer", "", &made.key[4..]] {
            assert!(store.authenticate(wrong).unwrap().is_none(), "{wrong}");
        }
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].masked.starts_with("sbx_") && listed[0].masked.contains('…'));
        assert_eq!(store.get(&made.info.id).unwrap().unwrap(), made.info);
        let revoked = store.revoke(&made.info.id).unwrap();
        assert!(revoked.revoked_at.is_some());
        assert!(store.authenticate(&made.key).unwrap().is_none());
        assert!(matches!(
            store.revoke(&made.info.id),
            Err(KeyError::NotFound(_))
        ));
        assert!(!store.any_live().unwrap());
        assert!(store.live_hashes().unwrap().is_empty());
        assert!(matches!(store.add("Team A"), Err(KeyError::Tenant(_))));
        made
    }

    #[test]
    fn a_key_authenticates_its_tenant_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        let made = a_key_authenticates_its_tenant_until_revoked_in(&store);
        // Only the masked form and a hash are stored.
        let bytes = fs_err::read(dir.path().join(crate::store::STORE_FILE)).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(&made.key[4..]), "the key is stored in clear");
    }

    #[test]
    fn postgres_a_key_authenticates_its_tenant_until_revoked_on_every_front() {
        let Some(cluster) = crate::shared::test_cluster::TestCluster::start() else {
            return;
        };
        let data = tempfile::tempdir().unwrap();
        let store = KeyStore::open(Some(&cluster.url), data.path()).unwrap();
        let made = a_key_authenticates_its_tenant_until_revoked_in(&store);
        // Nothing is kept in the data directory.
        assert!(!data.path().join(crate::store::STORE_FILE).exists());
        // Another handle on the same database (as another front's) sees a key made by this
        // one, and its revocation at its next check.
        let other = KeyStore {
            rows: Arc::new(pg::PgKeys::new(PgStore::open(&cluster.url).unwrap())),
        };
        assert_eq!(
            other.list().unwrap(),
            vec![store.get(&made.info.id).unwrap().unwrap()]
        );
        let second = store.add("team-b").unwrap();
        assert_eq!(
            other.authenticate(&second.key).unwrap().unwrap().id(),
            "team-b"
        );
        store.revoke(&second.info.id).unwrap();
        assert!(other.authenticate(&second.key).unwrap().is_none());
    }

    #[test]
    fn an_unreachable_database_is_an_error_with_a_hint() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let url: DatabaseUrl = format!("postgres://snakebox:pw-secret@127.0.0.1:{port}/db")
            .parse()
            .unwrap();
        let err = KeyStore::open(Some(&url), Path::new("/nonexistent")).unwrap_err();
        let text = format!("{}: {}", err.describe(), err.hint());
        assert!(text.contains("Failed to connect to the database"), "{text}");
        assert!(text.contains("check that PostgreSQL is running"), "{text}");
        assert!(!text.contains("pw-secret"), "{text}");
    }

    #[test]
    fn tenant_names_are_checked_and_the_store_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        assert!(matches!(store.add("Team A"), Err(KeyError::Tenant(_))));
        store.add("b").unwrap();
        let mode = fs_err::metadata(dir.path().join(crate::store::STORE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
