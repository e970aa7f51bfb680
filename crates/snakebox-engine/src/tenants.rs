//! Per-tenant quotas: how much of the server one tenant may take, so that a burst of one
//! tenant's calls never starves another's (`[tenants]`; used by the HTTP face, where each API
//! key names a tenant; stdio has one tenant and no quota by default).
//!
//! Three bounds, each off unless set:
//! - **runs at once**: a tenant's calls beyond it wait on the tenant's own queue, before the
//!   server's (`--max-concurrent-runs`). Set below the server's cap, the rest of the slots are
//!   always there for other tenants: a waiting call of another tenant gets the next free slot,
//!   however many of the busy tenant's calls are queued.
//! - **runs per minute**: a call past it is refused at once (`quota`) with how long to wait.
//! - **sessions**: `create_session` past it is refused (`quota`), besides the server's cap.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Caller, EngineError, ErrorKind};

/// The operator's quotas for each tenant (`None`: no such bound).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantQuotas {
    /// Calls of one tenant that run at once; more wait their turn.
    pub max_concurrent_runs: Option<usize>,
    /// Calls one tenant may start per minute; more are refused until the minute has passed.
    pub runs_per_minute: Option<u32>,
    /// Sessions one tenant may have at once.
    pub max_sessions: Option<usize>,
}

/// The window the per-minute bound counts over.
const MINUTE: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Tenant {
    slots: Option<Arc<Semaphore>>,
    /// When its recent calls started (within the last minute), oldest first.
    started: VecDeque<Instant>,
}

/// The tenants seen so far and what each holds.
pub(crate) struct Tenants {
    quotas: TenantQuotas,
    tenants: Mutex<HashMap<String, Tenant>>,
}

/// What an admitted call holds until it returns.
pub(crate) struct Admitted {
    _slot: Option<OwnedSemaphorePermit>,
}

impl Tenants {
    pub(crate) fn new(quotas: TenantQuotas) -> Tenants {
        Tenants {
            quotas,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// Count a call of `caller` against the per-minute bound, then wait for one of its
    /// slots.
    ///
    /// # Errors
    /// `quota`, when the tenant started its allowance of calls within the last minute: the
    /// message says when the next one may start.
    pub(crate) async fn admit(&self, caller: &Caller) -> Result<Admitted, EngineError> {
        let slots = {
            let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
            let tenant = tenants.entry(caller.id().to_owned()).or_default();
            if let Some(limit) = self.quotas.runs_per_minute {
                let now = Instant::now();
                while tenant
                    .started
                    .front()
                    .is_some_and(|at| now.duration_since(*at) >= MINUTE)
                {
                    tenant.started.pop_front();
                }
                if tenant.started.len() >= limit as usize {
                    let wait = tenant.started.front().map_or(MINUTE, |oldest| {
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
                        "wait {seconds} s before the next call, or ask the operator to raise `[tenants] runs_per_minute`"
                    )));
                }
                tenant.started.push_back(now);
            }
            match (self.quotas.max_concurrent_runs, &tenant.slots) {
                (None, _) => None,
                (Some(_), Some(slots)) => Some(Arc::clone(slots)),
                (Some(limit), None) => {
                    let slots = Arc::new(Semaphore::new(limit.max(1)));
                    tenant.slots = Some(Arc::clone(&slots));
                    Some(slots)
                }
            }
        };
        let slot = match slots {
            Some(slots) => Some(slots.acquire_owned().await.map_err(|_| {
                EngineError::new(ErrorKind::Unavailable, "The engine is shutting down")
            })?),
            None => None,
        };
        Ok(Admitted { _slot: slot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenant_past_its_minute_is_refused_with_when_to_retry_and_others_are_not() {
        let tenants = Tenants::new(TenantQuotas {
            runs_per_minute: Some(2),
            ..TenantQuotas::default()
        });
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        tenants.admit(&a).await.unwrap();
        tenants.admit(&a).await.unwrap();
        let refused = tenants.admit(&a).await.err().unwrap();
        assert_eq!(refused.kind, ErrorKind::Quota);
        assert!(
            refused.message.contains("retry after"),
            "{}",
            refused.message
        );
        assert!(refused.hint.unwrap().contains("runs_per_minute"));
        // Another tenant has its own allowance.
        tenants.admit(&b).await.unwrap();
    }

    #[tokio::test]
    async fn a_busy_tenant_waits_on_its_own_slots_and_others_pass() {
        let tenants = Arc::new(Tenants::new(TenantQuotas {
            max_concurrent_runs: Some(1),
            ..TenantQuotas::default()
        }));
        let (a, b) = (Caller::tenant("a").unwrap(), Caller::tenant("b").unwrap());
        let held = tenants.admit(&a).await.unwrap();
        // A's second call waits...
        let waiting = {
            let tenants = Arc::clone(&tenants);
            let a = a.clone();
            tokio::spawn(async move { tenants.admit(&a).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // ...while B is admitted at once.
        tokio::time::timeout(Duration::from_secs(5), tenants.admit(&b))
            .await
            .expect("B waited behind A")
            .unwrap();
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("A's second call never ran")
            .unwrap()
            .unwrap();
    }
}
