//! The HTTP face of snakebox: the same MCP handler and engine as stdio, served over
//! streamable HTTP to clients on the network, with API keys that name a tenant.
//!
//! What this crate owns is the edge: everything a request meets before the MCP handler sees
//! it, in one order for every route ([`edge`]): the `Host`, parsed strictly once
//! ([`authority`]) and checked against the allowlist (DNS rebinding), the `Origin` check
//! (browsers), JSON on POSTs (a browser's "simple" cross-site POST is refused), the one body
//! limit (`--max-body-bytes`), then authentication (`Authorization: Bearer sbx_…` → the
//! key's tenant, [`keys`]) from the live key store, watched while the response lasts so that
//! a revoked key's open streams end within a second ([`live`]). The tenant travels to the handler as a [`snakebox_engine::Caller`] in
//! the request's extensions ([`snakebox_server::SnakeboxServer::per_request`]), so every
//! session, run and artifact it touches is its own and another tenant's ids are "not found".
//!
//! It must not know how code runs: it calls the MCP handler, which calls the engine. rmcp does
//! the MCP framing (`StreamableHttpService`, stateless: both protocol eras); its own `Host`
//! check is replaced by ours, which covers every route.
//!
//! Two more routes: `/metrics` (`scrape`, Prometheus text; behind the same key as MCP)
//! and signed, expiring download links of artifacts ([`links`], `/files/…`: the link's
//! signature is its credential, no key). On HTTP, results carry each artifact's link
//! (`download_url`) beside its MCP `resource_link`.
//!
//! Without any API key, a server bound to loopback serves one local tenant without
//! authentication (a developer's machine); bound elsewhere it refuses to start unless told
//! `--insecure-no-auth`. Keys made while it runs take effect at once.
//!
//! The web UI (`ui`, mounted at `/ui/` in [`router`]) reads the same engine for a logged-in
//! tenant: runs, sessions, artifacts, the environment.

pub mod authority;
pub mod clients;
mod download;
pub mod edge;
pub mod keys;
pub mod links;
pub mod live;
mod refusal;
mod scrape;
mod sse;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any_service, get, post};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use snakebox_engine::{EngineHandle, EngineHost};
use snakebox_server::SnakeboxServer;
use tokio_util::sync::CancellationToken;

pub use edge::Edge;
pub use keys::{KeyError, KeyInfo, KeyStore, NewKey};
pub use links::{DEFAULT_LINK_TTL, LinkError, LinkSigner};

/// The largest request body accepted when the settings say nothing (`--max-body-bytes`,
/// `[http] max_body_bytes`): room for a call at the documented limits (32 MiB of input files
/// travel as base64, about 43 MiB of JSON, beside a script of up to `--max-script-bytes`).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How the HTTP face is set up (`[http]` in the config file, `serve --http` flags).
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The URL clients use to reach the server, when it is behind a proxy or a name: its host
    /// is allowed in `Host`, its origin in `Origin`.
    pub public_url: Option<String>,
    /// More `Host` values to accept (names or `name:port`), besides loopback names and the
    /// public URL's host.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call (`https://app.example.com`), besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Serve without API keys on a non-loopback address (everyone is the local tenant).
    pub insecure_no_auth: bool,
    /// Also serve the MCP conformance suite's fixtures (a hidden flag, for that suite only).
    pub conformance_fixtures: bool,
    /// How long the download links in results stay valid.
    pub link_ttl: Duration,
    /// The largest request body, on every route and transport (413 past it).
    pub max_body_bytes: usize,
}

/// Why the HTTP face cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A non-loopback bind without keys and without `--insecure-no-auth`.
    #[error(
        "Refusing to serve on `{0}` without authentication: it is not a loopback address and no API key exists"
    )]
    NoAuth(SocketAddr),
    /// A loopback bind published under another name (`--public-url`, `--allowed-host`), without
    /// keys and without `--insecure-no-auth`.
    #[error(
        "Refusing to serve as `{0}` without authentication: the bind is loopback, but clients reach it under that name (a reverse proxy), and no API key exists"
    )]
    NoAuthBehindProxy(String),
    /// The key store failed.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// The address could not be bound, or serving failed.
    #[error("Failed to serve HTTP on `{addr}`")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// `--public-url` is not an http(s) URL with a valid host.
    #[error("The public URL `{url}` is not valid")]
    PublicUrl {
        /// What was given.
        url: String,
        /// What is wrong with it.
        source: authority::UrlError,
    },
    /// An `--allowed-host` is not `host[:port]`.
    #[error("The allowed host `{host}` is not valid")]
    AllowedHost {
        /// What was given.
        host: String,
        /// What is wrong with it.
        source: authority::AuthorityError,
    },
    /// An `--allowed-origin` is not `scheme://host[:port]`.
    #[error("The allowed origin `{origin}` is not valid")]
    AllowedOrigin {
        /// What was given.
        origin: String,
        /// What is wrong with it.
        source: authority::UrlError,
    },
    /// The download links' secret cannot be read or made.
    #[error(transparent)]
    Links(#[from] LinkError),
}

impl HttpError {
    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            HttpError::NoAuthBehindProxy(_) => "make a key with `snakebox keys add --tenant NAME` (clients send it as `Authorization: Bearer sbx_…`), or pass --insecure-no-auth if the proxy in front authenticates".into(),
            HttpError::NoAuth(_) => "make a key with `snakebox keys add --tenant NAME` (clients send it as `Authorization: Bearer sbx_…`), bind to 127.0.0.1, or pass --insecure-no-auth if a proxy in front authenticates".into(),
            HttpError::Keys(err) => err.hint(),
            HttpError::Io { .. } => "check that the address is free (another server on that port?) and that this user may bind it".into(),
            HttpError::PublicUrl { .. } => "pass the URL clients use, e.g. `https://snakebox.example.com` or `https://example.com/snakebox` (no user part, query or fragment)".into(),
            HttpError::AllowedHost { .. } => "write a host name or address, optionally with a port, e.g. `snakebox.internal` or `snakebox.internal:8000`".into(),
            HttpError::AllowedOrigin { .. } => "write a scheme, a host and optionally a port, e.g. `https://app.example.com`".into(),
            HttpError::Links(err) => err.hint(),
        }
    }
}

/// The routes, behind the edge: what [`serve`] serves (tests call it directly). The first
/// call installs the process's metrics recorder.
///
/// # Errors
/// A bad public URL, a non-loopback bind without authentication, a download-link secret
/// that cannot be read or made.
pub fn router(
    engine: impl Into<EngineHandle>,
    config: &HttpConfig,
    keys: KeyStore,
    stop: CancellationToken,
) -> Result<Router, HttpError> {
    let engine: EngineHandle = engine.into();
    let edge = Arc::new(Edge::new(config, keys)?);
    let links = Arc::new(links::Links {
        signer: LinkSigner::load_or_create(&engine.host().config().data_dir)?,
        ttl: config.link_ttl,
        public_url: edge.public_url(),
        fallback_base: authority::BaseUrl::http(authority::Authority::from(config.addr)),
    });
    // Installed before anything records, so the first run is counted.
    let _ = scrape::handle();
    let mcp_config = {
        let mut mcp = StreamableHttpServerConfig::default()
            // Ours covers every route; rmcp's covers only its own.
            .disable_allowed_hosts()
            .disable_allowed_origins();
        // Stateless: no server-side MCP sessions to lose or to tie to a tenant; snakebox's
        // own sessions are addressed by `session_id` arguments.
        mcp.legacy_session_mode = false;
        mcp.json_response = true;
        // The edge owns the limit, for every route (rmcp's own default is 4 MiB).
        mcp.max_request_body_bytes = config.max_body_bytes;
        mcp.cancellation_token = stop.child_token();
        mcp
    };
    let handler = SnakeboxServer::per_request(engine.clone());
    let handler = if config.conformance_fixtures {
        handler.with_conformance_fixtures()
    } else {
        handler
    };
    let mcp = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let ready_engine = Arc::clone(engine.host());
    let files_engine = Arc::clone(engine.api());
    let legacy = sse::SseSessions::new(engine.clone(), edge.live(), stop.child_token());
    // Who may call what, by route group (the edge's checks before them cover every route):
    // the MCP transports and /metrics take an API key; the legacy SSE posts a key or their
    // session's id; download links their signature (`links`); the web UI its session cookie
    // and each form's CSRF token (`ui/auth.rs`); the probes and the fallback nothing.
    let keyed = Router::new()
        .route_service("/mcp", any_service(mcp.clone()))
        // `GET /sse` is the legacy SSE transport; clients configured with `…/sse` that speak
        // streamable HTTP POST there first.
        .route(
            "/sse",
            get(sse::open)
                .post_service(mcp)
                .with_state(Arc::clone(&legacy)),
        )
        .route(
            "/metrics",
            get(scrape::metrics).with_state(Arc::clone(engine.host())),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&edge),
            edge::require_key,
        ));
    let session_posts = Router::new()
        .route("/messages", post(sse::post).with_state(legacy))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&edge),
            edge::key_if_presented,
        ));
    let router = Router::new()
        .merge(keyed)
        .merge(session_posts)
        // The web UI (its own module tree, `ui/`): cookie sessions and CSRF-checked forms.
        .route("/ui/", ui::slash())
        .nest(
            "/ui",
            ui::router(Arc::clone(engine.api()), edge.live(), edge.public_url()),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let engine = Arc::clone(&ready_engine);
                async move { readiness(engine.as_ref()) }
            }),
        )
        .route(
            "/files/{execution_id}/{*path}",
            get(links::download).with_state((files_engine, Arc::clone(&links))),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "no such route; MCP is served at /mcp (streamable HTTP)\n",
            )
        })
        .layer(axum::middleware::from_fn_with_state(links, links::attach))
        // The edge's limit is the one limit: axum's own (2 MB, on extracted bodies) is off.
        // Routes with a smaller limit of their own (a UI upload: one file) set it themselves.
        .layer(axum::extract::DefaultBodyLimit::disable());
    Ok(edge
        .wrap(router)
        .layer(axum::middleware::from_fn(scrape::count)))
}

/// The process's metrics as Prometheus text, installing the exporter's recorder the first
/// time: for a process that serves them on a router of its own (`snakebox agent`). The
/// caller refreshes the engine's gauges first ([`EngineHost::publish_gauges`]).
#[must_use]
pub fn render_metrics() -> String {
    let handle = scrape::handle();
    handle.run_upkeep();
    handle.render()
}

/// `/readyz`: 200 when runs can be served, else 503 with the reasons.
fn readiness(engine: &dyn EngineHost) -> Response {
    let report = engine.report();
    let body = serde_json::json!({
        "ready": report.ready,
        "problems": report.problems,
    });
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Serve until `stop` is cancelled, then stop taking requests and let those in flight finish
/// (the engine's own shutdown answers them `cancelled`).
///
/// # Errors
/// The address cannot be bound, the key store cannot be read, or authentication would be off
/// on a non-loopback address.
pub async fn serve(
    engine: impl Into<EngineHandle>,
    config: &HttpConfig,
    stop: CancellationToken,
) -> Result<(), HttpError> {
    let engine: EngineHandle = engine.into();
    // The keys where the engine keeps its shared rows: the data directory's store, or the
    // deployment's database (opened once per process: this is the engine's pool).
    let keys = {
        let config = engine.host().config();
        let (database, data_dir) = (config.database.clone(), config.data_dir.clone());
        tokio::task::spawn_blocking(move || KeyStore::open(database.as_ref(), &data_dir))
            .await
            .unwrap_or(Err(KeyError::Interrupted))?
    };
    // Checked before binding: a refused configuration never holds the port.
    Edge::new(config, keys.clone())?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| HttpError::Io {
            addr: config.addr,
            source,
        })?;
    let bound = listener.local_addr().unwrap_or(config.addr);
    // Links without a public URL or a Host fall back to the address really bound (port 0).
    let bound_config = HttpConfig {
        addr: bound,
        ..config.clone()
    };
    let router = router(engine, &bound_config, keys, stop.clone())?;
    tracing::info!(%bound, "serving MCP over HTTP at http://{bound}/mcp");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|source| HttpError::Io {
            addr: config.addr,
            source,
        })
}
