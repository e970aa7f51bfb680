//! Per-tenant budgets of the shared stores: the runs table, the audit log and the artifact
//! store each keep what one tenant wrote within that tenant's own budget, and when a tenant
//! goes over it, the store removes that tenant's oldest, never another tenant's
//! ([`excess`]). One rule for every store, applied where the store writes, so a tenant
//! flooding a store can only ever cost itself.
//!
//! What each store removed by a tenant's budget (and what the queue to the runs table's and
//! audit log's writer dropped) is counted per tenant in the [`Ledger`]: `check_environment`
//! shows a tenant its own counts (never another's), `/metrics` the server-wide totals
//! ([`STORE_REMOVED_TOTAL`], [`AUDIT_DROPPED_TOTAL`]), and the server's log says so when it
//! starts happening (then at each power of ten, so a flood cannot flood the log too).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::human_bytes;

/// Records of one tenant removed by its own budget, by store (a server-wide counter: no label
/// names a tenant).
pub const STORE_REMOVED_TOTAL: &str = "snakebox_store_removed_total";
/// Records the writer's queue dropped (server-wide).
pub const AUDIT_DROPPED_TOTAL: &str = "snakebox_audit_dropped_total";

/// One tenant's budget in one store: at most `items` records and `bytes` bytes (`None`: no
/// such bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Records kept (runs, files).
    pub items: Option<u64>,
    /// Bytes kept.
    pub bytes: Option<u64>,
}

/// What a tenant holds in a store, or what one record costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) items: u64,
    pub(crate) bytes: u64,
}

impl Usage {
    /// One record of `bytes` bytes.
    pub(crate) fn one(bytes: u64) -> Usage {
        Usage { items: 1, bytes }
    }

    pub(crate) fn add(&mut self, other: Usage) {
        self.items = self.items.saturating_add(other.items);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }

    pub(crate) fn sub(&mut self, other: Usage) {
        self.items = self.items.saturating_sub(other.items);
        self.bytes = self.bytes.saturating_sub(other.bytes);
    }
}

impl Budget {
    /// A budget of bytes only.
    #[must_use]
    pub fn bytes(bytes: u64) -> Budget {
        Budget {
            items: None,
            bytes: Some(bytes),
        }
    }

    /// Whether `usage` fits.
    pub(crate) fn holds(&self, usage: Usage) -> bool {
        self.items.is_none_or(|max| usage.items <= max)
            && self.bytes.is_none_or(|max| usage.bytes <= max)
    }

    /// The budget in words: `100000 runs and 1.0 GiB`; `unbounded` when neither is set.
    #[must_use]
    pub fn describe(&self, what: &str) -> String {
        match (self.items, self.bytes) {
            (Some(items), Some(bytes)) => format!("{items} {what} and {}", human_bytes(bytes)),
            (Some(items), None) => format!("{items} {what}"),
            (None, Some(bytes)) => human_bytes(bytes),
            (None, None) => "unbounded".into(),
        }
    }
}

/// The rule every store applies: of one tenant's records, oldest first, those to remove so
/// that what the tenant still holds fits `budget`. `held` is all the tenant holds (the
/// records listed may be only its oldest). Only this tenant's records are ever passed in:
/// another tenant's use can never make a store remove them.
pub(crate) fn excess<K>(
    held: Usage,
    budget: Budget,
    oldest_first: impl IntoIterator<Item = (K, Usage)>,
) -> (Vec<K>, Usage) {
    let mut left = held;
    let mut removed = Vec::new();
    let mut freed = Usage::default();
    for (key, cost) in oldest_first {
        if budget.holds(left) {
            break;
        }
        left.sub(cost);
        freed.add(cost);
        removed.push(key);
    }
    (removed, freed)
}

/// The store budgets of every tenant (each tenant gets the same) and the writer's queue: the
/// operator's settings (`[tenants]`, `[server] audit_queue_size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreBudgets {
    /// Runs of one tenant kept in the runs table (rows and bytes of their scripts and
    /// results); past it, the tenant's oldest finished runs are removed.
    pub history: Budget,
    /// Bytes of one tenant's audit log (its current file and the rotated ones); past it,
    /// its oldest rotated file is removed.
    pub audit_bytes: u64,
    /// Bytes of one tenant's artifacts; past it, its oldest runs' artifacts are removed.
    pub artifact_bytes: u64,
    /// Bytes of records queued for the runs table's and the audit log's writer; past it, the
    /// tenant with the most queued loses its own newest first.
    pub audit_queue_bytes: u64,
}

/// Default runs kept per tenant.
pub const DEFAULT_HISTORY_ROWS: u64 = 100_000;
/// Default bytes of runs kept per tenant.
pub const DEFAULT_HISTORY_BYTES: u64 = 1 << 30;
/// Default bytes of audit log kept per tenant.
pub const DEFAULT_AUDIT_BYTES: u64 = 160 << 20;
/// Default bytes of artifacts kept per tenant.
pub const DEFAULT_ARTIFACT_BYTES: u64 = 256 << 20;
/// Default bytes of the writer's queue.
pub const DEFAULT_AUDIT_QUEUE_BYTES: u64 = 64 << 20;
/// Smallest audit budget of a tenant: a few of the largest lines in each of its files.
pub const MIN_AUDIT_BYTES: u64 = 64 << 10;
/// Smallest writer's queue: a few of the largest records (a call's start keeps up to 64 KiB
/// of its script and its bounded dependencies).
pub const MIN_AUDIT_QUEUE_BYTES: u64 = 512 << 10;

impl Default for StoreBudgets {
    fn default() -> Self {
        StoreBudgets {
            history: Budget {
                items: Some(DEFAULT_HISTORY_ROWS),
                bytes: Some(DEFAULT_HISTORY_BYTES),
            },
            audit_bytes: DEFAULT_AUDIT_BYTES,
            artifact_bytes: DEFAULT_ARTIFACT_BYTES,
            audit_queue_bytes: DEFAULT_AUDIT_QUEUE_BYTES,
        }
    }
}

/// The shared stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Store {
    Runs,
    Audit,
    Artifacts,
}

impl Store {
    fn as_str(self) -> &'static str {
        match self {
            Store::Runs => "runs",
            Store::Audit => "audit",
            Store::Artifacts => "artifacts",
        }
    }
}

/// One tenant's counts since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TenantCounts {
    /// Records removed by the tenant's own budget: runs, audit files, runs' artifacts.
    pub(crate) runs_removed: u64,
    pub(crate) audit_files_removed: u64,
    pub(crate) artifacts_removed: u64,
    /// Runs whose artifacts were not kept because the store as a whole was full.
    pub(crate) artifacts_refused: u64,
    /// Records of the tenant the writer's queue dropped.
    pub(crate) dropped: u64,
}

/// What the stores removed and dropped, per tenant.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    tenants: Mutex<HashMap<String, TenantCounts>>,
}

/// Whether a count that went from `before` to `after` is one to tell the server's log about:
/// the first, then each time it reaches another power of ten.
fn worth_logging(before: u64, after: u64) -> bool {
    before == 0 || after.ilog10() > before.ilog10()
}

impl Ledger {
    fn update(&self, tenant: &str, change: impl FnOnce(&mut TenantCounts) -> u64) -> u64 {
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(tenants.entry(tenant.to_owned()).or_default())
    }

    /// `count` records of `tenant` were removed from `store` by the tenant's own budget.
    pub(crate) fn removed(&self, store: Store, tenant: &str, count: u64, budget: &str) {
        if count == 0 {
            return;
        }
        let total = self.update(tenant, |counts| {
            let field = match store {
                Store::Runs => &mut counts.runs_removed,
                Store::Audit => &mut counts.audit_files_removed,
                Store::Artifacts => &mut counts.artifacts_removed,
            };
            *field += count;
            *field
        });
        metrics::counter!(STORE_REMOVED_TOTAL, "store" => store.as_str()).increment(count);
        if worth_logging(total - count, total) {
            tracing::info!(
                tenant,
                store = store.as_str(),
                removed = total,
                "a tenant is over its budget of a shared store ({budget}); its own oldest records are removed"
            );
        }
    }

    /// A run of `tenant` kept no artifacts: the store as a whole was full.
    pub(crate) fn refused(&self, tenant: &str) {
        self.update(tenant, |counts| {
            counts.artifacts_refused += 1;
            counts.artifacts_refused
        });
    }

    /// A record of `tenant` was dropped by the writer's full queue.
    pub(crate) fn dropped(&self, tenant: &str) {
        let total = self.update(tenant, |counts| {
            counts.dropped += 1;
            counts.dropped
        });
        metrics::counter!(AUDIT_DROPPED_TOTAL).increment(1);
        if worth_logging(total - 1, total) {
            tracing::warn!(
                tenant,
                dropped = total,
                "the audit writer's queue is full: records of the tenant with the most queued are dropped (its runs-table rows and audit lines); raise `[server] audit_queue_size` or find what slows the writer (the disk, a lock on store-v1.db)"
            );
        }
    }

    /// `tenant`'s counts.
    pub(crate) fn counts(&self, tenant: &str) -> TenantCounts {
        self.tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tenant)
            .copied()
            .unwrap_or_default()
    }
}

/// One store as `check_environment` shows it to a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoreReport {
    /// The tenant's budget in this store, in words, and what happens past it.
    pub budget: String,
    /// Records the tenant may keep (absent: no bound on the count).
    pub max_items: Option<u64>,
    /// Bytes the tenant may keep.
    pub max_bytes: Option<u64>,
    /// Records the tenant holds now (absent in the operator's report).
    pub used_items: Option<u64>,
    /// Bytes the tenant holds now (absent in the operator's report).
    pub used_bytes: Option<u64>,
    /// Records of the tenant removed by its own budget since the server started (runs,
    /// audit files, runs' artifacts).
    pub removed: u64,
}

/// The writer's queue, shared by every tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WriteQueueReport {
    /// Bytes of records it holds at most; past it, the tenant with the most queued loses its
    /// own newest records first.
    pub max_bytes: u64,
    /// Bytes queued now, every tenant's together (a server-wide figure).
    pub queued_bytes: u64,
    /// Records of the tenant dropped since the server started (its runs-table rows and audit
    /// lines).
    pub dropped: u64,
}

/// What the caller's tenant keeps in the server's shared stores (the runs table, the audit
/// log, the artifact store), its budget in each, and what its budgets removed. Another
/// tenant's use never removes a tenant's records: each store removes the overflowing tenant's
/// own oldest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoresReport {
    /// Whose figures these are: the caller's own tenant (absent in the operator's report,
    /// which shows the budgets only).
    pub tenant: Option<String>,
    /// The runs table (`list_runs`, the web UI).
    pub runs: StoreReport,
    /// The audit log (read by the operator with `snakebox audit`).
    pub audit: StoreReport,
    /// The artifact store (`resources/read`, download links).
    pub artifacts: StoreReport,
    /// Runs of the tenant whose files were not kept because the artifact store as a whole
    /// (`[artifacts] max_size`) was full, since the server started.
    pub artifacts_refused: u64,
    /// The queue to the runs table's and audit log's writer.
    pub write_queue: WriteQueueReport,
}

/// A bound with a default for every tenant and exceptions for some (what one store or queue
/// asks [`TenantBook`] for).
#[derive(Debug, Clone)]
pub(crate) struct PerTenant<T> {
    default: T,
    by_tenant: Arc<BTreeMap<String, T>>,
}

impl<T: Clone> PerTenant<T> {
    /// The same for every tenant.
    pub(crate) fn uniform(default: T) -> PerTenant<T> {
        PerTenant {
            default,
            by_tenant: Arc::new(BTreeMap::new()),
        }
    }

    /// Each value through `f`.
    pub(crate) fn map<U: Clone>(self, f: impl Fn(T) -> U) -> PerTenant<U> {
        PerTenant {
            default: f(self.default.clone()),
            by_tenant: Arc::new(
                self.by_tenant
                    .iter()
                    .map(|(name, value)| (name.clone(), f(value.clone())))
                    .collect(),
            ),
        }
    }

    /// The default: what a tenant without an override gets.
    pub(crate) fn default_value(&self) -> T {
        self.default.clone()
    }

    /// `default` for every tenant but those of `by_tenant`.
    pub(crate) fn new(default: T, by_tenant: BTreeMap<String, T>) -> PerTenant<T> {
        PerTenant {
            default,
            by_tenant: Arc::new(by_tenant),
        }
    }

    /// `tenant`'s.
    pub(crate) fn of(&self, tenant: &str) -> T {
        self.by_tenant.get(tenant).unwrap_or(&self.default).clone()
    }
}

impl<T: Clone> From<T> for PerTenant<T> {
    fn from(default: T) -> PerTenant<T> {
        PerTenant::uniform(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(bytes: &[u64]) -> Vec<(usize, Usage)> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| (i, Usage::one(*b)))
            .collect()
    }

    fn held(items: &[(usize, Usage)]) -> Usage {
        let mut total = Usage::default();
        for (_, usage) in items {
            total.add(*usage);
        }
        total
    }

    #[test]
    fn the_oldest_go_until_what_is_left_fits() {
        let items = runs(&[10, 10, 10, 10, 10]);
        let by_count = Budget {
            items: Some(3),
            bytes: None,
        };
        let (gone, freed) = excess(held(&items), by_count, items.clone());
        assert_eq!(gone, [0, 1]);
        assert_eq!(
            freed,
            Usage {
                items: 2,
                bytes: 20
            }
        );
        let (gone, _) = excess(held(&items), Budget::bytes(25), items.clone());
        assert_eq!(gone, [0, 1, 2]);
        // Both bounds: the tighter one decides.
        let both = Budget {
            items: Some(4),
            bytes: Some(35),
        };
        assert_eq!(excess(held(&items), both, items.clone()).0, [0, 1]);
        // Within budget: nothing.
        assert!(
            excess(held(&items), Budget::bytes(50), items.clone())
                .0
                .is_empty()
        );
        // Only the oldest were listed, the total counts the rest too.
        let total = Usage {
            items: 100,
            bytes: 1000,
        };
        let (gone, _) = excess(total, Budget::bytes(975), items);
        assert_eq!(gone, [0, 1, 2]);
    }

    #[test]
    fn each_tenant_is_counted_apart_and_logged_sparingly() {
        let ledger = Ledger::default();
        ledger.removed(Store::Runs, "a", 3, "3 runs");
        ledger.dropped("a");
        ledger.refused("a");
        assert_eq!(ledger.counts("a").runs_removed, 3);
        assert_eq!(ledger.counts("a").dropped, 1);
        assert_eq!(ledger.counts("a").artifacts_refused, 1);
        assert_eq!(ledger.counts("b"), TenantCounts::default());
        let logged: Vec<u64> = (1..=2000).filter(|n| worth_logging(n - 1, *n)).collect();
        assert_eq!(logged, [1, 10, 100, 1000]);
        assert!(worth_logging(95, 105) && !worth_logging(105, 195));
    }

    #[test]
    fn budgets_are_described() {
        let both = Budget {
            items: Some(5),
            bytes: Some(1 << 20),
        };
        assert_eq!(both.describe("runs"), "5 runs and 1 MiB");
        assert_eq!(Budget::bytes(2048).describe("runs"), "2 KiB");
        assert_eq!(Budget::default().describe("runs"), "unbounded");
    }
}
