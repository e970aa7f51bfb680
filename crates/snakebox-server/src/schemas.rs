//! The tools' JSON Schemas as every client's validator reads them.
//!
//! schemars writes Rust's integer widths as formats (`uint`, `uint64`, `uint16`, `int64`,
//! `double`): they are not JSON Schema formats, and the TypeScript SDK's validator (Ajv)
//! prints a warning for each one on every connect (112 lines in `claude mcp list`). The
//! range they stand for is already in the schema (`minimum: 0`), so they carry nothing a
//! client can use: every `format` that is not a standard string format is taken out of each
//! tool's input and output schema, once, when the server is built.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::JsonObject;
use serde_json::Value;

/// The formats JSON Schema defines for strings that validators know: these stay.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
];

/// Make every tool schema of `router` plain (see the module documentation).
pub(crate) fn make_plain<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        let mut input = (*tool.input_schema).clone();
        strip_formats(&mut input);
        tool.input_schema = std::sync::Arc::new(input);
        if let Some(output) = &tool.output_schema {
            let mut output = (**output).clone();
            strip_formats(&mut output);
            tool.output_schema = Some(std::sync::Arc::new(output));
        }
    }
}

/// Remove non-standard `format`s everywhere in `schema`.
fn strip_formats(schema: &mut JsonObject) {
    let non_standard = schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|format| !STANDARD_FORMATS.contains(&format));
    if non_standard {
        schema.remove("format");
    }
    for value in schema.values_mut() {
        strip_value(value);
    }
}

fn strip_value(value: &mut Value) {
    match value {
        Value::Object(object) => strip_formats(object),
        Value::Array(items) => items.iter_mut().for_each(strip_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_widths_go_and_string_formats_stay() {
        let Value::Object(mut schema) = serde_json::json!({
            "type": "object",
            "properties": {
                "size": {"type": "integer", "format": "uint64", "minimum": 0},
                "when": {"type": "string", "format": "date-time"},
                "list": {"type": "array", "items": {"type": "number", "format": "double"}},
            },
            "$defs": {"Port": {"anyOf": [{"type": "integer", "format": "uint16"}, {"type": "null"}]}},
        }) else {
            unreachable!("an object literal")
        };
        strip_formats(&mut schema);
        let text = Value::Object(schema).to_string();
        for gone in ["uint64", "double", "uint16"] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
        assert!(text.contains("date-time") && text.contains("\"minimum\":0"));
    }
}
