//! The web UI under `/ui/`: a tenant's runs, sessions and artifacts, the server's environment
//! and ready-to-copy client configurations, in a browser.
//!
//! Server-rendered: askama templates (`templates/ui/`, compiled into the binary, every value
//! escaped) and one small CSS and one small JS file (`static/`, also compiled in); nothing is
//! fetched from elsewhere. The edge's Host and Origin checks apply to `/ui/` as to every route;
//! its API-key check and JSON-only POSTs do not: the UI logs in with a key once and then
//! authenticates by cookie ([`auth`]), and its forms are URL-encoded, each POST carrying the
//! session's CSRF token and the server's own `Origin`.
//!
//! Every page carries a strict Content-Security-Policy (no inline script or style, nothing
//! from another origin, no framing). What runs produced is never rendered in the UI's origin:
//! downloads are `Content-Disposition: attachment` with `nosniff` and `CSP: sandbox`, and only
//! PNG, JPEG and GIF images (checked by their first bytes) are shown inline.

mod auth;
mod clients;
mod format;
mod highlight;
mod pages;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use snakebox_engine::Engine;

use crate::keys::KeyStore;
use auth::{NoSession, Sessions, UiSession};

/// The policy of every UI response.
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// Whether `path` is the UI's: the edge leaves its authentication and forms to it.
pub(crate) fn is_ui_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// What the UI's handlers share.
pub(crate) struct Ui {
    engine: Arc<Engine>,
    sessions: Sessions,
    /// The URL clients use, when configured (else the request's `Host` is used).
    public_url: Option<String>,
}

/// The UI's routes, to be nested at `/ui`.
pub(crate) fn router(
    engine: Arc<Engine>,
    keys: KeyStore,
    keyless_local: bool,
    public_url: Option<String>,
) -> Router {
    let secure = public_url
        .as_deref()
        .is_some_and(|url| url.starts_with("https://"));
    let ui = Arc::new(Ui {
        engine,
        sessions: Sessions::new(keys, keyless_local, secure),
        public_url: public_url.map(|url| url.trim_end_matches('/').to_owned()),
    });
    pages::routes()
        .with_state(ui)
        .layer(axum::middleware::from_fn(protect))
}

/// `/ui/` (the nested router serves `/ui` itself): to the runs.
pub(crate) fn slash() -> axum::routing::MethodRouter {
    axum::routing::get(|| async { Redirect::to("/ui/runs") })
        .layer(axum::middleware::from_fn(protect))
}

/// Headers on every UI response: the policy, no framing, no sniffing, no caching, no
/// referrer to other origins (URLs hold run and session ids; `no-referrer` would make the
/// browser send `Origin: null` on the UI's own forms).
async fn protect(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    // Downloads set their own, stricter CSP (`sandbox`) and referrer policy (`no-referrer`).
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(CSP));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(header::REFERRER_POLICY)
        .or_insert(HeaderValue::from_static("same-origin"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

impl Ui {
    /// The request's session, or where to go instead (the login page; an error page when
    /// the key store cannot be read).
    fn session(&self, headers: &HeaderMap) -> Result<UiSession, Box<Response>> {
        self.sessions.get(headers).map_err(|why| {
            Box::new(match why {
                NoSession::LogIn => Redirect::to("/ui/login").into_response(),
                NoSession::Unavailable(hint) => pages::unavailable(&hint),
            })
        })
    }

    /// The session of a state-changing form: logged in, from the server's own `Origin`, with
    /// the session's CSRF token in its `csrf` field.
    fn session_for_form(
        &self,
        headers: &HeaderMap,
        form: &std::collections::HashMap<String, String>,
    ) -> Result<UiSession, Box<Response>> {
        let session = self.session(headers)?;
        self.check_post(
            headers,
            Some(&session),
            form.get("csrf").map(String::as_str),
        )?;
        Ok(session)
    }

    /// A POST's checks: the server's own `Origin`, and the session's CSRF token in the form.
    fn check_post(
        &self,
        headers: &HeaderMap,
        session: Option<&UiSession>,
        token: Option<&str>,
    ) -> Result<(), Box<Response>> {
        let own = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .map(|host| host.to_ascii_lowercase());
        let origin = headers
            .get(header::ORIGIN)
            .and_then(|origin| origin.to_str().ok())
            .map(|origin| origin.trim_end_matches('/').to_ascii_lowercase());
        let same_origin = match (&own, &origin) {
            (Some(host), Some(origin)) => {
                *origin == format!("http://{host}")
                    || *origin == format!("https://{host}")
                    || self
                        .public_url
                        .as_deref()
                        .is_some_and(|url| url.eq_ignore_ascii_case(origin))
            }
            _ => false,
        };
        if !same_origin {
            return Err(Box::new(pages::error_page(
                StatusCode::FORBIDDEN,
                "This form was not sent from this server's own pages",
                "submit the form from the UI itself (the browser must send the server's own Origin)",
            )));
        }
        if let Some(session) = session
            && !token.is_some_and(|token| auth::same(token, &session.csrf))
        {
            return Err(Box::new(pages::error_page(
                StatusCode::FORBIDDEN,
                "The form's CSRF token is missing or stale",
                "reload the page and submit the form again",
            )));
        }
        Ok(())
    }

    /// The server's URL as clients reach it.
    fn base_url(&self, headers: &HeaderMap) -> String {
        if let Some(url) = &self.public_url {
            return url.clone();
        }
        let host = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("127.0.0.1:8000");
        format!("http://{host}")
    }
}
