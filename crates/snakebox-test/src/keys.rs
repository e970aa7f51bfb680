//! The one place this crate touches the API key store, so that a change of its home or its
//! calls is one edit here.

use std::path::Path;

use snakebox_http::KeyStore;

/// The key store of the data directory `data`.
pub(crate) fn store(data: &Path) -> KeyStore {
    KeyStore::new(data)
}

/// A new key of `tenant` in `data`'s key store: the key itself (what a client presents).
pub(crate) fn add(data: &Path, tenant: &str) -> String {
    store(data)
        .add(tenant)
        .unwrap_or_else(|err| panic!("a key for {tenant}: {err}"))
        .key
}
