//! The tools' JSON Schemas in the one shape every client and model provider takes.
//!
//! Tool schemas reach three kinds of reader: the MCP client's validator (Ajv in the
//! TypeScript SDK, `jsonschema` in the Python SDK, Ajv again in Gemini CLI, which checks a
//! model's arguments against `inputSchema` before it calls), and the model provider the
//! client forwards them to, whose function-declaration rules are narrower than JSON Schema:
//! OpenAI's strict function schemas and Gemini's OpenAPI-subset `Schema`. What schemars
//! writes for our Rust types breaks both: `$ref`/`$defs`, `oneOf` of `const`s for enums,
//! `["T", "null"]` type arrays, `default`, optional properties left out of `required`,
//! integer widths as `format`s (`uint64`: Ajv printed a warning for each on every connect).
//!
//! So every tool's input and output schema is rewritten once, when the server is built,
//! into the intersection of those rules (each rule, with its source, is in
//! [`rules`](self::rules), the test that holds every tool to them):
//!
//! - self-contained: every `$ref` is replaced by what it names; no `$defs`, no `$schema`;
//! - a string enum is `{"type": "string", "enum": [...]}` (never `oneOf`/`const`);
//! - every object is closed (`additionalProperties: false`); a property that may be left out
//!   is also *nullable*, written `{"anyOf": [{…}, {"type": "null"}]}` (OpenAI and Gemini both
//!   take `anyOf` with a null branch; Gemini takes no type arrays);
//! - an output schema lists **every** property in `required` (the server always sends every
//!   field, `null` when it has no value); an input schema lists only the arguments a call
//!   must give. That is the one OpenAI-strict rule (O3) input schemas break on purpose: with
//!   every argument required, clients that check a model's arguments against the schema
//!   before calling (Gemini CLI does, with Ajv) refuse any call that leaves an optional
//!   argument out, which is how models and people call tools. A strict-mode OpenAI client
//!   lists every property in `required` itself (the nullable shape makes that correct);
//! - no `default` (OpenAI refuses it; the default is said in the description) and no
//!   `format` but `date-time` (the only one all three know).
//!
//! A model may send `null` for an argument it does not mean to give (`"session_id": null`, as
//! strict mode makes it): every optional argument is an `Option` in its parameters struct,
//! so `null` and leaving it out mean the same: not given.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::JsonObject;
use serde_json::{Map, Value};

#[cfg(test)]
mod rules;

/// The one `format` OpenAI's strict schemas, Gemini's `Schema` and Ajv's formats all know.
const KEPT_FORMATS: &[&str] = &["date-time"];

/// How deep `$ref`s may nest before the schema is taken to be recursive (ours are not: a
/// recursive type cannot be written without `$ref`, and the rules test would fail on it).
const MAX_REF_DEPTH: usize = 32;

/// Make every tool schema of `router` plain (see the module documentation).
pub(crate) fn make_plain<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        tool.input_schema = Arc::new(plain(&tool.input_schema, Side::Input));
        if let Some(output) = &tool.output_schema {
            tool.output_schema = Some(Arc::new(plain(output, Side::Output)));
        }
    }
}

/// Which schema of a tool: what a call sends, or what it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Arguments: only those a call must give are `required`.
    Input,
    /// Results: every field is `required` (always sent).
    Output,
}

/// `schema` rewritten into the plain shape.
pub(crate) fn plain(schema: &JsonObject, side: Side) -> JsonObject {
    let mut root = schema.clone();
    let mut definitions = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = root.remove(key) {
            definitions.extend(defs);
        }
    }
    root.remove("$schema");
    inline_refs(&mut root, &definitions, 0);
    normalise(&mut root, side);
    root
}

/// Replace every `{"$ref": "#/$defs/X", …}` by the definition of X, the referring node's own
/// keys (its `description`) taking precedence.
fn inline_refs(node: &mut JsonObject, definitions: &Map<String, Value>, depth: usize) {
    let target = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| {
            reference
                .strip_prefix("#/$defs/")
                .or_else(|| reference.strip_prefix("#/definitions/"))
        })
        .and_then(|name| definitions.get(name))
        .and_then(Value::as_object)
        .filter(|_| depth < MAX_REF_DEPTH);
    if let Some(target) = target {
        {
            let mut merged = target.clone();
            node.remove("$ref");
            merged.extend(std::mem::take(node));
            *node = merged;
            inline_refs(node, definitions, depth + 1);
            return;
        }
    }
    for value in node.values_mut() {
        each_schema(value, &mut |child| inline_refs(child, definitions, depth));
    }
}

/// Apply `f` to every object reachable in `value` (a sub-schema, or a list or map of them).
fn each_schema(value: &mut Value, f: &mut impl FnMut(&mut JsonObject)) {
    match value {
        Value::Object(object) => f(object),
        Value::Array(items) => {
            for item in items {
                each_schema(item, f);
            }
        }
        _ => {}
    }
}

/// The sub-schemas of `node`: property schemas, `items`, `anyOf`/`oneOf` branches.
fn children(node: &mut JsonObject) -> impl Iterator<Item = &mut JsonObject> {
    let mut out: Vec<&mut JsonObject> = Vec::new();
    for (key, value) in node.iter_mut() {
        match (key.as_str(), value) {
            ("properties", Value::Object(properties)) => {
                out.extend(properties.values_mut().filter_map(Value::as_object_mut));
            }
            ("items" | "additionalProperties", Value::Object(item)) => out.push(item),
            ("anyOf" | "oneOf" | "allOf", Value::Array(branches)) => {
                out.extend(branches.iter_mut().filter_map(Value::as_object_mut));
            }
            _ => {}
        }
    }
    out.into_iter()
}

/// Rewrite one (self-contained) schema node and everything below it.
fn normalise(node: &mut JsonObject, side: Side) {
    // Before the branches are rewritten: they are recognised by their `const`.
    string_enum(node);
    for child in children(node) {
        normalise(child, side);
    }
    node.remove("default");
    node.remove("$schema");
    if node
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|format| !KEPT_FORMATS.contains(&format))
    {
        node.remove("format");
    }
    type_array_to_any_of(node);
    if node.get("type").and_then(Value::as_str) == Some("object") || node.contains_key("properties")
    {
        close_object(node, side);
    }
}

/// `oneOf` of string `const`s (how schemars writes a documented enum), or a lone `const`,
/// becomes `{"type": "string", "enum": [...]}`.
fn string_enum(node: &mut JsonObject) {
    if let Some(Value::String(value)) = node.get("const") {
        let value = value.clone();
        node.remove("const");
        node.insert("type".into(), "string".into());
        node.insert("enum".into(), Value::Array(vec![value.into()]));
        return;
    }
    let Some(Value::Array(branches)) = node.get("oneOf") else {
        return;
    };
    let values: Option<Vec<Value>> = branches
        .iter()
        .map(|branch| branch.get("const").filter(|c| c.is_string()).cloned())
        .collect();
    if let Some(values) = values {
        node.remove("oneOf");
        node.insert("type".into(), "string".into());
        node.insert("enum".into(), Value::Array(values));
    }
}

/// `{"type": ["T", "null"], …}` becomes `{"anyOf": [{"type": "T", …}, {"type": "null"}]}`,
/// the description staying outside.
fn type_array_to_any_of(node: &mut JsonObject) {
    let Some(Value::Array(types)) = node.get("type") else {
        return;
    };
    let others: Vec<Value> = types
        .iter()
        .filter(|t| t.as_str() != Some("null"))
        .cloned()
        .collect();
    if others.len() == types.len() || others.len() != 1 {
        return; // no null, or a union of several types (the rules test reports it)
    }
    let mut branch = std::mem::take(node);
    branch.insert("type".into(), others[0].clone());
    for key in ["description", "title"] {
        if let Some(value) = branch.remove(key) {
            node.insert(key.into(), value);
        }
    }
    node.insert(
        "anyOf".into(),
        Value::Array(vec![Value::Object(branch), null_schema()]),
    );
}

fn null_schema() -> Value {
    serde_json::json!({"type": "null"})
}

/// Whether `schema` already admits `null`.
fn is_nullable(schema: &JsonObject) -> bool {
    let null_type = |s: &JsonObject| match s.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(types)) => types.iter().any(|t| t == "null"),
        _ => false,
    };
    // A schema without a type (any JSON value) admits null too.
    let untyped = !["type", "anyOf", "oneOf", "enum", "const", "$ref"]
        .iter()
        .any(|key| schema.contains_key(*key));
    untyped
        || null_type(schema)
        || schema
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|branches| branches.iter().filter_map(Value::as_object).any(null_type))
}

/// Close an object: no other properties, those that were optional made nullable, and (for
/// results) every property required.
fn close_object(node: &mut JsonObject, side: Side) {
    if node
        .get("additionalProperties")
        .is_some_and(Value::is_object)
    {
        // A map: closing it would refuse its entries. Left as it is, for the rules test to
        // report (no provider's subset has maps).
        return;
    }
    node.insert("additionalProperties".into(), Value::Bool(false));
    let required: Vec<String> = node
        .get("required")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let Some(Value::Object(properties)) = node.get_mut("properties") else {
        node.insert("properties".into(), Value::Object(Map::new()));
        node.insert("required".into(), Value::Array(Vec::new()));
        return;
    };
    for (name, schema) in properties.iter_mut() {
        if required.contains(name) {
            continue;
        }
        if let Value::Object(schema) = schema
            && !is_nullable(schema)
        {
            let mut branch = std::mem::take(schema);
            for key in ["description", "title"] {
                if let Some(value) = branch.remove(key) {
                    schema.insert(key.into(), value);
                }
            }
            schema.insert(
                "anyOf".into(),
                Value::Array(vec![Value::Object(branch), null_schema()]),
            );
        }
    }
    let listed: Vec<Value> = properties
        .keys()
        .filter(|name| side == Side::Output || required.contains(name))
        .cloned()
        .map(Value::String)
        .collect();
    node.insert("required".into(), Value::Array(listed));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            _ => JsonObject::new(),
        }
    }

    fn sort_required(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    if let (true, Value::Array(names)) = (key == "required", &mut *child) {
                        names.sort_by_key(Value::to_string);
                    } else {
                        sort_required(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(sort_required),
            _ => {}
        }
    }

    #[test]
    fn integer_widths_go_and_date_time_stays() {
        let schema = plain(
            &object(serde_json::json!({
                "type": "object",
                "properties": {
                    "size": {"type": "integer", "format": "uint64", "minimum": 0},
                    "when": {"type": "string", "format": "date-time"},
                    "list": {"type": "array", "items": {"type": "number", "format": "double"}},
                },
                "required": ["size", "when", "list"],
            })),
            Side::Output,
        );
        let text = Value::Object(schema).to_string();
        for gone in ["uint64", "double"] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
        assert!(text.contains("date-time") && text.contains("\"minimum\":0"));
    }

    #[test]
    fn refs_are_inlined_enums_flattened_and_optionals_made_nullable() {
        let raw = object(serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "script": {"type": "string"},
                "timeout": {"type": ["number", "null"], "description": "seconds"},
                "deps": {"type": "array", "items": {"type": "string"}, "default": []},
                "files": {"type": "array", "items": {"$ref": "#/$defs/File"}},
            },
            "required": ["script"],
            "$defs": {
                "File": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "encoding": {"$ref": "#/$defs/Encoding", "description": "how"},
                    },
                    "required": ["path"],
                },
                "Encoding": {"oneOf": [
                    {"const": "utf-8", "type": "string", "description": "text"},
                    {"const": "base64", "type": "string"},
                ]},
            },
        }));
        let schema = plain(&raw, Side::Output);
        let expected = serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["script", "timeout", "deps", "files"],
            "properties": {
                "script": {"type": "string"},
                "timeout": {"description": "seconds", "anyOf": [{"type": "number"}, {"type": "null"}]},
                "deps": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                "files": {"anyOf": [{"type": "array", "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["path", "encoding"],
                    "properties": {
                        "path": {"type": "string"},
                        "encoding": {"description": "how", "anyOf": [
                            {"type": "string", "enum": ["utf-8", "base64"]},
                            {"type": "null"},
                        ]},
                    },
                }}, {"type": "null"}]},
            },
        });
        // `required` lists every property; its order is the map's.
        let (mut schema, mut expected) = (Value::Object(schema), expected);
        sort_required(&mut schema);
        sort_required(&mut expected);
        assert_eq!(schema, expected);
        // As arguments: the same, but only what a call must give is required.
        let mut input = Value::Object(plain(&raw, Side::Input));
        expected["required"] = serde_json::json!(["script"]);
        expected["properties"]["files"]["anyOf"][0]["items"]["required"] =
            serde_json::json!(["path"]);
        sort_required(&mut input);
        assert_eq!(input, expected);
    }

    #[test]
    fn an_any_value_property_stays_as_it_is() {
        // `{}` admits null already: required, not wrapped.
        let schema = plain(
            &object(serde_json::json!({
                "type": "object",
                "properties": {"json": {"description": "any"}},
            })),
            Side::Output,
        );
        assert_eq!(
            schema["properties"]["json"],
            serde_json::json!({"description": "any"})
        );
        assert_eq!(schema["required"], serde_json::json!(["json"]));
    }
}
