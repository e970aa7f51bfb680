//! Checking a script and its call-level dependencies without running anything.
//!
//! Unlike [`crate::parse`], which stops at the first problem, [`validate`] reports every problem
//! it can find, each with a position and a hint, for the `validate_script` tool. Python syntax
//! is not checked here (the engine asks a real interpreter).

use pep440_rs::Version;
use serde::Serialize;

use crate::error::ScriptError;
use crate::metadata;
use crate::pep723;
use crate::python::{matching_pythons, no_matching_python};
use crate::requirement::parse_requirement;

/// What kind of problem a [`Problem`] is. Serialises in `snake_case` (`"malformed_toml"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// The block's content is not valid TOML.
    MalformedToml,
    /// More than one `# /// script` block.
    MultipleBlocks,
    /// A `# /// script` block without its closing `# ///`.
    UnclosedBlock,
    /// A known key has a value of the wrong type.
    WrongType,
    /// A dependency is not a valid PEP 508 dependency specifier.
    InvalidRequirement,
    /// A dependency is refused for safety (environment variable expansion, control characters).
    UnsafeRequirement,
    /// `requires-python` is not a valid PEP 440 version specifier set.
    InvalidRequiresPython,
    /// No available interpreter satisfies `requires-python`.
    NoMatchingPython,
}

impl ScriptError {
    /// The [`ProblemKind`] this error is reported as.
    #[must_use]
    pub fn kind(&self) -> ProblemKind {
        match self {
            Self::MultipleBlocks { .. } => ProblemKind::MultipleBlocks,
            Self::UnclosedBlock { .. } => ProblemKind::UnclosedBlock,
            Self::MalformedToml { .. } => ProblemKind::MalformedToml,
            Self::WrongType { .. } => ProblemKind::WrongType,
            Self::InvalidRequirement { .. } => ProblemKind::InvalidRequirement,
            Self::UnsafeRequirement { .. } => ProblemKind::UnsafeRequirement,
            Self::InvalidRequiresPython { .. } => ProblemKind::InvalidRequiresPython,
            Self::NoMatchingPython { .. } => ProblemKind::NoMatchingPython,
        }
    }
}

/// One problem found by [`validate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// What kind of problem.
    pub kind: ProblemKind,
    /// What is wrong, with the offending value in backticks.
    pub message: String,
    /// 1-based line in the script, for problems found in the script.
    pub line: Option<usize>,
    /// 1-based column (in characters) in the script, for problems found in the script.
    pub column: Option<usize>,
    /// How to fix it.
    pub hint: Option<String>,
    /// 0-based index into the `dependencies` argument, for problems found there.
    pub dependency_index: Option<usize>,
}

impl Problem {
    fn new(error: &ScriptError, position: Option<(usize, usize)>) -> Self {
        Self {
            kind: error.kind(),
            message: error.to_string(),
            line: position.map(|(line, _)| line),
            column: position.map(|(_, column)| column),
            hint: error.hint(),
            dependency_index: None,
        }
    }
}

impl From<&ScriptError> for Problem {
    fn from(error: &ScriptError) -> Self {
        Self::new(error, None)
    }
}

/// Every problem in a script's metadata and in the call-level dependencies, script problems
/// first (in line order), then those of `dependencies` (in list order). Empty when all is well.
///
/// `available_pythons` are the interpreter versions the server has; when `requires-python`
/// matches none of them, that is a [`ProblemKind::NoMatchingPython`] whose hint lists them.
#[must_use]
pub fn validate(
    script: &str,
    dependencies: &[String],
    available_pythons: &[Version],
) -> Vec<Problem> {
    let scan = pep723::scan(script);
    let mut located = Vec::new();

    for &line in &scan.unclosed {
        located.push(metadata::Located {
            error: ScriptError::UnclosedBlock { line },
            position: Some((line, 1)),
        });
    }
    if let Some(first) = scan.blocks.first() {
        // > "When there are multiple comment blocks of the same TYPE defined, tools MUST
        // > produce an error."
        for other in &scan.blocks[1..] {
            located.push(metadata::Located {
                error: ScriptError::MultipleBlocks {
                    first_line: first.opening_line,
                    second_line: other.opening_line,
                },
                position: Some((other.opening_line, 1)),
            });
        }
    }
    for block in &scan.blocks {
        let read = metadata::read(block);
        located.extend(read.problems);
        if let Some(requires) = &read.metadata.requires_python
            && matching_pythons(Some(requires), available_pythons).is_empty()
        {
            located.push(metadata::Located {
                error: no_matching_python(Some(requires), available_pythons),
                position: read.requires_python_position,
            });
        }
    }
    // Stable: problems at one position keep the order they were found in.
    located.sort_by_key(|problem| problem.position.unwrap_or((usize::MAX, usize::MAX)));

    let mut problems: Vec<Problem> = located
        .iter()
        .map(|problem| Problem::new(&problem.error, problem.position))
        .collect();
    for (index, dependency) in dependencies.iter().enumerate() {
        if let Err(error) = parse_requirement(dependency) {
            problems.push(Problem {
                dependency_index: Some(index),
                ..Problem::from(&error)
            });
        }
    }
    problems
}
