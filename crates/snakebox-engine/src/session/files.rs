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
use std::path::{Component, Path, PathBuf};

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
    let mut truncated = false;
    list_into(
        dir,
        &prefix,
        depth,
        max_entries,
        &mut entries,
        &mut truncated,
    )?;
    Ok((entries, truncated))
}

fn list_into(
    dir: OwnedFd,
    prefix: &str,
    depth: usize,
    max_entries: usize,
    out: &mut Vec<FileEntry>,
    truncated: &mut bool,
) -> Result<(), FileError> {
    let mut listing = nix::dir::Dir::from_fd(dir).map_err(io_err(prefix))?;
    let mut children: Vec<(String, nix::dir::Type)> = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(io_err(prefix))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        children.push((name, entry.file_type().unwrap_or(nix::dir::Type::File)));
    }
    children.sort_by(|a, b| a.0.cmp(&b.0));
    let dir_fd = listing.as_fd();
    for (name, kind) in children {
        if out.len() >= max_entries {
            *truncated = true;
            return Ok(());
        }
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let stat = nix::sys::stat::fstatat(
            dir_fd,
            name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok();
        let (kind_name, size) = match kind {
            nix::dir::Type::Directory => ("directory", 0),
            nix::dir::Type::File => (
                "file",
                stat.map_or(0, |s| u64::try_from(s.st_size).unwrap_or(0)),
            ),
            nix::dir::Type::Symlink => ("symlink", 0),
            _ => ("other", 0),
        };
        out.push(FileEntry {
            path: rel.clone(),
            kind: kind_name.into(),
            size,
        });
        if kind == nix::dir::Type::Directory
            && depth > 1
            && let Ok(child) = openat(
                dir_fd,
                name.as_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
        {
            list_into(child, &rel, depth - 1, max_entries, out, truncated)?;
        }
    }
    Ok(())
}

/// Bytes of regular files under `root` (symlinks not followed, other file systems skipped).
pub(crate) fn tree_bytes(root: &Path) -> u64 {
    fn walk(path: &PathBuf, dev: u64, total: &mut u64) {
        let Ok(entries) = fs_err::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.dev() != dev {
                continue;
            }
            if meta.is_dir() {
                walk(&entry.path(), dev, total);
            } else if meta.is_file() {
                *total += meta.len();
            }
        }
    }
    let Ok(meta) = root.symlink_metadata() else {
        return 0;
    };
    let mut total = 0;
    walk(&root.to_path_buf(), meta.dev(), &mut total);
    total
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
