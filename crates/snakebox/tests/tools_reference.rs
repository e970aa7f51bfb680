//! The generated tools reference, `docs/src/reference/tools.md`: every tool the server lists,
//! with its description and its arguments as its input schema states them, rendered from a
//! real server's `tools/list` (in process, the `none` backend), so it cannot drift. Fails when
//! the committed page differs (`SNAKEBOX_BLESS=1` rewrites it) or when a tool is missing from
//! the hand-written chapter, `docs/src/tools.md` (a compatibility tool set's: from
//! `docs/src/migrating.md`). Each tool set of `--compat-tools` follows, with the tools it adds
//! or serves in place of snakebox's own.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use snakebox_engine::CompatToolSet;
use snakebox_test::TestEngine;

fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A property's type as a reader writes it: `string`, `integer or null`, `array of string`.
fn type_of(schema: &Value) -> String {
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array) {
        return options.iter().map(type_of).collect::<Vec<_>>().join(" or ");
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        return format!("one of {}", values.join(", "));
    }
    let base = match schema.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    };
    match (base.as_str(), schema.get("items")) {
        ("array", Some(items)) => format!("array of {}", type_of(items)),
        _ => base,
    }
}

/// One tool's section: its description, then its arguments as its input schema states them.
/// `heading` is its Markdown level (`##`, or `###` under a tool set).
fn render_tool(out: &mut String, heading: &str, tool: &rmcp::model::Tool) {
    let _ = write!(
        out,
        "\n{heading} `{}`\n\n{}\n",
        tool.name,
        tool.description.as_deref().unwrap_or("").trim()
    );
    let schema = Value::Object((*tool.input_schema).clone());
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object().filter(|p| !p.is_empty()) else {
        out.push_str("\nNo arguments.\n");
        return;
    };
    out.push_str("\n| argument | type | required | description |\n|---|---|---|---|\n");
    for (name, property) in properties {
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} |",
            type_of(property),
            if required.contains(&name.as_str()) {
                "yes"
            } else {
                "no"
            },
            one_line(property["description"].as_str().unwrap_or(""))
        );
    }
}

/// Whether two listed tools are one (as a client reads them).
fn same(a: &rmcp::model::Tool, b: &rmcp::model::Tool) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

async fn list_tools(sets: Vec<CompatToolSet>) -> Vec<rmcp::model::Tool> {
    let test = TestEngine::with(|config| config.compat_tools = sets).await;
    let client = test.mcp().await;
    let tools = client.list_tools().await;
    client.close().await;
    tools
}

/// The page, the names of the tools a default server lists, and those of the compatibility
/// tool sets.
async fn render() -> (String, Vec<String>, Vec<String>) {
    let tools = list_tools(Vec::new()).await;
    let mut out = String::from(
        "# Every tool (generated)\n\n\
         <!-- Generated from the server's tools/list by `SNAKEBOX_BLESS=1 cargo test -p snakebox \
         --test tools_reference`: do not edit by hand. -->\n\n\
         The tools a default `snakebox serve` lists, with the description and the arguments a \
         client reads in their schemas, then those of each compatibility tool set \
         (`--compat-tools`). What they return, and how they behave, are in the \
         [Tools reference](../tools.md) and, for the tool sets, [Migrating](../migrating.md).\n",
    );
    let mut names = Vec::new();
    for tool in &tools {
        names.push(tool.name.to_string());
        render_tool(&mut out, "##", tool);
    }
    let mut compat = Vec::new();
    for set in CompatToolSet::ALL {
        let _ = write!(
            out,
            "\n## The tool set `{}` (`--compat-tools {}`)\n",
            set.name(),
            set.name()
        );
        // What the set adds, or serves in place of one of snakebox's (the same name, another
        // tool).
        for tool in list_tools(vec![set]).await {
            if tools.iter().any(|own| same(own, &tool)) {
                continue;
            }
            compat.push(tool.name.to_string());
            render_tool(&mut out, "###", &tool);
        }
    }
    (out, names, compat)
}

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src")
}

#[tokio::test]
async fn the_generated_tools_reference_is_current_and_every_tool_is_documented() {
    let (rendered, names, compat) = render().await;
    let path = docs().join("reference/tools.md");
    if std::env::var_os("SNAKEBOX_BLESS").is_some() {
        fs_err::create_dir_all(path.parent().unwrap()).unwrap();
        fs_err::write(&path, &rendered).unwrap();
    }
    let committed = fs_err::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{} is not what the server lists; rewrite it with \
         `SNAKEBOX_BLESS=1 cargo test -p snakebox --test tools_reference` and commit it",
        path.display()
    );
    let chapter = fs_err::read_to_string(docs().join("tools.md")).unwrap();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !chapter.contains(&format!("`{name}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/tools.md does not document the tools {missing:?}"
    );
    let migrating = fs_err::read_to_string(docs().join("migrating.md")).unwrap();
    let missing: Vec<&String> = compat
        .iter()
        .filter(|name| !migrating.contains(&format!("`{name}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/migrating.md does not document the compatibility tools {missing:?}"
    );
}
