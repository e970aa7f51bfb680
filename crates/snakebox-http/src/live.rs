//! Live credentials: every request is authorised by a key that is live when it arrives, and
//! every response that lasts is ended once its key no longer is.
//!
//! A request's `Credential` (the SHA-256 of its API key, or the keyless local tenant) is
//! checked against the key store as it is at that moment, one read per request: by the edge
//! for every authenticated route, by the legacy SSE transport for each `POST /messages` (the
//! credential of the `GET /sse` that opened the session), by the web UI for each request of
//! a cookie session. The store is a file other processes write (`snakebox keys revoke`), so
//! nothing tells the server of a revocation: a response that outlives its check (the `GET
//! /sse` stream, a long `POST /mcp` streaming progress, the UI's live output) is watched
//! instead. While any response is watched, one task per server reads the set of live keys
//! every [`RECHECK`]; a response whose credential has left that set (confirmed by a fresh read
//! of the store: the set may predate a key made since) ends, and with it the calls it carried.
//! So a revoked key's open streams end within [`RECHECK`] and one read of the store: under a
//! second. A store that cannot be read ends them too (fail closed).
//!
//! The keyless local tenant (a loopback server with no key at all) is live while no key
//! exists: its streams end once a key is made, as its requests are then refused.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use snakebox_engine::Caller;
use tokio::sync::watch;

use crate::keys::{KeyError, KeyStore};

/// How often the live keys are read while a response is watched: the bound, with one read of
/// the store, on how long a revoked key's open streams go on.
pub const RECHECK: Duration = Duration::from_millis(500);

/// Run a read of the key store (a file, or a database across the network with `--database`)
/// where it may block: on a worker of a multi-threaded runtime (the web UI's handlers check
/// their session's key inline), the runtime is told first and moves its other tasks to other
/// workers (`block_in_place`); elsewhere (a blocking thread, a test's single-threaded
/// runtime, no runtime) it runs as is.
fn blocking<T>(read: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(read)
        }
        _ => read(),
    }
}

/// What authorised a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Credential {
    /// An API key, by its SHA-256 (what the store keeps).
    Key([u8; 32]),
    /// No key: the keyless local tenant, while no key exists.
    Keyless,
}

/// The last read of the live keys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    /// Not read yet: every credential checked by its request stands.
    Unread,
    /// The hashes of the live keys.
    Live(Arc<BTreeSet<[u8; 32]>>),
    /// The store could not be read.
    Unreadable,
}

/// The key store, as requests and watched responses see it.
#[derive(Debug, Clone)]
pub(crate) struct LiveKeys(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    keys: KeyStore,
    /// Whether the local tenant is served without a key while none exists.
    keyless_local: bool,
    view: watch::Sender<View>,
    /// Whether the task that reads the live keys was started.
    watching: AtomicBool,
}

/// A future that resolves when a credential is no longer live.
pub(crate) type Revoked = Pin<Box<dyn Future<Output = ()> + Send>>;

impl LiveKeys {
    pub(crate) fn new(keys: KeyStore, keyless_local: bool) -> LiveKeys {
        LiveKeys(Arc::new(Inner {
            keys,
            keyless_local,
            view: watch::Sender::new(View::Unread),
            watching: AtomicBool::new(false),
        }))
    }

    /// Who a presented key (or none) stands for right now, and the credential to check
    /// again later; `None`: not a live key, or no key where one is needed.
    ///
    /// # Errors
    /// A store that cannot be read (the request is refused, never let through).
    pub(crate) fn authenticate(
        &self,
        presented: Option<&str>,
    ) -> Result<Option<(Caller, Credential)>, KeyError> {
        let credential = match presented {
            Some(key) if key.starts_with(crate::keys::KEY_PREFIX) => {
                Credential::Key(KeyStore::hash_of(key))
            }
            Some(_) => return Ok(None),
            None => Credential::Keyless,
        };
        Ok(self.check(credential)?.map(|caller| (caller, credential)))
    }

    /// The tenant of `credential` if it is live now (one read of the store).
    ///
    /// # Errors
    /// A store that cannot be read.
    pub(crate) fn check(&self, credential: Credential) -> Result<Option<Caller>, KeyError> {
        blocking(|| match credential {
            Credential::Key(hash) => self.0.keys.authenticate_hash(&hash),
            Credential::Keyless => {
                let live = self.0.keyless_local && !self.0.keys.any_live()?;
                Ok(live.then(Caller::local))
            }
        })
    }

    /// Whether the last read of the live keys admits `credential`.
    fn admits(&self, view: &View, credential: Credential) -> bool {
        match (view, credential) {
            (View::Unread, _) => true,
            (View::Unreadable, _) => false,
            (View::Live(live), Credential::Key(hash)) => live.contains(&hash),
            (View::Live(live), Credential::Keyless) => self.0.keyless_local && live.is_empty(),
        }
    }

    /// Resolves once `credential` is no longer live (or the store cannot be read): what a
    /// lasting response races against.
    pub(crate) fn revoked(&self, credential: Credential) -> Revoked {
        self.watch();
        let mut view = self.0.view.subscribe();
        let this = self.clone();
        Box::pin(async move {
            loop {
                let admitted = this.admits(&view.borrow_and_update(), credential);
                if !admitted {
                    // Confirmed by a fresh read: the view may have been read before the key
                    // was made.
                    let again = this.clone();
                    let live = tokio::task::spawn_blocking(move || again.check(credential)).await;
                    match live {
                        Ok(Ok(Some(_))) => {}
                        Ok(Ok(None)) => return,
                        Ok(Err(err)) => {
                            tracing::error!(error = %err.describe(), "the API key store cannot be read: ending a response it authorised");
                            return;
                        }
                        Err(_) => return,
                    }
                }
                if view.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// Start the task that reads the live keys every [`RECHECK`] while a response is
    /// watched (once per server; it ends with the server).
    fn watch(&self) {
        if self.0.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.watching.store(false, Ordering::Release);
            return;
        };
        let inner: Weak<Inner> = Arc::downgrade(&self.0);
        runtime.spawn(async move {
            loop {
                let Some(strong) = inner.upgrade() else {
                    return;
                };
                if strong.view.receiver_count() > 0 {
                    let keys = strong.keys.clone();
                    let read = tokio::task::spawn_blocking(move || keys.live_hashes()).await;
                    let view = match read {
                        Ok(Ok(live)) => View::Live(Arc::new(live)),
                        Ok(Err(err)) => {
                            tracing::error!(error = %err.describe(), "the API key store cannot be read");
                            View::Unreadable
                        }
                        Err(_) => View::Unreadable,
                    };
                    strong.view.send_if_modified(|current| {
                        let changed = *current != view;
                        *current = view;
                        changed
                    });
                }
                drop(strong);
                tokio::time::sleep(RECHECK).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_revoked_keys_watch_ends_within_the_recheck_and_others_do_not() {
        let data = tempfile::tempdir().unwrap();
        let store = KeyStore::new(data.path());
        let a = store.add("team-a").unwrap();
        let b = store.add("team-b").unwrap();
        let live = LiveKeys::new(store.clone(), true);
        let (_, credential_a) = live.authenticate(Some(&a.key)).unwrap().unwrap();
        let (caller_b, credential_b) = live.authenticate(Some(&b.key)).unwrap().unwrap();
        assert_eq!(caller_b.id(), "team-b");
        assert!(live.authenticate(Some("sbx_0")).unwrap().is_none());
        // Keys exist: no keyless tenant.
        assert!(live.authenticate(None).unwrap().is_none());
        let mut watch_a = live.revoked(credential_a);
        let mut watch_b = live.revoked(credential_b);
        // Nothing ends while both keys are live.
        tokio::select! {
            () = &mut watch_a => panic!("a live key's watch ended"),
            () = &mut watch_b => panic!("a live key's watch ended"),
            () = tokio::time::sleep(RECHECK * 3) => {}
        }
        // A key made after the watch started is not taken for revoked.
        let c = store.add("team-c").unwrap();
        let (_, credential_c) = live.authenticate(Some(&c.key)).unwrap().unwrap();
        let mut watch_c = live.revoked(credential_c);
        store.revoke(&a.info.id).unwrap();
        let revoked_at = std::time::Instant::now();
        tokio::time::timeout(RECHECK * 2 + Duration::from_millis(500), &mut watch_a)
            .await
            .unwrap();
        assert!(revoked_at.elapsed() < RECHECK * 2 + Duration::from_millis(500));
        tokio::select! {
            () = &mut watch_b => panic!("another key's watch ended"),
            () = &mut watch_c => panic!("a new key's watch ended"),
            () = tokio::time::sleep(RECHECK * 3) => {}
        }
        assert!(live.check(credential_a).unwrap().is_none());
    }

    #[tokio::test]
    async fn the_keyless_tenant_ends_once_a_key_exists() {
        let data = tempfile::tempdir().unwrap();
        let store = KeyStore::new(data.path());
        let live = LiveKeys::new(store.clone(), true);
        let (caller, credential) = live.authenticate(None).unwrap().unwrap();
        assert_eq!(caller, Caller::local());
        let mut watch = live.revoked(credential);
        tokio::select! {
            () = &mut watch => panic!("ended while no key exists"),
            () = tokio::time::sleep(RECHECK * 2) => {}
        }
        store.add("team-a").unwrap();
        tokio::time::timeout(RECHECK * 3, watch).await.unwrap();
        // Not keyless-local (a public bind): never.
        let empty = tempfile::tempdir().unwrap();
        let public = LiveKeys::new(KeyStore::new(empty.path()), false);
        assert!(public.authenticate(None).unwrap().is_none());
    }
}
