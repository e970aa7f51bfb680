//! The edge: the checks every request passes, in this order, before any route sees it (1 to
//! 3), and the layers that decide who may call each group of routes (4 to 6).
//!
//! 1. **Host** must be one authority, parsed strictly ([`crate::authority`]: `host[:port]`
//!    and nothing else, 400 otherwise), naming a loopback host, the public URL's host or an
//!    allowed host (403): a web page that rebinds its own name to 127.0.0.1 still sends its
//!    own name. The parsed value goes into the request's extensions ([`RequestAuthority`]):
//!    every URL the server hands out is written from it (or from `--public-url`), never from
//!    the header's text.
//! 2. **Origin**, when a browser sends one, must be the server's own or an allowed origin
//!    (403): no web page may drive the tools from a user's browser.
//! 3. **Every body**, on every route and method, is at most `--max-body-bytes` (413 naming
//!    the limit and the setting): a `Content-Length` above it is refused at once, and a body
//!    without one is counted as it is read. This is the one body limit: the routes behind it
//!    (rmcp's `/mcp`, the legacy SSE posts) have none of their own below it.
//!
//! Who may call is decided by route group, each with its own layer ([`crate::router`]), not
//! by a list of exempt paths here:
//!
//! 4. **The routes that take API keys** (`/mcp`, `/sse`, `/metrics`: `require_key`): a POST
//!    body must be `application/json` (415), so a browser's "simple" cross-site form or
//!    `text/plain` POST never reaches a handler; then a live API key as
//!    `Authorization: Bearer sbx_…` (401 with `WWW-Authenticate` otherwise), read from the
//!    key store at this request ([`crate::live`]); the key's tenant goes into the request's
//!    extensions as a [`Caller`]. A server without any key serves the local tenant when it is
//!    bound to loopback (or told `--insecure-no-auth`). **While the response lasts**, its key
//!    must stay live: a request whose key is revoked before its answer is refused (401), and
//!    its response body (an event stream) ends within [`crate::live::RECHECK`] and a read of
//!    the store; the calls it carried stop.
//! 5. **A legacy SSE post** (`/messages`, `key_if_presented`): JSON, and as step 4 when it
//!    carries a key; without one it is let through to its handler, which accepts it only for
//!    an open session whose key is still live: the session id, handed out on an
//!    authenticated `GET /sse`, is its credential.
//! 6. **Download links** (`/files/…`) are authorised by their signature ([`crate::links`]);
//!    **the web UI** (`/ui/…`) by its own session cookie, checking each form's CSRF token and
//!    `Origin` itself (`ui/auth.rs`); `/healthz`, `/readyz` and unknown paths (404) by
//!    nothing.
//!
//! Refusals are JSON (`{"error": …, "hint": …}`) and say how to fix the request.

use crate::refusal::refusal;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::HttpBody as _;
use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use snakebox_engine::Caller;

use crate::authority::{Authority, AuthorityError, BaseUrl, Host, Origin};
use crate::keys::KeyStore;
use crate::live::{Credential, LiveKeys, Revoked};
use crate::{HttpConfig, HttpError};

/// The request's `Host`, parsed and allowed by the edge: what links and the UI's client
/// configurations are written from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAuthority(pub Authority);

/// The edge's settings, decided at start.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Accepted `Host` values: a pattern without a port admits any port.
    hosts: Vec<Authority>,
    /// Accepted `Origin` values besides the request's own.
    origins: Vec<Origin>,
    /// The largest request body, in bytes.
    max_body_bytes: usize,
    /// `--public-url`, parsed.
    public_url: Option<BaseUrl>,
    live: LiveKeys,
}

/// `bytes` as people read a size: `64 MiB`, `1.5 MiB`, `900 KiB`, `12 bytes`.
pub(crate) fn human_size(bytes: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let whole = bytes / unit;
            let tenths = (bytes % unit) * 10 / unit;
            return if tenths == 0 && bytes.is_multiple_of(unit) {
                format!("{whole} {name}")
            } else {
                format!("{whole}.{tenths} {name}")
            };
        }
    }
    format!("{bytes} bytes")
}

/// The 413 of a body over `limit`; the connection is closed after it (the client may still
/// be sending).
fn too_large(limit: usize) -> Response {
    let mut response = refusal(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!(
            "the request body is larger than this server's limit of {} ({limit} bytes)",
            human_size(limit)
        ),
        "send a smaller body (put large inputs in files the script downloads), or have the operator raise --max-body-bytes (`[http] max_body_bytes`)",
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

impl Edge {
    /// The edge for `config`; refuses a non-loopback bind that would serve without keys.
    ///
    /// # Errors
    /// A bad public URL, allowed host or allowed origin; no live key on a non-loopback
    /// address without `insecure_no_auth`.
    pub fn new(config: &HttpConfig, keys: KeyStore) -> Result<Edge, HttpError> {
        let loopback = config.addr.ip().is_loopback();
        let mut hosts: Vec<Authority> = [
            Host::Name("localhost".into()),
            Host::V4(Ipv4Addr::LOCALHOST),
            Host::V6(Ipv6Addr::LOCALHOST),
        ]
        .into_iter()
        .map(|host| Authority { host, port: None })
        .collect();
        let mut origins = Vec::new();
        let public = config
            .public_url
            .as_deref()
            .map(|url| {
                BaseUrl::parse(url).map_err(|source| HttpError::PublicUrl {
                    url: url.to_owned(),
                    source,
                })
            })
            .transpose()?;
        if let Some(public) = &public {
            hosts.push(Authority {
                host: public.authority.host.clone(),
                port: None,
            });
            origins.push(public.origin());
        }
        let mut allowed = Vec::new();
        for text in &config.allowed_hosts {
            let host = Authority::parse(text.trim()).map_err(|source| HttpError::AllowedHost {
                host: text.clone(),
                source,
            })?;
            allowed.push(host);
        }
        hosts.extend(allowed.iter().cloned());
        for text in &config.allowed_origins {
            let origin =
                Origin::parse(text.trim(), true).map_err(|source| HttpError::AllowedOrigin {
                    origin: text.clone(),
                    source,
                })?;
            origins.push(origin);
        }
        // A loopback bind named by a public URL or an allowed host that is not loopback is
        // reachable from elsewhere (through a reverse proxy): it needs keys like any other.
        let exposed_as = public
            .iter()
            .map(|public| &public.authority.host)
            .chain(allowed.iter().map(|allowed| &allowed.host))
            .find(|host| !host.is_loopback())
            .map(ToString::to_string);
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
            max_body_bytes: config.max_body_bytes,
            public_url: public,
            live: LiveKeys::new(keys, keyless_local),
        })
    }

    /// The live key store (the web UI and the legacy SSE posts check with it).
    pub(crate) fn live(&self) -> LiveKeys {
        self.live.clone()
    }

    /// `--public-url`, parsed: links and client configurations start with it when set.
    pub(crate) fn public_url(&self) -> Option<BaseUrl> {
        self.public_url.clone()
    }

    /// `router` behind the edge (steps 1 to 3's body limit, for every route; the routes
    /// that take keys add `require_key` or `key_if_presented` as their group's layer).
    pub fn wrap(self: &Arc<Self>, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            Arc::clone(self),
            check,
        ))
    }

    fn host_allowed(&self, authority: &Authority) -> bool {
        self.hosts.iter().any(|pattern| pattern.admits(authority))
    }

    fn origin_allowed(&self, origin: &str, authority: &Authority) -> bool {
        let Ok(origin) = Origin::parse(origin, false) else {
            return false;
        };
        // The server's own pages (same origin), whatever scheme a proxy in front speaks.
        origin.is_of(authority) || self.origins.iter().any(|allowed| allowed.same(&origin))
    }

    /// Who the request is for and what authorised it, or the refusal. The key store is read
    /// off the runtime's threads (it may be a database across the network, `--database`).
    async fn authenticate(
        &self,
        presented: Option<String>,
    ) -> Result<(Caller, Credential), Box<Response>> {
        let (live, asked) = (self.live.clone(), presented.clone());
        let checked = tokio::task::spawn_blocking(move || live.authenticate(asked.as_deref()))
            .await
            .unwrap_or_else(|_| Err(crate::keys::KeyError::Interrupted));
        match checked {
            Ok(Some(found)) => Ok(found),
            Ok(None) if presented.is_none() => Err(unauthorized("this server requires an API key")),
            Ok(None) => Err(unauthorized("the API key is not valid (wrong or revoked)")),
            Err(err) => {
                tracing::error!(error = %err.describe(), "the API key store cannot be read");
                Err(Box::new(refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server cannot check API keys right now",
                    &err.hint(),
                )))
            }
        }
    }
}

/// A 401 with the Bearer challenge.
pub(crate) fn unauthorized(error: &str) -> Box<Response> {
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

/// Why the request's authority cannot be read.
enum NoAuthority {
    Missing,
    Twice,
    Conflict,
    Invalid(AuthorityError),
}

/// The request's authority: its one `Host` header, or the target's authority (HTTP/2, an
/// absolute-form target), which must agree when both are there.
fn request_authority(request: &Request) -> Result<Authority, NoAuthority> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(NoAuthority::Twice);
    }
    let header = header
        .map(|value| {
            value
                .to_str()
                .map_err(|_| NoAuthority::Invalid(AuthorityError::Character))
                .and_then(|text| Authority::parse(text).map_err(NoAuthority::Invalid))
        })
        .transpose()?;
    let target = request
        .uri()
        .authority()
        .map(|authority| Authority::parse(authority.as_str()).map_err(NoAuthority::Invalid))
        .transpose()?;
    match (header, target) {
        (Some(header), Some(target)) if header != target => Err(NoAuthority::Conflict),
        (Some(authority), _) | (None, Some(authority)) => Ok(authority),
        (None, None) => Err(NoAuthority::Missing),
    }
}

const HOST_HINT: &str = "send `Host: name[:port]` (a DNS name, an IPv4 address or an IPv6 address in brackets, and optionally a port from 1 to 65535) and nothing else: no user part, path, spaces or second colon";

/// Steps 1 and 2: the parsed, allowed `Host`, and an allowed `Origin`.
fn check_host_and_origin(edge: &Edge, request: &Request) -> Result<Authority, Box<Response>> {
    let authority = match request_authority(request) {
        Ok(authority) => authority,
        Err(why) => {
            let error = match why {
                NoAuthority::Missing => "the request has no Host".to_owned(),
                NoAuthority::Twice => "the request has more than one Host header".to_owned(),
                NoAuthority::Conflict => {
                    "the Host header and the request target name different hosts".to_owned()
                }
                NoAuthority::Invalid(err) => format!("the Host is not a valid authority: {err}"),
            };
            return Err(Box::new(refusal(
                StatusCode::BAD_REQUEST,
                &error,
                HOST_HINT,
            )));
        }
    };
    if !edge.host_allowed(&authority) {
        return Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            "this Host is not served here",
            "reach the server by a loopback name, or have the operator add the name with --allowed-host or --public-url",
        )));
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| edge.origin_allowed(origin, &authority));
        if !allowed {
            return Err(Box::new(refusal(
                StatusCode::FORBIDDEN,
                "this Origin may not call the server",
                "browser pages may call only from the server's own origin or one the operator allows with --allowed-origin",
            )));
        }
    }
    Ok(authority)
}

/// How long a refused body is read (and dropped) before the 413 goes out: a client that
/// writes its whole body before it reads the answer (most do) then reads the 413 instead of
/// a reset connection.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// What a body over the limit left: whether it went over, and the rest of it, to drain.
#[derive(Default)]
struct Overflow {
    exceeded: AtomicBool,
    rest: std::sync::Mutex<Option<BodyDataStream>>,
}

impl Overflow {
    fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Acquire)
    }

    fn take_rest(&self) -> Option<BodyDataStream> {
        self.rest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Read and drop at most `budget` more bytes of a refused body, for at most [`DRAIN_TIME`]:
/// past that the connection is closed with the client still sending (it may see a reset).
async fn drain(mut data: BodyDataStream, budget: usize) {
    let mut left = budget;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(chunk)) = data.next().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
    })
    .await;
}

/// Step 3's limit on a body whose length is not known to be within it: counted as it is
/// read; past the limit the body fails, and the rest is kept in `overflow` (the edge then
/// drains it and answers 413).
fn limit_body(body: Body, limit: usize, overflow: Arc<Overflow>) -> Body {
    if body
        .size_hint()
        .upper()
        .is_some_and(|upper| upper <= limit as u64)
    {
        return body;
    }
    let counted = futures_util::stream::unfold(
        (Some(body.into_data_stream()), 0usize, overflow),
        move |(data, seen, overflow)| async move {
            let mut data = data?;
            let chunk = match data.next().await? {
                Ok(chunk) => chunk,
                Err(err) => return Some((Err(err), (Some(data), seen, overflow))),
            };
            let seen = seen.saturating_add(chunk.len());
            if seen > limit {
                *overflow
                    .rest
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(data);
                overflow.exceeded.store(true, Ordering::Release);
                let err = std::io::Error::other(format!("the body is larger than {limit} bytes"));
                return Some((Err(axum::Error::new(err)), (None, seen, overflow)));
            }
            Some((Ok(chunk), (Some(data), seen, overflow)))
        },
    );
    Body::from_stream(counted)
}

/// What ends a response body early: its key's revocation.
enum BodyEnd {
    Chunk(Option<Result<Bytes, axum::Error>>),
    Revoked,
}

/// The response body, holding `guard` (the request's calls stop when it is dropped; the
/// edge's), or, for an authenticated request (the key layer's), ending once its key is revoked: an event stream with a last
/// comment saying why, any other body with an error (the connection is cut, so a client
/// never takes a shortened body for a whole one).
fn watch_body(
    response: Response,
    guard: Option<tokio_util::sync::DropGuard>,
    revoked: Option<Revoked>,
) -> Response {
    let event_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"));
    response.map(|body| {
        let state = (body.into_data_stream(), guard, revoked, false);
        let stream = futures_util::stream::unfold(
            state,
            move |(mut data, guard, mut revoked, ended)| async move {
                if ended {
                    return None;
                }
                let next = match revoked.as_mut() {
                    Some(revoked) => tokio::select! {
                        chunk = data.next() => BodyEnd::Chunk(chunk),
                        () = revoked => BodyEnd::Revoked,
                    },
                    None => BodyEnd::Chunk(data.next().await),
                };
                match next {
                    BodyEnd::Chunk(chunk) => Some((chunk?, (data, guard, revoked, false))),
                    BodyEnd::Revoked if event_stream => Some((
                        Ok(Bytes::from_static(
                            b": the API key of this stream was revoked; it ends here\n\n",
                        )),
                        (data, guard, None, true),
                    )),
                    BodyEnd::Revoked => Some((
                        Err(axum::Error::new(std::io::Error::other(
                            "the API key of this response was revoked",
                        ))),
                        (data, guard, None, true),
                    )),
                }
            },
        );
        Body::from_stream(stream)
    })
}

async fn check(State(edge): State<Arc<Edge>>, mut request: Request, next: Next) -> Response {
    let authority = match check_host_and_origin(&edge, &request) {
        Ok(authority) => authority,
        Err(refused) => return *refused,
    };
    request.extensions_mut().insert(RequestAuthority(authority));
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let limit = edge.max_body_bytes;
    let (parts, body) = request.into_parts();
    if let Some(length) = length.filter(|length| *length > limit as u64) {
        // Up to twice the limit, the body is read first so that the client reads the 413.
        if length <= (limit as u64).saturating_mul(2) {
            drain(
                body.into_data_stream(),
                usize::try_from(length).unwrap_or(usize::MAX),
            )
            .await;
        }
        return too_large(limit);
    }
    let overflow = Arc::new(Overflow::default());
    let body = limit_body(body, limit, Arc::clone(&overflow));
    let mut request = Request::from_parts(parts, body);
    // Calls of this request stop when it goes away: the guard travels with the response
    // body, which is dropped once sent or when the client disconnects.
    let gone = tokio_util::sync::CancellationToken::new();
    request
        .extensions_mut()
        .insert(snakebox_server::RequestGone(gone.clone()));
    let guard = gone.drop_guard();
    let response = next.run(request).await;
    if overflow.exceeded() {
        if let Some(rest) = overflow.take_rest() {
            drain(rest, limit).await;
        }
        return too_large(limit);
    }
    watch_body(response, Some(guard), None)
}

/// Step 3 (JSON) and 4 (the key) for the routes that take API keys, as a route layer on
/// their group ([`crate::router`]): a POST body must be JSON; the key must be live; its
/// tenant goes into the request as a [`Caller`]; and step 5, while the response lasts.
pub(crate) async fn require_key(
    State(edge): State<Arc<Edge>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refused) = json_only(&request) {
        return *refused;
    }
    keyed(&edge, request, next).await
}

/// Steps 3 to 5 for the legacy SSE posts (`/messages`): as [`require_key`] when a key is
/// presented; without one the session id (128 random bits, handed out on an authenticated
/// `GET /sse` and bound to that key) is the credential, which the handler checks against
/// the live keys.
pub(crate) async fn key_if_presented(
    State(edge): State<Arc<Edge>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refused) = json_only(&request) {
        return *refused;
    }
    if bearer(request.headers()).is_none() {
        return next.run(request).await;
    }
    keyed(&edge, request, next).await
}

/// Step 3: a POST body must be JSON (a browser's "simple" cross-site form or `text/plain`
/// POST never reaches a handler).
fn json_only(request: &Request) -> Result<(), Box<Response>> {
    if request.method() == Method::POST && !is_json(request.headers()) {
        return Err(Box::new(refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST bodies must be JSON",
            "send `Content-Type: application/json`",
        )));
    }
    Ok(())
}

/// Steps 4 and 5: authenticate, then serve while the key stays live.
async fn keyed(edge: &Edge, mut request: Request, next: Next) -> Response {
    let presented = bearer(request.headers()).or_else(|| legacy_query_key(&request));
    let (caller, credential) = match edge.authenticate(presented).await {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(credential);
    let mut revoked = edge.live.revoked(credential);
    let response = tokio::select! {
        response = next.run(request) => response,
        () = &mut revoked => {
            return *unauthorized("the API key was revoked while the request was served");
        }
    };
    watch_body(response, None, Some(revoked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_written_for_people() {
        assert_eq!(human_size(64 << 20), "64 MiB");
        assert_eq!(human_size((3 << 20) / 2), "1.5 MiB");
        assert_eq!(human_size(900 << 10), "900 KiB");
        assert_eq!(human_size(12), "12 bytes");
        assert_eq!(human_size((64 << 20) + 1), "64.0 MiB");
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
