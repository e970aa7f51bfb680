//! `/metrics`: the Prometheus text exposition of what the engine and the edge record
//! through the `metrics` facade.
//!
//! The HTTP face installs the process's one recorder (the Prometheus exporter's) the first
//! time a router is built; stdio never does, so there every measurement is a no-op. A scrape
//! first refreshes the engine's snapshot gauges (sessions, pool, cache:
//! [`EngineHost::publish_gauges`], this process's own), then renders. The route needs what every other route needs
//! (an API key once keys exist): what it shows is the server's aggregate state, with no
//! tenant, script, session id or file name in any label.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use snakebox_engine::EngineHost;
use snakebox_engine::telemetry::{RUN_DURATION, RUN_SETUP};

/// Buckets of the duration histograms, in seconds (a run is usually well under a second, an
/// environment build up to minutes).
const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Requests answered, by route and status.
const HTTP_REQUESTS: &str = "snakebox_http_requests_total";
/// Time to the response's head, by route.
const HTTP_DURATION: &str = "snakebox_http_request_duration_seconds";

/// The exporter's handle, installing its recorder the first time.
pub(crate) fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let builder = match builder
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
                    &SECONDS_BUCKETS,
                )
                .map_err(|err| err.to_string())
            {
                Ok(builder) => builder,
                Err(err) => {
                    tracing::warn!(%err, "histogram buckets refused; summaries are exported");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(err) = metrics::set_global_recorder(recorder) {
                // Another recorder owns the process (an embedding program's): /metrics
                // answers, with nothing recorded.
                tracing::warn!(%err, "a metrics recorder was already installed; /metrics stays empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        snakebox_engine::telemetry::RUNS_TOTAL,
        "Calls that ran code (one-shot runs, session cells, commands), by kind and final status"
    );
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "Wall time of each run itself, by kind"
    );
    describe_histogram!(
        RUN_SETUP,
        Unit::Seconds,
        "Time spent preparing each run's environment, by kind"
    );
    describe_gauge!(
        snakebox_engine::telemetry::CALLS_QUEUED,
        "Work waiting for a slot (a tenant's turn, or one of --max-concurrent-runs)"
    );
    describe_gauge!(
        "snakebox_calls_in_flight",
        "Calls admitted and not yet answered"
    );
    describe_gauge!("snakebox_sandbox_slots", "--max-concurrent-runs");
    describe_gauge!(
        "snakebox_sandbox_slots_busy",
        "Slots of --max-concurrent-runs held now"
    );
    describe_gauge!(
        "snakebox_host_work_threads",
        "Pieces of host work (file tools, run and artifact reads) that may run at once"
    );
    describe_gauge!(
        "snakebox_host_work_busy",
        "Pieces of host work running now, every tenant's"
    );
    describe_gauge!("snakebox_sessions", "Live sessions");
    describe_gauge!(
        "snakebox_session_interpreters_running",
        "Session interpreters running now"
    );
    describe_gauge!(
        "snakebox_sessions_disk_bytes",
        Unit::Bytes,
        "Disk the sessions use together (as last measured)"
    );
    describe_gauge!(
        "snakebox_pool_size",
        "Warm sandboxes kept per environment (--warm-pool)"
    );
    describe_gauge!("snakebox_pool_ready", "Warm sandboxes ready now");
    describe_gauge!("snakebox_fork_servers", "Fork servers running now");
    describe_counter!(
        "snakebox_pool_served_total",
        "Runs served by a pre-started sandbox"
    );
    describe_counter!(
        "snakebox_pool_cold_starts_total",
        "Runs that started a sandbox while the caller waited"
    );
    describe_counter!(
        "snakebox_forked_runs_total",
        "Runs forked from a fork server"
    );
    describe_gauge!(
        "snakebox_env_cache_environments",
        "Environments in the cache"
    );
    describe_gauge!(
        "snakebox_env_cache_bytes",
        Unit::Bytes,
        "Size of the environment cache"
    );
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by route and status");
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "Time to each HTTP response's head, by route"
    );
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(engine): State<Arc<dyn EngineHost>>) -> Response {
    let handle = handle();
    // The cache's size is read from disk: off the async threads.
    let rendered = tokio::task::spawn_blocking(move || {
        engine.publish_gauges();
        handle.run_upkeep();
        handle.render()
    })
    .await
    .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        rendered,
    )
        .into_response()
}

/// The route a request matched, as a label: the route's pattern, never the path (which
/// carries execution ids and file names).
fn route_label(request: &Request) -> &'static str {
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str);
    match matched {
        "/mcp" => "/mcp",
        "/sse" => "/sse",
        "/messages" => "/messages",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        _ if request.uri().path().starts_with(crate::links::ROUTE_PREFIX) => "/files",
        _ => "other",
    }
}

/// Count every request (outside the edge: refusals count too).
pub(crate) async fn count(request: Request, next: Next) -> Response {
    let route = route_label(&request);
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS, "route" => route, "status" => status).increment(1);
    metrics::histogram!(HTTP_DURATION, "route" => route).record(started.elapsed().as_secs_f64());
    response
}
