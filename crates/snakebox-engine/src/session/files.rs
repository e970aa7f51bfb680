//! File access confined to a session's workspace, for the file tools.
//!
//! The workspace belongs to the sandbox user, who can put anything there, including symlinks
//! to the server's own files. So a path is never resolved by the kernel in one go: it must be
//! relative, made of plain names (no `..`, no `.`, no empty parts), and it is walked one name
//! at a time with `openat(O_NOFOLLOW)` from a descriptor of the workspace, so no symlink is
//! ever followed, not even one swapped in between two calls (the same guarantee as `openat2`
//! with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`). Files are written as the sandbox user's host
//! uid, so that the session's code can change them later.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use schemars::JsonSchema;
use serde::Serialize;

/// Why a file operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    #[error(
        "The path `{path}` is not allowed: use a relative path inside the session's workspace, made of plain names (no `..`, no leading `/`)"
    )]
    BadPath { path: String },
    #[error("No file or directory `{path}` in the session's workspace")]
    NotFound { path: String },
    #[error("`{path}` is a symbolic link; the file tools do not follow links")]
    Symlink { path: String },
    #[error("`{path}` is not a regular file")]
    NotAFile { path: String },
    #[error("`{path}` is not a directory")]
    NotADirectory { path: String },
    #[error("`{path}` is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("Failed to access `{path}` in the session's workspace: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FileEntry {
    /// Path relative to the workspace.
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
}

/// Check a workspace-relative path and split it into names. `""` and `"."` mean the workspace.
pub(crate) fn components(path: &str) -> Result<Vec<String>, FileError> {
    let bad = || FileError::BadPath { path: path.into() };
    if path.contains('\0') || path.len() > 4096 {
        return Err(bad());
    }
    let trimmed = path.trim_start_matches("./");
    if trimmed.is_empty() || trimmed == "." {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for part in trimmed.split('/') {
        if part.is_empty() {
            // `a//b` and a trailing `/` are harmless; a leading `/` is absolute.
            if names.is_empty() {
                return Err(bad());
            }
            continue;
        }
        match Path::new(part).components().next() {
            Some(Component::Normal(_)) if part != "." && part != ".." => {
                names.push(part.to_owned());
            }
            _ => return Err(bad()),
        }
    }
    Ok(names)
}

fn io_err(path: &str) -> impl Fn(nix::errno::Errno) -> FileError + '_ {
    move |errno| match errno {
        nix::errno::Errno::ENOENT => FileError::NotFound { path: path.into() },
        nix::errno::Errno::ELOOP => FileError::Symlink { path: path.into() },
        nix::errno::Errno::ENOTDIR => FileError::NotADirectory { path: path.into() },
        other => FileError::Io {
            path: path.into(),
            source: std::io::Error::from(other),
        },
    }
}

fn open_root(root: &Path, display: &str) -> Result<OwnedFd, FileError> {
    nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(io_err(display))
}

/// Walk to the directory holding the last name (creating missing directories, owned by
/// `owner`, when `create`). Returns the directory and the last name (`None` for the root).
fn walk(
    root: &Path,
    names: &[String],
    display: &str,
    create: Option<Option<(u32, u32)>>,
) -> Result<(OwnedFd, Option<String>), FileError> {
    let mut dir = open_root(root, display)?;
    let Some((last, parents)) = names.split_last() else {
        return Ok((dir, None));
    };
    for name in parents {
        let open = |dir: &OwnedFd| {
            openat(
                dir.as_fd(),
                name.as_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
        };
        let next = match (open(&dir), create) {
            (Err(nix::errno::Errno::ENOENT), Some(owner)) => {
                nix::sys::stat::mkdirat(
                    dir.as_fd(),
                    name.as_str(),
                    Mode::from_bits_truncate(0o755),
                )
                .map_err(io_err(display))?;
                let made = open(&dir).map_err(io_err(display))?;
                if let Some((uid, gid)) = owner {
                    nix::unistd::fchown(&made, Some(uid.into()), Some(gid.into()))
                        .map_err(io_err(display))?;
                }
                made
            }
            (result, _) => result.map_err(io_err(display))?,
        };
        dir = next;
    }
    Ok((dir, Some(last.clone())))
}

/// Open `name` in `dir` without following a link (nor blocking on a FIFO), and only if it is a
/// regular file; `path` is the caller's path, for errors.
fn open_regular(
    dir: &OwnedFd,
    name: &str,
    flags: OFlag,
    mode: Mode,
    path: &str,
) -> Result<(std::fs::File, std::fs::Metadata), FileError> {
    let fd = openat(
        dir.as_fd(),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        mode,
    )
    .map_err(io_err(path))?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|source| FileError::Io {
        path: path.into(),
        source,
    })?;
    if !meta.is_file() {
        return Err(FileError::NotAFile { path: path.into() });
    }
    Ok((file, meta))
}

/// Read a regular file (at most `limit` bytes; larger files are refused).
pub(crate) fn read(root: &Path, path: &str, limit: u64) -> Result<Vec<u8>, FileError> {
    let names = components(path)?;
    let (dir, last) = walk(root, &names, path, None)?;
    let Some(last) = last else {
        return Err(FileError::NotAFile { path: path.into() });
    };
    let (mut file, meta) = open_regular(&dir, &last, OFlag::O_RDONLY, Mode::empty(), path)?;
    if meta.size() > limit {
        return Err(FileError::TooLarge {
            path: path.into(),
            size: meta.size(),
            limit,
        });
    }
    let mut data = Vec::new();
    Read::by_ref(&mut file)
        .take(limit + 1)
        .read_to_end(&mut data)
        .map_err(|source| FileError::Io {
            path: path.into(),
            source,
        })?;
    if data.len() as u64 > limit {
        return Err(FileError::TooLarge {
            path: path.into(),
            size: data.len() as u64,
            limit,
        });
    }
    Ok(data)
}

/// Write (create or replace) a regular file, creating parent directories; both owned by
/// `owner` when given.
pub(crate) fn write(
    root: &Path,
    path: &str,
    data: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<u64, FileError> {
    let names = components(path)?;
    let (dir, last) = walk(root, &names, path, Some(owner))?;
    let Some(last) = last else {
        return Err(FileError::NotAFile { path: path.into() });
    };
    let (mut file, _) = open_regular(
        &dir,
        &last,
        OFlag::O_WRONLY | OFlag::O_CREAT,
        Mode::from_bits_truncate(0o644),
        path,
    )?;
    let io = |source| FileError::Io {
        path: path.into(),
        source,
    };
    file.set_len(0).map_err(io)?;
    file.write_all(data).map_err(io)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io)?;
    }
    Ok(data.len() as u64)
}

/// List a directory (recursively up to `depth` levels, at most `max_entries` entries).
/// Symlinks are listed, never followed.
pub(crate) fn list(
    root: &Path,
    path: &str,
    depth: usize,
    max_entries: usize,
) -> Result<(Vec<FileEntry>, bool), FileError> {
    let names = components(path)?;
    let (parent, last) = walk(root, &names, path, None)?;
    let dir = match last {
        None => parent,
        Some(last) => openat(
            parent.as_fd(),
            last.as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err(path))?,
    };
    let prefix = names.join("/");
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
    .map_err(|source| FileError::Io {
        path: path.into(),
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
    fn path_rules() {
        for ok in [
            "a.txt",
            "dir/a.txt",
            "./a",
            "a//b",
            "dir/",
            "",
            ".",
            "..x",
            "x..",
            ".hidden",
        ] {
            assert!(components(ok).is_ok(), "{ok:?} should be allowed");
        }
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a/..",
            "..",
            "nul\0x",
            "/",
        ] {
            assert!(
                matches!(components(bad), Err(FileError::BadPath { .. })),
                "{bad:?} should be refused"
            );
        }
        assert_eq!(components("a//b/").unwrap(), ["a", "b"]);
    }

    #[test]
    fn write_read_list_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(write(root, "data/in.csv", b"a,b\n1,2\n", None).unwrap(), 8);
        assert_eq!(read(root, "data/in.csv", 100).unwrap(), b"a,b\n1,2\n");
        write(root, "data/in.csv", b"x", None).unwrap();
        assert_eq!(
            read(root, "data/in.csv", 100).unwrap(),
            b"x",
            "replaced, not appended"
        );
        let (entries, truncated) = list(root, "", 5, 100).unwrap();
        assert!(!truncated);
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["data", "data/in.csv"]);
        assert!(matches!(
            read(root, "data/in.csv", 0),
            Err(FileError::TooLarge { .. })
        ));
        assert!(matches!(
            read(root, "nope", 10),
            Err(FileError::NotFound { .. })
        ));
        assert!(matches!(
            read(root, "data", 10),
            Err(FileError::NotAFile { .. })
        ));
    }

    #[test]
    fn symlinks_are_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), "canary").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("linkdir")).unwrap();
        assert!(matches!(
            read(root, "link", 100),
            Err(FileError::Symlink { .. })
        ));
        assert!(read(root, "linkdir/secret", 100).is_err());
        assert!(write(root, "link", b"overwrite", None).is_err());
        assert!(write(root, "linkdir/new", b"x", None).is_err());
        assert!(list(root, "linkdir", 1, 10).is_err());
        assert_eq!(
            fs_err::read_to_string(outside.path().join("secret")).unwrap(),
            "canary"
        );
        assert!(!outside.path().join("new").exists());
        let (entries, _) = list(root, "", 1, 10).unwrap();
        assert!(entries.iter().all(|e| e.kind == "symlink"));
    }
}
