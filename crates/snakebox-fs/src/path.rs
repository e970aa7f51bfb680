//! The one validator of caller-given relative paths.

use std::fmt;

/// Longest path accepted, in bytes (the kernel's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest name accepted, in bytes (the kernel's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Why a relative path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Names nothing (only where a file is meant: the root itself is `""`).
    #[error("the path is empty")]
    Empty,
    /// Starts with `/`.
    #[error("the path `{0}` is absolute")]
    Absolute(String),
    /// Has a `..` component.
    #[error("the path `{0}` leaves its directory (`..`)")]
    ParentComponent(String),
    /// NUL byte.
    #[error("the path `{0}` contains a NUL character")]
    Nul(String),
    /// Backslash (a Windows separator would become part of a file name here).
    #[error("the path `{0}` contains a backslash")]
    Backslash(String),
    /// Longer than [`MAX_PATH_BYTES`], or a name longer than [`MAX_NAME_BYTES`].
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

/// A checked relative path: plain names only, to be resolved beneath a directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RelativePath {
    names: Vec<String>,
}

impl RelativePath {
    /// Check `path` (see the crate documentation for the rules). `""` and `"."` are the root.
    ///
    /// # Errors
    /// When the path is absolute, has `..`, NUL or a backslash, or is too long.
    pub fn parse(path: &str) -> Result<Self, PathError> {
        let shown = || path.chars().take(200).collect::<String>();
        if path.contains('\0') {
            return Err(PathError::Nul(shown().replace('\0', "\\0")));
        }
        if path.starts_with('/') {
            return Err(PathError::Absolute(shown()));
        }
        if path.contains('\\') {
            return Err(PathError::Backslash(shown()));
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong(shown()));
        }
        let mut names = Vec::new();
        for name in path.split('/') {
            match name {
                ".." => return Err(PathError::ParentComponent(shown())),
                "" | "." => {}
                name if name.len() > MAX_NAME_BYTES => return Err(PathError::TooLong(shown())),
                name => names.push(name.to_owned()),
            }
        }
        Ok(Self { names })
    }

    /// [`parse`](Self::parse), refusing the root: the path must name an entry.
    ///
    /// # Errors
    /// As [`parse`](Self::parse), and [`PathError::Empty`] for the root.
    pub fn parse_entry(path: &str) -> Result<Self, PathError> {
        let parsed = Self::parse(path)?;
        if parsed.is_root() {
            return Err(PathError::Empty);
        }
        Ok(parsed)
    }

    /// The names, from the top.
    #[must_use]
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether this is the root itself (no names).
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.names.is_empty()
    }

    /// The last name and the names of the directories above it (`None` for the root).
    #[must_use]
    pub fn split_last(&self) -> Option<(&str, &[String])> {
        self.names
            .split_last()
            .map(|(last, parents)| (last.as_str(), parents))
    }

    /// The directories that hold it, from the top (`a`, `a/b` for `a/b/c`).
    pub fn ancestors(&self) -> impl Iterator<Item = String> + '_ {
        (1..self.names.len()).map(|n| self.names[..n].join("/"))
    }
}

impl fmt::Display for RelativePath {
    /// The normal form: names joined with `/` (`""` for the root).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_are_split_into_names() {
        for (path, expected) in [
            ("in.csv", &["in.csv"][..]),
            ("data/in.csv", &["data", "in.csv"]),
            ("a/b/c d.txt", &["a", "b", "c d.txt"]),
            (".hidden", &[".hidden"]),
            ("..x/y..", &["..x", "y.."]),
            ("...", &["..."]),
            // `.` and empty parts name the same place as without them.
            ("./a", &["a"]),
            ("a//b", &["a", "b"]),
            ("a/./b/", &["a", "b"]),
            ("", &[]),
            (".", &[]),
            ("./", &[]),
        ] {
            let parsed = RelativePath::parse(path).unwrap();
            assert_eq!(parsed.names(), expected, "{path:?}");
            assert_eq!(parsed.to_string(), expected.join("/"), "{path:?}");
        }
    }

    #[test]
    fn hostile_paths_are_refused_with_the_reason() {
        let long_name = "x".repeat(MAX_NAME_BYTES + 1);
        let long_path = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
        for (path, expected) in [
            ("/etc/passwd", PathError::Absolute("/etc/passwd".into())),
            ("/", PathError::Absolute("/".into())),
            ("//x", PathError::Absolute("//x".into())),
            ("..", PathError::ParentComponent("..".into())),
            ("../x", PathError::ParentComponent("../x".into())),
            ("a/../../x", PathError::ParentComponent("a/../../x".into())),
            ("a/..", PathError::ParentComponent("a/..".into())),
            ("./..", PathError::ParentComponent("./..".into())),
            ("a\0b", PathError::Nul("a\\0b".into())),
            ("\0", PathError::Nul("\\0".into())),
            ("a\\b", PathError::Backslash("a\\b".into())),
            ("..\\x", PathError::Backslash("..\\x".into())),
            (&long_name, PathError::TooLong("x".repeat(200))),
        ] {
            assert_eq!(RelativePath::parse(path), Err(expected), "{path:?}");
        }
        assert!(matches!(
            RelativePath::parse(&long_path),
            Err(PathError::TooLong(shown)) if shown.len() == 200
        ));
        let longest = format!("{}/{}", "y".repeat(MAX_NAME_BYTES), "z".repeat(10));
        assert!(RelativePath::parse(&longest).is_ok());
    }

    #[test]
    fn an_entry_is_not_the_root() {
        for root in ["", ".", "./", "//"] {
            let expected = if root.starts_with('/') {
                PathError::Absolute(root.into())
            } else {
                PathError::Empty
            };
            assert_eq!(RelativePath::parse_entry(root), Err(expected), "{root:?}");
        }
        let entry = RelativePath::parse_entry("a/b/c").unwrap();
        assert_eq!(
            entry.split_last(),
            Some(("c", &["a".into(), "b".into()][..]))
        );
        assert_eq!(entry.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
    }
}
