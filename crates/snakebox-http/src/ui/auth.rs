//! Who is looking at the UI: an API key exchanged once for a session cookie.
//!
//! The cookie (`snakebox_ui`, `HttpOnly; SameSite=Strict; Path=/ui`; when the server's public
//! URL is https, `__Host-snakebox_ui` with `Secure; Path=/`, a name that a sibling subdomain or
//! a plain-http page cannot set) holds only a random 256-bit id. A request carrying the cookie
//! twice (one planted beside ours) has no session. The server keeps, in memory,
//! what the id stands for: the tenant, a CSRF token for its forms, when it expires, and the
//! [`Credential`] it was made from (the SHA-256 of the key, which the store keeps too),
//! checked against the live key store at every request, so a revoked key ends its UI
//! sessions at their next request (and their open live-output streams within a second,
//! [`crate::live`]). The raw key is never kept. A restart logs everyone out. Without any key
//! on a loopback bind (the edge's keyless local tenant), `/ui/login` makes a local session
//! without asking, and such a session ends once a key exists.
//!
//! Every state-changing request is a POST that must carry the session's CSRF token in its
//! `csrf` field and an `Origin` that is the server's own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, header};
use snakebox_engine::Caller;

use crate::keys::random_hex;
use crate::live::{Credential, LiveKeys};

/// The cookie's name over plain http.
pub(crate) const COOKIE: &str = "snakebox_ui";
/// The cookie's name over https: browsers accept it only with `Secure`, `Path=/`, no `Domain`.
const SECURE_COOKIE: &str = "__Host-snakebox_ui";
/// How long a UI session lasts after login.
const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Most UI sessions kept at once (the oldest are dropped past that).
const MAX_SESSIONS: usize = 10_000;
/// Most UI sessions of one key (or of the keyless local tenant): logging in again past that
/// ends that key's oldest session, so one key cannot push everyone else's out.
const MAX_SESSIONS_PER_LOGIN: usize = 32;

/// One logged-in browser.
#[derive(Debug, Clone)]
pub(crate) struct UiSession {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
    expires: Instant,
    /// What it was opened with: checked again at each request.
    pub(crate) via: Credential,
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
    live: LiveKeys,
    /// Whether cookies get `Secure` (the public URL is https).
    secure: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of the cookie `name` in the request's `Cookie` headers; `None` when it is missing,
/// empty, or there more than once (a cookie planted beside ours: neither is trusted).
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut values = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then(|| value.to_owned())
        });
    let value = values.next()?;
    (values.next().is_none() && !value.is_empty()).then_some(value)
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
    pub(crate) fn new(live: LiveKeys, secure: bool) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            live,
            secure,
        }
    }

    /// The live key store.
    pub(crate) fn live(&self) -> &LiveKeys {
        &self.live
    }

    /// Whether the local tenant is served without a key right now.
    pub(crate) fn keyless(&self) -> Result<bool, NoSession> {
        let local = self
            .live
            .check(Credential::Keyless)
            .map_err(|err| NoSession::Unavailable(err.hint()))?;
        Ok(local.is_some())
    }

    /// The session of the request's cookie, still valid.
    pub(crate) fn get(&self, headers: &HeaderMap) -> Result<UiSession, NoSession> {
        let id = cookie(headers, self.cookie_name()).ok_or(NoSession::LogIn)?;
        let session = lock(&self.map).get(&id).cloned().ok_or(NoSession::LogIn)?;
        let live = session.expires > Instant::now()
            && self
                .live
                .check(session.via)
                .map_err(|err| NoSession::Unavailable(err.hint()))?
                .is_some_and(|caller| caller == session.caller);
        if !live {
            lock(&self.map).remove(&id);
            return Err(NoSession::LogIn);
        }
        Ok(session)
    }

    /// A new session for the tenant of `key` (`None`: not a live key).
    pub(crate) fn log_in(&self, key: &str) -> Result<Option<(UiSession, String)>, NoSession> {
        let key = key.trim();
        if key.is_empty() {
            return Ok(None);
        }
        let found = self
            .live
            .authenticate(Some(key))
            .map_err(|err| NoSession::Unavailable(err.hint()))?;
        let Some((caller, via)) = found else {
            return Ok(None);
        };
        self.open(caller, via).map(Some)
    }

    /// A new session for the keyless local tenant.
    pub(crate) fn log_in_keyless(&self) -> Result<(UiSession, String), NoSession> {
        self.open(Caller::local(), Credential::Keyless)
    }

    fn open(&self, caller: Caller, via: Credential) -> Result<(UiSession, String), NoSession> {
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
        let mine: Vec<(&String, &UiSession)> =
            map.iter().filter(|(_, s)| s.via == session.via).collect();
        if mine.len() >= MAX_SESSIONS_PER_LOGIN
            && let Some(oldest) = mine
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| (*id).clone())
        {
            map.remove(&oldest);
        }
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
        if let Some(id) = cookie(headers, self.cookie_name()) {
            lock(&self.map).remove(&id);
        }
    }

    /// The cookie's name: `__Host-` prefixed over https.
    fn cookie_name(&self) -> &'static str {
        if self.secure { SECURE_COOKIE } else { COOKIE }
    }

    /// A `Set-Cookie` value for the cookie holding `value` for `max_age` seconds.
    fn cookie_header(&self, value: &str, max_age: u64) -> HeaderValue {
        let (name, attributes) = if self.secure {
            (SECURE_COOKIE, "Path=/; Secure")
        } else {
            (COOKIE, "Path=/ui")
        };
        HeaderValue::from_str(&format!(
            "{name}={value}; {attributes}; HttpOnly; SameSite=Strict; Max-Age={max_age}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The `Set-Cookie` value that stores `id`.
    pub(crate) fn set_cookie(&self, id: &str) -> HeaderValue {
        self.cookie_header(id, LIFETIME.as_secs())
    }

    /// The `Set-Cookie` value that removes the cookie.
    pub(crate) fn clear_cookie(&self) -> HeaderValue {
        self.cookie_header("", 0)
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
    fn a_cookie_sent_twice_is_not_trusted() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("snakebox_ui=planted; snakebox_ui=abc"),
        );
        assert_eq!(cookie(&headers, COOKIE), None);
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("snakebox_ui=abc"));
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("snakebox_ui=planted"),
        );
        assert_eq!(cookie(&headers, COOKIE), None);
    }

    fn sessions(secure: bool) -> (tempfile::TempDir, Sessions) {
        let data = tempfile::tempdir().unwrap();
        let keys = crate::keys::KeyStore::new(data.path());
        (data, Sessions::new(LiveKeys::new(keys, true), secure))
    }

    fn with_cookie(set: &HeaderValue) -> HeaderMap {
        let pair = set.to_str().unwrap().split(';').next().unwrap().to_owned();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&pair).unwrap());
        headers
    }

    #[test]
    fn over_https_the_cookie_has_a_name_only_https_can_set() {
        let (_data, https) = sessions(true);
        let (_, id) = https.log_in_keyless().unwrap();
        let set = https.set_cookie(&id);
        let text = set.to_str().unwrap();
        assert!(text.starts_with("__Host-snakebox_ui="), "{text}");
        assert!(
            text.contains("; Path=/;") && text.contains("Secure"),
            "{text}"
        );
        assert!(https.get(&with_cookie(&set)).is_ok());
        // The plain name (which a sibling subdomain or an http page can set) is not read.
        let (_data, http) = sessions(false);
        let plain = http.set_cookie(&id);
        assert!(plain.to_str().unwrap().starts_with("snakebox_ui="));
        assert!(!plain.to_str().unwrap().contains("Secure"));
        assert!(matches!(
            https.get(&with_cookie(&plain)),
            Err(NoSession::LogIn)
        ));
    }

    #[test]
    fn one_login_cannot_push_out_the_others() {
        let (_data, sessions) = sessions(false);
        let first = sessions.log_in_keyless().unwrap().1;
        let other = sessions
            .open(Caller::local(), Credential::Key([7; 32]))
            .unwrap()
            .1;
        for _ in 0..MAX_SESSIONS_PER_LOGIN {
            sessions.log_in_keyless().unwrap();
        }
        let count = |via: &Credential| {
            lock(&sessions.map)
                .values()
                .filter(|s| &s.via == via)
                .count()
        };
        assert_eq!(count(&Credential::Keyless), MAX_SESSIONS_PER_LOGIN);
        let map = lock(&sessions.map);
        assert!(
            !map.contains_key(&first),
            "the login's oldest session ended"
        );
        assert!(map.contains_key(&other), "another login's session stayed");
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
