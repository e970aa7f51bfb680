//! The errors of confined file access.

use nix::errno::Errno;

use crate::PathError;

/// Why a confined file operation was refused or failed. `path` is always the caller's path.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path breaks the rules of [`crate::RelativePath`].
    #[error(transparent)]
    Path(#[from] PathError),
    /// Nothing there.
    #[error("No file or directory `{path}`")]
    NotFound {
        /// The caller's path.
        path: String,
    },
    /// A symbolic link on the way (or at the end): links are never followed.
    #[error("`{path}` is or goes through a symbolic link, and links are never followed")]
    Symlink {
        /// The caller's path.
        path: String,
    },
    /// Not a regular file (a directory, FIFO, socket or device).
    #[error("`{path}` is not a regular file")]
    NotAFile {
        /// The caller's path.
        path: String,
    },
    /// A directory was expected.
    #[error("`{path}` is not a directory")]
    NotADirectory {
        /// The caller's path.
        path: String,
    },
    /// Larger than the caller's limit.
    #[error("`{path}` is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// The caller's path.
        path: String,
        /// Its size (at least), in bytes.
        size: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// Any other failure.
    #[error("Failed to {operation} `{path}`")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The caller's path.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl FsError {
    /// The error of `errno` met while doing `operation` on `path`.
    pub(crate) fn from_errno(operation: &'static str, path: &str, errno: Errno) -> Self {
        let path = path.to_owned();
        match errno {
            Errno::ENOENT => FsError::NotFound { path },
            // ELOOP: `O_NOFOLLOW` or `RESOLVE_NO_SYMLINKS` met a link. EXDEV: `RESOLVE_BENEATH`
            // would have left the root (only through a link, as names never hold `..`).
            Errno::ELOOP | Errno::EXDEV => FsError::Symlink { path },
            Errno::ENOTDIR => FsError::NotADirectory { path },
            Errno::EISDIR => FsError::NotAFile { path },
            other => FsError::Io {
                operation,
                path,
                source: std::io::Error::from(other),
            },
        }
    }

    /// The error of an I/O failure while doing `operation` on `path`.
    pub(crate) fn io(operation: &'static str, path: &str, source: std::io::Error) -> Self {
        FsError::Io {
            operation,
            path: path.to_owned(),
            source,
        }
    }

    /// The message with its cause, for a reply (the cause is otherwise only a `source`).
    #[must_use]
    pub fn with_cause(&self) -> String {
        match self {
            FsError::Io { source, .. } => format!("{self}: {source}"),
            _ => self.to_string(),
        }
    }
}
