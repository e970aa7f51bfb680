//! Matching `requires-python` against the interpreters the server has.
//!
//! > "Script runners SHOULD error if no version of Python that satisfies the specified
//! > `requires-python` can be provided."

use pep440_rs::{Version, VersionSpecifiers};

use crate::error::ScriptError;

/// The available versions that satisfy `requires` (all of them when it is `None`), in the order
/// given.
#[must_use]
pub fn matching_pythons<'a>(
    requires: Option<&VersionSpecifiers>,
    available: &'a [Version],
) -> Vec<&'a Version> {
    available
        .iter()
        .filter(|version| requires.is_none_or(|specifiers| specifiers.contains(version)))
        .collect()
}

/// The newest available version that satisfies `requires`.
///
/// # Errors
///
/// [`ScriptError::NoMatchingPython`] when none does (or none is available); its hint lists the
/// available versions.
pub fn select_python<'a>(
    requires: Option<&VersionSpecifiers>,
    available: &'a [Version],
) -> Result<&'a Version, ScriptError> {
    matching_pythons(requires, available)
        .into_iter()
        .max()
        .ok_or_else(|| no_matching_python(requires, available))
}

pub(crate) fn no_matching_python(
    requires: Option<&VersionSpecifiers>,
    available: &[Version],
) -> ScriptError {
    ScriptError::NoMatchingPython {
        requires_python: requires.map_or_else(String::new, ToString::to_string),
        available: available.iter().map(ToString::to_string).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use assert_matches::assert_matches;

    use super::*;

    fn versions(list: &[&str]) -> Vec<Version> {
        list.iter().map(|v| Version::from_str(v).unwrap()).collect()
    }

    fn spec(text: &str) -> VersionSpecifiers {
        VersionSpecifiers::from_str(text).unwrap()
    }

    #[test]
    fn picks_the_newest_match() {
        let available = versions(&["3.11.7", "3.13.1", "3.12.3"]);
        let picked = select_python(Some(&spec(">=3.11,<3.13")), &available).unwrap();
        assert_eq!(picked.to_string(), "3.12.3");
        let picked = select_python(None, &available).unwrap();
        assert_eq!(picked.to_string(), "3.13.1");
    }

    #[test]
    fn minor_wildcard_matches_patch_releases() {
        let available = versions(&["3.11.7"]);
        assert!(select_python(Some(&spec("==3.11.*")), &available).is_ok());
        // PEP 440: `==3.11` means 3.11.0 exactly (zero-padded), not "any 3.11".
        assert!(select_python(Some(&spec("==3.11")), &available).is_err());
    }

    #[test]
    fn none_available() {
        assert_matches!(
            select_python(Some(&spec(">=3.14")), &versions(&["3.11.7", "3.12.3"])),
            Err(ScriptError::NoMatchingPython { available, .. }) if available == ["3.11.7", "3.12.3"]
        );
        assert_matches!(
            select_python(None, &[]),
            Err(ScriptError::NoMatchingPython { .. })
        );
    }
}
