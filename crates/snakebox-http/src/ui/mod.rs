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
mod format;
mod highlight;
mod pages;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use snakebox_engine::EngineApi;

use crate::authority::{Authority, BaseUrl, Origin};
use crate::live::LiveKeys;
use auth::{NoSession, Sessions, UiSession};

/// The policy of every UI response.
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// What the UI's handlers share.
pub(crate) struct Ui {
    engine: Arc<dyn EngineApi>,
    sessions: Sessions,
    /// The URL clients use, when configured (else the request's parsed `Host` is used).
    public_url: Option<BaseUrl>,
}

/// The UI's routes, to be nested at `/ui`.
pub(crate) fn router(
    engine: Arc<dyn EngineApi>,
    live: LiveKeys,
    public_url: Option<BaseUrl>,
) -> Router {
    let secure = public_url.as_ref().is_some_and(BaseUrl::is_https);
    let ui = Arc::new(Ui {
        engine,
        sessions: Sessions::new(live, secure),
        public_url,
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
        own: &Authority,
        form: &std::collections::HashMap<String, String>,
    ) -> Result<UiSession, Box<Response>> {
        let session = self.session(headers)?;
        self.check_post(
            headers,
            own,
            Some(&session),
            form.get("csrf").map(String::as_str),
        )?;
        Ok(session)
    }

    /// A POST's checks: the server's own `Origin` (the request's `Host` as the edge parsed
    /// it, `own`, or the public URL's), and the session's CSRF token in the form.
    fn check_post(
        &self,
        headers: &HeaderMap,
        own: &Authority,
        session: Option<&UiSession>,
        token: Option<&str>,
    ) -> Result<(), Box<Response>> {
        let origin = headers
            .get(header::ORIGIN)
            .and_then(|origin| origin.to_str().ok())
            .and_then(|origin| Origin::parse(origin, false).ok());
        let same_origin = origin.is_some_and(|origin| {
            origin.is_of(own)
                || self
                    .public_url
                    .as_ref()
                    .is_some_and(|url| url.origin().same(&origin))
        });
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

    /// The server's URL as clients reach it: the public URL, else `http://` and the
    /// request's `Host` as the edge parsed it (never the header's text).
    fn base_url(&self, own: &Authority) -> String {
        match &self.public_url {
            Some(url) => url.to_string(),
            None => BaseUrl::http(own.clone()).to_string(),
        }
    }
}
