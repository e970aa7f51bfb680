//! What snakebox's Rust tests share, so that a behaviour test is ten lines: a real engine on
//! the `none` backend in a temporary data directory ([`TestEngine`]), a client of the MCP face
//! in process ([`McpClient`]: rmcp's client over an in-memory stream, talking to
//! `SnakeboxServer`) and a client of the HTTP face's router ([`HttpClient`]: requests driven
//! through `snakebox_http::router` one at a time, no socket). Either face can be built over a
//! loopback wire ([`wire`]: every request, result and output chunk through JSON and back), to
//! prove that the faces work with a wire between them and the engine.
//!
//! A test room: it sits above every other crate and may use any of them, and nothing may
//! depend on it except as a dev-dependency (`crates/snakebox/src/rooms.rs` checks both). It
//! is used from integration tests (`tests/*.rs`) only: a crate's own unit tests would see two
//! copies of that crate, the one under test and the one this crate links.
//!
//! ```no_run
//! # async fn example() {
//! use serde_json::json;
//! let test = snakebox_test::TestEngine::new().await;
//! let mcp = test.mcp().await;
//! let reply = mcp.call("execute_python", json!({"script": "print(6 * 7)"})).await;
//! assert_eq!(reply.structured["stdout"], "42\n");
//! # }
//! ```

pub mod http;
mod keys;
pub mod mcp;
mod reply;
pub mod wire;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use snakebox_engine::{BackendKind, Caller, Engine, EngineConfig, EngineHandle};

pub use http::{HttpClient, Reply};
pub use mcp::McpClient;
pub use reply::ToolReply;
pub use wire::Loopback;

/// A real engine on the `none` backend (no isolation and no privilege: what a test of a face
/// exercises is the face and the engine, not the sandbox), in a temporary data directory that
/// lives as long as this value and every [`TestEngine::restart`] of it.
///
/// Nothing is started ahead (no warm pool, no fork server, no cache warming), so an engine
/// is ready in well under a second; timeouts are short, so that a hung run fails a test in
/// seconds.
pub struct TestEngine {
    // Dropped in this order: the engine before the directory it writes to.
    engine: Arc<Engine>,
    config: EngineConfig,
    data: Arc<tempfile::TempDir>,
}

/// A call's time limit when it gives none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest time limit a call may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

impl TestEngine {
    /// An engine with the test settings (see [`TestEngine`]).
    pub async fn new() -> TestEngine {
        TestEngine::with(|_| {}).await
    }

    /// An engine with the test settings, then `adjust`ed (the data directory is already set).
    pub async fn with(adjust: impl FnOnce(&mut EngineConfig)) -> TestEngine {
        let data = tempfile::tempdir().expect("a temporary data directory");
        let mut config = EngineConfig::new(data.path().to_path_buf(), BackendKind::None);
        config.warm_pool = 0;
        config.fork_server = false;
        config.warm_cache = false;
        config.default_timeout = DEFAULT_TIMEOUT;
        config.max_timeout = MAX_TIMEOUT;
        adjust(&mut config);
        let engine = Arc::new(Engine::new(config.clone()).await);
        TestEngine {
            engine,
            config,
            data: Arc::new(data),
        }
    }

    /// A new engine over the same data directory and settings, as a server restarted on the
    /// same host would be (this one keeps running: drop it first to test a real stop).
    pub async fn restart(&self) -> TestEngine {
        TestEngine {
            engine: Arc::new(Engine::new(self.config.clone()).await),
            config: self.config.clone(),
            data: Arc::clone(&self.data),
        }
    }

    /// The engine, for tests that call it directly or build a face of their own.
    #[must_use]
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The data directory (sessions, artifacts, the store, keys, the links' secret).
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// A connected MCP client whose calls are the local caller's (as on stdio).
    pub async fn mcp(&self) -> McpClient {
        McpClient::connect(&self.engine, Caller::local()).await
    }

    /// A connected MCP client whose calls are `tenant`'s (as over HTTP with its key).
    pub async fn mcp_as(&self, tenant: &str) -> McpClient {
        let caller = Caller::tenant(tenant).expect("a valid tenant name");
        McpClient::connect(&self.engine, caller).await
    }

    /// The engine as a face holds it, its API behind a loopback wire ([`wire`]), and the
    /// loopback (to count what crossed it).
    #[must_use]
    pub fn over_the_wire(&self) -> (EngineHandle, Arc<Loopback>) {
        let loopback = Arc::new(Loopback::new(Arc::clone(&self.engine) as _));
        let handle = EngineHandle::from(Arc::clone(&self.engine))
            .with_api(Arc::new(wire::Wire(Arc::clone(&loopback))));
        (handle, loopback)
    }

    /// A connected MCP client of the local caller whose every engine call crosses a loopback
    /// wire, and the loopback.
    pub async fn mcp_over_the_wire(&self) -> (McpClient, Arc<Loopback>) {
        let (handle, loopback) = self.over_the_wire();
        let server = snakebox_server::SnakeboxServer::for_caller(handle, Caller::local());
        (McpClient::connect_to(server).await, loopback)
    }

    /// A client of the HTTP face's router whose every engine call crosses a loopback wire,
    /// with [`http::config`]'s settings, and the loopback.
    #[must_use]
    pub fn http_over_the_wire(&self) -> (HttpClient, Arc<Loopback>) {
        let (handle, loopback) = self.over_the_wire();
        (HttpClient::over(handle, &http::config()), loopback)
    }

    /// A client of the HTTP face's router over this engine, with [`http::config`]'s settings
    /// (a loopback bind, authentication on), sending no key.
    #[must_use]
    pub fn http(&self) -> HttpClient {
        self.http_with(|_| {})
    }

    /// As [`TestEngine::http`], with the HTTP settings `adjust`ed first.
    ///
    /// # Panics
    /// When the router refuses the settings (call `snakebox_http::router` to test that).
    #[must_use]
    pub fn http_with(&self, adjust: impl FnOnce(&mut snakebox_http::HttpConfig)) -> HttpClient {
        let mut config = http::config();
        adjust(&mut config);
        HttpClient::new(&self.engine, &config)
    }

    /// The key store of this data directory: the one the routers of [`TestEngine::http`]
    /// check keys against.
    #[must_use]
    pub fn keys(&self) -> snakebox_http::KeyStore {
        keys::store(self.data_dir())
    }

    /// A new API key of `tenant` in the key store: the key itself.
    #[must_use]
    pub fn add_key(&self, tenant: &str) -> String {
        keys::add(self.data_dir(), tenant)
    }
}
