//! Every object snakebox generates is one agent-sandbox v0.5.6's CRDs accept (validated against
//! the vendored `openAPIV3Schema`, made as strict as the API server: `support`'s doc says how),
//! and the validation is strict enough to catch a misspelt field.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use kube::CustomResourceExt;
use serde_json::{Value, json};
use snakebox_kube::generate::{AgentNetwork, AgentTemplate};
use snakebox_kube::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use snakebox_kube::{claim_for_session, names, runner_claim, session_binding, session_claim};
use support::Crd;

const HOSTILE: &[&str] = &[
    "",
    "s-0123456789abcdef",
    "UPPER case",
    "../../etc",
    "日本語",
    "😀",
    "\0",
    "a-",
    "-a",
    "$(reboot)",
    "kube-system",
];

fn shutdown() -> Timestamp {
    "2026-12-31T23:59:59Z".parse().expect("a timestamp")
}

fn agent(profile: &str, python: &str) -> AgentTemplate {
    AgentTemplate {
        profile: profile.into(),
        python: python.into(),
        image: "snakebox:0.1.0".into(),
        port: 8100,
        front_key: ("snakebox-front-key".into(), "front.pub".into()),
        runtime_class: None,
        host_users: None,
        resources: None,
        network: AgentNetwork::default(),
    }
}

/// Every option set: a RuntimeClass, a user namespace, resources, an egress proxy.
fn agent_with_everything() -> AgentTemplate {
    AgentTemplate {
        runtime_class: Some("gvisor".into()),
        host_users: Some(false),
        resources: Some(support::resources()),
        network: support::network_with_proxy(),
        ..agent("data-science", "3.13")
    }
}

fn claims() -> Vec<SandboxClaim> {
    let mut claims = vec![];
    for id in HOSTILE {
        for tenant in HOSTILE {
            claims.push(session_claim(id, tenant, "agent-default", shutdown()));
            claims.push(claim_for_session(
                "r-1",
                id,
                "10.0.0.7:8700",
                tenant,
                "agent-default",
                shutdown(),
            ));
        }
        claims.push(runner_claim(id, "agent-default", shutdown()));
    }
    claims
}

fn templates() -> Vec<AgentTemplate> {
    let mut templates = vec![agent("default", "3.12"), agent_with_everything()];
    for profile in HOSTILE {
        templates.push(agent(profile, profile));
    }
    templates
}

/// RFC 7386 JSON merge patch, as the API server applies one.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

fn json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("serialisable")
}

#[test]
fn every_claim_snakebox_generates_is_accepted() {
    let crd = Crd::new("SandboxClaim", "v1beta1");
    for claim in claims() {
        crd.assert_valid(&json(&claim));
    }
}

#[test]
fn every_template_and_warm_pool_snakebox_generates_is_accepted() {
    let template_crd = Crd::new("SandboxTemplate", "v1beta1");
    let pools = Crd::new("SandboxWarmPool", "v1beta1");
    for agent in templates() {
        template_crd.assert_valid(&json(&agent.template()));
        for replicas in [0, 1, 50] {
            pools.assert_valid(&json(&agent.warm_pool(replicas)));
        }
    }
}

#[test]
fn a_claim_says_what_the_front_needs() {
    let claim = json(&claim_for_session(
        "r-42",
        "s-42",
        "10.0.0.7:8700",
        "acme",
        "agent-default",
        shutdown(),
    ));
    assert_eq!(claim["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(claim["kind"], "SandboxClaim");
    assert_eq!(claim["spec"]["warmPoolRef"]["name"], "agent-default");
    assert_eq!(
        claim["spec"]["lifecycle"],
        json!({"shutdownTime": "2026-12-31T23:59:59Z", "shutdownPolicy": "Delete"})
    );
    let labels = &claim["metadata"]["labels"];
    assert_eq!(labels[names::LABEL_KIND], "session");
    assert_eq!(
        labels[names::LABEL_TENANT],
        names::tenant_label("acme").as_str()
    );
    assert_eq!(
        labels[names::LABEL_SESSION],
        names::session_label("s-42").as_str()
    );
    assert_eq!(labels[names::LABEL_MANAGED_BY], "snakebox");
    let annotations = &claim["metadata"]["annotations"];
    assert_eq!(annotations[names::ANNOTATION_SESSION], "s-42");
    assert_eq!(annotations[names::ANNOTATION_TENANT], "acme");
    assert_eq!(annotations[names::ANNOTATION_AGENT], "10.0.0.7:8700");
    assert_eq!(
        claim["metadata"]["name"],
        names::session_claim_name("r-42").as_str()
    );
    // The claim made before the session exists, and the patch that binds it, make the same.
    let mut unbound = json(&session_claim("r-42", "acme", "agent-default", shutdown()));
    assert!(
        unbound["metadata"]["labels"]
            .get(names::LABEL_SESSION)
            .is_none()
    );
    merge(&mut unbound, &session_binding("s-42", "10.0.0.7:8700"));
    assert_eq!(unbound, claim);
    assert!(claim.get("status").is_none() || claim["status"].is_null());
}

#[test]
fn a_template_runs_the_agent_behind_an_explicit_network_policy() {
    let everything = agent_with_everything();
    let template = json(&everything.template());
    let pod = &template["spec"]["podTemplate"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["args"],
        json!([
            "agent",
            "--listen=0.0.0.0:8100",
            "--front-public-key=/etc/snakebox/front/front.pub",
            "--profile=data-science",
            "--python-version=3.13"
        ])
    );
    // A profile spelt like a flag stays the profile's value.
    let tricky = AgentTemplate {
        profile: "--listen=0.0.0.0:1".into(),
        ..agent("x", "3.12")
    };
    let args = tricky.agent_args();
    assert_eq!(args[3], "--profile=--listen=0.0.0.0:1");
    assert_eq!(
        args.iter().filter(|a| a.starts_with("--listen=")).count(),
        1
    );
    assert_eq!(pod["runtimeClassName"], "gvisor");
    assert_eq!(pod["hostUsers"], false);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(template["spec"]["networkPolicyManagement"], "Managed");
    assert_eq!(template["spec"]["envVarsInjectionPolicy"], "Disallowed");
    let policy = &template["spec"]["networkPolicy"];
    assert_eq!(policy["ingress"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        policy["ingress"][0]["ports"],
        json!([{"port": 8100, "protocol": "TCP"}])
    );
    // DNS to the cluster's DNS pods only, and the proxy: nothing else goes out.
    assert_eq!(policy["egress"].as_array().map(Vec::len), Some(2));
    assert!(policy["egress"][0]["to"][0]["namespaceSelector"].is_object());
    assert_eq!(
        policy["egress"][1]["ports"],
        json!([{"port": 3128, "protocol": "TCP"}])
    );
    let pool = json(&everything.warm_pool(3));
    assert_eq!(
        pool["spec"]["sandboxTemplateRef"]["name"],
        template["metadata"]["name"]
    );
    assert_eq!(pool["spec"]["replicas"], 3);
}

/// Change one thing of a valid object; the validation must refuse it.
fn refused(crd: &Crd, valid: &Value, change: impl FnOnce(&mut Value), why: &str) {
    let mut object = valid.clone();
    change(&mut object);
    assert_ne!(&object, valid, "{why}: the change changed nothing");
    let errors = crd.errors(&object);
    assert!(!errors.is_empty(), "{why}: accepted\n{object:#}");
}

fn rename(object: &mut Value, pointer: &str, from: &str, to: &str) {
    let map = object
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("{pointer}"));
    let value = map
        .remove(from)
        .unwrap_or_else(|| panic!("{pointer}/{from}"));
    map.insert(to.into(), value);
}

#[test]
fn a_misspelt_or_mistyped_claim_is_refused() {
    let crd = Crd::new("SandboxClaim", "v1beta1");
    let mut valid = json(&claim_for_session(
        "r-1",
        "s-1",
        "10.0.0.7:8700",
        "acme",
        "pool",
        shutdown(),
    ));
    valid["status"] = json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady",
            "message": "", "lastTransitionTime": "2026-12-07T10:00:00Z", "observedGeneration": 1}],
        "sandbox": {"name": "pool-abcde", "podIPs": ["10.0.0.7", "fd00::7"]}
    });
    crd.assert_valid(&valid);
    refused(
        &crd,
        &valid,
        |o| rename(o, "/spec", "warmPoolRef", "warmpoolRef"),
        "warmpoolRef",
    );
    refused(
        &crd,
        &valid,
        |o| rename(o, "/spec", "warmPoolRef", "templateRef"),
        "v1alpha1's templateRef",
    );
    refused(
        &crd,
        &valid,
        |o| rename(o, "/spec/lifecycle", "shutdownTime", "shutdowntime"),
        "shutdowntime",
    );
    refused(
        &crd,
        &valid,
        |o| rename(o, "/status/sandbox", "podIPs", "podIps"),
        "podIps",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["ttl"] = json!(5),
        "an unknown spec field",
    );
    refused(
        &crd,
        &valid,
        |o| o["extra"] = json!({}),
        "an unknown top-level field",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["lifecycle"]["shutdownPolicy"] = json!("delete"),
        "an enum's case",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["lifecycle"]["shutdownTime"] = json!("tomorrow"),
        "a date-time",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["lifecycle"]["ttlSecondsAfterFinished"] = json!(-1),
        "a minimum",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["lifecycle"]["ttlSecondsAfterFinished"] = json!(1u64 << 31),
        "int32",
    );
    refused(
        &crd,
        &valid,
        |o| o["spec"]["warmPoolRef"]["name"] = json!(7),
        "a type",
    );
    refused(
        &crd,
        &valid,
        |o| o["status"]["conditions"][0]["status"] = json!("true"),
        "a condition status",
    );
    refused(
        &crd,
        &valid,
        |o| o["metadata"]["name"] = json!("Not_A_Name"),
        "a name",
    );
    refused(
        &crd,
        &valid,
        |o| o["metadata"]["labels"]["snakebox.dev/tenant"] = json!("a b"),
        "a label value",
    );
    refused(
        &crd,
        &valid,
        |o| o["metadata"]["nam"] = json!("x"),
        "an ObjectMeta field",
    );
    refused(
        &crd,
        &valid,
        |o| o["apiVersion"] = json!("extensions.agents.x-k8s.io/v1"),
        "a v1 that does not exist",
    );
}

#[test]
fn a_misspelt_or_mistyped_template_or_pool_is_refused() {
    let templates = Crd::new("SandboxTemplate", "v1beta1");
    let valid = json(&agent_with_everything().template());
    templates.assert_valid(&valid);
    let container = "/spec/podTemplate/spec/containers/0";
    refused(
        &templates,
        &valid,
        |o| rename(o, "/spec", "podTemplate", "podtemplate"),
        "podtemplate",
    );
    refused(
        &templates,
        &valid,
        |o| rename(o, container, "args", "arguments"),
        "a container field",
    );
    refused(
        &templates,
        &valid,
        |o| rename(o, "/spec/podTemplate/spec", "hostUsers", "hostUser"),
        "a pod field",
    );
    refused(
        &templates,
        &valid,
        |o| o["spec"]["networkPolicy"]["podSelector"] = json!({}),
        "a field the restricted policy drops",
    );
    refused(
        &templates,
        &valid,
        |o| o["spec"]["networkPolicyManagement"] = json!("managed"),
        "an enum's case",
    );
    refused(
        &templates,
        &valid,
        |o| o["spec"]["service"] = json!("false"),
        "a boolean",
    );
    refused(
        &templates,
        &valid,
        |o| {
            let agent = o.pointer(container).cloned().unwrap_or_default();
            o["spec"]["podTemplate"]["spec"]["containers"] = json!([agent.clone(), agent]);
        },
        "two containers of one name (a list-map)",
    );
    refused(
        &templates,
        &valid,
        |o| {
            o.pointer_mut(container)
                .map(|c| c["ports"][0]["containerPort"] = json!("8100"))
                .unwrap_or_default()
        },
        "a port as a string",
    );
    refused(
        &templates,
        &valid,
        |o| {
            o.pointer_mut(container)
                .map(|c| c["resources"]["limits"]["cpu"] = json!("two"))
                .unwrap_or_default()
        },
        "a quantity",
    );

    let pools = Crd::new("SandboxWarmPool", "v1beta1");
    let valid = json(&agent("default", "3.12").warm_pool(2));
    pools.assert_valid(&valid);
    refused(
        &pools,
        &valid,
        |o| rename(o, "/spec", "sandboxTemplateRef", "templateRef"),
        "templateRef",
    );
    refused(
        &pools,
        &valid,
        |o| o["spec"]["replicas"] = json!(-1),
        "a minimum",
    );
    refused(
        &pools,
        &valid,
        |o| o["spec"]["updateStrategy"]["type"] = json!("Rolling"),
        "an enum",
    );
    refused(
        &pools,
        &valid,
        |o| o["spec"]["updateStrategy"]["kind"] = json!("Recreate"),
        "type, not kind",
    );
}

/// The int-or-string fields take both forms, as the API server does.
#[test]
fn int_or_string_takes_both_forms() {
    let crd = Crd::new("SandboxTemplate", "v1beta1");
    let mut object = json(&agent("default", "3.12").template());
    crd.assert_valid(&object);
    object["spec"]["networkPolicy"]["ingress"][0]["ports"][0]["port"] = json!("agent");
    crd.assert_valid(&object);
    object["spec"]["networkPolicy"]["ingress"][0]["ports"][0]["port"] = json!(true);
    assert!(!crd.errors(&object).is_empty());
}

/// The keywords the validator meets are the ones it handles; none loosens it (no
/// `x-kubernetes-preserve-unknown-fields` anywhere in these CRDs: no part of these objects
/// takes fields the schema does not list, except the root `metadata`, checked on its own).
#[test]
fn the_crds_use_only_keywords_the_validator_handles() {
    let mut seen = BTreeSet::new();
    for kind in [
        "Sandbox",
        "SandboxClaim",
        "SandboxTemplate",
        "SandboxWarmPool",
    ] {
        support::audit(&support::raw_schema(kind, "v1beta1"), kind, &mut seen);
    }
    assert!(!seen.contains("preserve-unknown-fields"), "{seen:?}");
    assert!(!seen.contains("embedded-resource"), "{seen:?}");
    assert!(
        seen.contains("int-or-string") && seen.contains("list-map-keys"),
        "{seen:?}"
    );
}

/// The other direction: every field of snakebox's Rust types (their JSON schema, as kube's derive
/// generates it) is a field of agent-sandbox's schema at the same place, of the same JSON type.
/// A misspelt `#[serde(rename)]` on a field snakebox only reads (say `podIps`) fails here,
/// though snakebox never generates it.
#[test]
fn every_field_of_snakeboxs_types_is_in_the_crd() {
    let ours = [
        ("SandboxClaim", SandboxClaim::crd()),
        ("SandboxTemplate", SandboxTemplate::crd()),
        ("SandboxWarmPool", SandboxWarmPool::crd()),
        ("Sandbox", Sandbox::crd()),
    ];
    for (kind, crd) in ours {
        let crd = json(&crd);
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1beta1");
        let theirs_crd = support::crd(support::crd_file(kind));
        assert_eq!(crd["spec"]["group"], theirs_crd["spec"]["group"], "{kind}");
        assert_eq!(
            crd["spec"]["names"]["plural"], theirs_crd["spec"]["names"]["plural"],
            "{kind}"
        );
        assert_eq!(crd["spec"]["scope"], theirs_crd["spec"]["scope"], "{kind}");
        let schema = &version["schema"]["openAPIV3Schema"];
        let theirs = support::raw_schema(kind, "v1beta1");
        let mut missing = vec![];
        for part in ["spec", "status"] {
            subset(
                &schema["properties"][part],
                &theirs["properties"][part],
                &format!("{kind}.{part}"),
                &mut missing,
            );
        }
        // One place differs, and not by a name: an ObjectMeta nested in a pod spec (an ephemeral
        // volume's claim template) is a full ObjectMeta in k8s-openapi and a bare `type: object`
        // in the CRD, whose contents the API server prunes. snakebox sets no ephemeral volume.
        let opaque = ".spec.podTemplate.spec.volumes[items].ephemeral.volumeClaimTemplate.metadata";
        let unexpected: Vec<&String> = missing
            .iter()
            .filter(|path| {
                !(path.starts_with(kind) && path.ends_with(&format!("{opaque} (opaque there)")))
            })
            .collect();
        assert!(
            unexpected.is_empty(),
            "not in agent-sandbox's schema:\n{unexpected:#?}"
        );
    }
}

fn subset(ours: &Value, theirs: &Value, path: &str, missing: &mut Vec<String>) {
    if ours.is_null() {
        return;
    }
    if theirs.is_null() {
        missing.push(path.to_owned());
        return;
    }
    let kind = |schema: &Value| {
        schema
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if let (Some(a), Some(b)) = (kind(ours), kind(theirs))
        && a != b
    {
        missing.push(format!("{path}: {a} here, {b} there"));
    }
    let opaque = theirs.get("properties").is_none() && theirs.get("additionalProperties").is_none();
    if let Some(properties) = ours.get("properties").and_then(Value::as_object) {
        if opaque {
            missing.push(format!("{path} (opaque there)"));
            return;
        }
        for (name, property) in properties {
            let theirs = theirs
                .get("properties")
                .and_then(|p| p.get(name))
                .unwrap_or(&Value::Null);
            subset(property, theirs, &format!("{path}.{name}"), missing);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = ours.get(key).filter(|c| c.is_object()) {
            subset(
                child,
                theirs.get(key).unwrap_or(&Value::Null),
                &format!("{path}[{key}]"),
                missing,
            );
        }
    }
}
