//! The content of a `script` block: TOML, then the typed fields PEP 723 defines.
//!
//! Reading collects every problem instead of stopping at the first, each with its position in
//! the script, so that `validate` can report them all and `parse` can return the first.

use std::str::FromStr;

use pep440_rs::VersionSpecifiers;
use pep508_rs::Requirement;
use serde::Deserialize;
use toml::{Spanned, Value};

use crate::error::ScriptError;
use crate::pep723::RawBlock;
use crate::requirement::parse_requirement;

/// The `requires-python` key.
pub(crate) const REQUIRES_PYTHON: &str = "requires-python";
/// The `dependencies` key.
pub(crate) const DEPENDENCIES: &str = "dependencies";
/// The `tool` key.
pub(crate) const TOOL: &str = "tool";

/// Parsed `script` metadata.
///
/// `requires_python` and `dependencies` are the typed forms of the two keys PEP 723 defines;
/// `table` keeps the whole TOML document as written, including those two keys, `[tool.uv]` and
/// any unknown key. [`crate::render`] writes the typed fields and every *other* key of `table`,
/// so changing the typed fields is how to change the rendered block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScriptMetadata {
    /// > "`requires-python`: A string that specifies the Python version(s) with which the script
    /// > is compatible. The value of this field MUST be a valid version specifier."
    pub requires_python: Option<VersionSpecifiers>,
    /// > "`dependencies`: A list of strings that specifies the runtime dependencies of the script.
    /// > Each entry MUST be a valid dependency specifier."
    pub dependencies: Vec<Requirement>,
    /// Every key of the block's TOML.
    pub table: toml::Table,
}

/// A problem with its 1-based (line, column) in the script, when known.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    pub(crate) error: ScriptError,
    pub(crate) position: Option<(usize, usize)>,
}

/// Positions of the known keys' values, read in a second pass (a `toml::Table` has none).
#[derive(Deserialize, Default)]
struct KeySpans {
    #[serde(rename = "requires-python")]
    requires_python: Option<Spanned<Value>>,
    dependencies: Option<Spanned<Value>>,
    tool: Option<Spanned<Value>>,
}

/// Positions of each item of `dependencies`, when it is a list.
#[derive(Deserialize, Default)]
struct ItemSpans {
    dependencies: Option<Vec<Spanned<Value>>>,
}

/// What reading a block gave.
#[derive(Debug, Default)]
pub(crate) struct Read {
    /// Everything that was valid.
    pub(crate) metadata: ScriptMetadata,
    /// Every problem, in the order of the keys (a TOML error ends the reading).
    pub(crate) problems: Vec<Located>,
    /// Where the `requires-python` value is, for a problem found later.
    pub(crate) requires_python_position: Option<(usize, usize)>,
}

/// Reads a block's content.
pub(crate) fn read(block: &RawBlock) -> Read {
    let mut problems = Vec::new();
    let table = match toml::from_str::<toml::Table>(&block.content) {
        Ok(table) => table,
        Err(err) => {
            let position = err.span().map(|span| block.locate(span.start));
            let error = ScriptError::MalformedToml {
                message: err.message().trim().to_owned(),
            };
            problems.push(Located { error, position });
            return Read {
                problems,
                ..Read::default()
            };
        }
    };
    // Spans are a nicety: a failure here only loses positions.
    let spans: KeySpans = toml::from_str(&block.content).unwrap_or_default();
    let at = |spanned: Option<&Spanned<Value>>| spanned.map(|s| block.locate(s.span().start));

    let mut metadata = ScriptMetadata::default();
    let mut requires_python_position = None;

    if let Some(value) = table.get(REQUIRES_PYTHON) {
        let position = at(spans.requires_python.as_ref());
        requires_python_position = position;
        match value {
            Value::String(text) => match VersionSpecifiers::from_str(text) {
                Ok(specifiers) => metadata.requires_python = Some(specifiers),
                Err(err) => problems.push(Located {
                    error: ScriptError::InvalidRequiresPython {
                        value: text.clone(),
                        reason: specifiers_reason(&err),
                    },
                    position,
                }),
            },
            other => problems.push(Located {
                error: wrong_type(REQUIRES_PYTHON.to_owned(), "a string", other),
                position,
            }),
        }
    }

    if let Some(value) = table.get(DEPENDENCIES) {
        let position = at(spans.dependencies.as_ref());
        match value {
            Value::Array(items) => {
                let item_spans = if items.is_empty() {
                    Vec::new()
                } else {
                    toml::from_str::<ItemSpans>(&block.content)
                        .ok()
                        .and_then(|spans| spans.dependencies)
                        .unwrap_or_default()
                };
                for (index, item) in items.iter().enumerate() {
                    let position = at(item_spans.get(index)).or(position);
                    match item {
                        Value::String(text) => match parse_requirement(text) {
                            Ok(requirement) => metadata.dependencies.push(requirement),
                            Err(error) => problems.push(Located { error, position }),
                        },
                        other => problems.push(Located {
                            error: wrong_type(
                                format!("{DEPENDENCIES}[{index}]"),
                                "a string",
                                other,
                            ),
                            position,
                        }),
                    }
                }
            }
            other => problems.push(Located {
                error: wrong_type(DEPENDENCIES.to_owned(), "a list of strings", other),
                position,
            }),
        }
    }

    // > "This document MAY include the top-level fields `dependencies` and `requires-python`, and
    // > MAY optionally include a `[tool]` table."
    // > "The `[tool]` table MAY be used by any tool, script runner or otherwise, to configure
    // > behavior. It has the same semantics as the `[tool]` table in `pyproject.toml`."
    // So `tool` must be a table; its content, and any other key, is kept as written.
    if let Some(value) = table.get(TOOL)
        && !value.is_table()
    {
        problems.push(Located {
            error: wrong_type(TOOL.to_owned(), "a table", value),
            position: at(spans.tool.as_ref()),
        });
    }

    metadata.table = table;
    Read {
        metadata,
        problems,
        requires_python_position,
    }
}

fn wrong_type(key: String, expected: &'static str, found: &Value) -> ScriptError {
    ScriptError::WrongType {
        key,
        expected,
        found: describe(found),
    }
}

/// "a string", "an integer", … for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

/// The first line of the PEP 440 parser's message, without its caret drawing.
pub(crate) fn specifiers_reason(err: &pep440_rs::VersionSpecifiersParseError) -> String {
    let text = err.to_string();
    let first = text.lines().next().unwrap_or_default();
    first
        .strip_prefix("Failed to parse version: ")
        .unwrap_or(first)
        .trim_end_matches(':')
        .to_owned()
}
