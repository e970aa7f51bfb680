//! The engine across a wire (issue 35): what a front and the engine agents it calls need to
//! trust each other. A deployment that outgrows one host runs `snakebox agent`s (the engine,
//! served over an internal HTTP API) behind stateless fronts (`snakebox serve --http`); an
//! agent acts only on requests a front signed for it.
//!
//! This room holds what both sides share and nothing of either: today the grant tokens
//! ([`token`]): short-lived, signed with the front's Ed25519 key, checked by the agent against
//! the public key it was given at start, so no shared secret lives in an agent's pod and a warm
//! pod stays warm.

pub mod token;

pub use token::{
    AUDIENCE, AgentCheck, FrontKey, Grant, MAX_LIFETIME, PRIVATE_KEY_FILE, PUBLIC_KEY_FILE,
    TokenError, write_keypair,
};
