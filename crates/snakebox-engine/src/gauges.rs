//! The engine's state as gauges (calls in flight, slots, sessions, the warm pool, the cache),
//! refreshed from a snapshot when a face exports its metrics. Apart from [`crate::telemetry`]
//! (which counts as calls happen, and is used by the modules below the report) because these
//! read the report's view of every part of the engine.

use metrics::{counter, gauge};

use crate::report::Reports;

#[allow(clippy::cast_precision_loss)]
fn set(name: &'static str, value: usize) {
    gauge!(name).set(value as f64);
}

impl Reports {
    /// Refresh the gauges of the engine's state from a snapshot: calls in flight, sandbox
    /// slots, sessions, the warm pool and fork servers, the environment cache. A face calls
    /// it before it exports (the cache's size is read from its manifests on disk, so call it
    /// off the async threads).
    pub(crate) fn publish_gauges(&self) {
        set("snakebox_calls_in_flight", self.calls.lifecycle.in_flight());
        let total = self.config.max_concurrent_runs.max(1);
        set("snakebox_sandbox_slots", total);
        set("snakebox_sandbox_slots_busy", self.calls.runs.busy());
        set("snakebox_host_work_threads", self.calls.host.threads());
        set("snakebox_host_work_busy", self.calls.host.busy());
        let sessions = self.sessions.report(&self.config.data_dir, None);
        set("snakebox_sessions", sessions.count);
        set(
            "snakebox_session_interpreters_running",
            sessions.running_interpreters,
        );
        #[allow(clippy::cast_precision_loss)]
        gauge!("snakebox_sessions_disk_bytes").set(sessions.used_disk_bytes as f64);
        let pool = self.pool.report(None);
        set("snakebox_pool_size", pool.size);
        set("snakebox_pool_ready", pool.ready);
        set("snakebox_fork_servers", pool.fork_servers);
        counter!("snakebox_pool_served_total").absolute(pool.served);
        counter!("snakebox_pool_cold_starts_total").absolute(pool.cold_starts);
        counter!("snakebox_forked_runs_total").absolute(pool.forked);
        if let Ok(cache) = &self.cache {
            let stats = cache.stats();
            set("snakebox_env_cache_environments", stats.environments);
            #[allow(clippy::cast_precision_loss)]
            gauge!("snakebox_env_cache_bytes").set(stats.bytes as f64);
        }
        #[allow(clippy::cast_precision_loss)]
        gauge!("snakebox_audit_queue_bytes").set(self.calls.history.queued_bytes() as f64);
    }
}
