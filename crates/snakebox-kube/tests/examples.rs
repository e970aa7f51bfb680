//! agent-sandbox's own example objects (vendored from v0.5.6, `tests/agent-sandbox-examples/`)
//! are accepted by the validator (so it is not stricter than the API server), parse into
//! snakebox's types, and come back out with every field snakebox reads; the fields they lose
//! are listed, and are ones snakebox neither sets nor reads. Then statuses as the controller
//! writes them, with fields a newer controller may add.

mod support;

use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use snakebox_kube::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use support::Crd;

fn examples() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agent-sandbox-examples");
    let mut files: Vec<PathBuf> = fs_err::read_dir(&dir)
        .expect("the examples")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, support::yaml(&path))
        })
        .collect()
}

/// Paths (`/a/b`) in `original` that `copy` lacks; panics where a value changed.
fn dropped(original: &Value, copy: &Value, path: &str, out: &mut Vec<String>) {
    match (original, copy) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(other) => dropped(value, other, &format!("{path}/{key}"), out),
                    None => out.push(format!("{path}/{key}")),
                }
            }
            for key in b.keys() {
                assert!(a.contains_key(key), "{path}/{key} appeared");
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}: length changed");
            for (n, (x, y)) in a.iter().zip(b).enumerate() {
                dropped(x, y, &format!("{path}/{n}"), out);
            }
        }
        (a, b) => assert_eq!(a, b, "{path} changed"),
    }
}

/// Parse `object` as `T`, write it back, and return what was lost.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str, object: &Value) -> Vec<String> {
    let typed: T = serde_json::from_value(object.clone())
        .unwrap_or_else(|err| panic!("{name} does not parse: {err}"));
    let copy = serde_json::to_value(&typed).expect("serialisable");
    let mut lost = vec![];
    dropped(object, &copy, "", &mut lost);
    lost
}

#[test]
fn agent_sandboxs_examples_are_valid_parse_and_keep_what_snakebox_reads() {
    let examples = examples();
    assert!(examples.len() >= 10, "{} examples", examples.len());
    let mut kinds = vec![];
    for (name, object) in &examples {
        let kind = object["kind"].as_str().expect("a kind").to_owned();
        let version = object["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .map(|(_, version)| version)
            .expect("an apiVersion");
        assert_eq!(version, "v1beta1", "{name}");
        // Accepted: the validator is no stricter than the API server.
        Crd::new(&kind, version).assert_valid(object);
        let lost = match kind.as_str() {
            "SandboxClaim" => round_trip::<SandboxClaim>(name, object),
            "SandboxTemplate" => round_trip::<SandboxTemplate>(name, object),
            "SandboxWarmPool" => round_trip::<SandboxWarmPool>(name, object),
            "Sandbox" => round_trip::<Sandbox>(name, object),
            other => panic!("{name}: {other}"),
        };
        // What snakebox's types do not carry, and so never sets nor reads: claims' and
        // templates' volume claim templates (snakebox keeps no volumes yet).
        let expected: &[&str] = match name.as_str() {
            "hermes-agents-as-a-service-10-sandboxtemplate.yaml" => &["/spec/volumeClaimTemplates"],
            _ => &[],
        };
        assert_eq!(lost, expected, "{name} lost fields");
        kinds.push(kind);
    }
    for kind in [
        "Sandbox",
        "SandboxClaim",
        "SandboxTemplate",
        "SandboxWarmPool",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no example of {kind}");
    }
}

#[test]
fn the_fields_snakebox_reads_come_through() {
    let examples = examples();
    let find = |file: &str| {
        examples
            .iter()
            .find(|(name, _)| name == file)
            .map(|(_, object)| object.clone())
            .unwrap_or_else(|| panic!("{file}"))
    };
    let claim: SandboxClaim =
        serde_json::from_value(find("hermes-agents-as-a-service-30-claim-alice.yaml"))
            .expect("a claim");
    assert_eq!(claim.spec.warm_pool_ref.name, "hermes-pool");
    assert_eq!(claim.metadata.namespace.as_deref(), Some("hermes-demo"));
    let labels = claim
        .spec
        .additional_pod_metadata
        .as_ref()
        .map(|m| &m.labels)
        .expect("pod metadata");
    assert_eq!(
        labels
            .get("sandbox.users.io/hermes-user")
            .map(String::as_str),
        Some("alice")
    );

    let pool: SandboxWarmPool =
        serde_json::from_value(find("kata-aks-sandboxwarmpool.yaml")).expect("a pool");
    assert_eq!(pool.spec.replicas, Some(3));
    assert_eq!(pool.spec.sandbox_template_ref.name, "kata-aks-template");

    let template: SandboxTemplate =
        serde_json::from_value(find("kata-aks-sandboxtemplate.yaml")).expect("a template");
    let pod = &template.spec.pod_template.spec;
    assert_eq!(pod.runtime_class_name.as_deref(), Some("kata-vm-isolation"));
    assert_eq!(pod.containers[0].name, "agent");
    let policy = template.spec.network_policy.as_ref().expect("a policy");
    assert_eq!(policy.ingress.len(), 1);
    assert_eq!(policy.egress.len(), 2);
    assert_eq!(template.spec.service, Some(true));
}

/// A claim's status as the controller writes it once a warm sandbox is bound (the `Ready`
/// condition forwarded from the Sandbox, `status.sandbox`), with fields no v0.5.6 controller
/// writes: they are ignored, not an error.
#[test]
fn a_ready_claim_gives_its_pod_ip_and_unknown_status_fields_are_ignored() {
    let mut object = serde_json::to_value(snakebox_kube::claim_for_session(
        "r-1",
        "s-1",
        "10.0.0.7:8700",
        "acme",
        "pool",
        "2026-12-31T00:00:00Z".parse().expect("a time"),
    ))
    .expect("serialisable");
    object["status"] = json!({
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "",
            "lastTransitionTime": "2026-12-07T10:00:00Z", "observedGeneration": 1
        }],
        "sandbox": {"name": "pool-x7k2p", "podIPs": ["10.4.0.17", "fd00::17"]}
    });
    Crd::new("SandboxClaim", "v1beta1").assert_valid(&object);
    let claim: SandboxClaim = serde_json::from_value(object.clone()).expect("parses");
    assert!(claim.is_ready());
    assert_eq!(claim.sandbox_name(), Some("pool-x7k2p"));
    let ips: Vec<String> = claim.pod_ips().iter().map(ToString::to_string).collect();
    assert_eq!(ips, ["10.4.0.17", "fd00::17"]);

    // A newer controller's fields, in status and elsewhere.
    object["status"]["sandbox"]["serviceFQDN"] = json!("pool-x7k2p.ns.svc.cluster.local");
    object["status"]["observedGeneration"] = json!(3);
    object["status"]["phase"] = json!({"nested": ["anything"]});
    object["status"]["conditions"][0]["futureField"] = json!(true);
    object["spec"]["futureSpecField"] = json!("x");
    let newer: SandboxClaim = serde_json::from_value(object).expect("unknown fields are ignored");
    assert_eq!(newer.status, claim.status);
    assert!(newer.is_ready());

    // Not ready: the condition False, or no pod IP yet.
    let mut pending = claim.clone();
    if let Some(status) = pending.status.as_mut() {
        status.conditions[0].status = "False".into();
    }
    assert!(!pending.is_ready());
    let mut no_ip = claim;
    if let Some(sandbox) = no_ip.status.as_mut().and_then(|s| s.sandbox.as_mut()) {
        sandbox.pod_ips.clear();
    }
    assert!(!no_ip.is_ready());
}

#[test]
fn a_sandboxs_status_gives_its_address() {
    let mut object = examples()
        .into_iter()
        .find(|(_, o)| o["kind"] == "Sandbox")
        .map(|(_, o)| o)
        .expect("a Sandbox example");
    object["status"] = json!({
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "Pod is Ready",
            "lastTransitionTime": "2026-12-07T10:00:00Z", "observedGeneration": 1
        }],
        "podIPs": ["10.4.0.9"],
        "service": "hello-world",
        "serviceFQDN": "hello-world.default.svc.cluster.local",
        "nodeName": "node-1",
        "selector": "agents.x-k8s.io/sandbox-name-hash=abc"
    });
    Crd::new("Sandbox", "v1beta1").assert_valid(&object);
    let sandbox: Sandbox = serde_json::from_value(object).expect("parses");
    let status = sandbox.status.as_ref().expect("a status");
    assert_eq!(
        status.service_fqdn.as_deref(),
        Some("hello-world.default.svc.cluster.local")
    );
    assert_eq!(sandbox.pod_ips().len(), 1);
    assert_eq!(
        sandbox.ready_condition().map(|c| c.reason.as_str()),
        Some("DependenciesReady")
    );
}
