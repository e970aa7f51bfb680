//! The one opener, reader and writer (see the crate documentation for the rules).

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, fchown, unlinkat};

use crate::{DIR_FLAGS, FsError, PathError, RelativePath};

/// The host uid and gid given what the writer creates.
pub type Owner = (u32, u32);

/// The mode of every directory the writer creates.
const DIR_MODE: u32 = 0o755;
/// The mode of every file the writer writes.
const FILE_MODE: u32 = 0o644;

/// Whether `openat2` may be tried (cleared the first time the kernel says it has none).
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// Open `root`, a directory the server chose (its last name must not be a link).
///
/// # Errors
/// When `root` is not a directory or cannot be opened; `path` names it in the error.
pub fn open_root(root: &Path, path: &str) -> Result<OwnedFd, FsError> {
    nix::fcntl::open(root, DIR_FLAGS, Mode::empty()).map_err(|errno| {
        let link = errno == Errno::ENOTDIR
            && fs_err::symlink_metadata(root).is_ok_and(|meta| meta.file_type().is_symlink());
        FsError::from_errno(
            "open the directory of",
            path,
            if link { Errno::ELOOP } else { errno },
        )
    })
}

/// Open the directory `path` beneath `root`, never through a link.
///
/// # Errors
/// When a name is missing, is a link or is not a directory.
pub fn open_dir(root: BorrowedFd<'_>, path: &RelativePath) -> Result<OwnedFd, FsError> {
    beneath(root, path.names(), None)
        .map_err(|errno| FsError::from_errno("open the directory", &path.to_string(), errno))
}

/// Open the regular file `path` beneath `root` for reading, never through a link, and
/// without blocking on a FIFO. Returns the file and its status.
///
/// # Errors
/// When a name is missing or is a link, or the entry is not a regular file.
pub fn open_file(
    root: BorrowedFd<'_>,
    path: &RelativePath,
) -> Result<(std::fs::File, FileStat), FsError> {
    let shown = path.to_string();
    let fail = |errno| FsError::from_errno("open", &shown, errno);
    let Some((last, parents)) = path.split_last() else {
        return Err(FsError::NotAFile { path: shown });
    };
    let dir = beneath(root, parents, None).map_err(fail)?;
    match open_regular_at(dir.as_fd(), last).map_err(fail)? {
        Some((fd, stat)) => Ok((std::fs::File::from(fd), stat)),
        None => Err(FsError::NotAFile { path: shown }),
    }
}

/// Open `name` in `dir` for reading, never through a link, never blocking on a FIFO nor
/// taking a terminal; `None` when it is not a regular file.
pub(crate) fn open_regular_at<P: ?Sized + nix::NixPath>(
    dir: BorrowedFd<'_>,
    name: &P,
) -> nix::Result<Option<(OwnedFd, FileStat)>> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty())?;
    let stat = fstat(&fd)?;
    Ok(is(&stat, SFlag::S_IFREG).then_some((fd, stat)))
}

/// Read the regular file `path` beneath `root`: at most `limit` bytes (a larger file is
/// refused, also one that grows while it is read).
///
/// # Errors
/// As [`open_file`], [`FsError::TooLarge`], or an I/O error.
pub fn read(root: &Path, path: &RelativePath, limit: u64) -> Result<Vec<u8>, FsError> {
    let shown = path.to_string();
    let root_fd = open_root(root, &shown)?;
    let (file, stat) = open_file(root_fd.as_fd(), path)?;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > limit {
        return Err(FsError::TooLarge {
            path: shown,
            size,
            limit,
        });
    }
    let mut data = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|source| FsError::io("read", &shown, source))?;
    let read = data.len() as u64;
    if read > limit {
        return Err(FsError::TooLarge {
            path: shown,
            size: read,
            limit,
        });
    }
    Ok(data)
}

/// Write `data` as the regular file `path` beneath `root`, creating the directories above it;
/// what is created is given to `owner` when set. The file is written under a temporary name
/// in its directory and renamed over whatever entry `path` was (never a directory), so no
/// link is followed, no other name of a hard-linked file is written through, and readers see
/// the old content or the new. Returns the bytes written.
///
/// # Errors
/// The root path, a link or a non-directory on the way, a directory at `path`, I/O errors.
pub fn write(
    root: &Path,
    path: &RelativePath,
    data: &[u8],
    owner: Option<Owner>,
) -> Result<u64, FsError> {
    let shown = path.to_string();
    let Some((last, parents)) = path.split_last() else {
        return Err(FsError::Path(PathError::Empty));
    };
    let root_fd = open_root(root, &shown)?;
    let dir = beneath(root_fd.as_fd(), parents, Some(owner))
        .map_err(|errno| FsError::from_errno("create the directories of", &shown, errno))?;
    if fstatat(dir.as_fd(), last, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|stat| is(&stat, SFlag::S_IFDIR))
    {
        return Err(FsError::NotAFile { path: shown });
    }
    let (temp, fd) = create_temp(dir.as_fd())
        .map_err(|errno| FsError::from_errno("create a temporary file for", &shown, errno))?;
    let written = fill(fd, data, owner)
        .and_then(|()| renameat(dir.as_fd(), temp.as_str(), dir.as_fd(), last))
        .map_err(|errno| FsError::from_errno("write", &shown, errno));
    if written.is_err() {
        let _ = unlinkat(dir.as_fd(), temp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written.map(|()| data.len() as u64)
}

/// Give the new file its mode and owner, then its content.
fn fill(fd: OwnedFd, data: &[u8], owner: Option<Owner>) -> nix::Result<()> {
    fchmod(&fd, Mode::from_bits_truncate(FILE_MODE))?;
    if let Some((uid, gid)) = owner {
        fchown(&fd, Some(uid.into()), Some(gid.into()))?;
    }
    std::fs::File::from(fd)
        .write_all(data)
        .map_err(|err| err.raw_os_error().map_or(Errno::EIO, Errno::from_raw))
}

/// Create a fresh hidden file in `dir` (hidden, so that artifact collection skips it).
fn create_temp(dir: BorrowedFd<'_>) -> nix::Result<(String, OwnedFd)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut attempts = 0;
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            ".snakebox-write.{}.{}.{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        match openat(dir, name.as_str(), flags, Mode::from_bits_truncate(0o600)) {
            Ok(fd) => return Ok((name, fd)),
            Err(Errno::EEXIST) if attempts < 16 => attempts += 1,
            Err(err) => return Err(err),
        }
    }
}

/// Open the directory `names` beneath `root` without following any link. With
/// `create: Some(owner)`, missing directories are made (given to `owner` when set).
fn beneath(
    root: BorrowedFd<'_>,
    names: &[String],
    create: Option<Option<Owner>>,
) -> nix::Result<OwnedFd> {
    beneath_with(root, names, create, OPENAT2.load(Ordering::Relaxed))
}

/// [`beneath`], trying `openat2` first when `try_openat2`.
fn beneath_with(
    root: BorrowedFd<'_>,
    names: &[String],
    create: Option<Option<Owner>>,
    try_openat2: bool,
) -> nix::Result<OwnedFd> {
    if names.is_empty() {
        return openat(root, ".", DIR_FLAGS, Mode::empty());
    }
    match try_openat2.then(|| resolve_beneath(root, names)).flatten() {
        Some(Err(Errno::ENOENT)) if create.is_some() => {}
        // Not a directory, or a link (with `O_DIRECTORY`, a link at the end is ENOTDIR): the
        // walk by hand tells which.
        Some(Err(Errno::ENOTDIR)) => {}
        Some(result) => return result,
        None => {}
    }
    let mut dir = openat(root, ".", DIR_FLAGS, Mode::empty())?;
    for name in names {
        dir = match (
            openat(dir.as_fd(), name.as_str(), DIR_FLAGS, Mode::empty()),
            create,
        ) {
            (Err(Errno::ENOENT), Some(owner)) => make_dir(dir.as_fd(), name, owner)?,
            (Err(Errno::ENOTDIR), _) if is_link(dir.as_fd(), name) => return Err(Errno::ELOOP),
            (result, _) => result?,
        };
    }
    Ok(dir)
}

/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` of the directory `names`, or `None` when the
/// kernel cannot (no `openat2`, or it gave up on a concurrent rename): then walk by hand.
fn resolve_beneath(root: BorrowedFd<'_>, names: &[String]) -> Option<nix::Result<OwnedFd>> {
    let how = OpenHow::new().flags(DIR_FLAGS).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    match openat2(root, names.join("/").as_str(), how) {
        Err(Errno::ENOSYS) => {
            OPENAT2.store(false, Ordering::Relaxed);
            None
        }
        // EPERM: a seccomp filter that refuses `openat2`; EAGAIN: a rename raced the lookup.
        Err(Errno::EPERM | Errno::EAGAIN) => None,
        result => Some(result),
    }
}

/// Make the directory `name` in `dir` (or take the one made meanwhile) and open it.
fn make_dir(dir: BorrowedFd<'_>, name: &str, owner: Option<Owner>) -> nix::Result<OwnedFd> {
    let made = match mkdirat(dir, name, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(err) => return Err(err),
    };
    let fd = openat(dir, name, DIR_FLAGS, Mode::empty())?;
    if made {
        fchmod(&fd, Mode::from_bits_truncate(DIR_MODE))?;
        if let Some((uid, gid)) = owner {
            fchown(&fd, Some(uid.into()), Some(gid.into()))?;
        }
    }
    Ok(fd)
}

/// Whether `name` in `dir` is a symbolic link (not followed).
fn is_link(dir: BorrowedFd<'_>, name: &str) -> bool {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|stat| is(&stat, SFlag::S_IFLNK))
}

fn is(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

#[cfg(test)]
mod tests;
