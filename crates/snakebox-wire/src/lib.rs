//! The engine across a wire (issue 35): a deployment that outgrows one host runs
//! `snakebox agent`s (the engine, served over an internal HTTP API) behind stateless fronts
//! (`snakebox serve --http --agents …`); an agent acts only on requests a front signed for it.
//!
//! This room holds both ends of that wire and what they share, and nothing of the faces:
//! - [`protocol`]: the routes, bodies and frames both sides speak;
//! - [`token`]: the grant tokens: short-lived, signed with the front's Ed25519 key, checked
//!   by the agent against the public key it was given at start, so no shared secret lives in
//!   an agent's pod and a warm pod stays warm;
//! - [`agent`]: the agent's router, the engine's API behind token checks;
//! - [`remote`]: [`RemoteEngine`], the client of one agent, an `EngineApi` a face can hold;
//! - [`directory`]: which agent holds what ([`Directory`]; [`StaticDirectory`] here, the
//!   Kubernetes one in `snakebox-kube`) and [`Routed`], the
//!   `EngineApi` a front's faces hold.
//!
//! Its arrows point down only: it depends on the engine's API (`snakebox_engine::api`) and
//! never on a face; the engine knows nothing of it. The binary wires it: `snakebox agent`
//! serves [`agent::router`], `snakebox serve --agents` hands the faces a [`Routed`].

pub mod agent;
pub mod directory;
pub mod protocol;
pub mod remote;
pub mod token;

pub use directory::{
    Directory, Placement, Routed, StaticDirectory, agents_readiness, lost_session, no_session,
};
pub use remote::{RemoteEngine, RemoteError};
pub use token::{
    AUDIENCE, AgentCheck, FrontKey, Grant, MAX_LIFETIME, PRIVATE_KEY_FILE, PUBLIC_KEY_FILE,
    TokenError, write_keypair,
};
