//! `parse`: one test per PEP 723 case, through the public API.
//!
//! Cases named `peer_*` are the failures observed in the tool we replace
//! (`mcp-python-exec-sandbox`, seed 001; `shared/PEERS.md`).

use assert_matches::assert_matches;
use indoc::indoc;
use snakebox_script::{ScriptBlock, ScriptError, UnsafeReason, parse};

/// `name: script => pattern (if guard),` — asserts `parse(script)` matches the pattern.
macro_rules! parse_cases {
    ($($name:ident: $script:expr => $pattern:pat $(if $guard:expr)?,)*) => {$(
        #[test]
        fn $name() {
            let result = parse($script);
            assert_matches!(result, $pattern $(if $guard)?, "{result:#?}");
        }
    )*};
}

/// The dependencies of a parsed block, as strings.
fn deps(block: &ScriptBlock) -> Vec<String> {
    block
        .metadata
        .dependencies
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// `requires-python` of a parsed block, as a string.
fn python(block: &ScriptBlock) -> Option<String> {
    block
        .metadata
        .requires_python
        .as_ref()
        .map(ToString::to_string)
}

parse_cases! {
    // The PEP's own example.
    pep_example: indoc! {r#"
        # /// script
        # requires-python = ">=3.11"
        # dependencies = [
        #   "requests<3",
        #   "rich",
        # ]
        # ///

        import requests
    "#} => Ok(Some(block))
        if deps(&block) == ["requests<3", "rich"] && python(&block).as_deref() == Some(">=3.11"),

    no_block: "print('hi')\n" => Ok(None),
    empty_script: "" => Ok(None),

    block_after_code: indoc! {r#"
        import sys
        # /// script
        # dependencies = ["rich"]
        # ///
        print(sys.argv)
    "#} => Ok(Some(block)) if deps(&block) == ["rich"],

    // `#` alone is an empty content line.
    empty_content_lines: indoc! {r#"
        # /// script
        #
        # dependencies = ["rich"]
        #
        # ///
    "#} => Ok(Some(block)) if deps(&block) == ["rich"],

    // The text asks nothing of the lines between; the regex would want one.
    empty_block: "# /// script\n# ///\n" => Ok(Some(block))
        if block.metadata.table.is_empty() && block.metadata.dependencies.is_empty(),

    no_final_newline: "# /// script\n# dependencies = [\"rich\"]\n# ///" => Ok(Some(block))
        if deps(&block) == ["rich"],

    byte_order_mark: "\u{feff}# /// script\n# dependencies = [\"rich\"]\n# ///\n" => Ok(Some(block))
        if deps(&block) == ["rich"],

    // See: shared/PEERS.md, "scripts with CRLF line endings fail".
    peer_crlf: "# /// script\r\n# requires-python = \">=3.11\"\r\n# dependencies = [\r\n#   \"rich\",\r\n# ]\r\n# ///\r\nprint(1)\r\n"
        => Ok(Some(block)) if deps(&block) == ["rich"] && python(&block).as_deref() == Some(">=3.11"),

    crlf_mixed_with_lf: "# /// script\r\n# dependencies = [\"rich\"]\n# ///\r\n" => Ok(Some(block))
        if deps(&block) == ["rich"],

    // > "Precedence for an ending line `# ///` is given when the next line is not a valid
    // > embedded content line as described above."
    pep_precedence_example: indoc! {r#"
        # /// script
        # embedded-csharp = """
        # /// <summary>
        # /// text
        # ///
        # /// </summary>
        # public class MyClass { }
        # """
        # ///
    "#} => Ok(Some(block)) if block.metadata.table["embedded-csharp"].as_str()
        == Some("/// <summary>\n/// text\n///\n/// </summary>\npublic class MyClass { }\n"),

    // > "The TYPE MUST only consist of ASCII letters, numbers and hyphens."
    // > "Tools MUST NOT read from metadata blocks with types that have not been standardized
    // > by this specification."
    other_type_ignored: indoc! {r#"
        # /// pyproject
        # dependencies = ["not-read"]
        # ///

        # /// script
        # dependencies = ["rich"]
        # ///
    "#} => Ok(Some(block)) if deps(&block) == ["rich"],

    // Precedence goes to the *last* `# ///` of a run of comment lines: two blocks with no
    // line between them are one block (here of TYPE `pyproject`, so not read).
    adjacent_blocks_are_one_block: indoc! {r#"
        # /// pyproject
        # x = 1
        # ///
        # /// script
        # dependencies = ["rich"]
        # ///
    "#} => Ok(None),

    other_type_unclosed_ignored: "# /// my-tool\n# x = 1\nprint(1)\n" => Ok(None),

    // Blocks do not overlap: a `# /// script` inside another block is that block's content.
    script_inside_other_type_is_content: indoc! {r#"
        # /// notes
        # /// script
        # dependencies = ["rich"]
        # ///
    "#} => Ok(None),

    // > "That is: a single `#`, followed by a single space, followed by three forward slashes,
    // > followed by a single space, followed by the type of metadata."
    trailing_space_after_type_is_not_an_opening: "# /// script \n# dependencies = [\"rich\"]\n# ///\n" => Ok(None),
    missing_space_is_not_an_opening: "#/// script\n# dependencies = [\"rich\"]\n# ///\n" => Ok(None),
    indented_is_not_an_opening: "  # /// script\n  # dependencies = [\"rich\"]\n  # ///\n" => Ok(None),
    underscore_type_is_not_an_opening: "# /// my_tool\n# x = 1\n" => Ok(None),

    // A `# /// script` that is not at the start of a line (in a string on a line of code) is
    // never a block.
    block_text_in_one_line_string: "x = \"# /// script\\n# dependencies = ['evil']\\n# ///\"\n" => Ok(None),

    // See: shared/PEERS.md, "a `# /// script` block inside a string literal is deleted from the
    // user's code". Indented lines of a string are not a block, and parsing never changes the
    // script (the engine runs it as written).
    peer_indented_block_in_string_is_not_a_block: indoc! {r#"
        def help():
            return """
            # /// script
            # dependencies = ["evil"]
            # ///
            """
    "#} => Ok(None),

    // PEP 723 works on lines: a column-0 block inside a triple-quoted string IS a block (uv
    // reads it too). Next to the real block, that is two blocks, and the hint says why.
    block_in_string_at_column_0_counts: indoc! {r#"
        # /// script
        # dependencies = ["rich"]
        # ///
        DOC = """
        # /// script
        # dependencies = ["example"]
        # ///
        """
    "#} => Err(ScriptError::MultipleBlocks { first_line: 1, second_line: 5 }),

    // > "When there are multiple comment blocks of the same TYPE defined, tools MUST produce an
    // > error."
    // See: shared/PEERS.md, "a second block is silently dropped (PEP 723 says: error)".
    peer_two_blocks: indoc! {r#"
        # /// script
        # dependencies = ["rich"]
        # ///
        import rich
        # /// script
        # dependencies = ["requests"]
        # ///
    "#} => Err(ScriptError::MultipleBlocks { first_line: 1, second_line: 5 }),

    // A deliberate deviation from "Unclosed blocks MUST be ignored" (see the `pep723` module).
    unclosed: indoc! {r#"
        # /// script
        # dependencies = ["rich"]
        import rich
    "#} => Err(ScriptError::UnclosedBlock { line: 1 }),

    unclosed_at_end_of_file: "print(1)\n# /// script\n# dependencies = [\"rich\"]" => Err(ScriptError::UnclosedBlock { line: 2 }),

    closing_with_trailing_space_does_not_close: "# /// script\n# dependencies = []\n# /// \n" => Err(ScriptError::UnclosedBlock { line: 1 }),

    unclosed_before_a_valid_block: indoc! {r#"
        # /// script
        x = 1
        # /// script
        # dependencies = ["rich"]
        # ///
    "#} => Err(ScriptError::UnclosedBlock { line: 1 }),

    // > "This document MAY include the top-level fields `dependencies` and `requires-python`,
    // > and MAY optionally include a `[tool]` table."
    tool_and_unknown_keys_are_kept: indoc! {r#"
        # /// script
        # dependencies = ["rich"]
        # future-key = { a = 1 }
        #
        # [tool.uv]
        # exclude-newer = "2024-01-01T00:00:00Z"
        # index-strategy = "first-index"
        # ///
    "#} => Ok(Some(block)) if block.metadata.table["tool"]["uv"]["exclude-newer"].as_str()
        == Some("2024-01-01T00:00:00Z")
        && block.metadata.table["future-key"]["a"].as_integer() == Some(1),

    // See: shared/PEERS.md, "`dependencies = \"x\"` (a string) crashes the merge".
    peer_dependencies_is_a_string: "# /// script\n# dependencies = \"requests\"\n# ///\n"
        => Err(ScriptError::WrongType { key, expected: "a list of strings", found: "a string" }) if key == "dependencies",

    requires_python_is_a_number: "# /// script\n# requires-python = 3.11\n# ///\n"
        => Err(ScriptError::WrongType { key, expected: "a string", found: "a number" }) if key == "requires-python",

    dependency_item_is_a_number: "# /// script\n# dependencies = [\"rich\", 1]\n# ///\n"
        => Err(ScriptError::WrongType { key, found: "an integer", .. }) if key == "dependencies[1]",

    dependency_item_is_a_list: "# /// script\n# dependencies = [[\"rich\"]]\n# ///\n"
        => Err(ScriptError::WrongType { key, found: "a list", .. }) if key == "dependencies[0]",

    dependencies_is_a_table: "# /// script\n# [dependencies]\n# rich = \"*\"\n# ///\n"
        => Err(ScriptError::WrongType { found: "a table", .. }),

    tool_is_not_a_table: "# /// script\n# tool = \"uv\"\n# ///\n"
        => Err(ScriptError::WrongType { key, .. }) if key == "tool",

    // See: shared/PEERS.md, "invalid PEP 508 strings pass `validate_script`".
    peer_incomplete_version: "# /// script\n# dependencies = [\"numpy>=\"]\n# ///\n"
        => Err(ScriptError::InvalidRequirement { requirement, .. }) if requirement == "numpy>=",
    peer_unclosed_extras: "# /// script\n# dependencies = [\"requests[\"]\n# ///\n"
        => Err(ScriptError::InvalidRequirement { requirement, .. }) if requirement == "requests[",
    peer_shell_injection: "# /// script\n# dependencies = [\"; rm -rf /\"]\n# ///\n"
        => Err(ScriptError::InvalidRequirement { requirement, .. }) if requirement == "; rm -rf /",
    empty_requirement: "# /// script\n# dependencies = [\"\"]\n# ///\n"
        => Err(ScriptError::InvalidRequirement { .. }),

    env_var_in_url: "# /// script\n# dependencies = [\"pkg @ https://example.invalid/${HOME}/pkg.whl\"]\n# ///\n"
        => Err(ScriptError::UnsafeRequirement { reason: UnsafeReason::EnvironmentVariable, .. }),
    newline_in_requirement: "# /// script\n# dependencies = [\"rich\\n--index-url=http://x\"]\n# ///\n"
        => Err(ScriptError::UnsafeRequirement { reason: UnsafeReason::ControlCharacter, .. }),

    requires_python_without_operator: "# /// script\n# requires-python = \"3.11\"\n# ///\n"
        => Err(ScriptError::InvalidRequiresPython { value, .. }) if value == "3.11",
    requires_python_garbage: "# /// script\n# requires-python = \">=three\"\n# ///\n"
        => Err(ScriptError::InvalidRequiresPython { .. }),

    malformed_toml: "# /// script\n# dependencies = [\"rich\"\n# ///\n" => Err(ScriptError::MalformedToml { .. }),
    duplicate_key: "# /// script\n# dependencies = []\n# dependencies = []\n# ///\n" => Err(ScriptError::MalformedToml { .. }),
    // A starting line inside a block is content, and here not TOML ("tools MAY produce an error").
    opening_inside_block: "# /// script\n# /// script\n# dependencies = []\n# ///\n" => Err(ScriptError::MalformedToml { .. }),
}

#[test]
fn span_covers_the_block_without_its_line_terminator() {
    let script = "import os\r\n# /// script\r\n# dependencies = []\r\n# ///\r\nprint(1)\r\n";
    let block = parse(script).unwrap().unwrap();
    assert_eq!(
        &script[block.span],
        "# /// script\r\n# dependencies = []\r\n# ///"
    );
}

#[test]
fn errors_have_messages_with_the_value_and_a_hint() {
    let error = parse("# /// script\n# dependencies = [\"numpy>=\"]\n# ///\n").unwrap_err();
    let message = error.to_string();
    assert!(message.contains("`numpy>=`"), "{message}");
    assert!(error.hint().is_some());

    let error = parse("# /// script\n# dependencies = \"x\"\n# ///\n").unwrap_err();
    assert_eq!(
        error.to_string(),
        "Expected a list of strings for `dependencies`, found a string"
    );
    assert!(error.hint().unwrap().contains("dependencies = ["));
}
