//! Validation of objects against agent-sandbox's vendored CRDs, as strict as the API server with
//! strict field validation (what `kubectl` asks for by default), no stricter.
//!
//! A CRD's `openAPIV3Schema` is OpenAPI 3.0's schema object (JSON Schema draft 4 and a few
//! keywords of Kubernetes' own) read as a *structural schema*. A plain JSON Schema validator
//! differs from the API server in these ways, each handled here:
//!
//! - **Unknown fields.** JSON Schema allows any property a schema does not list; the API
//!   server prunes it (silently) or, with strict field validation, refuses it, unless the node
//!   says `x-kubernetes-preserve-unknown-fields: true`. [`strict`] adds
//!   `additionalProperties: false` to every object node that lists no `additionalProperties` and
//!   preserves nothing, so a misspelt field is an error here. The one exception is the root's
//!   `metadata` (`type: object` and nothing else): the API server checks it as an `ObjectMeta`,
//!   not by this schema, and so does [`check_metadata`] here (name, label keys and values).
//! - **`x-kubernetes-int-or-string`.** controller-gen writes it beside an
//!   `anyOf: [{type: integer}, {type: string}]`, which the validator applies; [`audit`]
//!   checks that every such node has that `anyOf`.
//! - **`x-kubernetes-list-type`.** `set`: items unique, turned into `uniqueItems: true`. `map`:
//!   items unique by their `x-kubernetes-list-map-keys`, checked by [`check_list_maps`] (JSON
//!   Schema cannot say it). `atomic` and `x-kubernetes-map-type` only say how server-side apply
//!   merges; nothing to check on one object.
//! - **`format: int32` / `int64`** bound integers in Kubernetes; JSON Schema formats apply to
//!   strings only, so [`strict`] adds the bounds as `minimum`/`maximum`. `format: date-time` is
//!   checked (format validation is on).
//! - **`x-kubernetes-validations`** (CEL) are not run. [`audit`] allows only the one these CRDs
//!   have, a transition rule on a Sandbox's `volumeClaimTemplates` (it compares with `oldSelf`,
//!   so it applies to updates only, and snakebox creates no Sandbox); any other rule in a newer
//!   CRD fails the audit until it is looked at.
//! - **`default`** values are applied by the API server before it validates; the validator
//!   ignores them, so an object is checked as snakebox sends it (stricter, never looser).

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// An agent container's resources, as the tests' templates ask for them: 500m CPU and 1 GiB
/// requested, 2 CPUs and 2 GiB at most.
pub fn resources() -> k8s_openapi::api::core::v1::ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let quantity = |q: &str| Quantity(q.into());
    k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(std::collections::BTreeMap::from([
            ("cpu".into(), quantity("500m")),
            ("memory".into(), quantity("1Gi")),
        ])),
        limits: Some(std::collections::BTreeMap::from([
            ("cpu".into(), quantity("2")),
            ("memory".into(), quantity("2Gi")),
        ])),
        ..Default::default()
    }
}

/// The agents' network with the egress proxy (pods `app.kubernetes.io/name: snakebox-egress`,
/// port 3128) allowed besides DNS.
pub fn network_with_proxy() -> snakebox_kube::AgentNetwork {
    snakebox_kube::AgentNetwork {
        egress_proxy: Some((
            std::collections::BTreeMap::from([(
                "app.kubernetes.io/name".into(),
                "snakebox-egress".into(),
            )]),
            3128,
        )),
        ..snakebox_kube::AgentNetwork::default()
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A vendored file, parsed from YAML into JSON.
pub fn yaml(path: &Path) -> Value {
    let text = fs_err::read_to_string(path).expect("a vendored file");
    serde_saphyr::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// One of agent-sandbox's CRDs, by file name under `deploy/agent-sandbox/crds/`.
pub fn crd(file: &str) -> Value {
    yaml(&repo().join("deploy/agent-sandbox/crds").join(file))
}

/// The CRD file for a kind.
pub fn crd_file(kind: &str) -> &'static str {
    match kind {
        "Sandbox" => "agents.x-k8s.io_sandboxes.yaml",
        "SandboxClaim" => "extensions.agents.x-k8s.io_sandboxclaims.yaml",
        "SandboxTemplate" => "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
        "SandboxWarmPool" => "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
        other => panic!("no CRD for {other}"),
    }
}

/// A CRD's `openAPIV3Schema` for one version, as vendored.
pub fn raw_schema(kind: &str, version: &str) -> Value {
    let crd = crd(crd_file(kind));
    assert_eq!(crd["spec"]["names"]["kind"], kind);
    crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("{kind} has no version {version}"))["schema"]["openAPIV3Schema"]
        .clone()
}

/// A validator for one kind's objects at one version.
pub struct Crd {
    pub kind: String,
    pub api_version: String,
    pub schema: Value,
    validator: jsonschema::Validator,
}

impl Crd {
    pub fn new(kind: &str, version: &str) -> Self {
        let crd = crd(crd_file(kind));
        let group = crd["spec"]["group"].as_str().expect("group").to_owned();
        let schema = strict(&raw_schema(kind, version));
        let validator = jsonschema::draft4::options()
            .should_validate_formats(true)
            .build(&schema)
            .expect("the CRD schema compiles");
        Self {
            kind: kind.into(),
            api_version: format!("{group}/{version}"),
            schema,
            validator,
        }
    }

    /// Every way `object` breaks the schema (empty: it would be accepted).
    pub fn errors(&self, object: &Value) -> Vec<String> {
        let mut errors: Vec<String> = self
            .validator
            .iter_errors(object)
            .map(|err| format!("{}: {err}", err.instance_path()))
            .collect();
        if object["apiVersion"] != self.api_version.as_str() {
            errors.push(format!("apiVersion is not {}", self.api_version));
        }
        if object["kind"] != self.kind.as_str() {
            errors.push(format!("kind is not {}", self.kind));
        }
        check_metadata(&object["metadata"], &mut errors);
        check_list_maps(&self.schema, object, "", &mut errors);
        errors
    }

    /// Panics with every error unless `object` is accepted.
    pub fn assert_valid(&self, object: &Value) {
        let errors = self.errors(object);
        assert!(
            errors.is_empty(),
            "{} refused:\n{}\n{}",
            self.kind,
            errors.join("\n"),
            serde_json::to_string_pretty(object).unwrap_or_default()
        );
    }
}

/// The schema with the API server's strictness written out (see the module's doc).
pub fn strict(schema: &Value) -> Value {
    let mut schema = schema.clone();
    tighten(&mut schema, true);
    schema
}

fn tighten(node: &mut Value, root: bool) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    let preserves = object.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    if object.get("type") == Some(&json!("object"))
        && !object.contains_key("additionalProperties")
        && !preserves
    {
        object.insert("additionalProperties".into(), json!(false));
    }
    if object.get("x-kubernetes-list-type") == Some(&json!("set")) {
        object.insert("uniqueItems".into(), json!(true));
    }
    if object.get("type") == Some(&json!("integer")) {
        let bounds = match object.get("format").and_then(Value::as_str) {
            Some("int32") => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
            Some("int64") => Some((i64::MIN, i64::MAX)),
            _ => None,
        };
        if let Some((low, high)) = bounds {
            object.entry("minimum").or_insert(json!(low));
            object.entry("maximum").or_insert(json!(high));
        }
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            // The root's metadata is an ObjectMeta, checked by check_metadata.
            if root && name == "metadata" {
                continue;
            }
            tighten(property, false);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = object.get_mut(key) {
            tighten(child, false);
        }
    }
    if let Some(Value::Array(choices)) = object.get_mut("anyOf") {
        for choice in choices {
            tighten(choice, false);
        }
    }
}

/// Items of an `x-kubernetes-list-type: map` list must differ in their list-map keys.
pub fn check_list_maps(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                let child = schema["properties"]
                    .get(name)
                    .or_else(|| schema.get("additionalProperties"));
                if let Some(child) = child {
                    check_list_maps(child, field, &format!("{path}/{name}"), errors);
                }
            }
        }
        Value::Array(items) => {
            if schema["x-kubernetes-list-type"] == "map" {
                let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .map(|keys| keys.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen = BTreeSet::new();
                for item in items {
                    let key: Vec<String> = keys.iter().map(|k| item[*k].to_string()).collect();
                    if !seen.insert(key.clone()) {
                        errors.push(format!("{path}: two items with the key {key:?}"));
                    }
                }
            }
            for (n, item) in items.iter().enumerate() {
                check_list_maps(&schema["items"], item, &format!("{path}/{n}"), errors);
            }
        }
        _ => {}
    }
}

/// What the API server checks of an object's metadata that snakebox sets: the name (a DNS-1123
/// subdomain for a custom resource; snakebox's are DNS-1123 labels, checked by its own tests),
/// label keys and values, annotation values as strings, and no field ObjectMeta lacks.
pub fn check_metadata(metadata: &Value, errors: &mut Vec<String>) {
    use snakebox_kube::names::{is_dns_label, is_label_key, is_label_value};
    let Some(fields) = metadata.as_object() else {
        errors.push("metadata is not an object".into());
        return;
    };
    const OBJECT_META: &[&str] = &[
        "annotations",
        "creationTimestamp",
        "deletionGracePeriodSeconds",
        "deletionTimestamp",
        "finalizers",
        "generateName",
        "generation",
        "labels",
        "managedFields",
        "name",
        "namespace",
        "ownerReferences",
        "resourceVersion",
        "selfLink",
        "uid",
    ];
    for key in fields.keys() {
        if !OBJECT_META.contains(&key.as_str()) {
            errors.push(format!("metadata.{key} is not an ObjectMeta field"));
        }
    }
    match fields.get("name").and_then(Value::as_str) {
        Some(name) if name.len() <= 253 && name.split('.').all(is_dns_label) => {}
        other => errors.push(format!(
            "metadata.name {other:?} is not a DNS-1123 subdomain"
        )),
    }
    let empty = Map::new();
    let labels = fields
        .get("labels")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (key, value) in labels {
        if !is_label_key(key) {
            errors.push(format!("label key {key:?}"));
        }
        if !value.as_str().is_some_and(is_label_value) {
            errors.push(format!("label {key}: value {value}"));
        }
    }
    let annotations = fields
        .get("annotations")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (key, value) in annotations {
        if !is_label_key(key) || !value.is_string() {
            errors.push(format!("annotation {key:?}: {value}"));
        }
    }
}

/// Every `x-kubernetes-*` keyword in a schema, and what this file does about it. Panics on a
/// keyword or use it does not handle, so a newer CRD cannot slip past.
pub fn audit(schema: &Value, path: &str, seen: &mut BTreeSet<String>) {
    let Some(object) = schema.as_object() else {
        return;
    };
    for (key, value) in object {
        if let Some(keyword) = key.strip_prefix("x-kubernetes-") {
            seen.insert(keyword.to_owned());
            match keyword {
                "int-or-string" => assert_eq!(
                    object.get("anyOf"),
                    Some(&json!([{"type": "integer"}, {"type": "string"}])),
                    "{path}: int-or-string without its anyOf"
                ),
                "list-type" => assert!(
                    ["atomic", "set", "map"].contains(&value.as_str().unwrap_or_default()),
                    "{path}: list-type {value}"
                ),
                "list-map-keys" => assert_eq!(object["x-kubernetes-list-type"], "map"),
                "map-type" => {
                    assert!(["atomic", "granular"].contains(&value.as_str().unwrap_or_default()))
                }
                "validations" => {
                    for rule in value.as_array().into_iter().flatten() {
                        let text = rule["rule"].as_str().unwrap_or_default();
                        assert!(
                            text.contains("oldSelf"),
                            "{path}: a CEL rule on creation, not checked here: {text}"
                        );
                    }
                }
                other => panic!("{path}: x-kubernetes-{other} is not handled by this validator"),
            }
        }
    }
    assert!(!object.contains_key("nullable"), "{path}: nullable");
    for (key, child) in object {
        match child {
            Value::Object(_) => audit(child, &format!("{path}/{key}"), seen),
            Value::Array(items) => {
                for (n, item) in items.iter().enumerate() {
                    audit(item, &format!("{path}/{key}/{n}"), seen);
                }
            }
            _ => {}
        }
    }
}
