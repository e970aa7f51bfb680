//! What the HTTP face's integration tests share: a real engine on the `none` backend (no
//! sandbox: what is under test is the HTTP face in front of the MCP handler), the router in
//! front of it, and requests sent through it one at a time as a client would send them.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::{Value, json};
use snakebox_engine::BackendKind;
use snakebox_engine::{Engine, EngineConfig};
use snakebox_http::{HttpConfig, KeyStore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The `Host` every request is sent with (a loopback name the edge allows).
pub(crate) const HOST: &str = "127.0.0.1:8000";

/// An engine on the `none` backend with nothing started ahead (no pool, no fork server, no
/// cache warming): each test starts in well under a second.
pub(crate) async fn engine(data: &std::path::Path) -> Arc<Engine> {
    let mut config = EngineConfig::new(data.to_path_buf(), BackendKind::None);
    config.warm_pool = 0;
    config.fork_server = false;
    config.warm_cache = false;
    Arc::new(Engine::new(config).await)
}

/// A loopback server's HTTP settings at `addr`: no public URL, no extra hosts or origins,
/// authentication on.
pub(crate) fn http_config(addr: &str) -> HttpConfig {
    HttpConfig {
        addr: addr.parse::<SocketAddr>().unwrap(),
        public_url: None,
        allowed_hosts: vec![],
        allowed_origins: vec![],
        insecure_no_auth: false,
        conformance_fixtures: false,
        link_ttl: snakebox_http::DEFAULT_LINK_TTL,
        max_body_bytes: snakebox_http::DEFAULT_MAX_BODY_BYTES,
    }
}

/// The router of a fresh engine whose data (keys included) live in `data`.
pub(crate) async fn router_with(data: &std::path::Path, http: &HttpConfig) -> Router {
    snakebox_http::router(
        engine(data).await,
        http,
        KeyStore::new(data),
        CancellationToken::new(),
    )
    .unwrap()
}

/// What came back for one request.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value, or "" when it is absent.
    pub(crate) fn header(&self, name: header::HeaderName) -> String {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    /// The body as JSON: a JSON body, or the last `data:` line of an event stream, or else the
    /// text as a JSON string (so that an assertion's message shows it).
    pub(crate) fn json(&self) -> Value {
        let text = self.text();
        serde_json::from_str(&text).unwrap_or_else(|_| {
            text.lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .next_back()
                .unwrap_or(Value::String(text))
        })
    }
}

pub(crate) async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// `GET path` from [`HOST`].
pub(crate) fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::HOST, HOST)
        .body(Body::empty())
        .unwrap()
}

/// A JSON-RPC request to `/mcp`, as a streamable-HTTP client sends it.
pub(crate) fn rpc(method: &str, params: Value) -> Request<Body> {
    Request::post("/mcp")
        .header(header::HOST, HOST)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(Body::from(
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(),
        ))
        .unwrap()
}

/// `tools/call` of `name` with `arguments`.
pub(crate) fn tool_call(name: &str, arguments: Value) -> Request<Body> {
    rpc("tools/call", json!({"name": name, "arguments": arguments}))
}

pub(crate) fn with_key(mut request: Request<Body>, key: &str) -> Request<Body> {
    request.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {key}").parse().unwrap(),
    );
    request
}

/// Call tool `name` as the holder of `key`; the call's `result` (asserting HTTP 200).
pub(crate) async fn call_tool(router: &Router, key: &str, name: &str, arguments: Value) -> Value {
    let reply = send(router, with_key(tool_call(name, arguments), key)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["result"].clone()
}
