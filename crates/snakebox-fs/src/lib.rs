//! Confined file access: the one piece of host code that reads and writes trees that callers
//! control (a run's working directory, a session's workspace, an environment that package code
//! ran in, the artifact store addressed by a caller's URI).
//!
//! Such a tree belongs to untrusted code, which can put anything there: symbolic links to the
//! server's own files, hard links, FIFOs, directories swapped between two calls, chains deeper
//! than any stack. This code once lived in three copies with three sets of rules; it now lives
//! here, once, with one set:
//!
//! - **One validator** ([`RelativePath::parse`]): a caller's path is relative and made of plain
//!   names: no leading `/`, no `..`, no NUL, no backslash, at most [`MAX_NAME_BYTES`] per name
//!   and [`MAX_PATH_BYTES`] in all (the kernel's own `NAME_MAX` and `PATH_MAX`, so nothing a
//!   program could create is refused). `.` and empty parts (`./a`, `a//b`, `a/`) name the same
//!   place as without them and are dropped; `""` and `"."` are the root.
//! - **One opener** ([`open_dir`], [`open_file`]): a path is resolved beneath a directory
//!   descriptor and never through a link, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//!   where the kernel has it, else one name at a time with `openat(O_NOFOLLOW)` (the same
//!   guarantee, a link swapped in between two calls included).
//! - **One writer** ([`fn@write`]): the content goes to a fresh temporary name in the target's own
//!   directory (`O_CREAT | O_EXCL | O_NOFOLLOW`), is given its mode and owner on the descriptor,
//!   and is renamed over the target. The rename replaces whatever entry was there (a link is
//!   replaced, never followed; a hard link to another file is unlinked from here, never written
//!   through) and readers see the old file or the new one, never half of either. Truncating in
//!   place would write through a hard link; unlinking then creating leaves a moment with no
//!   file at all.
//! - **One reader** ([`read`]): regular files only (never a FIFO, device or link), opened
//!   non-blocking, at most a given number of bytes.
//! - **One walker and remover** ([`tree`]): iterative, O(1) descriptors at any depth, never
//!   following a link, bounded where a result is returned.
//!
//! This crate depends on nothing of snakebox: the sandbox, the environment cache and the engine
//! all sit above it.

#![deny(missing_docs)]

mod error;
mod file;
mod path;
pub mod tree;

pub use error::FsError;
pub use file::{Owner, open_dir, open_file, open_root, read, write};
pub use path::{MAX_NAME_BYTES, MAX_PATH_BYTES, PathError, RelativePath};

use nix::fcntl::OFlag;

/// How every directory is opened: read-only, never through a link.
pub(crate) const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);
