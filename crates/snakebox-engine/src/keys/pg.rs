//! The keys' rows in the deployment's PostgreSQL (`snakebox_keys`): the same rows as the
//! SQLite store's `keys` table, so every front checks a presented key against one set and a
//! revocation through any front (or `snakebox keys revoke --database …`) holds on all of them
//! from their next request.

use super::{KeyError, KeyInfo, KeyRows};
use crate::shared::PgStore;

/// The keys of one PostgreSQL database.
#[derive(Debug)]
pub(crate) struct PgKeys {
    store: PgStore,
}

impl PgKeys {
    pub(crate) fn new(store: PgStore) -> PgKeys {
        PgKeys { store }
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn info(row: &tokio_postgres::Row) -> KeyInfo {
    KeyInfo {
        id: row.get(0),
        tenant: row.get(1),
        masked: row.get(2),
        created_at: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
        revoked_at: row
            .get::<_, Option<i64>>(4)
            .and_then(|v| u64::try_from(v).ok()),
    }
}

impl KeyRows for PgKeys {
    fn insert(&self, info: &KeyInfo, hash: &[u8; 32]) -> Result<(), KeyError> {
        let info = info.clone();
        let hash = hash.to_vec();
        self.store
            .block(move |conn| async move {
                let client = conn.client().await?;
                client
                    .execute(
                        "INSERT INTO snakebox_keys (id, tenant, hash, masked, created_at)
                         VALUES ($1, $2, $3, $4, $5)",
                        &[
                            &info.id,
                            &info.tenant,
                            &hash,
                            &info.masked,
                            &to_i64(info.created_at),
                        ],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(())
            })
            .map_err(KeyError::Database)
    }

    fn list(&self) -> Result<Vec<KeyInfo>, KeyError> {
        self.store
            .block(|conn| async move {
                let client = conn.client().await?;
                let rows = client
                    .query(
                        "SELECT id, tenant, masked, created_at, revoked_at FROM snakebox_keys
                         ORDER BY created_at, id",
                        &[],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(rows.iter().map(info).collect())
            })
            .map_err(KeyError::Database)
    }

    fn revoke(&self, id: &str, at: u64) -> Result<bool, KeyError> {
        let id = id.to_owned();
        self.store
            .block(move |conn| async move {
                let client = conn.client().await?;
                let changed = client
                    .execute(
                        "UPDATE snakebox_keys SET revoked_at = $2
                         WHERE id = $1 AND revoked_at IS NULL",
                        &[&id, &to_i64(at)],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(changed > 0)
            })
            .map_err(KeyError::Database)
    }

    fn get(&self, id: &str) -> Result<Option<KeyInfo>, KeyError> {
        let id = id.to_owned();
        self.store
            .block(move |conn| async move {
                let client = conn.client().await?;
                let row = client
                    .query_opt(
                        "SELECT id, tenant, masked, created_at, revoked_at FROM snakebox_keys
                         WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(row.as_ref().map(info))
            })
            .map_err(KeyError::Database)
    }

    fn any_live(&self) -> Result<bool, KeyError> {
        self.store
            .block(|conn| async move {
                let client = conn.client().await?;
                let row = client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM snakebox_keys WHERE revoked_at IS NULL)",
                        &[],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(row.get::<_, bool>(0))
            })
            .map_err(KeyError::Database)
    }

    fn live(&self) -> Result<Vec<(String, Vec<u8>)>, KeyError> {
        self.store
            .block(|conn| async move {
                let client = conn.client().await?;
                let rows = client
                    .query(
                        "SELECT tenant, hash FROM snakebox_keys WHERE revoked_at IS NULL",
                        &[],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
            })
            .map_err(KeyError::Database)
    }
}
