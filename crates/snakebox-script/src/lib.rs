//! PEP 723 inline script metadata, and PEP 508 / PEP 440 validation.
//!
//! Pure functions, no I/O: this crate parses a script's `# /// script` block, merges it with
//! dependencies given alongside the script, and renders a block back. It is the first thing
//! that touches untrusted input, so it is fuzzed.
//!
//! It depends on no other snakebox crate and knows nothing of uv, sandboxes or MCP. The one
//! design decision that shapes it: the user's script is only ever *read*. The engine runs it
//! exactly as written, block included; merged metadata travels beside the script, never
//! spliced into it.
//!
//! - [`parse`] finds the block and returns typed metadata, or the first problem;
//! - [`validate`] returns every problem, with positions and hints, for `validate_script`;
//! - [`merge_dependencies`] applies the call's `dependencies` on top of the script's;
//! - [`render`] writes a block back; [`select_python`] picks an interpreter.
#![deny(missing_docs)]

mod error;
mod merge;
mod metadata;
mod pep723;
mod python;
mod render;
mod requirement;
mod validate;

use std::ops::Range;

pub use error::{ScriptError, UnsafeReason};
pub use merge::merge_dependencies;
pub use metadata::ScriptMetadata;
pub use python::{matching_pythons, select_python};
pub use render::render;
pub use requirement::{
    MAX_MARKER_NESTING, MAX_REQUIREMENT_BYTES, is_exact_pin, normalize_name, parse_requirement,
};
pub use validate::{Problem, ProblemKind, validate};

/// A script's `# /// script` block.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptBlock {
    /// The block's metadata.
    pub metadata: ScriptMetadata,
    /// Bytes of the script from the `#` of `# /// script` to the end of the closing `# ///`
    /// (its line terminator excluded). For display only: the script is never changed.
    pub span: Range<usize>,
}

/// Finds and reads the script's `# /// script` block; `Ok(None)` when it has none.
///
/// # Errors
///
/// One problem, when there are any: first a problem with the blocks themselves (the earliest of
/// [`ScriptError::MultipleBlocks`] and [`ScriptError::UnclosedBlock`]), else the first problem
/// in the block's content, in the order `requires-python`, `dependencies`, `tool`:
/// [`ScriptError::MalformedToml`], [`ScriptError::WrongType`],
/// [`ScriptError::InvalidRequirement`], [`ScriptError::UnsafeRequirement`] or
/// [`ScriptError::InvalidRequiresPython`].
pub fn parse(script: &str) -> Result<Option<ScriptBlock>, ScriptError> {
    let scan = pep723::scan(script);
    // > "When there are multiple comment blocks of the same TYPE defined, tools MUST produce an
    // > error."
    let multiple = scan.blocks.get(1).map(|second| {
        let first_line = scan.blocks[0].opening_line;
        let second_line = second.opening_line;
        (
            second_line,
            ScriptError::MultipleBlocks {
                first_line,
                second_line,
            },
        )
    });
    // An unclosed `# /// script` is an error too (a deliberate deviation: see `pep723`).
    let unclosed = scan
        .unclosed
        .first()
        .map(|&line| (line, ScriptError::UnclosedBlock { line }));
    let earliest = match (multiple, unclosed) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    };
    if let Some((_, error)) = earliest {
        return Err(error);
    }
    let Some(block) = scan.blocks.first() else {
        return Ok(None);
    };
    let read = metadata::read(block);
    if let Some(first) = read.problems.into_iter().next() {
        return Err(first.error);
    }
    Ok(Some(ScriptBlock {
        metadata: read.metadata,
        span: block.span.clone(),
    }))
}
