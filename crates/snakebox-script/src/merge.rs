//! Merging the dependencies given with a call into those of the script's block.
//!
//! The contract (`DESIGN.md`): "PEP 723 block and `dependencies` merge; on a name clash the
//! `dependencies` entry wins." A clash is decided on PEP 503 normalised names, so
//! `Foo_Bar`, `foo-bar` and `foo.bar` are one package.

use std::collections::HashSet;

use pep508_rs::Requirement;

use crate::error::ScriptError;
use crate::metadata::ScriptMetadata;
use crate::requirement::{normalize_name, parse_requirement};

/// Merges call-level dependencies into the script's.
///
/// The result is the script's requirements whose name no call entry names, in their order, then
/// every call entry, in its order. A call entry replaces *every* script entry of that name,
/// with their extras and markers: `requests==2.31.0` given with the call overrides a script's
/// `requests[socks]>=2; python_version >= "3.8"` entirely. Several entries of one name on the
/// same side are all kept (uv intersects them).
///
/// # Errors
///
/// The first call entry that is not a valid (or is an unsafe) dependency specifier, as
/// [`ScriptError::InvalidRequirement`] or [`ScriptError::UnsafeRequirement`]. Use
/// [`crate::validate`] to get every problem at once.
pub fn merge_dependencies(
    script: Option<&ScriptMetadata>,
    extra: &[String],
) -> Result<Vec<Requirement>, ScriptError> {
    let extra = extra
        .iter()
        .map(|text| parse_requirement(text))
        .collect::<Result<Vec<_>, _>>()?;
    let overridden: HashSet<String> = extra
        .iter()
        .map(|req| normalize_name(req.name.as_ref()))
        .collect();
    let kept = script
        .into_iter()
        .flat_map(|metadata| metadata.dependencies.iter())
        .filter(|req| !overridden.contains(&normalize_name(req.name.as_ref())))
        .cloned();
    Ok(kept.chain(extra).collect())
}
