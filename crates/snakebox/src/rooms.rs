//! The arrows between the rooms (ARCHITECTURE.md), checked: every workspace crate depends only
//! on crates below it in the list, and the faces (MCP and HTTP) reach everything through the
//! engine, so that the engine can move behind a wire without touching them. A test, not a
//! convention: a new `use` of a lower room in a face fails here.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Top to bottom, as ARCHITECTURE.md draws them.
    const ROOMS: &[&str] = &[
        "snakebox",
        "snakebox-http",
        "snakebox-server",
        "snakebox-engine",
        "snakebox-env",
        "snakebox-sandbox",
        "snakebox-fs",
        "snakebox-script",
    ];
    /// The faces: below them, only the engine (and the MCP face, for HTTP).
    const FACES: &[&str] = &["snakebox-http", "snakebox-server"];

    fn crates() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The workspace crates a manifest names under `[dependencies]`.
    fn dependencies(room: &str) -> Vec<String> {
        let manifest = fs_err::read_to_string(crates().join(room).join("Cargo.toml"))
            .unwrap_or_else(|err| panic!("{room}/Cargo.toml: {err}"));
        let manifest: toml::Table = manifest.parse().expect("a valid manifest");
        manifest
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
