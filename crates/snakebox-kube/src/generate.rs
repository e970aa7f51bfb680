//! The objects snakebox writes to the cluster, built in one place so that what the front creates
//! is what the tests validate against agent-sandbox's schemas: a claim per session (and a runner
//! claim per tenant for one-shot runs), and for each engine profile × Python version a template
//! whose pod runs `snakebox agent` and a warm pool of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    ClaimLifecycle, InjectionPolicy, NetworkPolicyManagement, PodMetadata, PodTemplate,
    SandboxClaim, SandboxClaimSpec, SandboxNetworkPolicy, SandboxTemplate, SandboxTemplateRef,
    SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec, ShutdownPolicy, UpdateStrategy,
    UpdateStrategyType, WarmPoolRef,
};
use crate::names::{
    self, ANNOTATION_AGENT, ANNOTATION_SESSION, ANNOTATION_TENANT, LABEL_KIND, LABEL_MANAGED_BY,
    LABEL_PROFILE, LABEL_PYTHON, LABEL_SESSION, LABEL_TENANT, MANAGED_BY,
};

/// The value of [`LABEL_KIND`] on a session's claim.
pub const KIND_SESSION: &str = "session";
/// The value of [`LABEL_KIND`] on a tenant's runner claim.
pub const KIND_RUNNER: &str = "runner";
/// The value of [`LABEL_KIND`] on an agent pod.
pub const KIND_AGENT: &str = "agent";
/// The agent container's name in every template.
pub const AGENT_CONTAINER: &str = "agent";
/// The label Kubernetes puts on every namespace, its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Where the front's public key is mounted in an agent pod.
pub const FRONT_KEY_DIR: &str = "/etc/snakebox/front";

/// The claim that will hold one session: from the warm pool `pool`, labelled with its
/// tenant, ending at `shutdown_at` at the latest (the claim is then deleted).
///
/// Its name is derived from `reservation`, an id the front makes before the session exists:
/// the session's id is made by the agent's engine, once the claim has given the front an
/// agent to ask. When the session exists, [`session_binding`] labels the claim with it.
pub fn session_claim(
    reservation: &str,
    tenant: &str,
    pool: &str,
    shutdown_at: Timestamp,
) -> SandboxClaim {
    claim(
        names::session_claim_name(reservation),
        KIND_SESSION,
        tenant,
        pool,
        shutdown_at,
    )
}

/// The JSON merge patch that binds a session claim to the session it holds and the agent
/// that made it: the session's label (to find the claim by) and its id and the agent's name
/// as annotations (exact, where any string fits).
pub fn session_binding(session_id: &str, agent: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "labels": { LABEL_SESSION: names::session_label(session_id) },
            "annotations": { ANNOTATION_SESSION: session_id, ANNOTATION_AGENT: agent },
        }
    })
}

/// The claim holding one session, as it is once bound: [`session_claim`] with
/// [`session_binding`] applied.
pub fn claim_for_session(
    reservation: &str,
    session_id: &str,
    agent: &str,
    tenant: &str,
    pool: &str,
    shutdown_at: Timestamp,
) -> SandboxClaim {
    let mut claim = session_claim(reservation, tenant, pool, shutdown_at);
    claim
        .metadata
        .labels
        .get_or_insert_default()
        .insert(LABEL_SESSION.into(), names::session_label(session_id));
    let annotations = claim.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_SESSION.into(), session_id.into());
    annotations.insert(ANNOTATION_AGENT.into(), agent.into());
    claim
}

/// A tenant's runner claim, for its one-shot runs: the same as a session's, without a session.
pub fn runner_claim(tenant: &str, pool: &str, shutdown_at: Timestamp) -> SandboxClaim {
    claim(
        names::runner_claim_name(tenant),
        KIND_RUNNER,
        tenant,
        pool,
        shutdown_at,
    )
}

fn claim(
    name: String,
    kind: &str,
    tenant: &str,
    pool: &str,
    shutdown_at: Timestamp,
) -> SandboxClaim {
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_KIND.to_owned(), kind.to_owned()),
        (LABEL_TENANT.to_owned(), names::tenant_label(tenant)),
    ]);
    let annotations = BTreeMap::from([(ANNOTATION_TENANT.to_owned(), tenant.to_owned())]);
    let metadata = ObjectMeta {
        name: Some(name),
        labels: Some(labels),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    };
    let spec = SandboxClaimSpec {
        warm_pool_ref: WarmPoolRef { name: pool.into() },
        lifecycle: Some(ClaimLifecycle {
            shutdown_time: Some(Time(shutdown_at)),
            shutdown_policy: Some(ShutdownPolicy::Delete),
            ttl_seconds_after_finished: None,
        }),
        additional_pod_metadata: None,
    };
    SandboxClaim {
        metadata,
        spec,
        status: None,
    }
}

/// The agent's name is its pod's address, `IP:PORT` (`SNAKEBOX_AGENT_NAME`, from the pod's
/// IP through the downward API): a pod of a warm pool cannot know which claim will take it,
/// and the front knows the pod by the IP the claim's status reports, so that is the name the
/// front signs each call for.
pub fn agent_env(port: u16) -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        EnvVar {
            name: "SNAKEBOX_AGENT_NAME".into(),
            value: Some(format!("$(POD_IP):{port}")),
            ..EnvVar::default()
        },
    ]
}

/// The name a front signs for when it calls the agent at `ip` on `port`: what
/// [`agent_env`] names the agent in its pod.
pub fn agent_name(ip: std::net::IpAddr, port: u16) -> String {
    format!("{ip}:{port}")
}

/// Who may talk to an agent pod and whom it may reach: the NetworkPolicy rules of its template.
/// Pods are selected in the agents' own namespace, except the cluster DNS.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentNetwork {
    /// The labels of the front pods: the only ones let in, on the agent port.
    pub front_pods: BTreeMap<String, String>,
    /// The labels of the egress proxy's pods and its port: the one place agents may connect to
    /// besides DNS. None: DNS only.
    pub egress_proxy: Option<(BTreeMap<String, String>, u16)>,
    /// The namespace of the cluster DNS and the labels of its pods: port 53 is open to them
    /// only (port 53 to anywhere would be a way out).
    pub dns: (String, BTreeMap<String, String>),
}

impl Default for AgentNetwork {
    /// Fronts labelled `app.kubernetes.io/name: snakebox-front`, no egress proxy, and the
    /// usual cluster DNS (`k8s-app: kube-dns` in `kube-system`).
    fn default() -> Self {
        let labels = |key: &str, value: &str| BTreeMap::from([(key.to_owned(), value.to_owned())]);
        Self {
            front_pods: labels("app.kubernetes.io/name", "snakebox-front"),
            egress_proxy: None,
            dns: ("kube-system".into(), labels("k8s-app", "kube-dns")),
        }
    }
}

/// One agent template: the engine profile and Python version its agents serve, the image, and
/// how the pod is run.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentTemplate {
    /// The engine profile (`snakebox --profile`).
    pub profile: String,
    /// The Python version (`snakebox --python-version`).
    pub python: String,
    /// The snakebox image (its entrypoint is `snakebox`).
    pub image: String,
    /// The port the agent listens on.
    pub port: u16,
    /// The ConfigMap holding the front's public key, and its key in it (`front.pub`).
    pub front_key: (String, String),
    /// The RuntimeClass (gVisor, Kata…); None: the cluster's default runtime.
    pub runtime_class: Option<String>,
    /// `hostUsers`: `Some(false)` gives the pod a user namespace of its own (what bubblewrap
    /// needs inside a pod).
    pub host_users: Option<bool>,
    /// The agent container's resources.
    pub resources: Option<ResourceRequirements>,
    /// The pod's network policy.
    pub network: AgentNetwork,
}

impl AgentTemplate {
    /// The name of this template and of its warm pool.
    pub fn name(&self) -> String {
        names::template_name(&self.profile, &self.python)
    }

    /// The agent container's command line, after the image's `snakebox` entrypoint. Every value
    /// is joined to its flag (`--profile=…`), so a value that starts with `-` stays a value.
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "agent".to_owned(),
            format!("--listen=0.0.0.0:{}", self.port),
            format!("--front-public-key={FRONT_KEY_DIR}/{}", self.front_key.1),
            format!("--profile={}", self.profile),
            format!("--python-version={}", self.python),
        ]
    }

    fn pod_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
            (LABEL_KIND.to_owned(), KIND_AGENT.to_owned()),
            (
                LABEL_PROFILE.to_owned(),
                names::profile_label(&self.profile),
            ),
            (LABEL_PYTHON.to_owned(), names::python_label(&self.python)),
        ])
    }

    /// The agent container's security context: no capability, no privilege escalation. In a
    /// pod with a user namespace of its own (`hostUsers: false`) the agent runs its sandboxes
    /// with bubblewrap, which needs what a container's defaults deny: to make user
    /// namespaces (the runtime's default seccomp and AppArmor profiles refuse it) and to mount
    /// a fresh `/proc` (a masked one cannot be): so seccomp and AppArmor are `Unconfined` and
    /// `/proc` is `Unmasked` there, and only there (Kubernetes allows `Unmasked` only with a
    /// user namespace). The agent's own seccomp program and namespaces confine each run.
    fn security_context(&self) -> SecurityContext {
        let bubblewrap = self.host_users == Some(false);
        SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            proc_mount: bubblewrap.then(|| "Unmasked".into()),
            seccomp_profile: Some(SeccompProfile {
                type_: if bubblewrap {
                    "Unconfined"
                } else {
                    "RuntimeDefault"
                }
                .into(),
                ..SeccompProfile::default()
            }),
            app_armor_profile: bubblewrap.then(|| AppArmorProfile {
                type_: "Unconfined".into(),
                ..AppArmorProfile::default()
            }),
            ..SecurityContext::default()
        }
    }

    /// The `SandboxTemplate`.
    pub fn template(&self) -> SandboxTemplate {
        let port = i32::from(self.port);
        let probe = |path: &str| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::Int(port),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        };
        let agent = Container {
            name: AGENT_CONTAINER.into(),
            image: Some(self.image.clone()),
            args: Some(self.agent_args()),
            env: Some(agent_env(self.port)),
            ports: Some(vec![ContainerPort {
                name: Some("agent".into()),
                container_port: port,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }]),
            readiness_probe: Some(probe("/readyz")),
            liveness_probe: Some(probe("/healthz")),
            resources: self.resources.clone(),
            security_context: Some(self.security_context()),
            volume_mounts: Some(vec![VolumeMount {
                name: "front-key".into(),
                mount_path: FRONT_KEY_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        };
        let spec = PodSpec {
            containers: vec![agent],
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            runtime_class_name: self.runtime_class.clone(),
            host_users: self.host_users,
            volumes: Some(vec![Volume {
                name: "front-key".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: self.front_key.0.clone(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        };
        SandboxTemplate {
            metadata: self.metadata(),
            spec: SandboxTemplateSpec {
                pod_template: PodTemplate {
                    metadata: Some(PodMetadata {
                        labels: self.pod_labels(),
                        annotations: BTreeMap::new(),
                    }),
                    spec,
                },
                service: Some(false),
                network_policy: Some(self.network_policy()),
                network_policy_management: Some(NetworkPolicyManagement::Managed),
                env_vars_injection_policy: Some(InjectionPolicy::Disallowed),
                volume_claim_templates_policy: Some(InjectionPolicy::Disallowed),
            },
        }
    }

    /// Written out, never the controller's default (which lets a sandbox reach the internet):
    /// in, only the fronts on the agent port; out, only DNS and the egress proxy.
    fn network_policy(&self) -> SandboxNetworkPolicy {
        let pods = |labels: &BTreeMap<String, String>| NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            }),
            ..NetworkPolicyPeer::default()
        };
        let tcp = |port: u16| NetworkPolicyPort {
            port: Some(IntOrString::Int(i32::from(port))),
            protocol: Some("TCP".into()),
            ..NetworkPolicyPort::default()
        };
        let (dns_namespace, dns_pods) = &self.network.dns;
        let dns = NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        NAMESPACE_NAME_LABEL.to_owned(),
                        dns_namespace.clone(),
                    )])),
                    ..LabelSelector::default()
                }),
                ..pods(dns_pods)
            }]),
            ports: Some(vec![
                NetworkPolicyPort {
                    protocol: Some("UDP".into()),
                    ..tcp(53)
                },
                tcp(53),
            ]),
        };
        let mut egress = vec![dns];
        if let Some((proxy, port)) = &self.network.egress_proxy {
            egress.push(NetworkPolicyEgressRule {
                to: Some(vec![pods(proxy)]),
                ports: Some(vec![tcp(*port)]),
            });
        }
        SandboxNetworkPolicy {
            ingress: vec![NetworkPolicyIngressRule {
                from: Some(vec![pods(&self.network.front_pods)]),
                ports: Some(vec![tcp(self.port)]),
            }],
            egress,
        }
    }

    /// The `SandboxWarmPool` keeping `replicas` agents of this template started. A template
    /// snakebox changes (a new image) replaces the pool's unclaimed agents at once.
    pub fn warm_pool(&self, replicas: i32) -> SandboxWarmPool {
        SandboxWarmPool {
            metadata: self.metadata(),
            spec: SandboxWarmPoolSpec {
                replicas: Some(replicas),
                sandbox_template_ref: SandboxTemplateRef { name: self.name() },
                update_strategy: Some(UpdateStrategy {
                    kind: Some(UpdateStrategyType::Recreate),
                }),
            },
            status: None,
        }
    }

    fn metadata(&self) -> ObjectMeta {
        let mut labels = self.pod_labels();
        labels.remove(LABEL_KIND);
        ObjectMeta {
            name: Some(self.name()),
            labels: Some(labels),
            ..ObjectMeta::default()
        }
    }
}
