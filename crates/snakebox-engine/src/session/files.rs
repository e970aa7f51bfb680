//! Listing and measuring a session's workspace, for the file tools and the disk cap.
//!
//! The workspace belongs to the sandbox user, who can put anything there, including symlinks
//! to the server's own files. Paths, opening, reading and writing are the confined-fs crate's
//! ([`snakebox_fs`]: plain relative names, resolved beneath the workspace, no link ever
//! followed); this module adds the listing's entries and the workspace's measure.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_fs::{FsError, RelativePath};

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileEntry {
    /// Path relative to the workspace.
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
}

/// List a directory (recursively up to `depth` levels, at most `max_entries` entries).
/// Symlinks are listed, never followed.
pub(crate) fn list(
    root: &Path,
    path: &str,
    depth: usize,
    max_entries: usize,
) -> Result<(Vec<FileEntry>, bool), FsError> {
    let path = RelativePath::parse(path)?;
    let prefix = path.to_string();
    let root = snakebox_fs::open_root(root, &prefix)?;
    let dir = snakebox_fs::open_dir(std::os::fd::AsFd::as_fd(&root), &path)?;
    let mut entries = Vec::new();
    let caps = crate::tree::Caps {
        entries: u64::try_from(max_entries).unwrap_or(u64::MAX),
        depth,
        time: LIST_TIME,
    };
    let walked = crate::tree::walk_from(dir, &caps, &mut |entry| {
        let rel = entry.relative_lossy();
        let (kind, size) = match entry.kind() {
            crate::tree::Kind::Directory => ("directory", 0),
            crate::tree::Kind::File => ("file", u64::try_from(entry.stat.st_size).unwrap_or(0)),
            crate::tree::Kind::Symlink => ("symlink", 0),
            _ => ("other", 0),
        };
        entries.push(FileEntry {
            path: if prefix.is_empty() {
                rel
            } else {
                format!("{prefix}/{rel}")
            },
            kind: kind.into(),
            size,
        });
        crate::tree::Next::Descend
    })
    .map_err(|source| FsError::Io {
        operation: "list",
        path: prefix,
        source,
    })?;
    Ok((entries, walked.stopped.is_some()))
}

/// How long a listing may take before it is returned as it is (truncated).
const LIST_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// How far a measure of a workspace goes (see [`tree_bytes`]).
pub(crate) const MEASURE_CAPS: crate::tree::Caps = crate::tree::Caps {
    entries: 5_000_000,
    depth: usize::MAX,
    time: std::time::Duration::from_secs(60),
};

/// Bytes of regular files under `root` (symlinks not followed, other file systems skipped),
/// and a note when the walk hit a cap (the count is then a lower bound).
pub(crate) fn tree_bytes(root: &Path) -> (u64, Option<String>) {
    let mut total = 0u64;
    let walked = crate::tree::walk(root, &MEASURE_CAPS, &mut |entry| {
        if entry.stat.st_dev != entry.root_dev {
            return crate::tree::Next::Skip;
        }
        if entry.kind() == crate::tree::Kind::File {
            total = total.saturating_add(u64::try_from(entry.stat.st_size).unwrap_or(0));
        }
        crate::tree::Next::Descend
    });
    match walked {
        Ok(walked) => (
            total,
            walked.note(&MEASURE_CAPS, "the measure of the workspace"),
        ),
        Err(_) => (total, None),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_shows_links_and_never_enters_them() {
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), "canary").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        snakebox_fs::write(
            root,
            &RelativePath::parse("data/in.csv").unwrap(),
            b"a,b\n",
            None,
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("linkdir")).unwrap();
        let (entries, truncated) = list(root, "", 5, 100).unwrap();
        assert!(!truncated);
        let paths: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e.path.as_str(), e.kind.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("data", "directory"),
                ("data/in.csv", "file"),
                ("linkdir", "symlink")
            ]
        );
        let (entries, _) = list(root, "./data/", 1, 100).unwrap();
        assert_eq!(entries[0].path, "data/in.csv");
        assert!(matches!(
            list(root, "linkdir", 1, 10),
            Err(FsError::Symlink { .. })
        ));
        assert!(matches!(list(root, "../x", 1, 10), Err(FsError::Path(_))));
        assert_eq!(tree_bytes(root).0, 4);
    }
}
