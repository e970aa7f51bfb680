//! Writing a `# /// script` block back from [`ScriptMetadata`].

use std::fmt::Write as _;

use toml::Value;

use crate::metadata::{DEPENDENCIES, REQUIRES_PYTHON, ScriptMetadata};

/// Renders a complete `# /// script` block, ending with a newline after `# ///`.
///
/// `requires-python` and `dependencies` come from the typed fields (so set those to change
/// them: e.g. add `requires_python` when it is absent, or put the merged dependencies in);
/// every other key of [`ScriptMetadata::table`] (`[tool.uv]`, unknown keys) follows as written
/// (keys sorted, as `toml::Table` keeps them). `dependencies` is written when non-empty, or
/// when the table had the key.
///
/// Reading the result with [`crate::parse`] gives back the same metadata. A multi-line TOML
/// string may put a line `# ///` inside the block: that is still content, because PEP 723
/// ends a block at the *last* `# ///` of a run of comment lines. So the line after the
/// rendered block must not be a comment line that belongs to another block.
#[must_use]
pub fn render(metadata: &ScriptMetadata) -> String {
    let mut content = String::new();
    if let Some(requires_python) = &metadata.requires_python {
        let value = Value::String(requires_python.to_string());
        let _ = writeln!(content, "{REQUIRES_PYTHON} = {value}");
    }
    if !metadata.dependencies.is_empty() || metadata.table.contains_key(DEPENDENCIES) {
        content.push_str(DEPENDENCIES);
        content.push_str(" = [\n");
        for requirement in &metadata.dependencies {
            let value = Value::String(requirement.to_string());
            let _ = writeln!(content, "    {value},");
        }
        content.push_str("]\n");
    }
    let mut rest = metadata.table.clone();
    rest.remove(REQUIRES_PYTHON);
    rest.remove(DEPENDENCIES);
    if !rest.is_empty() {
        // A table read from TOML always serialises; should that ever fail, the keys are
        // dropped rather than a broken block written (the round-trip tests watch this).
        let tail = toml::to_string(&rest).unwrap_or_default();
        content.push_str(&tail);
    }

    let mut block = String::from("# /// script\n");
    for line in content.lines() {
        if line.is_empty() {
            block.push_str("#\n");
        } else {
            block.push_str("# ");
            block.push_str(line);
            block.push('\n');
        }
    }
    block.push_str("# ///\n");
    block
}
