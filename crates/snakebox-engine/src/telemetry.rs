//! What the engine measures, through the `metrics` facade: counters and histograms recorded
//! where things happen (a call admitted, waiting, returned), and gauges of state that
//! [`Engine::publish_gauges`](crate::Engine::publish_gauges) refreshes from a snapshot when a
//! face exports them.
//!
//! The engine never depends on an exporter: without a recorder installed (stdio, `run`,
//! tests) every macro is a no-op. The HTTP face installs a Prometheus recorder and serves
//! `/metrics`. No label carries a tenant, a script, a session id or a path: what is exported
//! is the server's aggregate state only.

use metrics::{counter, gauge, histogram};

use crate::history::RunKind;
use crate::result::ExecutionResult;

/// Calls that ran (or were refused) code, by kind and final status.
pub const RUNS_TOTAL: &str = "snakebox_runs_total";
/// Wall time of a call's run itself, by kind.
pub const RUN_DURATION: &str = "snakebox_run_duration_seconds";
/// Time spent preparing a call's environment, by kind.
pub const RUN_SETUP: &str = "snakebox_run_setup_seconds";
/// Work waiting for a slot: a call for its tenant's turn, any sandbox (a run, an install,
/// a build) for one of `--max-concurrent-runs`.
pub const CALLS_QUEUED: &str = "snakebox_calls_queued";

pub use crate::budget::{AUDIT_DROPPED_TOTAL, STORE_REMOVED_TOTAL};

/// Security events of tracked calls, by kind (see [`crate::EventKind`]).
pub const SECURITY_EVENTS_TOTAL: &str = "snakebox_security_events_total";

/// Record the end of one tracked call.
pub(crate) fn run_finished(kind: RunKind, result: &ExecutionResult) {
    let kind = kind.as_str();
    counter!(RUNS_TOTAL, "kind" => kind, "status" => result.status.as_str()).increment(1);
    for event in &result.events {
        counter!(SECURITY_EVENTS_TOTAL, "kind" => event.kind.as_str()).increment(1);
    }
    #[allow(clippy::cast_precision_loss)]
    {
        histogram!(RUN_DURATION, "kind" => kind).record(result.duration_ms as f64 / 1000.0);
        histogram!(RUN_SETUP, "kind" => kind).record(result.setup_ms as f64 / 1000.0);
    }
}

/// Counts one call in [`CALLS_QUEUED`] while it lives (dropped when the wait ends, however
/// it ends: a slot, a refusal, a cancellation).
pub(crate) struct Queued(());

impl Queued {
    pub(crate) fn enter() -> Queued {
        gauge!(CALLS_QUEUED).increment(1.0);
        Queued(())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        gauge!(CALLS_QUEUED).decrement(1.0);
    }
}
