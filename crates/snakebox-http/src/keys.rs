//! API keys, as the edge uses them: `Authorization: Bearer sbx_…` → the tenant the key was
//! made for. The keys are kept in the data directory's one store, by the engine
//! ([`snakebox_engine::keys`]); this face checks presented keys against it on every request
//! ([`crate::live`]), so a revocation holds from the next request on.

pub use snakebox_engine::keys::{KEY_PREFIX, KeyError, KeyInfo, KeyStore, NewKey, random_hex};
