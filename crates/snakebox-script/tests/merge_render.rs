//! `merge_dependencies` and `render`.

use std::str::FromStr;

use assert_matches::assert_matches;
use indoc::indoc;
use pep440_rs::VersionSpecifiers;
use snakebox_script::{ScriptError, ScriptMetadata, merge_dependencies, parse, render};

fn metadata(script: &str) -> ScriptMetadata {
    parse(script)
        .expect("valid metadata")
        .expect("a block")
        .metadata
}

/// `name: (script dependencies, [call dependencies]) => [merged];`
macro_rules! merge_cases {
    ($($name:ident: ([$($script:expr),* $(,)?], [$($call:expr),* $(,)?]) => [$($merged:expr),* $(,)?];)*) => {$(
        #[test]
        fn $name() {
            let script_deps: Vec<String> = vec![$(format!("{:?}", $script)),*];
            let script = format!("# /// script\n# dependencies = [{}]\n# ///\n", script_deps.join(", "));
            let script = metadata(&script);
            let call: Vec<String> = vec![$($call.to_string()),*];
            let merged = merge_dependencies(Some(&script), &call).unwrap();
            let merged: Vec<String> = merged.iter().map(ToString::to_string).collect();
            let expected: Vec<&str> = vec![$($merged),*];
            assert_eq!(merged, expected);
        }
    )*};
}

merge_cases! {
    call_wins_on_clash: (["requests>=2", "rich"], ["Requests==2.31.0"]) => ["rich", "requests==2.31.0"]; // names print normalised
    pep503_underscore: (["Foo_Bar>=1"], ["foo-bar==2"]) => ["foo-bar==2"];
    pep503_dot: (["foo.bar>=1"], ["FOO_BAR==2"]) => ["foo-bar==2"];
    pep503_runs: (["foo._-bar>=1"], ["foo-bar==2"]) => ["foo-bar==2"];
    order_script_then_call: (["b", "a", "c"], ["z", "y"]) => ["b", "a", "c", "z", "y"];
    override_drops_extras_and_markers: (["requests[socks]>=2; python_version >= '3.8'", "rich"], ["requests==2.31.0"])
        => ["rich", "requests==2.31.0"];
    every_script_entry_of_the_name_goes: (["a>=1", "a<3", "b"], ["a==2"]) => ["b", "a==2"];
    duplicates_in_the_call_are_kept: (["b"], ["a>=1", "a<3"]) => ["b", "a>=1", "a<3"];
    nothing_given: ([], []) => [];
}

#[test]
fn merge_without_a_script_block() {
    let merged = merge_dependencies(None, &["pandas>=2.2".to_owned()]).unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].to_string(), "pandas>=2.2");
}

#[test]
fn merge_rejects_invalid_call_dependencies() {
    assert_matches!(
        merge_dependencies(None, &["rich".to_owned(), "numpy>=".to_owned()]),
        Err(ScriptError::InvalidRequirement { requirement, .. }) if requirement == "numpy>="
    );
    assert_matches!(
        merge_dependencies(None, &["x @ https://h.invalid/${TOKEN}".to_owned()]),
        Err(ScriptError::UnsafeRequirement { .. })
    );
}

#[test]
fn render_exact_output() {
    let metadata = metadata(indoc! {r#"
        # /// script
        # dependencies = ["requests >= 2.31", 'rich']
        # requires-python = ">= 3.11"
        # ///
    "#});
    assert_eq!(
        render(&metadata),
        indoc! {r#"
            # /// script
            # requires-python = ">=3.11"
            # dependencies = [
            #     "requests>=2.31",
            #     "rich",
            # ]
            # ///
        "#}
    );
}

#[test]
fn render_keeps_tool_and_unknown_keys() {
    let original = metadata(indoc! {r#"
        # /// script
        # dependencies = ["rich"]
        # x-custom = [1, 2]
        #
        # [tool.uv]
        # exclude-newer = "2024-01-01T00:00:00Z"
        # [tool.uv.sources]
        # rich = { index = "internal" }
        # ///
    "#});
    let rendered = render(&original);
    assert!(rendered.contains("# [tool.uv]\n"), "{rendered}");
    let again = metadata(&rendered);
    assert_eq!(again, original);
}

#[test]
fn render_adds_requires_python_when_absent() {
    // What the engine does: keep the user's keys, fill in what is missing, merge dependencies.
    let mut metadata = metadata(
        "# /// script\n# dependencies = [\"rich\"]\n# [tool.uv]\n# offline = true\n# ///\n",
    );
    assert!(metadata.requires_python.is_none());
    metadata.requires_python = Some(VersionSpecifiers::from_str(">=3.12").unwrap());
    metadata.dependencies =
        merge_dependencies(Some(&metadata), &["pandas>=2.2".to_owned()]).unwrap();
    let rendered = render(&metadata);
    assert_eq!(
        rendered,
        indoc! {r#"
            # /// script
            # requires-python = ">=3.12"
            # dependencies = [
            #     "rich",
            #     "pandas>=2.2",
            # ]
            # [tool.uv]
            # offline = true
            # ///
        "#}
    );
    let again = parse(&rendered).unwrap().unwrap().metadata;
    assert_eq!(again.requires_python, metadata.requires_python);
    assert_eq!(again.dependencies, metadata.dependencies);
}

#[test]
fn render_of_empty_metadata_is_an_empty_block() {
    let rendered = render(&ScriptMetadata::default());
    assert_eq!(rendered, "# /// script\n# ///\n");
    assert_eq!(
        parse(&rendered).unwrap().unwrap().metadata,
        ScriptMetadata::default()
    );
}

#[test]
fn render_survives_a_string_with_block_markers() {
    // A multi-line string whose lines look like block markers: still one block when read back.
    let original = metadata(indoc! {r#"
        # /// script
        # note = """
        # ///
        # /// script
        # ///
        # done"""
        # ///
    "#});
    let rendered = render(&original);
    assert_eq!(metadata(&rendered), original, "{rendered}");
    // And a script starting with it still has exactly one block.
    let script = format!("{rendered}print('hi')\n");
    assert_eq!(parse(&script).unwrap().unwrap().metadata, original);
}
