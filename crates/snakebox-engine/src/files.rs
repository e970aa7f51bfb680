//! Files in: the `files` argument of an execution, checked, decoded and written into the run's
//! working directory before the script starts.
//!
//! Paths are confined by construction: only relative paths of plain components are accepted
//! (no `/` at the start, no `..`, no `.`, no NUL, no backslash), and writing walks the
//! directory tree one component at a time with `openat(O_NOFOLLOW)`, so nothing already in the
//! working directory (a session's, say) can redirect a write through a symbolic link.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::result::ErrorInfo;

/// Most files one call may send.
pub const MAX_INPUT_FILES: usize = 100;
/// Most bytes (decoded) one call may send, all files together.
pub const MAX_INPUT_BYTES: usize = 32 << 20;
/// Longest relative path accepted, in bytes.
const MAX_PATH_BYTES: usize = 1024;
/// Deepest relative path accepted, in components.
const MAX_PATH_DEPTH: usize = 32;

/// How the `content` of an input file is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileEncoding {
    /// Text, written as UTF-8 (the default).
    #[default]
    #[serde(rename = "utf-8", alias = "utf8", alias = "text")]
    Utf8,
    /// Binary content, standard base64 (padding optional).
    Base64,
}

/// One file to place in the working directory before the script runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// Relative path inside the working directory, e.g. `data/in.csv`.
    pub path: String,
    /// The content, as text or base64 according to `encoding`.
    pub content: String,
    /// How `content` is encoded.
    pub encoding: FileEncoding,
}

/// A checked input file: validated path components and decoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodedFile {
    /// Path components, each a plain name.
    pub(crate) components: Vec<String>,
    /// The bytes to write.
    pub(crate) bytes: Vec<u8>,
}

impl DecodedFile {
    pub(crate) fn path(&self) -> String {
        self.components.join("/")
    }
}

/// Why a relative path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty path.
    #[error("the path is empty")]
    Empty,
    /// Starts with `/`.
    #[error("the path `{0}` is absolute")]
    Absolute(String),
    /// Has a `..` component.
    #[error("the path `{0}` leaves the working directory (`..`)")]
    ParentComponent(String),
    /// Has a `.` or empty component (`a//b`, `./a`, `a/`).
    #[error("the path `{0}` has an empty or `.` component")]
    EmptyComponent(String),
    /// NUL byte.
    #[error("the path `{0}` contains a NUL character")]
    Nul(String),
    /// Backslash (a Windows separator would become part of a file name here).
    #[error("the path `{0}` contains a backslash")]
    Backslash(String),
    /// Too long or too deep.
    #[error("the path `{0}` is too long")]
    TooLong(String),
}

impl PathError {
    /// How to fix the path.
    #[must_use]
    pub fn hint(&self) -> &'static str {
        match self {
            PathError::Backslash(_) => "separate directories with `/`, e.g. `data/in.csv`",
            _ => "give a path relative to the working directory, e.g. `data/in.csv`",
        }
    }
}

/// Check a relative path (used for input files and for artifact URIs) and split it into
/// its components.
///
/// # Errors
/// When the path is empty, absolute, has `..`, `.` or empty components, NUL, a backslash,
/// or is longer than 1024 bytes or 32 components.
pub(crate) fn split_relative_path(path: &str) -> Result<Vec<String>, PathError> {
    let owned = || path.chars().take(200).collect::<String>();
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains('\0') {
        return Err(PathError::Nul(owned().replace('\0', "\\0")));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(owned()));
    }
    if path.contains('\\') {
        return Err(PathError::Backslash(owned()));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong(owned()));
    }
    let mut components = Vec::new();
    for component in path.split('/') {
        match component {
            ".." => return Err(PathError::ParentComponent(owned())),
            "" | "." => return Err(PathError::EmptyComponent(owned())),
            name if name.len() > 255 => return Err(PathError::TooLong(owned())),
            name => components.push(name.to_string()),
        }
    }
    if components.len() > MAX_PATH_DEPTH {
        return Err(PathError::TooLong(owned()));
    }
    Ok(components)
}

/// Check and decode the `files` of a request.
///
/// # Errors
/// An [`ErrorInfo`] with a hint naming the offending file: too many files, too many bytes,
/// a bad path, invalid base64, or the same path twice (or a file used as a directory).
pub(crate) fn decode(files: &[InputFile]) -> Result<Vec<DecodedFile>, ErrorInfo> {
    let invalid = |message: String, hint: &str| ErrorInfo {
        message,
        hint: Some(hint.to_string()),
    };
    if files.len() > MAX_INPUT_FILES {
        return Err(invalid(
            format!(
                "{} input files were sent; at most {MAX_INPUT_FILES} are accepted",
                files.len()
            ),
            "send fewer files, e.g. one archive (base64) that the script unpacks",
        ));
    }
    let mut decoded = Vec::with_capacity(files.len());
    let mut total = 0usize;
    let mut seen_files = BTreeSet::new();
    let mut seen_dirs = BTreeSet::new();
    for file in files {
        let components = split_relative_path(&file.path)
            .map_err(|err| invalid(format!("Invalid input file path: {err}"), err.hint()))?;
        let bytes = match file.encoding {
            FileEncoding::Utf8 => file.content.as_bytes().to_vec(),
            FileEncoding::Base64 => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(file.content.trim().trim_end_matches('='))
                    .map_err(|err| {
                        invalid(
                            format!("The content of input file `{}` is not valid base64: {err}", file.path),
                            "encode binary content with standard base64 (A-Z, a-z, 0-9, +, /), or send text with \"encoding\": \"utf-8\"",
                        )
                    })?
            }
        };
        total = total.saturating_add(bytes.len());
        if total > MAX_INPUT_BYTES {
            return Err(invalid(
                format!(
                    "The input files add up to more than {} MiB (at `{}`)",
                    MAX_INPUT_BYTES >> 20,
                    file.path
                ),
                "send less data, or let the script download it (when the server allows network access)",
            ));
        }
        let joined = components.join("/");
        let mut prefix = String::new();
        for dir in &components[..components.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(dir);
            if seen_files.contains(&prefix) {
                return Err(invalid(
                    format!("Input file `{prefix}` is also used as a directory (by `{joined}`)"),
                    "give every input file a distinct path that is not another file's directory",
                ));
            }
            seen_dirs.insert(prefix.clone());
        }
        if seen_dirs.contains(&joined) || !seen_files.insert(joined.clone()) {
            return Err(invalid(
                format!("Input file path `{joined}` is given twice (or is also a directory)"),
                "give every input file a distinct path",
            ));
        }
        decoded.push(DecodedFile { components, bytes });
    }
    Ok(decoded)
}

/// Write checked input files under `root`, creating directories as needed. Files and
/// directories created are given to `owner` (the sandbox's host uid/gid) when set.
///
/// Never follows a symbolic link: each directory is opened with `O_NOFOLLOW | O_DIRECTORY`
/// relative to its parent, and an existing entry at a file's path is unlinked (not
/// truncated: it may be a hard link) before the file is created with `O_EXCL`.
///
/// # Errors
/// I/O errors, with the path in the message.
pub(crate) fn write(
    root: &Path,
    files: &[DecodedFile],
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    if files.is_empty() {
        return Ok(());
    }
    let fail = |path: &str, what: &str, err: nix::Error| format!("{what} `{path}`: {err}");
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root_fd = nix::fcntl::open(root, dir_flags, Mode::empty())
        .map_err(|err| fail(&root.display().to_string(), "Failed to open", err))?;
    for file in files {
        let path = file.path();
        let (name, dirs) = file
            .components
            .split_last()
            .ok_or_else(|| "empty input path".to_string())?;
        let mut dir: OwnedFd = root_fd
            .try_clone()
            .map_err(|err| format!("Failed to duplicate a descriptor: {err}"))?;
        for component in dirs {
            match mkdirat(&dir, component.as_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    if let Some((uid, gid)) = owner {
                        nix::unistd::fchownat(
                            &dir,
                            component.as_str(),
                            Some(Uid::from_raw(uid)),
                            Some(Gid::from_raw(gid)),
                            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                        )
                        .map_err(|err| fail(&path, "Failed to give the sandbox", err))?;
                    }
                }
                Err(nix::Error::EEXIST) => {}
                Err(err) => return Err(fail(&path, "Failed to create a directory for", err)),
            }
            dir = openat(&dir, component.as_str(), dir_flags, Mode::empty())
                .map_err(|err| fail(&path, "Failed to open a directory of", err))?;
        }
        match unlinkat(&dir, name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => {}
            Err(err) => return Err(fail(&path, "Failed to replace", err)),
        }
        let fd = openat(
            &dir,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|err| fail(&path, "Failed to create", err))?;
        if let Some((uid, gid)) = owner {
            fchown(
                fd.as_fd(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
            )
            .map_err(|err| fail(&path, "Failed to give the sandbox", err))?;
        }
        let mut handle = std::fs::File::from(fd);
        handle
            .write_all(&file.bytes)
            .map_err(|err| format!("Failed to write `{path}`: {err}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(path: &str, content: &str) -> InputFile {
        InputFile {
            path: path.into(),
            content: content.into(),
            encoding: FileEncoding::Utf8,
        }
    }

    #[test]
    fn relative_paths_are_split_into_plain_components() {
        for (path, expected) in [
            ("in.csv", vec!["in.csv"]),
            ("data/in.csv", vec!["data", "in.csv"]),
            ("a/b/c d.txt", vec!["a", "b", "c d.txt"]),
            (".hidden", vec![".hidden"]),
            ("..x/y..", vec!["..x", "y.."]),
        ] {
            assert_eq!(split_relative_path(path).unwrap(), expected, "{path}");
        }
    }

    #[test]
    fn hostile_paths_are_refused_with_the_reason() {
        for (path, expected) in [
            ("", PathError::Empty),
            ("/etc/passwd", PathError::Absolute("/etc/passwd".into())),
            ("../x", PathError::ParentComponent("../x".into())),
            ("a/../../x", PathError::ParentComponent("a/../../x".into())),
            ("a/..", PathError::ParentComponent("a/..".into())),
            ("./a", PathError::EmptyComponent("./a".into())),
            ("a//b", PathError::EmptyComponent("a//b".into())),
            ("a/", PathError::EmptyComponent("a/".into())),
            ("a\0b", PathError::Nul("a\\0b".into())),
            ("a\\b", PathError::Backslash("a\\b".into())),
        ] {
            assert_eq!(split_relative_path(path), Err(expected), "{path:?}");
        }
        assert!(matches!(
            split_relative_path("a/".repeat(40).trim_end_matches('/')),
            Err(PathError::TooLong(_))
        ));
        assert!(matches!(
            split_relative_path(&"x".repeat(300)),
            Err(PathError::TooLong(_))
        ));
    }

    #[test]
    fn decode_checks_count_size_duplicates_and_base64() {
        let ok = decode(&[
            text("a.txt", "hi"),
            InputFile {
                path: "bin/b.dat".into(),
                content: "AAEC/w==".into(),
                encoding: FileEncoding::Base64,
            },
        ])
        .unwrap();
        assert_eq!(ok[0].bytes, b"hi");
        assert_eq!(ok[1].bytes, [0, 1, 2, 255]);
        assert_eq!(ok[1].path(), "bin/b.dat");

        let many: Vec<_> = (0..=MAX_INPUT_FILES)
            .map(|i| text(&format!("f{i}"), ""))
            .collect();
        assert!(decode(&many).unwrap_err().message.contains("at most"));
        let big = text("big", &"x".repeat(MAX_INPUT_BYTES + 1));
        assert!(decode(&[big]).unwrap_err().message.contains("MiB"));
        let twice = decode(&[text("a", ""), text("a", "")]).unwrap_err();
        assert!(twice.message.contains("twice"), "{}", twice.message);
        let file_and_dir = decode(&[text("a", ""), text("a/b", "")]).unwrap_err();
        assert!(file_and_dir.message.contains("directory"));
        let dir_and_file = decode(&[text("a/b", ""), text("a", "")]).unwrap_err();
        assert!(dir_and_file.message.contains("twice"));
        let bad = decode(&[InputFile {
            path: "x".into(),
            content: "not base64!".into(),
            encoding: FileEncoding::Base64,
        }])
        .unwrap_err();
        assert!(bad.message.contains("base64") && bad.hint.is_some());
        let absolute = decode(&[text("/etc/x", "")]).unwrap_err();
        assert!(absolute.message.contains("absolute") && absolute.hint.is_some());
    }

    #[test]
    fn write_creates_directories_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("target"), "precious").unwrap();
        // A planted link where a directory and a file are to be written.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), dir.path().join("f")).unwrap();

        let files = decode(&[text("data/in.csv", "a,b\n"), text("f", "new")]).unwrap();
        write(dir.path(), &files, None).unwrap();
        assert_eq!(
            fs_err::read_to_string(dir.path().join("data/in.csv")).unwrap(),
            "a,b\n"
        );
        // The link was replaced by a file; its target is untouched.
        assert_eq!(fs_err::read_to_string(dir.path().join("f")).unwrap(), "new");
        assert_eq!(
            fs_err::read_to_string(outside.path().join("target")).unwrap(),
            "precious"
        );
        let through_link = decode(&[text("sub/x", "boom")]).unwrap();
        let err = write(dir.path(), &through_link, None).unwrap_err();
        assert!(err.contains("sub/x"), "{err}");
        assert!(!outside.path().join("x").exists());
    }
}
