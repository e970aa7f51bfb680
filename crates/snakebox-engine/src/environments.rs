//! The environments calls run in, as a service: the environment cache, built in a call's
//! name (holding one of its sandbox slots) or in the server's (cache warming, the warm pool's
//! default environment), and pruned. Its own room so that what builds environments needs
//! only the cache, the interpreter choice and the slots, not the rest of the engine.

use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_env::{EnvCache, Environment, Interpreter};

use crate::lifecycle::Calls;
use crate::plan::Planner;
use crate::{EngineConfig, EngineError, Unavailable, ids};

/// State of cache warming. On the wire one flat object ([`WarmReport`]): a tagged union
/// would be a `oneOf`, which the model providers' schema rules refuse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(into = "WarmReport", from = "WarmReport")]
#[schemars(with = "WarmReport")]
pub enum WarmState {
    /// `--no-warm-cache` was given.
    Disabled,
    /// Not started yet.
    Pending,
    /// Building the default environment now.
    Running,
    /// The default environment is ready.
    Ready {
        /// How long warming took.
        duration_ms: u64,
    },
    /// Warming failed (executions will retry and report the reason).
    Failed {
        /// Why.
        message: String,
    },
}

/// Cache warming as `check_environment` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WarmReport {
    /// `disabled` (`--no-warm-cache`), `pending`, `running`, `ready` or `failed` (executions
    /// will retry and report the reason).
    pub state: WarmPhase,
    /// How long warming took, once `ready`.
    pub duration_ms: Option<u64>,
    /// Why warming failed, when `failed`.
    pub message: Option<String>,
}

/// The phase of cache warming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarmPhase {
    /// `--no-warm-cache` was given.
    Disabled,
    /// Not started yet.
    Pending,
    /// Building the default environment now.
    Running,
    /// The default environment is ready.
    Ready,
    /// Warming failed.
    Failed,
}

impl From<WarmState> for WarmReport {
    fn from(state: WarmState) -> Self {
        let (state, duration_ms, message) = match state {
            WarmState::Disabled => (WarmPhase::Disabled, None, None),
            WarmState::Pending => (WarmPhase::Pending, None, None),
            WarmState::Running => (WarmPhase::Running, None, None),
            WarmState::Ready { duration_ms } => (WarmPhase::Ready, Some(duration_ms), None),
            WarmState::Failed { message } => (WarmPhase::Failed, None, Some(message)),
        };
        Self {
            state,
            duration_ms,
            message,
        }
    }
}

impl From<WarmReport> for WarmState {
    fn from(report: WarmReport) -> Self {
        match report.state {
            WarmPhase::Disabled => WarmState::Disabled,
            WarmPhase::Pending => WarmState::Pending,
            WarmPhase::Running => WarmState::Running,
            WarmPhase::Ready => WarmState::Ready {
                duration_ms: report.duration_ms.unwrap_or_default(),
            },
            WarmPhase::Failed => WarmState::Failed {
                message: report.message.unwrap_or_default(),
            },
        }
    }
}

/// The environment cache and its warming.
pub(crate) struct Environments {
    config: Arc<EngineConfig>,
    cache: Result<Arc<EnvCache>, Unavailable>,
    planner: Arc<Planner>,
    calls: Arc<Calls>,
    /// How cache warming went ([`Environments::warm`]).
    pub(crate) warm: Mutex<WarmState>,
}

impl Environments {
    pub(crate) fn new(
        config: Arc<EngineConfig>,
        cache: Result<Arc<EnvCache>, Unavailable>,
        planner: Arc<Planner>,
        calls: Arc<Calls>,
    ) -> Environments {
        let warm = if config.warm_cache {
            WarmState::Pending
        } else {
            WarmState::Disabled
        };
        Environments {
            config,
            cache,
            planner,
            calls,
            warm: Mutex::new(warm),
        }
    }

    /// Build the default environment so the first call does not pay for it (cache warming).
    /// Observable through [`crate::Engine::report`] (`warm`). Does nothing when warming is disabled.
    pub(crate) async fn warm(&self) {
        if !self.config.warm_cache {
            return;
        }
        self.set_warm(WarmState::Running);
        let started = std::time::Instant::now();
        let mut failed = Vec::new();
        if let Err(err) = self.default_environment().await {
            failed.push(err.message);
        } else {
            // Then `[cache] warm`, one environment each; one that fails does not stop the rest.
            for requirement in &self.config.warm_packages {
                if let Err(err) = self
                    .server_environment(std::slice::from_ref(requirement))
                    .await
                {
                    failed.push(format!("`{requirement}`: {}", err.message));
                }
            }
        }
        let state = if failed.is_empty() {
            WarmState::Ready {
                duration_ms: ids::millis(started.elapsed()),
            }
        } else {
            WarmState::Failed {
                message: failed.join("; "),
            }
        };
        tracing::info!(?state, "cache warming finished");
        self.set_warm(state);
    }

    pub(crate) async fn default_environment(&self) -> Result<Environment, EngineError> {
        self.server_environment(&[]).await
    }

    /// The default interpreter's environment of `requirements` (none: the default
    /// environment), built in the server's name if missing: cache warming's work.
    async fn server_environment(
        &self,
        requirements: &[pep508_rs::Requirement],
    ) -> Result<Environment, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        let interpreter = self.planner.pick_interpreter(None, None)?;
        // Building it runs uv's install sandboxes: a slot, like every sandbox.
        let _slot = self.calls.server_slot().await?;
        Ok(cache.ensure(&interpreter, requirements).await?)
    }

    fn set_warm(&self, state: WarmState) {
        if let Ok(mut warm) = self.warm.lock() {
            *warm = state;
        }
    }

    /// The environment of `requirements` for a call of `caller`, from the cache or built now
    /// in its name.
    pub(crate) async fn environment(
        &self,
        caller: &crate::Caller,
        interpreter: &Interpreter,
        requirements: &[pep508_rs::Requirement],
    ) -> Result<Environment, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        // A build runs uv's install sandboxes: it holds a slot of the concurrency cap, released
        // before the run takes its own (never both at once), in the caller's name, and its
        // sandboxes weigh on the CPU as the slot's share says. (A cancel drops this whole
        // future: the caller's select.)
        let slot = self.calls.share(caller).slot().await?;
        Ok(cache
            .ensure_weighed(interpreter, requirements, slot.cpu())
            .await?)
    }
    /// Remove environments past the cache's retention rule (age, then size).
    pub(crate) async fn prune(&self) -> Result<snakebox_env::PruneReport, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        Ok(cache.prune().await?)
    }
}
