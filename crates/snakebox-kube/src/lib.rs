//! The Kubernetes objects snakebox creates and reads when it runs on a cluster with
//! kubernetes-sigs/agent-sandbox (issue 35): the front's `kubernetes` directory holds each
//! session in a `SandboxClaim`, claimed from a `SandboxWarmPool` of a `SandboxTemplate` whose pod
//! runs `snakebox agent`, and calls the pod IP the claim's status reports.
//!
//! This room is the objects only, no API client: their types ([`api`], against agent-sandbox's
//! `v1beta1` API, held to its vendored CRD schemas by the tests), the names and labels derived
//! from snakebox's identifiers ([`names`]) and the objects snakebox writes ([`generate`]). The
//! directory that creates, watches and deletes them is built on top.

pub mod api;
pub mod generate;
pub mod names;

pub use api::{
    CORE_GROUP, EXTENSIONS_GROUP, Sandbox, SandboxClaim, SandboxClaimSpec, SandboxClaimStatus,
    SandboxSpec, SandboxStatus, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec, SandboxWarmPoolStatus, VERSION,
};
pub use generate::{AgentNetwork, AgentTemplate, claim_for_session, runner_claim};
pub use k8s_openapi;
pub use kube;
