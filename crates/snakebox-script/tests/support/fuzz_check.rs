//! The properties checked on arbitrary input, shared by the stable smoke test
//! (`tests/fuzz_smoke.rs`) and the cargo-fuzz target (`fuzz/fuzz_targets/pep723_parse.rs`),
//! which includes this file by path.
//!
//! Beyond "never panics": `parse` fails exactly when `validate` finds a problem in the script,
//! a parsed block's span is a block, `render` round-trips, and messages stay on one line.

use std::str::FromStr;

use pep440_rs::Version;
use snakebox_script::{
    ProblemKind, is_exact_pin, merge_dependencies, normalize_name, parse, render, validate,
};

/// Checks every property on one input. Panics (so the harness reports it) when one fails.
pub(crate) fn check(input: &str) {
    let pythons: Vec<Version> = ["3.11.7", "3.12.3", "3.13.1"]
        .iter()
        .filter_map(|v| Version::from_str(v).ok())
        .collect();
    // Call-level dependencies taken from the input itself, so they are arbitrary too.
    let extra: Vec<String> = input.lines().take(3).map(str::to_owned).collect();

    let parsed = parse(input);
    let problems = validate(input, &[], &pythons);
    let script_problems = problems
        .iter()
        .any(|p| p.kind != ProblemKind::NoMatchingPython);
    assert_eq!(
        parsed.is_err(),
        script_problems,
        "parse and validate disagree: {parsed:?} vs {problems:?}"
    );
    if let Err(error) = &parsed {
        assert!(
            problems.iter().any(|p| p.kind == error.kind()),
            "{error:?} not in {problems:?}"
        );
        assert!(
            !error.to_string().contains('\n'),
            "multi-line message: {error}"
        );
        let _ = error.hint();
    }
    for problem in validate(input, &extra, &pythons) {
        assert!(
            !problem.message.contains('\n'),
            "multi-line message: {}",
            problem.message
        );
    }

    let metadata = match parsed {
        Ok(Some(block)) => {
            let text = input
                .get(block.span.clone())
                .expect("span on char boundaries");
            assert!(text.starts_with("# /// script"), "span {text:?}");
            assert!(text.ends_with("# ///"), "span {text:?}");
            Some(block.metadata)
        }
        Ok(None) | Err(_) => None,
    };

    if let Some(metadata) = &metadata {
        for dependency in &metadata.dependencies {
            let _ = is_exact_pin(dependency);
        }
        let rendered = render(metadata);
        let again = parse(&rendered)
            .unwrap_or_else(|e| panic!("rendered block does not parse: {e}\n{rendered}"))
            .unwrap_or_else(|| panic!("rendered block not found:\n{rendered}"))
            .metadata;
        assert_eq!(
            again.requires_python, metadata.requires_python,
            "{rendered}"
        );
        assert_eq!(again.dependencies, metadata.dependencies, "{rendered}");
        assert_eq!(render(&again), rendered, "render is not stable");
    }

    let merged = merge_dependencies(metadata.as_ref(), &extra);
    if let Ok(merged) = merged {
        let script_count = metadata.as_ref().map_or(0, |m| m.dependencies.len());
        assert!(merged.len() <= script_count + extra.len());
        assert!(merged.len() >= extra.len());
    }

    let name = normalize_name(input);
    assert_eq!(
        normalize_name(&name),
        name,
        "normalize_name is not idempotent"
    );
}
