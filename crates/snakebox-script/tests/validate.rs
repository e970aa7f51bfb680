//! `validate`: every problem, with positions and hints.

use std::str::FromStr;

use indoc::indoc;
use pep440_rs::Version;
use snakebox_script::{Problem, ProblemKind, validate};

fn pythons() -> Vec<Version> {
    ["3.11.7", "3.12.3"]
        .iter()
        .map(|v| Version::from_str(v).expect("a version"))
        .collect()
}

fn kinds(problems: &[Problem]) -> Vec<ProblemKind> {
    problems.iter().map(|p| p.kind).collect()
}

/// `name: (script, [dependencies]) => [kinds];` — asserts the kinds `validate` reports, in order.
macro_rules! validate_cases {
    ($($name:ident: ($script:expr, [$($dep:expr),* $(,)?]) => [$($kind:ident),* $(,)?];)*) => {$(
        #[test]
        fn $name() {
            let dependencies: Vec<String> = vec![$($dep.to_string()),*];
            let problems = validate($script, &dependencies, &pythons());
            assert_eq!(kinds(&problems), [$(ProblemKind::$kind),*], "{problems:#?}");
        }
    )*};
}

validate_cases! {
    valid: (indoc! {r#"
        # /// script
        # requires-python = ">=3.11"
        # dependencies = ["rich>=13"]
        # ///
    "#}, ["pandas>=2.2"]) => [];
    no_block: ("print(1)\n", []) => [];
    // See: shared/PEERS.md, "invalid PEP 508 strings pass `validate_script`".
    peer_invalid_strings: (indoc! {r#"
        # /// script
        # dependencies = ["numpy>=", "requests[", "; rm -rf /", "rich"]
        # ///
    "#}, []) => [InvalidRequirement, InvalidRequirement, InvalidRequirement];
    invalid_arguments: ("", ["numpy>=", "ok>=1", "pkg @ https://x.invalid/${HOME}"]) => [InvalidRequirement, UnsafeRequirement];
    peer_dependencies_is_a_string: ("# /// script\n# dependencies = \"x\"\n# ///\n", []) => [WrongType];
    every_kind_of_key_problem: (indoc! {r#"
        # /// script
        # requires-python = 3.11
        # dependencies = ["numpy>=", 7]
        # tool = "uv"
        # ///
    "#}, []) => [WrongType, InvalidRequirement, WrongType, WrongType];
    malformed_toml: ("# /// script\n# dependencies = [\n# ///\n", []) => [MalformedToml];
    two_blocks_and_unclosed: (indoc! {r#"
        # /// script
        # dependencies = ["numpy>="]
        # ///
        import os
        # /// script
        # dependencies = []
        # ///
        import sys
        # /// script
        x = 1
    "#}, []) => [InvalidRequirement, MultipleBlocks, UnclosedBlock];
    requires_python_unparsable: ("# /// script\n# requires-python = \"3.11\"\n# ///\n", []) => [InvalidRequiresPython];
    no_matching_python: ("# /// script\n# requires-python = \">=3.13\"\n# ///\n", []) => [NoMatchingPython];
    matching_python: ("# /// script\n# requires-python = \"~=3.12.0\"\n# ///\n", []) => [];
}

#[test]
fn no_matching_python_lists_the_available_versions() {
    let problems = validate(
        "# /// script\n# requires-python = \">=3.13\"\n# ///\n",
        &[],
        &pythons(),
    );
    let [problem] = problems.as_slice() else {
        panic!("{problems:#?}")
    };
    assert_eq!(
        problem.message,
        "No available Python interpreter satisfies `requires-python = \">=3.13\"`"
    );
    let hint = problem.hint.as_deref().unwrap();
    assert!(hint.contains("3.11.7, 3.12.3"), "{hint}");
    assert_eq!((problem.line, problem.column), (Some(2), Some(21)));
}

#[test]
fn positions_point_into_the_script() {
    let script = indoc! {r#"
        import os
        # /// script
        # requires-python = 3
        # dependencies = [
        #     "rich",
        #     "numpy>=",
        # ]
        # ///
    "#};
    let problems = validate(script, &[], &pythons());
    let positions: Vec<_> = problems.iter().map(|p| (p.line, p.column)).collect();
    // `3` on line 3, column 21; `"numpy>="` on line 6, column 7.
    assert_eq!(
        positions,
        [(Some(3), Some(21)), (Some(6), Some(7))],
        "{problems:#?}"
    );
    assert!(problems[1].message.contains("`numpy>=`"));
}

#[test]
fn malformed_toml_has_a_position() {
    let problems = validate(
        "x = 1\n# /// script\n# dependencies = [\"rich\" \"numpy\"]\n# ///\n",
        &[],
        &pythons(),
    );
    let [problem] = problems.as_slice() else {
        panic!("{problems:#?}")
    };
    assert_eq!(problem.kind, ProblemKind::MalformedToml);
    assert_eq!(problem.line, Some(3));
    assert!(problem.column.is_some());
}

#[test]
fn argument_problems_carry_their_index() {
    let deps = vec!["rich".to_owned(), "requests[".to_owned()];
    let problems = validate("", &deps, &pythons());
    let [problem] = problems.as_slice() else {
        panic!("{problems:#?}")
    };
    assert_eq!(problem.dependency_index, Some(1));
    assert_eq!(problem.line, None);
    assert!(
        problem.message.contains("`requests[`"),
        "{}",
        problem.message
    );
}

#[test]
fn problems_serialise_with_snake_case_kinds() {
    let problems = validate(
        "# /// script\n# dependencies = \"x\"\n# ///\n",
        &[],
        &pythons(),
    );
    let json = serde_json::to_value(&problems).unwrap();
    assert_eq!(json[0]["kind"], "wrong_type");
    assert_eq!(json[0]["line"], 2);
    assert_eq!(json[0]["column"], 18);
    assert!(json[0]["hint"].is_string());
    assert!(json[0]["dependency_index"].is_null());
}

#[test]
fn messages_stay_on_one_line() {
    let deps = vec![
        "a; b == 'x\ny'".to_owned(),
        format!("{}>=", "x".repeat(10_000)),
    ];
    for problem in validate("", &deps, &pythons()) {
        assert!(!problem.message.contains('\n'), "{}", problem.message);
        assert!(problem.message.len() < 1_000, "{}", problem.message.len());
    }
}
