//! agent-sandbox's four kinds as snakebox sees them, typed against the `v1beta1` API of
//! agent-sandbox v0.5.6 (commit `211b7579`, CRDs vendored in `deploy/agent-sandbox/crds/`).
//! snakebox creates `SandboxClaim`s, `SandboxTemplate`s and `SandboxWarmPool`s and reads their
//! status; it reads `Sandbox`es (the core kind) only. agent-sandbox publishes Go types, not Rust
//! ones, so these are written here, field by field from its API, and the crate's tests hold
//! them to the vendored schemas.
//!
//! Each type keeps the fields snakebox sets or reads, and every field the schema requires. A
//! field these types do not name is ignored when an object is read (a newer controller's
//! status fields parse) and so is not written back: snakebox creates and deletes these
//! objects, and must patch, never replace, one it read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the core kind, `Sandbox`.
pub const CORE_GROUP: &str = "agents.x-k8s.io";
/// The API group of claims, templates and warm pools.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The version snakebox speaks, in both groups: the storage version at v0.5.6 (`v1alpha1` is
/// served too, deprecated; there is no `v1`).
pub const VERSION: &str = "v1beta1";
/// The condition type a claim (and a Sandbox) reports readiness with.
pub const CONDITION_READY: &str = "Ready";

// ---- SandboxClaim ----------------------------------------------------------------------

/// What a claim asks for: a sandbox from a warm pool, until a time at the latest.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    shortname = "sandboxclaim",
    namespaced,
    status = "SandboxClaimStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// The warm pool to take a sandbox from (required).
    pub warm_pool_ref: WarmPoolRef,
    /// When and how the claim ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    /// Labels and annotations the controller puts on the claimed sandbox's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
}

/// `spec.warmPoolRef`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct WarmPoolRef {
    /// The `SandboxWarmPool`'s name, in the claim's namespace.
    pub name: String,
}

/// `spec.lifecycle` of a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    /// The claim's hard end: the controller tears the sandbox down then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// What happens to the claim itself at `shutdownTime` (the API's default: `Retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<ShutdownPolicy>,
    /// How long a finished claim is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// `spec.lifecycle.shutdownPolicy` of a claim.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ShutdownPolicy {
    /// Delete the claim (and so its sandbox) at `shutdownTime`.
    Delete,
    /// The same, by foreground deletion: the claim stays, being deleted, until its pod is gone.
    DeleteForeground,
    /// Keep the claim (its sandbox's resources are deleted; the claim says it expired).
    Retain,
}

/// Labels and annotations for a pod (`additionalPodMetadata`, `podTemplate.metadata`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct PodMetadata {
    /// Pod labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A claim's status, filled in by agent-sandbox's controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct SandboxClaimStatus {
    /// The `Ready` condition (forwarded from the Sandbox once one is bound) and others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The sandbox bound to the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

/// `status.sandbox` of a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct ClaimedSandbox {
    /// The bound Sandbox's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The pod's IPs (two in a dual-stack cluster), mirrored from the Sandbox; empty while
    /// there is no pod.
    #[serde(rename = "podIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
}

impl SandboxClaim {
    /// The claim's `Ready` condition, if the controller has set one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        ready(self.status.as_ref().map(|status| &status.conditions[..]))
    }

    /// Ready (`Ready` is `True`) with a pod IP to call: what the front waits for.
    pub fn is_ready(&self) -> bool {
        self.ready_condition()
            .is_some_and(|condition| condition.status == "True")
            && !self.pod_ips().is_empty()
    }

    /// The bound pod's IPs that parse as IP addresses, in the controller's order.
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        self.status
            .as_ref()
            .and_then(|status| status.sandbox.as_ref())
            .map(|sandbox| parse_ips(&sandbox.pod_ips))
            .unwrap_or_default()
    }

    /// The bound Sandbox's name.
    pub fn sandbox_name(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|status| status.sandbox.as_ref())
            .and_then(|sandbox| sandbox.name.as_deref())
    }
}

// ---- SandboxTemplate -------------------------------------------------------------------

/// A pod blueprint warm pools and claims make sandboxes from, and its network policy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    shortname = "sandboxtemplate",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// The pod (required).
    pub pod_template: PodTemplate,
    /// Whether the controller makes a headless Service per sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// The rules of the one NetworkPolicy the controller keeps for this template's sandboxes
    /// (when `networkPolicyManagement` is `Managed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<SandboxNetworkPolicy>,
    /// Whether the controller keeps that NetworkPolicy (the API's default: `Managed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<NetworkPolicyManagement>,
    /// Whether a claim may set environment variables (the API's default: `Disallowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<InjectionPolicy>,
    /// Whether a claim may add volume claim templates (the API's default: `Disallowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates_policy: Option<InjectionPolicy>,
}

/// `spec.podTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct PodTemplate {
    /// Labels and annotations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodMetadata>,
    /// The pod spec (required).
    pub spec: PodSpec,
}

/// `spec.networkPolicy`: the ingress and egress rules of a Kubernetes NetworkPolicy, without
/// its selector and policy types (the controller sets those: the template's pods, both ways,
/// default deny).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct SandboxNetworkPolicy {
    /// Traffic allowed in; none listed is none allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<NetworkPolicyIngressRule>,
    /// Traffic allowed out; none listed is none allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<NetworkPolicyEgressRule>,
}

/// `spec.networkPolicyManagement`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NetworkPolicyManagement {
    /// The controller keeps the template's NetworkPolicy (from `networkPolicy`, or its own
    /// default when that is absent).
    Managed,
    /// No NetworkPolicy from the controller: someone else's job.
    Unmanaged,
}

/// `spec.envVarsInjectionPolicy` and `spec.volumeClaimTemplatesPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum InjectionPolicy {
    /// A claim may add what the template does not define.
    Allowed,
    /// A claim may add and override.
    Overrides,
    /// A claim that tries is refused.
    Disallowed,
}

// ---- SandboxWarmPool -------------------------------------------------------------------

/// A number of sandboxes kept started from one template, for claims to take.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    shortname = "swp",
    namespaced,
    status = "SandboxWarmPoolStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// How many sandboxes to keep (the API's default: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The template (required).
    pub sandbox_template_ref: SandboxTemplateRef,
    /// How unclaimed sandboxes of an older template are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// `spec.sandboxTemplateRef`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SandboxTemplateRef {
    /// The `SandboxTemplate`'s name, in the pool's namespace.
    pub name: String,
}

/// `spec.updateStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct UpdateStrategy {
    /// The strategy (the API's default: `OnReplenish`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<UpdateStrategyType>,
}

/// `spec.updateStrategy.type`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategyType {
    /// Replace stale unclaimed sandboxes at once.
    Recreate,
    /// Replace a stale sandbox only when it is claimed or deleted.
    OnReplenish,
}

/// A warm pool's status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// Sandboxes in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Of them, ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The label selector of the pool's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The pool generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

// ---- Sandbox (core; read only) ---------------------------------------------------------

/// A Sandbox: one pod with a stable identity. snakebox never creates one (claims do); it reads
/// one to see where a claimed sandbox runs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    shortname = "sandbox",
    namespaced,
    status = "SandboxStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// The pod (required).
    pub pod_template: PodTemplate,
    /// When the Sandbox expires (inline `Lifecycle` in the Go type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// `Running` or `Suspended` (a string: snakebox only shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
}

/// A Sandbox's status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `Ready` and the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The pod's IPs; empty while there is no pod.
    #[serde(rename = "podIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    /// The headless Service's name, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The headless Service's DNS name, when there is one.
    #[serde(
        rename = "serviceFQDN",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_fqdn: Option<String>,
    /// The node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

impl Sandbox {
    /// The Sandbox's `Ready` condition.
    pub fn ready_condition(&self) -> Option<&Condition> {
        ready(self.status.as_ref().map(|status| &status.conditions[..]))
    }

    /// The pod's IPs that parse as IP addresses.
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        self.status
            .as_ref()
            .map(|status| parse_ips(&status.pod_ips))
            .unwrap_or_default()
    }
}

fn ready(conditions: Option<&[Condition]>) -> Option<&Condition> {
    conditions?
        .iter()
        .find(|condition| condition.type_ == CONDITION_READY)
}

fn parse_ips(ips: &[String]) -> Vec<IpAddr> {
    ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}
