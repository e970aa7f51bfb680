//! The one error type of this crate, [`ScriptError`], and its hints.
//!
//! Every message says what failed and ends with the offending value in backticks; every variant
//! can say how to fix it through [`ScriptError::hint`]. Values that come from the user are shown
//! escaped (control characters as `\n`, `\u{0}`, …) and cut to a readable length, so a message is
//! always one line whatever the input.
//!
//! Upstream parser errors are kept as text, not as `#[source]`: the `Display` of
//! `pep508_rs::Pep508Error` can panic on some inputs (it asserts on its own span), and a caller
//! that walks the source chain (anyhow does) must never be able to trigger that.

use thiserror::Error;

/// Longest user value (in characters) quoted in a message before it is cut.
const MAX_SHOWN_CHARS: usize = 120;

/// Something wrong with a script's metadata or with the dependencies given alongside it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// Two or more `# /// script` blocks in one script.
    #[error(
        "Found a second `# /// script` block at line {second_line} (the first starts at line {first_line})"
    )]
    MultipleBlocks {
        /// 1-based line of the first block's opening line.
        first_line: usize,
        /// 1-based line of the second block's opening line.
        second_line: usize,
    },

    /// A `# /// script` opening line without a matching `# ///` closing line.
    #[error("The `# /// script` block opened at line {line} is never closed by a `# ///` line")]
    UnclosedBlock {
        /// 1-based line of the opening line.
        line: usize,
    },

    /// The block's content is not valid TOML.
    #[error("Failed to parse the `script` block as TOML: {}", shown(message))]
    MalformedToml {
        /// What the TOML parser said.
        message: String,
    },

    /// A known key holds a value of the wrong type (`dependencies = "x"`, `requires-python = 3.11`).
    #[error("Expected {expected} for `{key}`, found {found}")]
    WrongType {
        /// The key, with an index for list items (`dependencies[2]`).
        key: String,
        /// What the PEP asks for ("a list of strings").
        expected: &'static str,
        /// What was there ("a string", "an integer").
        found: &'static str,
    },

    /// A dependency that is not a valid PEP 508 dependency specifier.
    #[error(
        "Failed to parse the dependency specifier `{}`: {}",
        shown(requirement),
        shown(reason)
    )]
    InvalidRequirement {
        /// The string as given.
        requirement: String,
        /// What the PEP 508 parser said.
        reason: String,
    },

    /// A dependency that parses, but that snakebox refuses for safety.
    #[error("Refused the dependency specifier `{}`: {reason}", shown(requirement))]
    UnsafeRequirement {
        /// The string as given.
        requirement: String,
        /// Why it is refused.
        reason: UnsafeReason,
    },

    /// `requires-python` is not a valid PEP 440 version specifier set.
    #[error(
        "Failed to parse `requires-python` as a version specifier: {} in `{}`",
        shown(reason),
        shown(value)
    )]
    InvalidRequiresPython {
        /// The value as given.
        value: String,
        /// What the PEP 440 parser said.
        reason: String,
    },

    /// No interpreter the server has satisfies `requires-python`.
    #[error(
        "No available Python interpreter satisfies `requires-python = \"{}\"`",
        shown(requires_python)
    )]
    NoMatchingPython {
        /// The specifier set, as text.
        requires_python: String,
        /// The interpreter versions the server has.
        available: Vec<String>,
    },
}

/// Why a syntactically valid dependency is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UnsafeReason {
    /// `${NAME}` would be expanded from the server's environment by the PEP 508 URL parser
    /// (and by uv), leaking its value into a URL.
    #[error("it contains `${{`, which would expand an environment variable of the server")]
    EnvironmentVariable,
    /// A control character (newline, NUL, …) could split the requirement into several lines of
    /// a requirements file.
    #[error("it contains a control character")]
    ControlCharacter,
    /// Longer than [`crate::MAX_REQUIREMENT_BYTES`]: marker evaluation grows much faster than
    /// the text (a 7 kB marker takes seconds), so length is bounded.
    #[error("it is longer than {} bytes", crate::MAX_REQUIREMENT_BYTES)]
    TooLong,
    /// Parentheses nested deeper than [`crate::MAX_MARKER_NESTING`]: the PEP 508 parser
    /// recurses on each, and a deep enough nest overflows the stack and aborts the server.
    #[error("it nests parentheses more than {} deep", crate::MAX_MARKER_NESTING)]
    TooDeep,
}

impl ScriptError {
    /// How to fix the problem, for a `hint:` line or a `hint` field.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::MultipleBlocks { .. } => Some(
                "keep a single `# /// script` block; a block inside a string literal counts too \
                 when its lines start at column 0 with `#` (PEP 723 works on lines): indent it or \
                 change its first line"
                    .to_owned(),
            ),
            Self::UnclosedBlock { .. } => Some(
                "end the block with a line that is exactly `# ///`; every line in between must be \
                 `#` alone or start with `# `"
                    .to_owned(),
            ),
            Self::MalformedToml { .. } => Some(
                "the block's lines, without their leading `# `, must form a valid TOML document, \
                 e.g. `# dependencies = [\"requests>=2.31\"]`"
                    .to_owned(),
            ),
            Self::WrongType { key, .. } => Some(match key_root(key) {
                "dependencies" => {
                    "write `dependencies` as a list of strings, e.g. `dependencies = [\"requests>=2.31\", \"pandas>=2.2\"]`"
                        .to_owned()
                }
                "requires-python" => {
                    "write `requires-python` as a quoted string, e.g. `requires-python = \">=3.11\"`"
                        .to_owned()
                }
                "tool" => "`tool` must be a table, e.g. `[tool.uv]`".to_owned(),
                _ => return None,
            }),
            Self::InvalidRequirement { .. } => Some(
                "use a PEP 508 dependency specifier: a package name, optional extras and version \
                 constraints, e.g. `requests>=2.31`, `pandas[excel]==2.2.2`"
                    .to_owned(),
            ),
            Self::UnsafeRequirement { reason, .. } => Some(match reason {
                UnsafeReason::EnvironmentVariable => {
                    "write the URL in full, without `${...}`".to_owned()
                }
                UnsafeReason::TooLong | UnsafeReason::TooDeep => {
                    "simplify the environment marker; real-world dependency specifiers are far \
                     shorter"
                        .to_owned()
                }
                UnsafeReason::ControlCharacter => {
                    "give one dependency per list item, without newlines or other control characters"
                        .to_owned()
                }
            }),
            Self::InvalidRequiresPython { value, .. } => {
                let trimmed = value.trim();
                if trimmed.parse::<pep440_rs::Version>().is_ok() {
                    Some(format!(
                        "add an operator: `requires-python = \">={trimmed}\"` for this version or newer"
                    ))
                } else {
                    Some(
                        "use a PEP 440 version specifier, e.g. `requires-python = \">=3.11\"`"
                            .to_owned(),
                    )
                }
            }
            Self::NoMatchingPython { available, .. } => Some(if available.is_empty() {
                "this server has no Python interpreter; ask its operator to install one".to_owned()
            } else {
                format!(
                    "available Python versions: {}; relax `requires-python`, e.g. `>={}`",
                    available.join(", "),
                    lowest_minor(available)
                )
            }),
        }
    }
}

/// `dependencies[3]` → `dependencies`.
fn key_root(key: &str) -> &str {
    key.split('[').next().unwrap_or(key)
}

/// `["3.12.3", "3.11.7"]` → `3.11` (the lowest `major.minor`), for a hint.
fn lowest_minor(available: &[String]) -> String {
    available
        .iter()
        .filter_map(|v| v.parse::<pep440_rs::Version>().ok())
        .min()
        .map_or_else(String::new, |v| {
            v.release()
                .iter()
                .take(2)
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(".")
        })
}

/// A user value made safe for a one-line message: control characters escaped, cut when long.
pub(crate) fn shown(value: &str) -> String {
    let mut out = String::new();
    for (count, c) in value.chars().enumerate() {
        if count == MAX_SHOWN_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_and_cuts() {
        assert_eq!(shown("a\nb"), "a\\nb");
        assert_eq!(shown(&"x".repeat(500)).chars().count(), MAX_SHOWN_CHARS + 1);
    }

    #[test]
    fn every_variant_has_a_hint() {
        let errors = [
            ScriptError::MultipleBlocks {
                first_line: 1,
                second_line: 5,
            },
            ScriptError::UnclosedBlock { line: 1 },
            ScriptError::MalformedToml {
                message: "x".into(),
            },
            ScriptError::WrongType {
                key: "dependencies[0]".into(),
                expected: "a string",
                found: "an integer",
            },
            ScriptError::InvalidRequirement {
                requirement: "x".into(),
                reason: "y".into(),
            },
            ScriptError::UnsafeRequirement {
                requirement: "x".into(),
                reason: UnsafeReason::ControlCharacter,
            },
            ScriptError::InvalidRequiresPython {
                value: "3.11".into(),
                reason: "y".into(),
            },
            ScriptError::NoMatchingPython {
                requires_python: ">=3.14".into(),
                available: vec!["3.12.3".into(), "3.11.7".into()],
            },
        ];
        for error in errors {
            assert!(error.hint().is_some(), "{error:?}");
        }
    }

    #[test]
    fn requires_python_hint_suggests_an_operator() {
        let error = ScriptError::InvalidRequiresPython {
            value: "3.11".into(),
            reason: String::new(),
        };
        assert!(error.hint().unwrap().contains("\">=3.11\""));
    }

    #[test]
    fn no_matching_python_hint_lists_versions() {
        let error = ScriptError::NoMatchingPython {
            requires_python: ">=3.14".into(),
            available: vec!["3.12.3".into(), "3.11.7".into()],
        };
        let hint = error.hint().unwrap();
        assert!(hint.contains("3.12.3, 3.11.7"), "{hint}");
        assert!(hint.contains("`>=3.11`"), "{hint}");
    }
}
