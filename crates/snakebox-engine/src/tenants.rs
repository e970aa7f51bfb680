//! Per-tenant quotas and fair shares: how much of the server one tenant may take, so that a
//! burst of one tenant's calls never starves another's (`[tenants]`; used by the HTTP face,
//! where each API key names a tenant; stdio has one tenant and no quota by default).
//!
//! **Fair shares of the sandbox slots** ([`FairSlots`]). Every sandbox that does work holds one
//! of the server's `--max-concurrent-runs` slots while it runs, in the name of the tenant it
//! works for: one-shot runs, session cells and commands, validation's compile checks,
//! environment builds, session installs (each uv step); the server's own background work
//! (warming, compilation) in the server's name. A slot that frees goes to the waiting tenant
//! that holds the fewest slots now (the one served longest ago among equals), not to the
//! oldest waiting call: a tenant with a hundred calls queued gets one slot in turn like any
//! other, so another tenant's call waits at most until the first of the running sandboxes
//! ends, whatever the first tenant queued (issue 32, item 1).
//!
//! **Fair shares of the CPU** ([`Slot::cpu`]). Every slot a tenant holds carries a
//! [`CpuShare`]: the CPU weight of the sandbox doing that slot's work, attached to its cgroup
//! while it works (see `snakebox_sandbox::CpuShare`). Each tenant weighs what one default
//! sandbox weighs ([`TENANT_CPU`]), divided evenly between its busy sandboxes: a tenant with
//! three slots held gets a third of that on each, and when a slot of it is taken or given back
//! the others' weights are rewritten (a few small file writes, one per slot the tenant holds).
//! So when the CPU is contended, a tenant with seven CPU-bound sandboxes gets as much of it as
//! a tenant with one, not seven times as much. A session's interpreter between calls holds no
//! slot and does not count. The server's own work (warming, compilation) carries none and
//! keeps the default weight; pre-forked children wait for their run at the background weight.
//! Without a cpu cgroup (no cgroups, or a backend without them) nothing is written.
//!
//! Three bounds on top, each off unless set:
//! - **runs at once**: the most slots one tenant holds at once; its calls beyond it wait on
//!   its own queue. Set below the server's cap, the rest of the slots are always there for
//!   other tenants.
//! - **runs per minute**: a call past it is refused at once (`quota`) with how long to wait.
//! - **sessions**: `create_session` past it is refused (`quota`), besides the server's cap.
//!
//! **A tenant's own settings** ([`Tenant`], [`TenantBook`]). The bounds above and the
//! tenant's budgets in the shared stores have a default for every tenant (`[tenants]`) and
//! may be set apart for one (`[tenants.NAME]`, a [`TenantOverride`]), with the profiles it may
//! name and its default profile. [`TenantBook`] is the one place that answers what a tenant
//! may take: the engine looks a [`Tenant`] up by its caller there, and each store and queue
//! asks it for the one bound it applies ([`PerTenant`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use snakebox_sandbox::{CpuShare, CpuWeight};
use tokio::sync::oneshot;

pub(crate) use crate::budget::PerTenant;
use crate::budget::{Budget, StoreBudgets};
use crate::{Caller, EngineError, ErrorKind, Profiles};

/// The operator's quotas for each tenant (`None`: no such bound).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantQuotas {
    /// Sandboxes of one tenant that run at once; more wait their turn.
    pub max_concurrent_runs: Option<usize>,
    /// Calls one tenant may start per minute; more are refused until the minute has passed.
    pub runs_per_minute: Option<u32>,
    /// Sessions one tenant may have at once.
    pub max_sessions: Option<usize>,
}

/// What `[tenants.NAME]` sets apart for one tenant (`None`, empty: the `[tenants]` default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantOverride {
    /// Sandboxes of this tenant that run at once.
    pub max_concurrent_runs: Option<usize>,
    /// Calls this tenant may start per minute.
    pub runs_per_minute: Option<u32>,
    /// Sessions this tenant may have at once.
    pub max_sessions: Option<usize>,
    /// Runs of this tenant kept in the runs table.
    pub history_max_runs: Option<u64>,
    /// Bytes of this tenant's runs kept in the runs table.
    pub history_max_bytes: Option<u64>,
    /// Bytes of this tenant's audit log.
    pub audit_max_bytes: Option<u64>,
    /// Bytes of this tenant's artifacts.
    pub artifacts_max_bytes: Option<u64>,
    /// This tenant's share of the sessions' disk.
    pub sessions_max_disk_bytes: Option<u64>,
    /// Profiles this tenant may name besides the server's default (added to each profile's
    /// own `tenants` list: either way grants it).
    pub profiles: Vec<String>,
    /// The profile of this tenant's calls that name none (else the server's default).
    pub default_profile: Option<String>,
}

/// One tenant as the engine sees it: what it may take of the server and keep in its stores,
/// and which profiles it may name. Looked up from a [`Caller`] (`TenantBook::tenant`);
/// `check_environment` shows a tenant its own.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Tenant {
    /// The tenant's name (its callers' id).
    pub name: String,
    /// Sandboxes it runs at once (`null`: no bound of its own, the server's cap).
    pub max_concurrent_runs: Option<usize>,
    /// Calls it may start per minute (`null`: no bound).
    pub runs_per_minute: Option<u32>,
    /// Sessions it may have at once (`null`: the server's cap only).
    pub max_sessions: Option<usize>,
    /// Runs of its kept in the runs table (`null`: no bound).
    pub history_max_runs: Option<u64>,
    /// Bytes of its runs kept in the runs table (`null`: no bound).
    pub history_max_bytes: Option<u64>,
    /// Bytes of its audit log.
    pub audit_max_bytes: u64,
    /// Bytes of its artifacts.
    pub artifacts_max_bytes: u64,
    /// Its share of the sessions' disk (`null`: the whole disk).
    pub sessions_max_disk_bytes: Option<u64>,
    /// The profiles it may name (the server's default included).
    pub profiles: Vec<String>,
    /// The profile of its calls that name none.
    pub default_profile: String,
}

/// Every tenant's settings: the `[tenants]` defaults, each `[tenants.NAME]` override and the
/// profiles (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct TenantBook {
    quotas: TenantQuotas,
    budgets: StoreBudgets,
    sessions_disk: Option<u64>,
    overrides: Arc<BTreeMap<String, TenantOverride>>,
    profiles: Profiles,
}

impl TenantBook {
    /// The `[tenants]` defaults (`quotas`, `budgets`, `sessions_disk`: each tenant's share
    /// of the sessions' disk), each tenant's `overrides` and the `profiles` (with the
    /// overrides' grants applied: [`Profiles::grant`]).
    pub(crate) fn new(
        quotas: TenantQuotas,
        budgets: StoreBudgets,
        sessions_disk: Option<u64>,
        overrides: BTreeMap<String, TenantOverride>,
        profiles: Profiles,
    ) -> TenantBook {
        TenantBook {
            quotas,
            budgets,
            sessions_disk,
            overrides: Arc::new(overrides),
            profiles,
        }
    }

    /// One bound: `pick` of each override that sets it, `default` for the others.
    fn per_tenant<T: Clone>(
        &self,
        default: T,
        pick: impl Fn(&TenantOverride) -> Option<T>,
    ) -> PerTenant<T> {
        PerTenant::new(
            default,
            self.overrides
                .iter()
                .filter_map(|(name, over)| Some((name.clone(), pick(over)?)))
                .collect(),
        )
    }

    /// Sandboxes each tenant runs at once.
    pub(crate) fn max_concurrent_runs(&self) -> PerTenant<Option<usize>> {
        self.per_tenant(self.quotas.max_concurrent_runs, |o| {
            o.max_concurrent_runs.map(Some)
        })
    }

    /// Calls each tenant may start per minute.
    pub(crate) fn runs_per_minute(&self) -> PerTenant<Option<u32>> {
        self.per_tenant(self.quotas.runs_per_minute, |o| o.runs_per_minute.map(Some))
    }

    /// Each tenant's budget in the runs table.
    pub(crate) fn history(&self) -> PerTenant<Budget> {
        let default = self.budgets.history;
        self.per_tenant(default, |o| {
            (o.history_max_runs.is_some() || o.history_max_bytes.is_some()).then(|| Budget {
                items: o.history_max_runs.or(default.items),
                bytes: o.history_max_bytes.or(default.bytes),
            })
        })
    }

    /// Each tenant's budget of audit log bytes.
    pub(crate) fn audit_bytes(&self) -> PerTenant<u64> {
        self.per_tenant(self.budgets.audit_bytes, |o| o.audit_max_bytes)
    }

    /// Each tenant's budget of artifact bytes.
    pub(crate) fn artifact_bytes(&self) -> PerTenant<u64> {
        self.per_tenant(self.budgets.artifact_bytes, |o| o.artifacts_max_bytes)
    }

    /// Each tenant's share of the sessions' disk (`None`: the whole disk).
    pub(crate) fn sessions_disk(&self) -> PerTenant<Option<u64>> {
        self.per_tenant(self.sessions_disk, |o| o.sessions_max_disk_bytes.map(Some))
    }

    /// The tenant of `caller`, with every bound and profile that holds for it.
    pub(crate) fn tenant(&self, caller: &Caller) -> Tenant {
        let name = caller.id();
        let over = self.overrides.get(name).cloned().unwrap_or_default();
        let history = self.history().of(name);
        Tenant {
            name: name.to_owned(),
            max_concurrent_runs: over.max_concurrent_runs.or(self.quotas.max_concurrent_runs),
            runs_per_minute: over.runs_per_minute.or(self.quotas.runs_per_minute),
            max_sessions: over.max_sessions.or(self.quotas.max_sessions),
            history_max_runs: history.items,
            history_max_bytes: history.bytes,
            audit_max_bytes: over.audit_max_bytes.unwrap_or(self.budgets.audit_bytes),
            artifacts_max_bytes: over
                .artifacts_max_bytes
                .unwrap_or(self.budgets.artifact_bytes),
            sessions_max_disk_bytes: over.sessions_max_disk_bytes.or(self.sessions_disk),
            profiles: self
                .profiles
                .all
                .keys()
                .filter(|profile| self.profiles.for_caller(caller, Some(profile)).is_ok())
                .cloned()
                .collect(),
            default_profile: self.profiles.default_for(caller).to_owned(),
        }
    }
}

/// The window the per-minute bound counts over.
const MINUTE: Duration = Duration::from_secs(60);

/// The tenants seen so far and when each started its recent calls.
pub(crate) struct Tenants {
    book: TenantBook,
    runs_per_minute: PerTenant<Option<u32>>,
    /// When each tenant's recent calls started (within the last minute), oldest first.
    started: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Tenants {
    pub(crate) fn new(book: TenantBook) -> Tenants {
        Tenants {
            runs_per_minute: book.runs_per_minute(),
            book,
            started: Mutex::new(HashMap::new()),
        }
    }

    /// Every tenant's settings.
    pub(crate) fn book(&self) -> &TenantBook {
        &self.book
    }

    /// Count a call of `caller` against the per-minute bound.
    ///
    /// # Errors
    /// `quota`, when the tenant started its allowance of calls within the last minute: the
    /// message says when the next one may start.
    pub(crate) fn admit(&self, caller: &Caller) -> Result<(), EngineError> {
        let Some(limit) = self.runs_per_minute.of(caller.id()) else {
            return Ok(());
        };
        let mut all = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        let started = all.entry(caller.id().to_owned()).or_default();
        let now = Instant::now();
        while started
            .front()
            .is_some_and(|at| now.duration_since(*at) >= MINUTE)
        {
            started.pop_front();
        }
        if started.len() >= limit as usize {
            let wait = started.front().map_or(MINUTE, |oldest| {
                MINUTE.saturating_sub(now.duration_since(*oldest))
            });
            let seconds = wait.as_secs() + 1;
            return Err(EngineError::new(
                ErrorKind::Quota,
                format!(
                    "Tenant `{}` started {limit} runs in the last minute, the most it may; retry after {seconds} s",
                    caller.id()
                ),
            )
            .with_hint(format!(
                "wait {seconds} s before the next call, or ask the operator to raise `[tenants] runs_per_minute`, or this tenant's own in `[tenants.NAME]`"
            )));
        }
        started.push_back(now);
        Ok(())
    }
}

/// The name the server's own background work holds slots in (no tenant has an empty name).
const SERVER: &str = "";

/// What all of one tenant's busy sandboxes weigh together against the rest of the server's
/// work (one default sandbox's weight: a tenant with one busy sandbox weighs what every
/// sandbox weighed before tenants were weighed).
pub(crate) const TENANT_CPU: CpuWeight = CpuWeight::DEFAULT;

/// The server's sandbox slots, shared fairly between tenants (see the module documentation).
pub(crate) struct FairSlots {
    /// The most slots each tenant holds at once (`[tenants] max_concurrent_runs`, or its
    /// `[tenants.NAME]`'s).
    tenant_cap: PerTenant<Option<usize>>,
    total: usize,
    /// Whether each slot carries its tenant's CPU share ([`Slot::cpu`]): the sandbox slots
    /// do; slots of work that runs in no cgroup of its own (host work) do not.
    weighs_cpu: bool,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    free: usize,
    /// Slots each tenant holds now.
    held: HashMap<Arc<str>, usize>,
    /// Each tenant's waiting calls (when each began to wait, a counter), oldest first.
    waiting: HashMap<Arc<str>, VecDeque<(u64, oneshot::Sender<Slot>)>>,
    arrivals: u64,
    /// When each tenant was last given a slot (a counter), for turns among equals.
    served: HashMap<Arc<str>, u64>,
    turn: u64,
    /// The CPU shares of the slots each tenant holds now (the server's own have none).
    cpu: HashMap<Arc<str>, Vec<CpuShare>>,
}

impl SlotState {
    /// A share for a slot `tenant` is given now (none for the server's own work); the
    /// tenant's other slots get their smaller part at once.
    fn add_cpu(&mut self, tenant: &Arc<str>) -> Option<CpuShare> {
        if tenant.as_ref() == SERVER {
            return None;
        }
        let shares = self.cpu.entry(Arc::clone(tenant)).or_default();
        let share = CpuShare::new(TENANT_CPU.divided(shares.len() + 1));
        shares.push(share.clone());
        reweigh(shares);
        Some(share)
    }

    /// `share` of `tenant`'s is given back; its other slots get their larger part at once.
    fn remove_cpu(&mut self, tenant: &Arc<str>, share: &CpuShare) {
        let Some(shares) = self.cpu.get_mut(tenant) else {
            return;
        };
        shares.retain(|held| held != share);
        if shares.is_empty() {
            self.cpu.remove(tenant);
        } else {
            reweigh(shares);
        }
    }
}

/// Give each of one tenant's `shares` an even part of [`TENANT_CPU`] (only a share whose
/// part changed writes its cgroups).
fn reweigh(shares: &[CpuShare]) {
    let part = TENANT_CPU.divided(shares.len());
    for share in shares {
        share.set(part);
    }
}

/// One held slot; given back when dropped.
pub(crate) struct Slot {
    /// `None`: not (or no longer) counted.
    owner: Option<(Arc<FairSlots>, Arc<str>)>,
    /// The CPU share of the sandbox doing this slot's work (see the module documentation);
    /// `None` for the server's own work.
    cpu: Option<CpuShare>,
}

impl Slot {
    /// The CPU share the cgroup of the sandbox doing this slot's work attaches to (its
    /// policy's, its forked run's, or attached to a pooled or live sandbox for the call);
    /// `None` for the server's own work, which keeps the default weight.
    pub(crate) fn cpu(&self) -> Option<&CpuShare> {
        self.cpu.as_ref()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((slots, tenant)) = self.owner.take() {
            let mut state = slots.lock();
            state.free += 1;
            release_held(&mut state, &tenant);
            if let Some(share) = self.cpu.take() {
                state.remove_cpu(&tenant, &share);
            }
            slots.dispatch(&mut state);
        }
    }
}

fn release_held(state: &mut SlotState, tenant: &Arc<str>) {
    if let Some(held) = state.held.get_mut(tenant) {
        *held = held.saturating_sub(1);
        if *held == 0 {
            state.held.remove(tenant);
        }
    }
}

/// A tenant's claim on the server's slots: what a sandbox of its waits for.
#[derive(Clone)]
pub(crate) struct Share {
    slots: Arc<FairSlots>,
    tenant: Arc<str>,
}

impl Share {
    /// Wait for a slot in this tenant's name (see [`FairSlots`]).
    ///
    /// # Errors
    /// `unavailable`, when the slots are gone (the engine is being dropped).
    pub(crate) async fn slot(&self) -> Result<Slot, EngineError> {
        let _queued = crate::telemetry::Queued::enter();
        let (sender, granted) = oneshot::channel();
        {
            let mut state = self.slots.lock();
            state.arrivals += 1;
            let arrival = state.arrivals;
            state
                .waiting
                .entry(Arc::clone(&self.tenant))
                .or_default()
                .push_back((arrival, sender));
            self.slots.dispatch(&mut state);
        }
        granted.await.map_err(|_| {
            EngineError::new(ErrorKind::Unavailable, "The engine is shutting down")
                .with_hint("retry once the server has been restarted")
        })
    }
}

impl FairSlots {
    /// `total` slots, at most `tenant_cap` to one tenant; no CPU shares.
    pub(crate) fn new(total: usize, tenant_cap: Option<usize>) -> Arc<FairSlots> {
        Self::make(total, PerTenant::uniform(tenant_cap), false)
    }

    /// The sandbox slots: as [`FairSlots::new`], each tenant's slot carrying its part of the
    /// tenant's CPU weight (see the module documentation).
    pub(crate) fn for_sandboxes(
        total: usize,
        tenant_cap: PerTenant<Option<usize>>,
    ) -> Arc<FairSlots> {
        Self::make(total, tenant_cap, true)
    }

    fn make(
        total: usize,
        tenant_cap: PerTenant<Option<usize>>,
        weighs_cpu: bool,
    ) -> Arc<FairSlots> {
        let total = total.max(1);
        Arc::new(FairSlots {
            tenant_cap,
            total,
            weighs_cpu,
            state: Mutex::new(SlotState {
                free: total,
                ..SlotState::default()
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `caller`'s claim.
    pub(crate) fn share(self: &Arc<Self>, caller: &Caller) -> Share {
        Share {
            slots: Arc::clone(self),
            tenant: Arc::from(caller.id()),
        }
    }

    /// The server's own claim (warming, background compilation).
    pub(crate) fn server_share(self: &Arc<Self>) -> Share {
        Share {
            slots: Arc::clone(self),
            tenant: Arc::from(SERVER),
        }
    }

    /// Slots held now, all tenants together.
    pub(crate) fn busy(&self) -> usize {
        self.total.saturating_sub(self.lock().free)
    }

    /// Give free slots to waiting calls: each to the tenant holding the fewest (among equals,
    /// the one served longest ago, then the one waiting longest) that is under its cap; a
    /// call that gave up waiting is skipped.
    fn dispatch(self: &Arc<Self>, state: &mut SlotState) {
        while state.free > 0 {
            let next = state
                .waiting
                .iter()
                .filter_map(|(tenant, queue)| Some((tenant, queue.front()?.0)))
                .filter(|(tenant, _)| {
                    self.tenant_cap.of(tenant).is_none_or(|cap| {
                        state.held.get(*tenant).copied().unwrap_or(0) < cap.max(1)
                    }) || tenant.as_ref() == SERVER
                })
                .min_by_key(|(tenant, oldest)| {
                    (
                        state.held.get(*tenant).copied().unwrap_or(0),
                        state.served.get(*tenant).copied().unwrap_or(0),
                        *oldest,
                    )
                })
                .map(|(tenant, _)| Arc::clone(tenant));
            let Some(tenant) = next else {
                break;
            };
            let Some((_, sender)) = state.waiting.get_mut(&tenant).and_then(VecDeque::pop_front)
            else {
                break;
            };
            if state.waiting.get(&tenant).is_some_and(VecDeque::is_empty) {
                state.waiting.remove(&tenant);
            }
            state.free -= 1;
            *state.held.entry(Arc::clone(&tenant)).or_default() += 1;
            state.turn += 1;
            state.served.insert(Arc::clone(&tenant), state.turn);
            let slot = Slot {
                owner: Some((Arc::clone(self), Arc::clone(&tenant))),
                cpu: if self.weighs_cpu {
                    state.add_cpu(&tenant)
                } else {
                    None
                },
            };
            if let Err(mut unclaimed) = sender.send(slot) {
                // The call gave up waiting: undo here (its drop would take the lock we hold).
                unclaimed.owner = None;
                state.free += 1;
                release_held(state, &tenant);
                if let Some(share) = unclaimed.cpu.take() {
                    state.remove_cpu(&tenant, &share);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_minute_is_refused_with_when_to_retry_and_others_are_not() {
        let quotas = TenantQuotas {
            runs_per_minute: Some(2),
            ..TenantQuotas::default()
        };
        let overrides = BTreeMap::from([(
            "c".to_owned(),
            TenantOverride {
                runs_per_minute: Some(1),
                ..TenantOverride::default()
            },
        )]);
        let tenants = Tenants::new(TenantBook::new(
            quotas,
            StoreBudgets::default(),
            None,
            overrides,
            Profiles::default(),
        ));
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        tenants.admit(&a).unwrap();
        tenants.admit(&a).unwrap();
        let refused = tenants.admit(&a).err().unwrap();
        assert_eq!(refused.kind, ErrorKind::Quota);
        assert!(
            refused.message.contains("retry after"),
            "{}",
            refused.message
        );
        assert!(refused.hint.unwrap().contains("runs_per_minute"));
        // Another tenant has its own allowance.
        tenants.admit(&b).unwrap();
        // One with an override of its own has that one.
        let c = Caller::tenant("c").unwrap();
        tenants.admit(&c).unwrap();
        assert_eq!(tenants.admit(&c).unwrap_err().kind, ErrorKind::Quota);
        assert_eq!(tenants.book().tenant(&c).runs_per_minute, Some(1));
        assert_eq!(tenants.book().tenant(&a).runs_per_minute, Some(2));
    }

    #[test]
    fn a_tenant_set_apart_has_its_own_bounds_and_profiles_and_the_others_the_defaults() {
        let quotas = TenantQuotas {
            max_concurrent_runs: Some(3),
            max_sessions: Some(4),
            ..TenantQuotas::default()
        };
        let over = TenantOverride {
            max_sessions: Some(1),
            history_max_bytes: Some(1 << 20),
            audit_max_bytes: Some(1 << 21),
            sessions_max_disk_bytes: Some(64 << 20),
            profiles: vec!["network".into()],
            default_profile: Some("basic".into()),
            ..TenantOverride::default()
        };
        let mut profiles = Profiles::default();
        // What the engine does at start with each override (`Engine::assemble`).
        profiles.grant("a", &over.profiles, over.default_profile.as_deref());
        // The profile's own list grants too: the union holds.
        profiles.all.get_mut("filesystem").unwrap().tenants = vec!["a".into(), "b".into()];
        let book = TenantBook::new(
            quotas,
            StoreBudgets::default(),
            Some(128 << 20),
            BTreeMap::from([("a".to_owned(), over)]),
            profiles,
        );
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        let mine = book.tenant(&a);
        assert_eq!(
            (mine.max_sessions, mine.max_concurrent_runs),
            (Some(1), Some(3))
        );
        assert_eq!(
            (mine.history_max_runs, mine.history_max_bytes),
            (StoreBudgets::default().history.items, Some(1 << 20))
        );
        assert_eq!(mine.audit_max_bytes, 1 << 21);
        assert_eq!(mine.sessions_max_disk_bytes, Some(64 << 20));
        assert_eq!(mine.default_profile, "basic");
        for profile in ["basic", "filesystem", "network", "standard"] {
            assert!(mine.profiles.contains(&profile.to_owned()), "{mine:?}");
        }
        let theirs = book.tenant(&b);
        assert_eq!(theirs.max_sessions, Some(4));
        assert_eq!(theirs.audit_max_bytes, StoreBudgets::default().audit_bytes);
        assert_eq!(theirs.sessions_max_disk_bytes, Some(128 << 20));
        assert_eq!(theirs.default_profile, "standard");
        assert_eq!(theirs.profiles, ["filesystem", "standard"]);
        // What each store is handed agrees.
        assert_eq!(book.audit_bytes().of("a"), 1 << 21);
        assert_eq!(book.history().of("b"), StoreBudgets::default().history);
        assert_eq!(book.max_concurrent_runs().of("a"), Some(3));
    }

    #[tokio::test]
    async fn a_tenant_set_apart_holds_its_own_number_of_slots() {
        let caps = PerTenant::new(Some(2), BTreeMap::from([("a".to_owned(), Some(1))]));
        let slots = FairSlots::for_sandboxes(8, caps);
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        let _held = slots.share(&a).slot().await.unwrap();
        let share = slots.share(&a);
        let mut waiting = tokio::spawn(async move { share.slot().await });
        assert!(granted(&mut waiting).await.is_none(), "a holds one at most");
        // b has the default: two at once.
        let mut held_by_b = Vec::new();
        for _ in 0..2 {
            let share = slots.share(&b);
            let mut got = tokio::spawn(async move { share.slot().await });
            held_by_b.push(granted(&mut got).await.expect("b waited"));
        }
        waiting.abort();
    }

    /// The slot `waiting` was granted within a moment, if it was (held by the caller).
    async fn granted(
        waiting: &mut tokio::task::JoinHandle<Result<Slot, EngineError>>,
    ) -> Option<Slot> {
        let joined = tokio::time::timeout(Duration::from_millis(50), waiting)
            .await
            .ok()?;
        Some(joined.unwrap().unwrap())
    }

    #[tokio::test]
    async fn a_busy_tenant_waits_on_its_own_slots_and_others_pass() {
        let slots = FairSlots::new(4, Some(1));
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        let held = slots.share(&a).slot().await.unwrap();
        // A's second sandbox waits (its cap is 1)...
        let share = slots.share(&a);
        let mut waiting = tokio::spawn(async move { share.slot().await });
        assert!(granted(&mut waiting).await.is_none());
        // ...while B gets one at once.
        tokio::time::timeout(Duration::from_secs(5), slots.share(&b).slot())
            .await
            .expect("B waited behind A")
            .unwrap();
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("A's second sandbox never ran")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_tenant_holding_fewest_not_to_the_longest_queue() {
        let slots = FairSlots::new(2, None);
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        // A holds both slots and queues ten more sandboxes; then B asks for one.
        let first = slots.share(&a).slot().await.unwrap();
        let _second = slots.share(&a).slot().await.unwrap();
        let mut queued: Vec<_> = (0..10)
            .map(|_| {
                let share = slots.share(&a);
                tokio::spawn(async move { share.slot().await })
            })
            .collect();
        tokio::task::yield_now().await;
        let share = slots.share(&b);
        let mut b_slot = tokio::spawn(async move { share.slot().await });
        assert!(granted(&mut b_slot).await.is_none());
        // The first slot A gives back goes to B, ahead of A's ten.
        drop(first);
        let _b = granted(&mut b_slot)
            .await
            .expect("B waited behind A's queue");
        for slot in &mut queued {
            assert!(granted(slot).await.is_none());
        }
        assert_eq!(slots.busy(), 2);
    }

    /// The weight of each share, in cgroup v1 `cpu.shares` units.
    fn weights(slots: &[&Slot]) -> Vec<u32> {
        slots
            .iter()
            .map(|slot| {
                slot.cpu()
                    .expect("a tenant's slot has a share")
                    .weight()
                    .shares()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_tenants_busy_sandboxes_together_weigh_what_one_tenant_weighs() {
        let slots = FairSlots::for_sandboxes(8, PerTenant::uniform(None));
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        let a1 = slots.share(&a).slot().await.unwrap();
        assert_eq!(weights(&[&a1]), [1024]);
        // A's second and third sandboxes: each of A's three gets a third, rewritten at once.
        let a2 = slots.share(&a).slot().await.unwrap();
        assert_eq!(weights(&[&a1, &a2]), [512, 512]);
        let a3 = slots.share(&a).slot().await.unwrap();
        assert_eq!(weights(&[&a1, &a2, &a3]), [341, 341, 341]);
        // B's one sandbox weighs what A's three do together; A's are not touched.
        let b1 = slots.share(&b).slot().await.unwrap();
        assert_eq!(weights(&[&b1]), [1024]);
        assert_eq!(weights(&[&a1, &a2, &a3]), [341, 341, 341]);
        // One of A's ends: the two left share A's weight.
        let ended = a2.cpu().cloned().unwrap();
        drop(a2);
        assert_eq!(weights(&[&a1, &a3]), [512, 512]);
        // Its share is no longer A's: later changes of A's count do not write it.
        let a4 = slots.share(&a).slot().await.unwrap();
        assert_eq!(weights(&[&a1, &a3, &a4]), [341, 341, 341]);
        drop(a4);
        assert_eq!(ended.weight().shares(), 341);
        drop((a1, a3));
        assert_eq!(weights(&[&b1]), [1024]);
        // The server's own work carries no share: it keeps the default weight.
        let server = slots.server_share().slot().await.unwrap();
        assert!(server.cpu().is_none());
        // Nor does a slot of work that runs in no cgroup of its own (host work).
        let host = FairSlots::new(2, None);
        assert!(host.share(&a).slot().await.unwrap().cpu().is_none());
    }

    #[tokio::test]
    async fn a_share_is_bounded_below_however_many_sandboxes_a_tenant_holds() {
        let slots = FairSlots::for_sandboxes(1000, PerTenant::uniform(None));
        let a = Caller::tenant("a").unwrap();
        let mut held = Vec::new();
        for _ in 0..600 {
            held.push(slots.share(&a).slot().await.unwrap());
        }
        let all: Vec<&Slot> = held.iter().collect();
        assert!(weights(&all).iter().all(|&w| w == CpuWeight::MIN.shares()));
        held.truncate(2);
        let all: Vec<&Slot> = held.iter().collect();
        assert_eq!(weights(&all), [512, 512]);
    }

    #[tokio::test]
    async fn a_call_that_stops_waiting_takes_no_slot_with_it() {
        let slots = FairSlots::for_sandboxes(1, PerTenant::uniform(None));
        let a = Caller::tenant("a").unwrap();
        let held = slots.share(&a).slot().await.unwrap();
        let share = slots.share(&a);
        let gave_up = tokio::spawn(async move { share.slot().await });
        tokio::task::yield_now().await;
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        // The slot is free again, not lost to the call that left, and the share it was
        // given is not counted: the one sandbox A holds weighs what A weighs.
        let again = tokio::time::timeout(Duration::from_secs(5), slots.share(&a).slot())
            .await
            .expect("the slot was lost")
            .unwrap();
        assert_eq!(slots.busy(), 1);
        assert_eq!(weights(&[&again]), [1024]);
    }
}
