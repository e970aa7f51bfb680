//! Who is looking at the UI: an API key exchanged once for a session cookie.
//!
//! The cookie (`snakebox_ui`, `HttpOnly; SameSite=Strict; Path=/ui`, plus `Secure` when the
//! server's public URL is https) holds only a random 256-bit id. The server keeps, in memory,
//! what the id stands for: the tenant, a CSRF token for its forms, when it expires, and the
//! SHA-256 of the key it was made from (the store keeps the same hash), so a revoked key ends
//! its UI sessions at their next request. The raw key is never kept. A restart logs everyone
//! out. Without any key on a loopback bind (the edge's keyless local tenant), `/ui/login`
//! makes a local session without asking, and such a session ends once a key exists.
//!
//! Every state-changing request is a POST that must carry the session's CSRF token in its
//! `csrf` field and an `Origin` that is the server's own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, header};
use snakebox_engine::Caller;

use crate::keys::{KeyStore, random_hex};

/// The cookie's name.
pub(crate) const COOKIE: &str = "snakebox_ui";
/// How long a UI session lasts after login.
const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Most UI sessions kept at once (the oldest are dropped past that).
const MAX_SESSIONS: usize = 10_000;

/// How a UI session was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Via {
    /// An API key, by its SHA-256.
    Key([u8; 32]),
    /// The keyless local tenant.
    Keyless,
}

/// One logged-in browser.
#[derive(Debug, Clone)]
pub(crate) struct UiSession {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
    expires: Instant,
    via: Via,
}

/// Why a request has no session.
#[derive(Debug)]
pub(crate) enum NoSession {
    /// No cookie, an unknown or expired one, or its key was revoked: log in.
    LogIn,
    /// The key store cannot be read.
    Unavailable(String),
}

/// The server-side map of UI sessions.
#[derive(Debug)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, UiSession>>,
    keys: KeyStore,
    /// Whether the edge serves the local tenant when no key exists.
    keyless_local: bool,
    /// Whether cookies get `Secure` (the public URL is https).
    secure: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of the cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name && !value.is_empty()).then(|| value.to_owned())
        })
}

/// Equal strings, compared in time that does not depend on where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

impl Sessions {
    pub(crate) fn new(keys: KeyStore, keyless_local: bool, secure: bool) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            keys,
            keyless_local,
            secure,
        }
    }

    /// Whether the local tenant is served without a key right now.
    pub(crate) fn keyless(&self) -> Result<bool, NoSession> {
        if !self.keyless_local {
            return Ok(false);
        }
        let any = self
            .keys
            .any_live()
            .map_err(|err| NoSession::Unavailable(err.hint()))?;
        Ok(!any)
    }

    /// The session of the request's cookie, still valid.
    pub(crate) fn get(&self, headers: &HeaderMap) -> Result<UiSession, NoSession> {
        let id = cookie(headers, COOKIE).ok_or(NoSession::LogIn)?;
        let session = lock(&self.map).get(&id).cloned().ok_or(NoSession::LogIn)?;
        let live = session.expires > Instant::now()
            && match &session.via {
                Via::Key(hash) => self
                    .keys
                    .authenticate_hash(hash)
                    .map_err(|err| NoSession::Unavailable(err.hint()))?
                    .is_some_and(|caller| caller == session.caller),
                Via::Keyless => self.keyless()?,
            };
        if !live {
            lock(&self.map).remove(&id);
            return Err(NoSession::LogIn);
        }
        Ok(session)
    }

    /// A new session for the tenant of `key` (`None`: not a live key).
    pub(crate) fn log_in(&self, key: &str) -> Result<Option<(UiSession, String)>, NoSession> {
        let caller = self
            .keys
            .authenticate(key.trim())
            .map_err(|err| NoSession::Unavailable(err.hint()))?;
        let Some(caller) = caller else {
            return Ok(None);
        };
        self.open(caller, Via::Key(KeyStore::hash_of(key.trim())))
            .map(Some)
    }

    /// A new session for the keyless local tenant.
    pub(crate) fn log_in_keyless(&self) -> Result<(UiSession, String), NoSession> {
        self.open(Caller::local(), Via::Keyless)
    }

    fn open(&self, caller: Caller, via: Via) -> Result<(UiSession, String), NoSession> {
        let random = |bytes| {
            random_hex(bytes).map_err(|err| {
                NoSession::Unavailable(format!("the system's random source failed: {err}"))
            })
        };
        let id = random(32)?;
        let session = UiSession {
            caller,
            csrf: random(32)?,
            expires: Instant::now() + LIFETIME,
            via,
        };
        let mut map = lock(&self.map);
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
        {
            map.remove(&oldest);
        }
        map.insert(id.clone(), session.clone());
        Ok((session, id))
    }

    /// End the session of the request's cookie.
    pub(crate) fn log_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            lock(&self.map).remove(&id);
        }
    }

    /// The `Set-Cookie` value that stores `id`.
    pub(crate) fn set_cookie(&self, id: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let value = format!(
            "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            LIFETIME.as_secs()
        );
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The `Set-Cookie` value that removes the cookie.
    pub(crate) fn clear_cookie(&self) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{secure}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; snakebox_ui=abc ; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
