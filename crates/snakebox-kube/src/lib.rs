//! The Kubernetes objects snakebox creates and reads when it runs on a cluster with
//! kubernetes-sigs/agent-sandbox (issue 35): the front's `kubernetes` directory holds each
//! session in a `SandboxClaim`, claimed from a `SandboxWarmPool` of a `SandboxTemplate` whose pod
//! runs `snakebox agent`, and calls the pod IP the claim's status reports.
//!
//! This room holds the objects: their types ([`api`], against agent-sandbox's `v1beta1` API,
//! held to its vendored CRD schemas by the tests), the names and labels derived from
//! snakebox's identifiers ([`names`]) and the objects snakebox writes ([`generate`]); and the
//! front's [`directory`] that creates, watches and deletes claims through the Kubernetes API
//! (kube's client, rustls; a `snakebox_wire::Directory`). It sits above `snakebox-wire` and
//! knows nothing of the faces.

pub mod api;
pub mod directory;
pub mod generate;
pub mod names;

pub use api::{
    CORE_GROUP, EXTENSIONS_GROUP, Sandbox, SandboxClaim, SandboxClaimSpec, SandboxClaimStatus,
    SandboxSpec, SandboxStatus, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec, SandboxWarmPoolStatus, VERSION,
};
pub use directory::{KubernetesDirectory, KubernetesSettings};
pub use generate::{
    AgentNetwork, AgentTemplate, claim_for_session, runner_claim, session_binding, session_claim,
};
pub use k8s_openapi;
pub use kube;
