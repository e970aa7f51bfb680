//! The HTTP face without a socket: requests go through `snakebox_http::router` one at a time
//! (tower's `oneshot`), meeting the same edge, authentication and handlers a client meets.
//! The request builders below are what the tests of the edge start from when they want a
//! header of their own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use snakebox_engine::{Engine, EngineHandle};
use snakebox_http::HttpConfig;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::ToolReply;

/// The `Host` every request is sent with (a loopback name the edge allows).
pub const HOST: &str = "127.0.0.1:8000";

/// The largest body read back from a reply.
const MAX_REPLY_BYTES: usize = 1 << 24;

/// The HTTP settings of a server bound to [`HOST`] on loopback: no public URL, no extra hosts
/// or origins, authentication on, the default link lifetime and body limit.
#[must_use]
pub fn config() -> HttpConfig {
    HttpConfig {
        addr: HOST.parse::<SocketAddr>().expect("a socket address"),
        public_url: None,
        allowed_hosts: vec![],
        allowed_origins: vec![],
        insecure_no_auth: false,
        conformance_fixtures: false,
        link_ttl: snakebox_http::DEFAULT_LINK_TTL,
        max_body_bytes: snakebox_http::DEFAULT_MAX_BODY_BYTES,
    }
}

/// A client of one router; with a key ([`HttpClient::with_key`]), every request it builds
/// presents that key.
#[derive(Clone)]
pub struct HttpClient {
    router: Router,
    data: PathBuf,
    key: Option<Arc<str>>,
}

impl HttpClient {
    /// The router of `engine` with `config`, its keys in the engine's data directory.
    ///
    /// # Panics
    /// When the router refuses the settings.
    #[must_use]
    pub fn new(engine: &Arc<Engine>, config: &HttpConfig) -> HttpClient {
        HttpClient::over(EngineHandle::from(Arc::clone(engine)), config)
    }

    /// The router of the engine `handle` reaches (through a wire, say) with `config`, its keys
    /// in the engine's data directory.
    ///
    /// # Panics
    /// When the router refuses the settings.
    #[must_use]
    pub fn over(handle: EngineHandle, config: &HttpConfig) -> HttpClient {
        let data = handle.host().config().data_dir.clone();
        let router = snakebox_http::router(
            handle,
            config,
            crate::keys::store(&data),
            CancellationToken::new(),
        )
        .unwrap_or_else(|err| panic!("the router: {err} ({})", err.hint()));
        HttpClient {
            router,
            data,
            key: None,
        }
    }

    /// A client of a router built elsewhere (keys in `data`).
    #[must_use]
    pub fn of(router: Router, data: PathBuf) -> HttpClient {
        HttpClient {
            router,
            data,
            key: None,
        }
    }

    /// The same router, presenting a new key of `tenant` (made in the key store now).
    #[must_use]
    pub fn with_key(&self, tenant: &str) -> HttpClient {
        self.presenting(&crate::keys::add(&self.data, tenant))
    }

    /// The same router, presenting `key` as it is (a wrong or revoked one, say).
    #[must_use]
    pub fn presenting(&self, key: &str) -> HttpClient {
        HttpClient {
            key: Some(Arc::from(key)),
            ..self.clone()
        }
    }

    /// The key this client presents.
    ///
    /// # Panics
    /// When it presents none.
    #[must_use]
    pub fn key(&self) -> &str {
        self.key.as_deref().expect("a client with a key")
    }

    /// The router, for what [`HttpClient::send`] does not cover.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Send `request` as it is (no key added); the whole reply.
    ///
    /// # Panics
    /// When the router or the body fails (neither does: errors are replies).
    pub async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.response(request).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), MAX_REPLY_BYTES)
            .await
            .expect("the reply's body")
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    /// Send `request` as it is; the response, its body unread: for a body that streams or
    /// stays open (an event stream).
    ///
    /// # Panics
    /// When the router fails (it does not: errors are responses).
    pub async fn response(&self, request: Request<Body>) -> Response<Body> {
        self.router.clone().oneshot(request).await.expect("a reply")
    }

    /// `GET path` from [`HOST`], with this client's key if it has one.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.keyed(get(path))).await
    }

    /// A JSON-RPC request `method` to `/mcp`, with this client's key if it has one.
    pub async fn post_mcp(&self, method: &str, params: Value) -> Reply {
        self.send(self.keyed(rpc(method, params))).await
    }

    /// `tools/call` of `name` with `arguments`, with this client's key if it has one.
    ///
    /// # Panics
    /// When the reply is not HTTP 200 with a JSON-RPC result (a protocol error, a refused
    /// key: use [`HttpClient::post_mcp`] to see those).
    pub async fn call_tool(&self, name: &str, arguments: Value) -> ToolReply {
        let reply = self
            .post_mcp("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text());
        let body = reply.json();
        assert!(body.get("result").is_some(), "{name}: no result: {body}");
        ToolReply::from_result(body["result"].clone())
    }

    /// `request` with this client's key, if it has one.
    #[must_use]
    pub fn keyed(&self, request: Request<Body>) -> Request<Body> {
        match &self.key {
            Some(key) => with_key(request, key),
            None => request,
        }
    }
}

/// What came back for one request.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text (lossy).
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value, or "" when it is absent.
    #[must_use]
    pub fn header(&self, name: header::HeaderName) -> String {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    }

    /// The body as JSON: a JSON body, or the last `data:` line of an event stream, or else the
    /// text as a JSON string (so that an assertion's message shows it).
    #[must_use]
    pub fn json(&self) -> Value {
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

/// `GET path` from [`HOST`].
///
/// # Panics
/// When `path` is not a valid request target.
#[must_use]
pub fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::HOST, HOST)
        .body(Body::empty())
        .expect("a request")
}

/// A JSON-RPC request to `/mcp`, as a streamable-HTTP client sends it.
///
/// # Panics
/// Never (a fixed target and headers).
#[must_use]
pub fn rpc(method: &str, params: Value) -> Request<Body> {
    Request::post("/mcp")
        .header(header::HOST, HOST)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(Body::from(
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(),
        ))
        .expect("a request")
}

/// `tools/call` of `name` with `arguments`.
#[must_use]
pub fn tool_call(name: &str, arguments: Value) -> Request<Body> {
    rpc("tools/call", json!({"name": name, "arguments": arguments}))
}

/// `request` presenting `key` (`Authorization: Bearer`).
///
/// # Panics
/// When `key` is not a valid header value.
#[must_use]
pub fn with_key(mut request: Request<Body>, key: &str) -> Request<Body> {
    request.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {key}").parse().expect("a header value"),
    );
    request
}
