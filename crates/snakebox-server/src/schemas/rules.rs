//! The model providers' rules for function schemas, written down as checks, and the test
//! that holds every snakebox tool's input and output schema to them.
//!
//! Each rule names where it comes from. The providers validate a declaration when a request
//! carries it and refuse the whole request (HTTP 400) on the first violation, so one bad
//! tool breaks every tool of every server the user has connected.
//!
//! **OpenAI, strict function calling** (`"strict": true`): the "Supported schemas" section
//! of OpenAI's Structured Outputs guide, which governs strict function parameters too.
//! - O1 the root is an object, not an `anyOf`;
//! - O2 every object has `additionalProperties: false`;
//! - O3 every property of an object is listed in `required` ("to emulate an optional
//!   parameter, use a union type with `null`");
//! - O4 every schema has a `type` (`string`, `number`, `integer`, `boolean`, `object`,
//!   `array`, `null`, or a list of them), or is an `anyOf`/`enum`;
//! - O5 only the supported keywords: `type`, `description`, `title`, `properties`,
//!   `required`, `additionalProperties`, `items`, `enum`, `const`, `anyOf`, `$ref`/`$defs`,
//!   `pattern`, `format`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//!   `multipleOf`, `minItems`, `maxItems`. Not `oneOf`, `allOf`, `not`, `if`/`then`/`else`,
//!   `default` ("'default' is not permitted"), `minLength`/`maxLength`, `uniqueItems`,
//!   `patternProperties`, …;
//! - O6 string `format`s: `date-time`, `time`, `date`, `duration`, `email`, `hostname`,
//!   `ipv4`, `ipv6`, `uuid`;
//! - O7 at most 5000 properties in all, 10 levels of object nesting, 1000 enum values, and
//!   120,000 characters of property names and enum values together;
//! - function names match `^[a-zA-Z0-9_-]{1,64}$`.
//!
//! **Gemini, function declarations**: `FunctionDeclaration.parameters` is a `Schema`
//! message (googleapis `google/ai/generativelanguage/v1beta/content.proto`, "a select
//! subset of an OpenAPI 3.0 schema object"), converted from JSON field by field: a field the
//! message does not have is an "Unknown name … Cannot find field" error.
//! - G1 only the `Schema` message's fields: `type`, `format`, `title`, `description`,
//!   `nullable`, `enum`, `items`, `minItems`, `maxItems`, `properties`, `required`,
//!   `minimum`, `maximum`, `anyOf`, `propertyOrdering`, `default` (accepted and ignored),
//!   `minLength`, `maxLength`, `pattern`, `minProperties`, `maxProperties`, `example`. So no
//!   `$ref`, `$defs`, `$schema`, `oneOf`, `allOf`, `not`, `const`. One exception, kept
//!   because O2 demands it: `additionalProperties: false`. It is in the example of
//!   `FunctionDeclaration.parametersJsonSchema` (the JSON Schema twin of `parameters`,
//!   which Gemini CLI fills from an MCP tool's `inputSchema` as it is); a client that
//!   fills `parameters` itself copies the fields the message has;
//! - G2 `type` is one value of the `Type` enum (`STRING`, `NUMBER`, `INTEGER`, `BOOLEAN`,
//!   `ARRAY`, `OBJECT`, `NULL`), never a list: a nullable value is an `anyOf` with a `NULL`
//!   branch (the proto's comment on `NULL`: it exists for exactly that) or `nullable`;
//! - G3 `type` is required, except beside `anyOf`;
//! - G4 `format` only `float`/`double` on numbers, `int32`/`int64` on integers,
//!   `enum`/`date-time` on strings;
//! - G5 `enum` only on strings;
//! - G6 an `OBJECT` has at least one property ("parameters.properties: should be non-empty
//!   for OBJECT type"), except the root of a tool without parameters, which clients send
//!   with no `parameters` at all ("for function with no parameters, this can be left
//!   unset");
//! - G7 an `ARRAY` has `items`;
//! - property names start with a letter or `_` and hold only letters, digits and `_`, at
//!   most 64; function names hold letters, digits, `_` and `-`, at most 63.
//!
//! **JSON Schema / Ajv** (the TypeScript SDK's validator) is satisfied by the same
//! intersection: every keyword above is standard, and the one `format` left (`date-time`)
//! is one ajv-formats knows. The end-to-end test with the real SDK asserts that it prints no
//! warning (tests/e2e/test_clients.py).
//!
//! One node is outside these rules on purpose: `result.json` of the execution results,
//! the value of the script's last expression as JSON. It can be any JSON value, which no
//! provider's subset can say (a `type` is required, and an `object` must be closed).
//! It is in output schemas only, which no provider receives: function declarations carry
//! parameters, and Gemini CLI sends `parametersJsonSchema` alone. The compatibility tools
//! (`crate::compat`, opt-in) keep IBM's python sandbox server's answers, which have three more
//! such nodes: `execute_code`'s `result` and `last_expression` (any JSON value) and
//! `get_sandbox_info`'s `security_profiles` (a map keyed by profile name); also output only.

use serde_json::Value;

/// One broken rule: where, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// JSON-pointer-like path of the offending node (`/properties/files/items`).
    pub path: String,
    /// The rule, as listed in the module documentation.
    pub rule: String,
}

const OPENAI_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
];
const OPENAI_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];
const OPENAI_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

const GEMINI_FIELDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "items",
    "minItems",
    "maxItems",
    "properties",
    "required",
    "minimum",
    "maximum",
    "anyOf",
    "propertyOrdering",
    "default",
    "minLength",
    "maxLength",
    "pattern",
    "minProperties",
    "maxProperties",
    "example",
];

fn violation(path: &str, rule: impl Into<String>) -> Violation {
    Violation {
        path: if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
        rule: rule.into(),
    }
}

/// The sub-schemas of `node` with their paths.
fn children<'a>(node: &'a serde_json::Map<String, Value>, path: &str) -> Vec<(String, &'a Value)> {
    let mut out = Vec::new();
    if let Some(Value::Object(properties)) = node.get("properties") {
        for (name, schema) in properties {
            out.push((format!("{path}/properties/{name}"), schema));
        }
    }
    if let Some(items) = node.get("items") {
        out.push((format!("{path}/items"), items));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = node.get(key) {
            for (i, branch) in branches.iter().enumerate() {
                out.push((format!("{path}/{key}/{i}"), branch));
            }
        }
    }
    if let Some(Value::Object(defs)) = node.get("$defs") {
        for (name, schema) in defs {
            out.push((format!("{path}/$defs/{name}"), schema));
        }
    }
    out
}

fn types(node: &serde_json::Map<String, Value>) -> Vec<&str> {
    match node.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Whether `name` is a valid OpenAI function name.
pub(crate) fn openai_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether `name` is a valid Gemini function name.
pub(crate) fn gemini_function_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The OpenAI-strict violations of `schema` (a tool's input or output schema).
pub(crate) fn openai_strict(schema: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    match schema {
        Value::Object(root) if types(root) == ["object"] && !root.contains_key("anyOf") => {}
        _ => out.push(violation("", "O1 the root is an object, not an anyOf")),
    }
    let mut totals = (0_usize, 0_usize, 0_usize); // properties, enum values, characters
    openai_node(schema, "", 0, &mut totals, &mut out);
    let (properties, enums, characters) = totals;
    if properties > 5000 || enums > 1000 || characters > 120_000 {
        out.push(violation(
            "",
            format!(
                "O7 size: {properties} properties, {enums} enum values, {characters} characters"
            ),
        ));
    }
    out
}

fn openai_node(
    schema: &Value,
    path: &str,
    depth: usize,
    totals: &mut (usize, usize, usize),
    out: &mut Vec<Violation>,
) {
    let Value::Object(node) = schema else {
        out.push(violation(path, "O4 a schema is an object"));
        return;
    };
    for key in node.keys() {
        if !OPENAI_KEYWORDS.contains(&key.as_str()) {
            out.push(violation(path, format!("O5 unsupported keyword `{key}`")));
        }
    }
    let node_types = types(node);
    if node_types.is_empty() && !node.contains_key("anyOf") && !node.contains_key("enum") {
        out.push(violation(path, "O4 no `type`"));
    }
    for t in &node_types {
        if !OPENAI_TYPES.contains(t) {
            out.push(violation(path, format!("O4 unsupported type `{t}`")));
        }
    }
    if let Some(format) = node.get("format").and_then(Value::as_str)
        && !OPENAI_FORMATS.contains(&format)
    {
        out.push(violation(path, format!("O6 unsupported format `{format}`")));
    }
    if let Some(Value::Array(values)) = node.get("enum") {
        totals.1 += values.len();
        totals.2 += values
            .iter()
            .filter_map(Value::as_str)
            .map(str::len)
            .sum::<usize>();
    }
    let is_object = node_types.contains(&"object");
    let mut depth = depth;
    if is_object {
        depth += 1;
        if depth > 10 {
            out.push(violation(path, "O7 more than 10 levels of nesting"));
        }
        if node.get("additionalProperties") != Some(&Value::Bool(false)) {
            out.push(violation(path, "O2 `additionalProperties` is not false"));
        }
        let required: Vec<&str> = node
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(Value::Object(properties)) = node.get("properties") {
            totals.0 += properties.len();
            for name in properties.keys() {
                totals.2 += name.len();
                if !required.contains(&name.as_str()) {
                    out.push(violation(path, format!("O3 `{name}` is not in `required`")));
                }
            }
        }
    }
    for (child_path, child) in children(node, path) {
        openai_node(child, &child_path, depth, totals, out);
    }
}

/// The Gemini violations of `schema`; `parameterless` when it is the input schema of a
/// tool without parameters (G6).
pub(crate) fn gemini(schema: &Value, parameterless: bool) -> Vec<Violation> {
    let mut out = Vec::new();
    gemini_node(schema, "", parameterless, &mut out);
    out
}

fn gemini_node(schema: &Value, path: &str, parameterless_root: bool, out: &mut Vec<Violation>) {
    let Value::Object(node) = schema else {
        out.push(violation(path, "G1 a schema is an object"));
        return;
    };
    for (key, value) in node {
        let allowed = GEMINI_FIELDS.contains(&key.as_str())
            || (key == "additionalProperties" && value == &Value::Bool(false));
        if !allowed {
            out.push(violation(
                path,
                format!("G1 `{key}` is not a field of Schema"),
            ));
        }
    }
    let single = match node.get("type") {
        None => {
            if !node.contains_key("anyOf") {
                out.push(violation(path, "G3 no `type`"));
            }
            None
        }
        Some(Value::String(t)) => {
            const TYPES: &[&str] = &[
                "string", "number", "integer", "boolean", "array", "object", "null",
            ];
            if !TYPES.contains(&t.to_ascii_lowercase().as_str()) {
                out.push(violation(path, format!("G2 unknown type `{t}`")));
            }
            Some(t.to_ascii_lowercase())
        }
        Some(_) => {
            out.push(violation(path, "G2 `type` is a list"));
            None
        }
    };
    if let Some(format) = node.get("format").and_then(Value::as_str) {
        let ok = match single.as_deref() {
            Some("number") => ["float", "double"].contains(&format),
            Some("integer") => ["int32", "int64"].contains(&format),
            Some("string") => ["enum", "date-time"].contains(&format),
            _ => false,
        };
        if !ok {
            out.push(violation(path, format!("G4 format `{format}` here")));
        }
    }
    if node.contains_key("enum") && single.as_deref() != Some("string") {
        out.push(violation(path, "G5 `enum` on a non-string"));
    }
    if single.as_deref() == Some("object") {
        let empty = node
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(serde_json::Map::is_empty);
        if empty && !(parameterless_root && path.is_empty()) {
            out.push(violation(path, "G6 an object without properties"));
        }
        if let Some(Value::Object(properties)) = node.get("properties") {
            for name in properties.keys() {
                let mut chars = name.chars();
                let ok = name.len() <= 64
                    && chars
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !ok {
                    out.push(violation(path, format!("G property name `{name}`")));
                }
            }
        }
    }
    if single.as_deref() == Some("array") && !node.contains_key("items") {
        out.push(violation(path, "G7 an array without `items`"));
    }
    for (child_path, child) in children(node, path) {
        gemini_node(child, &child_path, false, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnakeboxServer;

    /// The one node outside the rules on purpose (see the module documentation): where it
    /// is in the execution results, and the one rule of each provider it breaks.
    fn any_value_exception(violation: &Violation) -> bool {
        violation.path == "/properties/result/anyOf/0/properties/json"
            && (violation.rule == "O4 no `type`" || violation.rule == "G3 no `type`")
    }

    /// The compatibility tools' nodes outside the rules (see the module documentation).
    fn compat_exception(tool: &str, violation: &Violation) -> bool {
        match tool {
            "execute_code" => {
                ["/properties/result", "/properties/last_expression"]
                    .contains(&violation.path.as_str())
                    && (violation.rule == "O4 no `type`" || violation.rule == "G3 no `type`")
            }
            "get_sandbox_info" => violation.path == "/properties/security_profiles",
            _ => false,
        }
    }

    /// Properties (path, name) of `schema`'s objects that are not `required` and do not
    /// admit null.
    fn optional_not_nullable(schema: &Value, path: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let Some(node) = schema.as_object() else {
            return out;
        };
        let required: Vec<&str> = node
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(Value::Object(properties)) = node.get("properties") {
            for (name, property) in properties {
                let nullable = property["anyOf"]
                    .as_array()
                    .is_some_and(|branches| branches.iter().any(|b| b["type"] == "null"));
                if !required.contains(&name.as_str()) && !nullable {
                    out.push((path.to_owned(), name.clone()));
                }
            }
        }
        for (child_path, child) in children(node, path) {
            out.extend(optional_not_nullable(child, &child_path));
        }
        out
    }

    /// Every tool snakebox serves, with the schemas it lists.
    fn tools() -> Vec<rmcp::model::Tool> {
        SnakeboxServer::every_tool()
    }

    #[test]
    fn every_tool_schema_is_accepted_by_openai_strict_and_gemini() {
        let tools = tools();
        assert!(tools.len() >= 13, "{} tools", tools.len());
        let mut broken = Vec::new();
        for tool in &tools {
            assert!(openai_function_name(&tool.name), "{}", tool.name);
            assert!(gemini_function_name(&tool.name), "{}", tool.name);
            let input = Value::Object((*tool.input_schema).clone());
            let parameterless = input["properties"]
                .as_object()
                .is_some_and(serde_json::Map::is_empty);
            // Arguments break O3 on purpose (see `schemas`): only what a call must give is
            // required, and everything else is nullable, so a strict client may require it.
            for v in openai_strict(&input)
                .into_iter()
                .chain(gemini(&input, parameterless))
                .filter(|v| !v.rule.starts_with("O3 "))
            {
                broken.push(format!("{} input {}: {}", tool.name, v.path, v.rule));
            }
            for (path, name) in optional_not_nullable(&input, "") {
                broken.push(format!(
                    "{} input {path}: `{name}` is neither required nor nullable",
                    tool.name
                ));
            }
            let output = tool
                .output_schema
                .as_ref()
                .map(|schema| Value::Object((**schema).clone()));
            assert!(output.is_some(), "{} has no output schema", tool.name);
            if let Some(output) = output {
                for v in openai_strict(&output)
                    .into_iter()
                    .chain(gemini(&output, false))
                {
                    if !any_value_exception(&v) && !compat_exception(&tool.name, &v) {
                        broken.push(format!("{} output {}: {}", tool.name, v.path, v.rule));
                    }
                }
            }
        }
        assert!(broken.is_empty(), "{}", broken.join("\n"));
    }

    /// The exception is really there (so the rule above cannot pass by not looking).
    #[test]
    fn the_any_value_node_is_where_the_exception_says() {
        let tools = tools();
        let execute = tools.iter().find(|t| t.name == "execute_python");
        let output = execute
            .and_then(|t| t.output_schema.as_ref())
            .map(|s| Value::Object((**s).clone()))
            .unwrap_or_default();
        let found: Vec<Violation> = openai_strict(&output)
            .into_iter()
            .chain(gemini(&output, false))
            .collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(any_value_exception), "{found:?}");
    }

    /// The checkers find what schemars wrote before the schemas were made plain (issue 16
    /// (3)): each rule catches its violation.
    #[test]
    fn the_checkers_catch_what_schemars_writes() {
        let raw = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "script": {"type": "string"},
                "timeout": {"type": ["number", "null"], "format": "double"},
                "deps": {"type": "array", "items": {"type": "string"}, "default": []},
                "files": {"type": "array", "items": {"$ref": "#/$defs/File"}},
                "any": {"description": "anything"},
            },
            "required": ["script"],
            "$defs": {"File": {"type": "object", "properties": {
                "encoding": {"oneOf": [{"const": "utf-8"}, {"const": "base64"}]},
            }}},
        });
        let rules = |found: Vec<Violation>| -> Vec<String> {
            found
                .into_iter()
                .map(|v| format!("{} {}", v.path, v.rule))
                .collect()
        };
        let openai_found = rules(openai_strict(&raw)).join("\n");
        for expected in [
            "/ O5 unsupported keyword `$schema`",
            "/ O2 `additionalProperties` is not false",
            "/ O3 `timeout` is not in `required`",
            "/properties/deps O5 unsupported keyword `default`",
            "/properties/timeout O6 unsupported format `double`",
            "/properties/any O4 no `type`",
            "/$defs/File/properties/encoding O5 unsupported keyword `oneOf`",
        ] {
            assert!(
                openai_found.contains(expected),
                "{expected} not in\n{openai_found}"
            );
        }
        let gemini_found = rules(gemini(&raw, false)).join("\n");
        for expected in [
            "/ G1 `$schema` is not a field of Schema",
            "/ G1 `$defs` is not a field of Schema",
            "/properties/timeout G2 `type` is a list",
            "/properties/files/items G1 `$ref` is not a field of Schema",
            "/$defs/File/properties/encoding G1 `oneOf` is not a field of Schema",
            "/$defs/File/properties/encoding/oneOf/0 G1 `const` is not a field of Schema",
            "/properties/any G3 no `type`",
        ] {
            assert!(
                gemini_found.contains(expected),
                "{expected} not in\n{gemini_found}"
            );
        }
        // Made plain, only the any-value node is left (one rule each).
        let Value::Object(raw) = raw else {
            unreachable!("an object literal")
        };
        let plain = Value::Object(super::super::plain(&raw, super::super::Side::Output));
        assert_eq!(
            rules(openai_strict(&plain)),
            ["/properties/any O4 no `type`"]
        );
        assert_eq!(
            rules(gemini(&plain, false)),
            ["/properties/any G3 no `type`"]
        );
        // An empty object: fine for OpenAI, for Gemini only as a parameterless root.
        let empty = serde_json::json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false});
        assert!(openai_strict(&empty).is_empty());
        assert!(gemini(&empty, true).is_empty());
        assert_eq!(
            rules(gemini(&empty, false)),
            ["/ G6 an object without properties"]
        );
    }
}
