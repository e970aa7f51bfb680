//! The arrows between the rooms (ARCHITECTURE.md), checked: every workspace crate depends only
//! on crates below it in the list, and the faces (MCP and HTTP) reach everything through the
//! engine, and the engine only through its API (`snakebox_engine::api`: the `EngineApi` trait
//! for tenants' calls, `EngineHost` for the process's own), never the `Engine` type itself, so
//! that the engine can move behind a wire without touching them. A test, not a convention: a
//! new `use` of a lower room, or of `Engine`, in a face fails here.
//!
//! `snakebox-test` is the test room on top: it may use every room, and no room may depend on
//! it except as a dev-dependency (tests use it; nothing built for users contains it).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Top to bottom, as ARCHITECTURE.md draws them.
    const ROOMS: &[&str] = &[
        "snakebox-test",
        "snakebox",
        "snakebox-http",
        "snakebox-server",
        "snakebox-kube",
        "snakebox-wire",
        "snakebox-engine",
        "snakebox-env",
        "snakebox-sandbox",
        "snakebox-fs",
        "snakebox-script",
    ];
    /// The test room: a dev-dependency only.
    const TEST_ROOM: &str = "snakebox-test";
    /// The faces: below them, only the engine (and the MCP face, for HTTP).
    const FACES: &[&str] = &["snakebox-http", "snakebox-server"];

    /// Every crate of the workspace (its directory under `crates/`).
    fn all_crates() -> Vec<String> {
        let mut names: Vec<String> = fs_err::read_dir(crates())
            .expect("the crates directory")
            .flatten()
            .filter(|entry| entry.path().join("Cargo.toml").is_file())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn manifest(room: &str) -> toml::Table {
        let manifest = fs_err::read_to_string(crates().join(room).join("Cargo.toml"))
            .unwrap_or_else(|err| panic!("{room}/Cargo.toml: {err}"));
        manifest.parse().expect("a valid manifest")
    }

    fn crates() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The workspace crates a manifest names under `[dependencies]`.
    fn dependencies(room: &str) -> Vec<String> {
        manifest(room)
            .get("dependencies")
            .and_then(toml::Value::as_table)
            .map(|deps| {
                deps.keys()
                    .filter(|name| ROOMS.contains(&name.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn every_crate_is_a_room() {
        for name in all_crates() {
            assert!(
                ROOMS.contains(&name.as_str()),
                "crates/{name} is not in ROOMS: place it in the list (and ARCHITECTURE.md)"
            );
        }
    }

    /// What a manifest links into what it builds: `[dependencies]` and `[build-dependencies]`,
    /// plain and per target.
    fn linked_tables(manifest: &toml::Table) -> Vec<(String, &toml::Table)> {
        let mut scopes = vec![(String::new(), manifest)];
        if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
            for (target, table) in targets {
                if let Some(table) = table.as_table() {
                    scopes.push((format!("target.{target}."), table));
                }
            }
        }
        let mut tables = vec![];
        for (prefix, scope) in scopes {
            for section in ["dependencies", "build-dependencies"] {
                if let Some(deps) = scope.get(section).and_then(toml::Value::as_table) {
                    tables.push((format!("{prefix}{section}"), deps));
                }
            }
        }
        tables
    }

    #[test]
    fn the_test_room_is_only_ever_a_dev_dependency() {
        for name in all_crates() {
            let manifest = manifest(&name);
            for (section, deps) in linked_tables(&manifest) {
                assert!(
                    !deps.contains_key(TEST_ROOM),
                    "{name} has {TEST_ROOM} under [{section}]: it is for [dev-dependencies] only"
                );
            }
        }
        let test_room = manifest(TEST_ROOM);
        assert_eq!(
            test_room["package"]
                .get("publish")
                .and_then(toml::Value::as_bool),
            Some(false),
            "{TEST_ROOM} is never published"
        );
    }

    #[test]
    fn every_room_depends_only_on_rooms_below_it() {
        for (n, room) in ROOMS.iter().enumerate() {
            for dependency in dependencies(room) {
                let below = ROOMS[n + 1..].contains(&dependency.as_str());
                assert!(
                    below,
                    "{room} depends on {dependency}, which is not below it"
                );
            }
        }
    }

    /// Whether `line` (code, not a comment) names the type `Engine` (not `EngineApi`,
    /// `EngineError`…, nor base64's `Engine` trait).
    fn names_the_engine_type(line: &str) -> bool {
        let code = line.trim_start();
        if code.starts_with("//") {
            return false;
        }
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        code.match_indices("Engine").any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + "Engine".len()..].chars().next();
            !before.is_some_and(word)
                && !after.is_some_and(word)
                && !code[..at].ends_with("base64::")
                && !code[..at].ends_with("base64::engine::")
        })
    }

    #[test]
    fn a_line_that_names_the_engine_type_is_told_apart() {
        assert!(names_the_engine_type(
            "use snakebox_engine::{Caller, Engine};"
        ));
        assert!(names_the_engine_type("    engine: Arc<Engine>,"));
        assert!(names_the_engine_type("Engine::report(&engine)"));
        assert!(!names_the_engine_type("    engine: Arc<dyn EngineApi>,"));
        assert!(!names_the_engine_type(
            "use snakebox_engine::{EngineError, EngineHost};"
        ));
        assert!(!names_the_engine_type("    use base64::Engine as _;"));
        assert!(!names_the_engine_type("/// See [`Engine::shutdown`]."));
    }

    /// Every `.rs` file under `dir`.
    fn rust_files(dir: PathBuf) -> Vec<PathBuf> {
        let mut files = vec![];
        let mut dirs = vec![dir];
        while let Some(dir) = dirs.pop() {
            for entry in fs_err::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() && !path.ends_with("target") {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        files
    }

    /// The faces hold `Arc<dyn EngineApi>` for tenants' calls, so a remote engine can stand in:
    /// none names `Engine` (whose inherent methods would bypass the API). Their own tests may
    /// build one.
    #[test]
    fn the_faces_reach_the_engine_only_through_its_api() {
        for face in FACES {
            let files = rust_files(crates().join(face).join("src"));
            assert!(!files.is_empty(), "{face} has no sources");
            for path in files {
                let text = fs_err::read_to_string(&path).unwrap_or_default();
                for (n, line) in text.lines().enumerate() {
                    assert!(
                        !names_the_engine_type(line),
                        "{}:{}: `{}` names `Engine`: hold `Arc<dyn EngineApi>` (tenants' calls) or `EngineHost` (the process's own), as `snakebox_engine::EngineHandle` hands them over",
                        path.display(),
                        n + 1,
                        line.trim()
                    );
                }
            }
        }
    }

    #[test]
    fn the_faces_reach_the_rooms_below_only_through_the_engine() {
        for face in FACES {
            for dependency in dependencies(face) {
                assert!(
                    dependency == "snakebox-engine" || FACES.contains(&dependency.as_str()),
                    "{face} depends on {dependency}: reach it through snakebox-engine"
                );
            }
            // Nor by a path (a crate renamed in a manifest would pass the check above).
            let mut dirs = vec![crates().join(face)];
            while let Some(dir) = dirs.pop() {
                for entry in fs_err::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_dir() && !path.ends_with("target") {
                        dirs.push(path);
                    } else if path.extension().is_some_and(|e| e == "rs") {
                        let text = fs_err::read_to_string(&path).unwrap_or_default();
                        for lower in ["snakebox_sandbox::", "snakebox_env::", "snakebox_fs::"] {
                            assert!(!text.contains(lower), "{} names {lower}", path.display());
                        }
                    }
                }
            }
        }
    }
}
