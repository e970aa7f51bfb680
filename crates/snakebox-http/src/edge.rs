//! The edge: the checks every request passes, in this order, before any route sees it.
//!
//! 1. **Host** must be a loopback name, the public URL's host, or an allowed host (403):
//!    a web page that rebinds its own name to 127.0.0.1 still sends its own name.
//! 2. **Origin**, when a browser sends one, must be the server's own or an allowed origin
//!    (403): no web page may drive the tools from a user's browser.
//! 3. **POST bodies** must be `application/json` (415), so a browser's "simple" cross-site
//!    form or `text/plain` POST never reaches a handler, and not larger than the limit (413).
//! 4. **Authentication**, for every route but `/healthz`, `/readyz` and download links
//!    (`/files/…`, whose signature is their credential: [`crate::links`]): a live API key as
//!    `Authorization: Bearer sbx_…` (401 with `WWW-Authenticate` otherwise); the key's tenant
//!    goes into the request's extensions as a [`Caller`]. A server without any key serves the
//!    local tenant when it is bound to loopback (or told `--insecure-no-auth`). A legacy SSE
//!    post (`/messages`) without a key is let through to its handler, which accepts it only for
//!    an open session: the session id, handed out on an authenticated `GET /sse`, is its
//!    credential.
//!
//! The web UI (`/ui/…`) passes steps 1 and 2 and the body limit like every route; it
//! authenticates by its own session cookie and checks each form's CSRF token and `Origin`
//! itself (`ui/auth.rs`), so steps 3 (JSON) and 4 (Bearer key) do not apply to it.
//!
//! Refusals are JSON (`{"error": …, "hint": …}`) and say how to fix the request.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use snakebox_engine::Caller;

use crate::keys::KeyStore;
use crate::{HttpConfig, HttpError, MAX_BODY_BYTES};

/// The routes that answer without authentication (probes).
const OPEN_ROUTES: [&str; 2] = ["/healthz", "/readyz"];

/// The edge's settings, decided at start.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Accepted `Host` values: bare hosts (any port) and `host:port` authorities.
    hosts: BTreeSet<String>,
    /// Accepted `Origin` values besides the request's own.
    origins: BTreeSet<String>,
    /// Whether a server with no live key may serve the local tenant.
    keyless_local: bool,
    keys: KeyStore,
}

fn refusal(status: StatusCode, error: &str, hint: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": error, "hint": hint })),
    )
        .into_response()
}

/// `host` without its port, lowercased; IPv6 literals keep their brackets.
fn bare_host(authority: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority.clone(), |(host, _)| format!("{host}]"));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host.to_owned(),
        _ => authority,
    }
}

/// Whether a bare host (as [`bare_host`] writes it) names this machine's loopback interface.
fn names_loopback(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The scheme, host and port of an `http(s)://…` URL, as an `Origin` header writes them.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
}

impl Edge {
    /// The edge for `config`; refuses a non-loopback bind that would serve without keys.
    ///
    /// # Errors
    /// A bad public URL; no live key on a non-loopback address without `insecure_no_auth`.
    pub fn new(config: &HttpConfig, keys: KeyStore) -> Result<Edge, HttpError> {
        let loopback = config.addr.ip().is_loopback();
        let mut hosts: BTreeSet<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut origins = BTreeSet::new();
        if let Some(url) = &config.public_url {
            let origin = origin_of(url).ok_or_else(|| HttpError::PublicUrl(url.clone()))?;
            let authority = origin.split_once("://").map_or("", |(_, a)| a);
            hosts.insert(bare_host(authority));
            origins.insert(origin);
        }
        for host in &config.allowed_hosts {
            hosts.insert(host.trim().to_ascii_lowercase());
        }
        for origin in &config.allowed_origins {
            origins.insert(origin.trim().trim_end_matches('/').to_ascii_lowercase());
        }
        // A loopback bind named by a public URL or an allowed host that is not loopback is
        // reachable from elsewhere (through a reverse proxy): it needs keys like any other.
        let exposed_as = config
            .public_url
            .iter()
            .filter_map(|url| origin_of(url))
            .map(|origin| {
                let authority = origin.split_once("://").map_or("", |(_, a)| a).to_owned();
                bare_host(&authority)
            })
            .chain(config.allowed_hosts.iter().map(|host| bare_host(host)))
            .find(|host| !names_loopback(host));
        let keyless_local = (loopback && exposed_as.is_none()) || config.insecure_no_auth;
        if !keyless_local && !keys.any_live()? {
            return Err(match exposed_as {
                Some(host) if loopback => HttpError::NoAuthBehindProxy(host),
                _ => HttpError::NoAuth(config.addr),
            });
        }
        Ok(Edge {
            hosts,
            origins,
            keyless_local,
            keys,
        })
    }

    /// The key store (the web UI logs in with it).
    pub(crate) fn keys(&self) -> KeyStore {
        self.keys.clone()
    }

    /// Whether the local tenant is served when no key exists.
    pub(crate) fn keyless_local(&self) -> bool {
        self.keyless_local
    }

    /// `router` behind the edge.
    pub fn wrap(self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(Arc::new(self), check))
    }

    fn host_allowed(&self, authority: &str) -> bool {
        let authority = authority.trim().to_ascii_lowercase();
        self.hosts.contains(&authority) || self.hosts.contains(&bare_host(&authority))
    }

    fn origin_allowed(&self, origin: &str, authority: &str) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        let authority = authority.trim().to_ascii_lowercase();
        // The server's own pages (same origin), whatever scheme a proxy in front speaks.
        origin == format!("http://{authority}")
            || origin == format!("https://{authority}")
            || self.origins.contains(&origin)
    }

    /// Who the request is for, or the refusal.
    fn authenticate(&self, request: &Request) -> Result<Caller, Box<Response>> {
        let unauthorized = |error: &str| {
            let mut response = refusal(
                StatusCode::UNAUTHORIZED,
                error,
                "send `Authorization: Bearer sbx_…` with a key from `snakebox keys add --tenant NAME`",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"snakebox\""),
            );
            Box::new(response)
        };
        let unavailable = |err: &crate::KeyError| {
            tracing::error!(error = %err, "the API key store cannot be read");
            Box::new(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server cannot check API keys right now",
                &err.hint(),
            ))
        };
        let presented = bearer(request.headers()).or_else(|| legacy_query_key(request));
        let Some(presented) = presented else {
            let any_keys = self.keys.any_live().map_err(|err| unavailable(&err))?;
            if !any_keys && self.keyless_local {
                return Ok(Caller::local());
            }
            return Err(unauthorized("this server requires an API key"));
        };
        match self.keys.authenticate(&presented) {
            Ok(Some(caller)) => Ok(caller),
            Ok(None) => Err(unauthorized("the API key is not valid (wrong or revoked)")),
            Err(err) => Err(unavailable(&err)),
        }
    }
}

/// The key of `Authorization: Bearer …`.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
        .filter(|token| !token.is_empty())
}

/// `?api_key=` is accepted on `GET /sse` only (clients of the legacy SSE transport that
/// cannot send headers); never logged.
fn legacy_query_key(request: &Request) -> Option<String> {
    if request.method() != Method::GET || request.uri().path() != "/sse" {
        return None;
    }
    request.uri().query()?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        (name == "api_key" && !value.is_empty()).then(|| value.to_owned())
    })
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

async fn check(State(edge): State<Arc<Edge>>, mut request: Request, next: Next) -> Response {
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(ToString::to_string));
    let Some(authority) = authority else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "the request has no Host",
            "send a Host header (every HTTP/1.1 client does)",
        );
    };
    if !edge.host_allowed(&authority) {
        return refusal(
            StatusCode::FORBIDDEN,
            "this Host is not served here",
            "reach the server by a loopback name, or have the operator add the name with --allowed-host or --public-url",
        );
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| edge.origin_allowed(origin, &authority));
        if !allowed {
            return refusal(
                StatusCode::FORBIDDEN,
                "this Origin may not call the server",
                "browser pages may call only from the server's own origin or one the operator allows with --allowed-origin",
            );
        }
    }
    // The web UI authenticates by its own cookie and posts URL-encoded forms, each checked
    // for its CSRF token and Origin (`ui/auth.rs`); Host, Origin and the body limit apply.
    let ui = crate::ui::is_ui_path(request.uri().path());
    if request.method() == Method::POST {
        if !ui && !is_json(request.headers()) {
            return refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "POST bodies must be JSON",
                "send `Content-Type: application/json`",
            );
        }
        let length = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if length.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
                "send at most 64 MiB; put large inputs in files the script downloads",
            );
        }
    }
    // A legacy SSE post may come without a key: its session id (128 random bits, handed out
    // on an authenticated `GET /sse` and bound to that tenant) is its credential. With a key,
    // the key must be valid and the session its tenant's (checked by the handler).
    let session_post = request.uri().path() == "/messages" && bearer(request.headers()).is_none();
    let download = matches!(*request.method(), Method::GET | Method::HEAD)
        && request.uri().path().starts_with(crate::links::ROUTE_PREFIX);
    if !OPEN_ROUTES.contains(&request.uri().path()) && !session_post && !download && !ui {
        match edge.authenticate(&request) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(refused) => return *refused,
        }
    }
    // Calls of this request stop when it goes away: the guard travels with the response
    // body, which is dropped once sent or when the client disconnects.
    let gone = tokio_util::sync::CancellationToken::new();
    request
        .extensions_mut()
        .insert(snakebox_server::RequestGone(gone.clone()));
    let response = next.run(request).await;
    let guard = gone.drop_guard();
    response.map(|body| {
        let stream = futures_util::stream::unfold(
            (body.into_data_stream(), guard),
            |(mut data, guard)| async move {
                let chunk = futures_util::StreamExt::next(&mut data).await?;
                Some((chunk, (data, guard)))
            },
        );
        axum::body::Body::from_stream(stream)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port_and_keep_ipv6_brackets() {
        assert_eq!(bare_host("LocalHost:8000"), "localhost");
        assert_eq!(bare_host("[::1]:8000"), "[::1]");
        assert_eq!(bare_host("[::1]"), "[::1]");
        assert_eq!(bare_host("example.com"), "example.com");
    }

    #[test]
    fn origins_are_scheme_and_authority() {
        assert_eq!(
            origin_of("https://Snakebox.example.com/base?x").as_deref(),
            Some("https://snakebox.example.com")
        );
        assert_eq!(origin_of("ftp://x"), None);
        assert_eq!(origin_of("no-scheme"), None);
    }

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  sbx_1"),
        );
        assert_eq!(bearer(&headers).as_deref(), Some("sbx_1"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic x"));
        assert_eq!(bearer(&headers), None);
    }
}
