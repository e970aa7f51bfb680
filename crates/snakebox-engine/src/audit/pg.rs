//! The audit log in the deployment's PostgreSQL (`snakebox_audit`): one row per line, the
//! same JSON as a line of the files, with its tenant, time and size beside it, so every
//! front's lines land in one place and `snakebox audit --database …` reads them together.
//!
//! Each tenant's lines are bounded by its budget ([`crate::StoreBudgets::audit_bytes`]) as
//! its files are: what a tenant holds is one row of `snakebox_audit_usage`, updated with each
//! batch; past the budget, the tenant's own oldest lines beyond it are removed (counted in the
//! ledger as the files' rotations are), never another tenant's.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::AuditEntry;
use crate::budget::{Ledger, PerTenant, Store};
use crate::shared::{PgError, PgStore};

/// The writer's handle on the table.
pub(crate) struct PgAudit {
    store: PgStore,
    budget: PerTenant<u64>,
    ledger: Arc<Ledger>,
    /// Whether the last write failed (so a failing database is logged once, not per batch).
    failing: bool,
}

impl PgAudit {
    pub(crate) fn new(store: PgStore, budget: PerTenant<u64>, ledger: Arc<Ledger>) -> PgAudit {
        PgAudit {
            store,
            budget,
            ledger,
            failing: false,
        }
    }

    /// Insert the lines of a batch in one transaction, then hold each tenant it touched to
    /// its budget.
    pub(crate) fn append_batch(&mut self, entries: &[AuditEntry]) {
        let mut lines: Vec<(String, i64, String, i64)> = Vec::with_capacity(entries.len());
        for entry in entries {
            if !crate::is_plain_name(&entry.tenant) {
                tracing::warn!("an audit line without a valid tenant was not written");
                continue;
            }
            let Some(line) = entry.line() else {
                continue;
            };
            let mut text = String::from_utf8_lossy(&line).into_owned();
            text.truncate(text.trim_end().len());
            let bytes = i64::try_from(line.len()).unwrap_or(i64::MAX);
            lines.push((
                entry.tenant.clone(),
                i64::try_from(entry.at_ms).unwrap_or(i64::MAX),
                text,
                bytes,
            ));
        }
        if lines.is_empty() {
            return;
        }
        let tenants: BTreeSet<String> = lines.iter().map(|(t, ..)| t.clone()).collect();
        let budgets: Vec<(String, i64)> = tenants
            .into_iter()
            .map(|tenant| {
                let budget = i64::try_from(self.budget.of(&tenant)).unwrap_or(i64::MAX);
                (tenant, budget)
            })
            .collect();
        let written = self.store.block(move |conn| async move {
            let mut client = conn.client().await?;
            let tx = client.transaction().await.map_err(|e| conn.failed(e))?;
            for (tenant, at_ms, line, bytes) in &lines {
                tx.execute(
                    "INSERT INTO snakebox_audit (tenant, at_ms, line, bytes) VALUES ($1, $2, $3, $4)",
                    &[tenant, at_ms, line, bytes],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            }
            // What each tenant holds is one row, updated in this transaction: its lock
            // orders the fronts writing for one tenant, and the check costs one row, not a
            // scan of the tenant's lines.
            let mut removed = Vec::new();
            for (tenant, budget) in &budgets {
                let added: i64 = lines
                    .iter()
                    .filter(|(t, ..)| t == tenant)
                    .map(|(.., bytes)| *bytes)
                    .sum();
                let held: i64 = tx
                    .query_one(
                        "INSERT INTO snakebox_audit_usage (tenant, bytes) VALUES ($1, $2)
                         ON CONFLICT (tenant)
                         DO UPDATE SET bytes = snakebox_audit_usage.bytes + EXCLUDED.bytes
                         RETURNING bytes",
                        &[tenant, &added],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?
                    .get(0);
                if held <= *budget {
                    continue;
                }
                // Past its budget: the tenant's newest lines that fit it are kept, its older
                // ones go, and what it holds is measured again from its lines.
                let gone = tx
                    .execute(
                        "DELETE FROM snakebox_audit WHERE seq IN (
                             SELECT seq FROM (
                                 SELECT seq, SUM(bytes) OVER (ORDER BY seq DESC) AS newer
                                 FROM snakebox_audit WHERE tenant = $1
                             ) kept WHERE newer > $2::BIGINT)",
                        &[tenant, budget],
                    )
                    .await
                    .map_err(|e| conn.failed(e))?;
                tx.execute(
                    "UPDATE snakebox_audit_usage SET bytes = (
                         SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM snakebox_audit WHERE tenant = $1)
                     WHERE tenant = $1",
                    &[tenant],
                )
                .await
                .map_err(|e| conn.failed(e))?;
                removed.push((tenant.clone(), gone));
            }
            tx.commit().await.map_err(|e| conn.failed(e))?;
            Ok(removed)
        });
        match written {
            Ok(removed) => {
                self.failing = false;
                for (tenant, gone) in removed {
                    self.ledger.removed(
                        Store::Audit,
                        &tenant,
                        gone,
                        &crate::ids::human_bytes(self.budget.of(&tenant)),
                    );
                }
            }
            Err(err) => {
                if !self.failing {
                    tracing::warn!(error = %crate::error::describe(&err), "could not write the audit log to the database");
                }
                self.failing = true;
            }
        }
    }
}

/// Bytes of `tenant`'s lines in the table (0 when it cannot be read).
pub(crate) fn tenant_bytes(store: &PgStore, tenant: &str) -> u64 {
    let tenant = tenant.to_owned();
    store
        .block(move |conn| async move {
            let client = conn.client().await?;
            let row = client
                .query_one(
                    "SELECT COALESCE((SELECT bytes FROM snakebox_audit_usage WHERE tenant = $1), 0)",
                    &[&tenant],
                )
                .await
                .map_err(|e| conn.failed(e))?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .map_err(|err| tracing::warn!(error = %crate::error::describe(&err), "could not read the audit log's size"))
        .unwrap_or(0)
}

/// Every entry of the audit log in `store`, oldest first (every front's, every tenant's); a
/// row that is not an entry is counted in the second value and skipped.
///
/// # Errors
/// The database cannot be read.
pub fn read_audit_table(store: &PgStore) -> Result<(Vec<AuditEntry>, usize), PgError> {
    let lines: Vec<String> = store.block(|conn| async move {
        let client = conn.client().await?;
        let rows = client
            .query("SELECT line FROM snakebox_audit ORDER BY at_ms, seq", &[])
            .await
            .map_err(|e| conn.failed(e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    })?;
    let mut entries = Vec::with_capacity(lines.len());
    let mut bad = 0;
    for line in lines {
        match serde_json::from_str::<AuditEntry>(&line) {
            Ok(entry) => entries.push(entry),
            Err(_) => bad += 1,
        }
    }
    Ok((entries, bad))
}
