//! Arguments a client added on its own, told apart from a caller's typos.
//!
//! Some clients put arguments of their own into every tool call (Gemini CLI adds
//! `wait_for_previous`). Refusing unknown fields would make every such call fail, and
//! accepting anything would let a misspelled argument (`sesion_id`) be silently dropped, so
//! the code runs somewhere the caller did not mean. One rule for every tool, applied before
//! its parameters are read: an argument the tool's input schema does not name is refused
//! when it looks like one it does name (a hint says which), and otherwise set aside; the
//! result then says which arguments were ignored. An argument of the wrong type gets an
//! error in the form of every other, naming the argument and the type it needs.
//!
//! A few arguments have a second name, the one the systems snakebox replaces gave them, so
//! that prompts written for those keep working ([`ALIASES`]): read as the argument they mean,
//! never listed in a schema, and the result says which name was used.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};

/// Arguments under the name another system gave them: (tool, that name, the argument it
/// means). IBM's python sandbox and the python code executor call a script `code` and its
/// time limit `timeout` (issue 36).
const ALIASES: &[(&str, &str, &str)] = &[
    ("execute_python", "code", "script"),
    ("execute_python", "timeout", "timeout_seconds"),
];

/// Rename in `arguments` each argument of `tool` given under its other name ([`ALIASES`]).
/// Returns `(other name, argument)` of each renamed. A name the served tool's own schema
/// has is its argument, never another name: the code executor's `execute_python(code,
/// timeout)`, served in place of snakebox's by `--compat-tools code-executor`, keeps them.
///
/// # Errors
/// An argument given under both names (`invalid_params`, saying to give one).
pub(crate) fn read_aliases(
    tool: &Tool,
    arguments: &mut JsonObject,
) -> Result<Vec<(&'static str, &'static str)>, ErrorData> {
    let own = tool
        .input_schema
        .get("properties")
        .and_then(serde_json::Value::as_object);
    let is_own = |name: &str| own.is_some_and(|properties| properties.contains_key(name));
    let tool = tool.name.as_ref();
    let mut read = Vec::new();
    for (_, alias, meant) in ALIASES
        .iter()
        .filter(|(name, alias, _)| *name == tool && !is_own(alias))
    {
        let Some(value) = arguments.remove(*alias) else {
            continue;
        };
        if arguments.contains_key(*meant) {
            return Err(ErrorData::invalid_params(
                format!(
                    "{tool} was given both `{meant}` and `{alias}`, which is another name of \
                     `{meant}`; give `{meant}` only"
                ),
                None,
            ));
        }
        arguments.insert((*meant).to_owned(), value);
        read.push((*alias, *meant));
    }
    Ok(read)
}

/// Say in the result which arguments were read under their other name (see [`ALIASES`]).
pub(crate) fn note_aliases(result: &mut CallToolResult, read: &[(&str, &str)]) {
    for (alias, meant) in read {
        note(
            result,
            format!("read `{alias}` as `{meant}` (this tool's name for it)"),
        );
    }
}

/// Take out of `arguments` those `tool` does not know. Returns their names (sorted).
///
/// # Errors
/// An unknown argument that looks like a misspelling of a known one (`invalid_params`, with
/// the argument the caller probably meant).
pub(crate) fn set_aside_foreign(
    tool: &Tool,
    arguments: &mut JsonObject,
) -> Result<Vec<String>, ErrorData> {
    let known: Vec<&str> = tool
        .input_schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|properties| properties.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut foreign: Vec<String> = arguments
        .keys()
        .filter(|key| !known.contains(&key.as_str()))
        .cloned()
        .collect();
    foreign.sort();
    for name in &foreign {
        if let Some(meant) = known.iter().find(|known| looks_like(name, known)) {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown argument `{name}` for {}; did you mean `{meant}`? (arguments: {})",
                    tool.name,
                    known.join(", ")
                ),
                None,
            ));
        }
    }
    for name in &foreign {
        arguments.remove(name);
    }
    Ok(foreign)
}

/// Say in the result which arguments were ignored: a `notes` entry when the structured result
/// has notes (execute_python, run_command), and a text line either way.
pub(crate) fn note_ignored(result: &mut CallToolResult, ignored: &[String]) {
    if ignored.is_empty() {
        return;
    }
    let names = ignored
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    note(
        result,
        format!("ignored argument {names}: not one of this tool's (a client added it)"),
    );
}

/// Add `note` to the result: to its `notes` when the structured result has them
/// (execute_python, run_command), and as a text line either way.
fn note(result: &mut CallToolResult, note: String) {
    if let Some(notes) = result
        .structured_content
        .as_mut()
        .and_then(|content| content.get_mut("notes"))
        .and_then(serde_json::Value::as_array_mut)
    {
        notes.push(serde_json::Value::String(note.clone()));
    }
    result
        .content
        .push(ContentBlock::text(format!("note: {note}\n")));
}

/// rmcp's words when a tool's arguments do not deserialize into its parameters.
const NOT_DESERIALIZED: &str = "failed to deserialize parameters: ";

/// Arguments whose JSON type the tool's input schema does not allow, as hint phrases
/// (`` `script` must be a string, not a number ``). Read before the call, kept for
/// [`explain_unfit`].
pub(crate) fn wrong_types(tool: &Tool, arguments: Option<&JsonObject>) -> Vec<String> {
    let Some(arguments) = arguments else {
        return Vec::new();
    };
    let properties = tool
        .input_schema
        .get("properties")
        .and_then(serde_json::Value::as_object);
    let mut wrong = Vec::new();
    for (name, value) in arguments {
        let Some(schema) = properties.and_then(|p| p.get(name)) else {
            continue;
        };
        let mut allowed = Vec::new();
        allowed_types(schema, &mut allowed);
        let given = json_type(value);
        let fits = allowed.is_empty()
            || allowed.contains(&given)
            || (given == "integer" && allowed.contains(&"number"));
        if !fits {
            let wanted: Vec<&str> = allowed.iter().copied().filter(|t| *t != "null").collect();
            wrong.push(format!(
                "`{name}` must be {}, not {}",
                article(&wanted.join(" or ")),
                article(given)
            ));
        }
    }
    wrong
}

/// When rmcp could not read a call's arguments it answers with serde's words alone, naming
/// neither the argument nor the fix. Rewrite that result as every other error is written
/// (`error (invalid): …` and a `hint:`), with what [`wrong_types`] found. Whether it was such
/// a result: a call refused before the tool ran.
pub(crate) fn explain_unfit(tool: &str, wrong: &[String], result: &mut CallToolResult) -> bool {
    if result.is_error != Some(true) || result.structured_content.is_some() {
        return false;
    }
    let [ContentBlock::Text(text)] = result.content.as_slice() else {
        return false;
    };
    let Some(detail) = text.text.strip_prefix(NOT_DESERIALIZED) else {
        return false;
    };
    let hint = if wrong.is_empty() {
        "give the arguments with the names and types of the tool's input schema (tools/list)"
            .to_owned()
    } else {
        format!(
            "{}; the tool's input schema (tools/list) gives every argument's type",
            wrong.join("; ")
        )
    };
    result.content = vec![ContentBlock::text(format!(
        "error (invalid): The arguments do not fit {tool}: {detail}\nhint: {hint}\n"
    ))];
    true
}

/// The JSON types a property's schema allows (`type`, also inside `anyOf`/`oneOf`).
fn allowed_types<'a>(schema: &'a serde_json::Value, into: &mut Vec<&'a str>) {
    match schema.get("type") {
        Some(serde_json::Value::String(name)) => into.push(name),
        Some(serde_json::Value::Array(names)) => {
            into.extend(names.iter().filter_map(serde_json::Value::as_str));
        }
        _ => {}
    }
    for key in ["anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            allowed_types(branch, into);
        }
    }
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn article(noun: &str) -> String {
    match noun {
        "null" => "null".to_owned(),
        "array" | "object" | "integer" => format!("an {noun}"),
        _ => format!("a {noun}"),
    }
}

/// Whether `name` is probably a misspelling of `known`: the same once case, `_` and `-` are
/// ignored, or at most two edits apart (one for short names).
fn looks_like(name: &str, known: &str) -> bool {
    let fold = |s: &str| {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect::<Vec<char>>()
    };
    let (a, b) = (fold(name), fold(known));
    if a == b {
        return true;
    }
    let allowed = if b.len() <= 5 { 1 } else { 2 };
    a.len().abs_diff(b.len()) <= allowed && edit_distance(&a, &b) <= allowed
}

/// Levenshtein distance (small inputs: argument names).
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tool() -> Tool {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"script": {}, "session_id": {}, "timeout_seconds": {}, "files": {}},
        });
        let serde_json::Value::Object(schema) = schema else {
            unreachable!("an object literal")
        };
        Tool::new("execute_python", "runs", Arc::new(schema))
    }

    fn arguments(value: serde_json::Value) -> JsonObject {
        match value {
            serde_json::Value::Object(map) => map,
            _ => JsonObject::new(),
        }
    }

    #[test]
    fn a_clients_own_argument_is_set_aside_and_named() {
        let mut args = arguments(serde_json::json!({"script": "1", "wait_for_previous": true}));
        let ignored = set_aside_foreign(&tool(), &mut args).ok();
        assert_eq!(ignored, Some(vec!["wait_for_previous".to_owned()]));
        assert_eq!(args.keys().collect::<Vec<_>>(), ["script"]);
    }

    #[test]
    fn another_systems_name_of_an_argument_is_read_as_it_and_said() {
        let mut args = arguments(serde_json::json!({"code": "print(1)", "timeout": 5}));
        let read = read_aliases(&tool(), &mut args).ok();
        assert_eq!(
            read,
            Some(vec![("code", "script"), ("timeout", "timeout_seconds")])
        );
        assert_eq!(args["script"], "print(1)");
        assert_eq!(args["timeout_seconds"], 5);
        assert!(!args.contains_key("code") && !args.contains_key("timeout"));
        // Only for the tool whose other system used it.
        let mut args = arguments(serde_json::json!({"session_id": "s", "code": "x"}));
        let read_file = Tool::new("read_file", "reads", tool().input_schema);
        assert_eq!(read_aliases(&read_file, &mut args).ok(), Some(vec![]));
        assert!(args.contains_key("code"));
        // Nor when the tool served under that name has it as its own argument (the code
        // executor's execute_python, issue 36).
        let mut own = (*tool().input_schema).clone();
        own.insert(
            "properties".into(),
            serde_json::json!({"code": {}, "timeout": {}}),
        );
        let theirs = Tool::new("execute_python", "runs", Arc::new(own));
        let mut args = arguments(serde_json::json!({"code": "print(1)", "timeout": 5}));
        assert_eq!(read_aliases(&theirs, &mut args).ok(), Some(vec![]));
        assert!(args.contains_key("code") && args.contains_key("timeout"));
        // Both names: which one was meant is not a guess.
        let mut args = arguments(serde_json::json!({"script": "1", "code": "2"}));
        let refused = read_aliases(&tool(), &mut args).err();
        let message = refused.map(|e| e.message.to_string()).unwrap_or_default();
        assert!(message.contains("give `script` only"), "{message}");
        let mut result = CallToolResult::success(vec![]);
        result.structured_content = Some(serde_json::json!({"notes": []}));
        note_aliases(&mut result, &[("code", "script")]);
        let notes = &result
            .structured_content
            .as_ref()
            .map(|c| c["notes"].clone());
        assert_eq!(
            notes.as_ref().and_then(|n| n[0].as_str()),
            Some("read `code` as `script` (this tool's name for it)")
        );
    }

    #[test]
    fn a_misspelled_argument_is_refused_with_the_one_meant() {
        for typo in [
            "sesion_id",
            "sessionId",
            "SESSION-ID",
            "timeout_second",
            "fils",
        ] {
            let mut args = arguments(serde_json::json!({"script": "1", typo: "x"}));
            let refused = set_aside_foreign(&tool(), &mut args).err();
            let message = refused.map(|e| e.message.to_string()).unwrap_or_default();
            assert!(message.contains("did you mean"), "{typo}: {message}");
        }
        // Far from every known name: set aside, not refused.
        let mut args = arguments(serde_json::json!({"script": "1", "trace_id": "x"}));
        assert!(set_aside_foreign(&tool(), &mut args).is_ok());
    }

    #[test]
    fn an_argument_of_the_wrong_type_is_named_with_the_type_it_needs() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "script": {"type": "string"},
                "timeout_seconds": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "files": {"anyOf": [{"type": "array"}, {"type": "null"}]},
            },
        });
        let serde_json::Value::Object(schema) = schema else {
            unreachable!("an object literal")
        };
        let tool = Tool::new("execute_python", "runs", Arc::new(schema));
        let args =
            arguments(serde_json::json!({"script": 42, "timeout_seconds": 5, "files": null}));
        let wrong = wrong_types(&tool, Some(&args));
        assert_eq!(wrong, ["`script` must be a string, not an integer"]);

        let mut result = CallToolResult::error(vec![ContentBlock::text(
            "failed to deserialize parameters: invalid type: integer `42`, expected a string",
        )]);
        assert!(explain_unfit("execute_python", &wrong, &mut result));
        let [ContentBlock::Text(text)] = result.content.as_slice() else {
            panic!("one text block: {result:?}")
        };
        assert_eq!(
            text.text,
            "error (invalid): The arguments do not fit execute_python: invalid type: integer \
             `42`, expected a string\nhint: `script` must be a string, not an integer; the \
             tool's input schema (tools/list) gives every argument's type\n"
        );

        // Any other error result is left as it is.
        let mut other = CallToolResult::error(vec![ContentBlock::text("error (not_found): x\n")]);
        assert!(!explain_unfit("execute_python", &wrong, &mut other));
        assert!(
            matches!(other.content.as_slice(), [ContentBlock::Text(t)] if t.text == "error (not_found): x\n")
        );
    }

    #[test]
    fn the_note_goes_into_notes_and_the_text() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("out")]);
        result.structured_content = Some(serde_json::json!({"notes": []}));
        note_ignored(&mut result, &["wait_for_previous".to_owned()]);
        let notes = result
            .structured_content
            .as_ref()
            .and_then(|c| c["notes"].as_array().cloned())
            .unwrap_or_default();
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0]
                .as_str()
                .is_some_and(|n| n.contains("wait_for_previous"))
        );
        assert_eq!(result.content.len(), 2);
    }
}
