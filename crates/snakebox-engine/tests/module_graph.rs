//! The engine's modules form a graph without cycles (issue 11): each module's `crate::…`
//! paths, outside its tests, point at modules that do not point back. A cycle is how the
//! engine got tangled before (`execute.rs` doubled as a toolbox that everything imported);
//! this test keeps it from coming back.
//!
//! Names re-exported at the crate root (`crate::EngineError`) count as uses of the module
//! that defines them; the root itself (`crate::Engine`, the façade) is not a module here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs_err::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Identifiers in `text`, in order.
fn idents(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The top-level module a name re-exported at the root comes from (`pub use x::{A, B}`).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let statement = statement.trim();
        let Some(rest) = statement
            .find("pub use ")
            .map(|at| &statement[at + "pub use ".len()..])
        else {
            continue;
        };
        let words = idents(rest);
        let Some((module, exported)) = words.split_first() else {
            continue;
        };
        for name in exported {
            if name.chars().next().is_some_and(char::is_uppercase) {
                names.insert((*name).to_owned(), (*module).to_owned());
            }
        }
    }
    names
}

/// The modules `text` uses through `crate::` paths.
fn uses(
    text: &str,
    modules: &BTreeSet<String>,
    roots: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let group = if rest.starts_with('{') {
            rest.find('}').map_or(rest, |end| &rest[..end])
        } else {
            rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
        };
        for word in idents(group) {
            if modules.contains(word) {
                found.insert(word.to_owned());
            } else if let Some(module) = roots.get(word) {
                found.insert(module.clone());
            }
        }
    }
    found
}

#[test]
fn engine_modules_have_no_use_cycle() {
    let root = src();
    let lib = fs_err::read_to_string(root.join("lib.rs")).expect("lib.rs");
    let roots = root_names(&lib);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let module_of = |path: &Path| -> Option<String> {
        let relative = path.strip_prefix(&root).ok()?;
        let first = relative.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (name != "lib").then(|| name.to_owned())
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| module_of(p)).collect();
    assert!(modules.len() > 10, "found only {modules:?}");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = fs_err::read_to_string(file).expect("source");
        // Tests may reach anywhere; the shape is about the code that ships.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut used = uses(code, &modules, &roots);
        used.remove(&module);
        graph.entry(module).or_default().extend(used);
    }
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!(
                "the engine's modules use each other in a cycle: {}\nthe graph: {graph:#?}",
                cycle.join(" → ")
            );
        }
    }
}

#[test]
fn the_parser_sees_grouped_and_root_uses() {
    let modules: BTreeSet<String> = ["error", "run", "plan"].map(str::to_owned).into();
    let roots: BTreeMap<String, String> = [("EngineError".to_owned(), "error".to_owned())].into();
    let text = "use crate::{EngineError, plan::Checked};\nlet x = crate::run::classify();";
    let found = uses(text, &modules, &roots);
    assert_eq!(found, ["error", "plan", "run"].map(str::to_owned).into());
    assert_eq!(
        root_names("pub use error::{EngineError, ErrorKind};\npub use plan::ExecuteRequest;")
            .get("ExecuteRequest")
            .map(String::as_str),
        Some("plan")
    );
}
