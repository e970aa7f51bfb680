//! Walking and removing trees that callers built (session workspaces, a run's `/work`, a
//! session's virtual environment, an environment that package code ran in): the one place
//! that does it, with one set of rules (the crate's, see its documentation), used by every
//! crate above (the engine, the environment cache).
//!
//! Such a tree can be anything its builder wanted: a directory chain 20 000 deep, a million
//! entries, names of maximal length, links anywhere, directories swapped while we look. So:
//!
//! - **iterative, never recursive**: an explicit stack, so depth costs heap, not the thread's
//!   stack (a recursive walk, `std::fs::remove_dir_all` included, overflowed it: issue 10,
//!   catalogue S-01);
//! - **O(1) descriptors whatever the depth**: only the current directory is open; going back
//!   up opens `..` and checks that it is the very directory (device and inode) we came from,
//!   so a directory moved meanwhile stops the walk instead of taking it elsewhere;
//! - **no link is ever followed**: every name is opened relative to its directory with
//!   `O_NOFOLLOW` (`fstatat(AT_SYMLINK_NOFOLLOW)` to look, `unlinkat` to remove);
//! - **bounded where a result is returned**: [`walk`] stops at an entry, depth or time cap and
//!   says which in its [`Walked`], for the caller to tell its own caller. [`remove`] has no
//!   cap (it must finish), and its memory grows only with the directories still to remove.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::DIR_FLAGS;

/// How far a [`walk`] may go.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Entries examined (every name met counts, skipped ones too).
    pub entries: u64,
    /// Directory levels below the root that are entered (1: the root's own entries only).
    pub depth: usize,
    /// Wall time.
    pub time: Duration,
}

/// Why a walk stopped early, or left something out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// [`Caps::entries`] reached: the rest was not examined.
    Entries,
    /// [`Caps::time`] reached: the rest was not examined.
    Time,
    /// A directory changed place while it was walked: the rest was not examined.
    Changed,
}

/// What a walk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    /// Entries examined.
    pub entries: u64,
    /// Why the walk stopped before the end (`None`: it examined everything it was asked to).
    pub stopped: Option<Cap>,
    /// Directories below [`Caps::depth`] were not entered.
    pub too_deep: bool,
}

impl Walked {
    /// Whether the result is partial, in words (`None` when it is complete).
    pub fn note(&self, caps: &Caps, what: &str) -> Option<String> {
        let why = match self.stopped {
            Some(Cap::Entries) => format!("it holds more than {} entries", caps.entries),
            Some(Cap::Time) => format!("walking it took more than {:?}", caps.time),
            Some(Cap::Changed) => "it changed while it was walked".to_string(),
            None if self.too_deep => {
                format!("directories nested deeper than {} levels", caps.depth)
            }
            None => return None,
        };
        Some(format!(
            "{what} is partial: {why}; the rest was not examined"
        ))
    }
}

/// The kind of an entry, from `lstat` (links are never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Directory,
    /// A regular file.
    File,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO.
    Fifo,
    /// A socket.
    Socket,
    /// A character or block device.
    Device,
    /// Anything else.
    Other,
}

impl Kind {
    fn of(stat: &FileStat) -> Kind {
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        match kind {
            k if k == SFlag::S_IFDIR => Kind::Directory,
            k if k == SFlag::S_IFREG => Kind::File,
            k if k == SFlag::S_IFLNK => Kind::Symlink,
            k if k == SFlag::S_IFIFO => Kind::Fifo,
            k if k == SFlag::S_IFSOCK => Kind::Socket,
            k if k == SFlag::S_IFCHR || k == SFlag::S_IFBLK => Kind::Device,
            _ => Kind::Other,
        }
    }
}

/// One entry met by a [`walk`].
pub struct Entry<'a> {
    /// The directory that holds it (open it relative to this, never by path).
    pub dir: BorrowedFd<'a>,
    /// Its name in that directory.
    pub name: &'a CStr,
    /// `lstat` of it.
    pub stat: &'a FileStat,
    /// 1 for the root's own entries.
    pub depth: usize,
    /// The root's device (to stay on one file system).
    pub root_dev: u64,
    parents: &'a [CString],
}

impl Entry<'_> {
    /// Its kind (links are not followed).
    pub fn kind(&self) -> Kind {
        Kind::of(self.stat)
    }

    /// Open it for reading if it is still the regular file the walk saw (same device and
    /// inode: it may have been swapped meanwhile), never through a link, never blocking on a
    /// FIFO. `Ok(None)` when it is not, or no longer, that file.
    ///
    /// # Errors
    /// When it cannot be opened or examined.
    pub fn open_file(&self) -> nix::Result<Option<(OwnedFd, FileStat)>> {
        Ok(crate::file::open_regular_at(self.dir, self.name)?
            .filter(|(_, stat)| id(stat) == id(self.stat)))
    }

    /// Its path relative to the root, `/`-separated; `None` when a name is not UTF-8.
    pub fn relative(&self) -> Option<String> {
        let mut out = String::new();
        for part in self
            .parents
            .iter()
            .map(CString::as_c_str)
            .chain([self.name])
        {
            if !out.is_empty() {
                out.push('/');
            }
            out.push_str(part.to_str().ok()?);
        }
        Some(out)
    }

    /// Its path relative to the root, with names that are not UTF-8 shown lossily.
    pub fn relative_lossy(&self) -> String {
        let parts: Vec<String> = self
            .parents
            .iter()
            .map(CString::as_c_str)
            .chain([self.name])
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        parts.join("/")
    }
}

/// What the visitor wants after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Go on; a directory is entered (within [`Caps::depth`]).
    Descend,
    /// Go on; a directory is not entered.
    Skip,
    /// Stop the walk now.
    Stop,
}

/// One directory level of a walk: its identity and the names still to visit (reversed).
struct Level {
    id: (u64, u64),
    pending: Vec<CString>,
}

impl Level {
    /// The level of the open directory `dir`, holding at most `max` of its names.
    fn read(dir: BorrowedFd<'_>, stat: &FileStat, max: u64) -> Level {
        let max = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
        let mut pending = names(dir, max).unwrap_or_default();
        pending.reverse();
        Level {
            id: id(stat),
            pending,
        }
    }
}

fn id(stat: &FileStat) -> (u64, u64) {
    (stat.st_dev, stat.st_ino)
}

fn io(err: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(err as i32)
}

/// Walk `root` depth-first (pre-order), each directory's entries in name order, calling
/// `visit` for every entry (not the root itself). See the module documentation for the rules.
///
/// # Errors
/// When `root` cannot be opened as a directory (a link there is refused).
pub fn walk(
    root: &Path,
    caps: &Caps,
    visit: &mut dyn FnMut(&Entry<'_>) -> Next,
) -> std::io::Result<Walked> {
    let root_fd = nix::fcntl::open(root, DIR_FLAGS, Mode::empty()).map_err(io)?;
    walk_from(root_fd, caps, visit)
}

/// [`walk`] from a directory already open (confined by the caller).
///
/// # Errors
/// When `root_fd` cannot be examined.
pub fn walk_from(
    root_fd: OwnedFd,
    caps: &Caps,
    visit: &mut dyn FnMut(&Entry<'_>) -> Next,
) -> std::io::Result<Walked> {
    let root_stat = fstat(&root_fd).map_err(io)?;
    let started = Instant::now();
    let mut walked = Walked::default();
    let mut levels = vec![Level::read(root_fd.as_fd(), &root_stat, caps.entries)];
    let mut cur = root_fd;
    // The names of the directories from the root down to `cur`.
    let mut parents: Vec<CString> = Vec::new();
    while let Some(level) = levels.last_mut() {
        let Some(name) = level.pending.pop() else {
            // This directory is done: back to its parent, if it is still where it was.
            levels.pop();
            parents.pop();
            let Some(parent) = levels.last() else { break };
            match up(cur.as_fd(), parent.id) {
                Some(fd) => cur = fd,
                None => {
                    walked.stopped = Some(Cap::Changed);
                    break;
                }
            }
            continue;
        };
        if walked.entries >= caps.entries {
            walked.stopped = Some(Cap::Entries);
            break;
        }
        if started.elapsed() > caps.time {
            walked.stopped = Some(Cap::Time);
            break;
        }
        walked.entries += 1;
        let Ok(stat) = fstatat(cur.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue; // gone meanwhile
        };
        let depth = parents.len() + 1;
        let next = visit(&Entry {
            dir: cur.as_fd(),
            name: &name,
            stat: &stat,
            depth,
            root_dev: root_stat.st_dev,
            parents: &parents,
        });
        match next {
            Next::Stop => break,
            Next::Skip => continue,
            Next::Descend if Kind::of(&stat) != Kind::Directory => continue,
            Next::Descend if depth >= caps.depth => {
                walked.too_deep = true;
                continue;
            }
            Next::Descend => {}
        }
        let Ok(fd) = openat(cur.as_fd(), name.as_c_str(), DIR_FLAGS, Mode::empty()) else {
            continue; // gone or replaced by a non-directory meanwhile
        };
        let Ok(stat) = fstat(&fd) else { continue };
        let room = caps.entries.saturating_sub(walked.entries);
        levels.push(Level::read(fd.as_fd(), &stat, room));
        cur = fd;
        parents.push(name);
    }
    Ok(walked)
}

/// Open `..` of `dir` and check that it is the directory `expected` (device, inode).
fn up(dir: BorrowedFd<'_>, expected: (u64, u64)) -> Option<OwnedFd> {
    let fd = openat(dir, c"..", DIR_FLAGS, Mode::empty()).ok()?;
    let stat = fstat(&fd).ok()?;
    (id(&stat) == expected).then_some(fd)
}

/// Up to `max` names of a directory, sorted, without `.` and `..`.
fn names(dir: BorrowedFd<'_>, max: usize) -> nix::Result<Vec<CString>> {
    let duplicate = openat(dir, c".", DIR_FLAGS, Mode::empty())?;
    let mut listing = Dir::from_fd(duplicate)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let Ok(entry) = entry else { break };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if names.len() >= max {
            break;
        }
        names.push(name.to_owned());
    }
    names.sort();
    Ok(names)
}

/// How many names [`remove`] reads from a directory at a time.
const REMOVE_BATCH: usize = 1024;

/// Remove `path` and everything under it, without following any link (a link is removed,
/// never what it points to), iteratively and with a few descriptors whatever the depth.
/// A missing `path` is not an error.
///
/// # Errors
/// When something could not be removed (the rest is still attempted where possible), or a
/// directory moved while it was being emptied.
pub fn remove(path: &Path) -> std::io::Result<()> {
    let meta = match fs_err::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if !meta.is_dir() {
        return fs_err::remove_file(path);
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("refusing to remove `{}`", path.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_fd = nix::fcntl::open(
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    let name = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    remove_dir_at(parent_fd.as_fd(), &name).map_err(|err| {
        std::io::Error::new(
            err.kind(),
            format!("failed to remove `{}`: {err}", path.display()),
        )
    })
}

/// Remove the directory `name` of `parent` with everything in it (see [`remove`]).
fn remove_dir_at(parent: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    struct Level {
        id: (u64, u64),
        name: CString,
        /// Names read but not handled yet.
        pending: Vec<CString>,
    }
    let parent_id = id(&fstat(parent).map_err(io)?);
    let mut cur = openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(io)?;
    let mut levels = vec![Level {
        id: id(&fstat(&cur).map_err(io)?),
        name: name.to_owned(),
        pending: Vec::new(),
    }];
    let mut first_error: Option<std::io::Error> = None;
    // Names that could not be removed, per directory: never retried in a loop.
    let mut stuck: std::collections::HashSet<((u64, u64), CString)> =
        std::collections::HashSet::new();
    while let Some(level) = levels.last_mut() {
        if level.pending.is_empty() {
            let mut batch = names(cur.as_fd(), REMOVE_BATCH + stuck.len()).map_err(io)?;
            batch.retain(|n| !stuck.contains(&(level.id, n.clone())));
            batch.truncate(REMOVE_BATCH);
            batch.reverse();
            level.pending = batch;
        }
        if let Some(entry) = level.pending.pop() {
            let here = level.id;
            match unlinkat(cur.as_fd(), entry.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => continue,
                Err(Errno::EISDIR) => {}
                Err(err) => {
                    first_error.get_or_insert(io(err));
                    stuck.insert((here, entry));
                    continue;
                }
            }
            match unlinkat(cur.as_fd(), entry.as_c_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => continue,
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                Err(err) => {
                    first_error.get_or_insert(io(err));
                    stuck.insert((here, entry));
                    continue;
                }
            }
            match openat(cur.as_fd(), entry.as_c_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => {
                    let child = id(&fstat(&fd).map_err(io)?);
                    cur = fd;
                    levels.push(Level {
                        id: child,
                        name: entry,
                        pending: Vec::new(),
                    });
                }
                Err(err) => {
                    first_error.get_or_insert(io(err));
                    stuck.insert((here, entry));
                }
            }
            continue;
        }
        // This directory is empty (or holds only what could not be removed): remove it.
        let Some(done) = levels.pop() else { break };
        let (above, above_id) = match levels.last() {
            Some(level) => {
                let Some(fd) = up(cur.as_fd(), level.id) else {
                    return Err(first_error.unwrap_or_else(|| {
                        std::io::Error::other("a directory moved while it was being removed")
                    }));
                };
                (Some(fd), level.id)
            }
            None => (None, parent_id),
        };
        let holder = above.as_ref().map_or(parent, AsFd::as_fd);
        match unlinkat(holder, done.name.as_c_str(), UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(err) => {
                first_error.get_or_insert(io(err));
                stuck.insert((above_id, done.name));
            }
        }
        match above {
            Some(fd) => cur = fd,
            None => break,
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(root: &Path, depth: usize) {
        // Built relative to a descriptor: the chain's paths are far longer than PATH_MAX.
        let mut dir = nix::fcntl::open(root, DIR_FLAGS, Mode::empty()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(dir.as_fd(), c"d", Mode::from_bits_truncate(0o755)).unwrap();
            let file = openat(
                dir.as_fd(),
                c"f",
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .unwrap();
            drop(file);
            dir = openat(dir.as_fd(), c"d", DIR_FLAGS, Mode::empty()).unwrap();
        }
    }

    const WIDE: Caps = Caps {
        entries: u64::MAX,
        depth: usize::MAX,
        time: Duration::from_secs(60),
    };

    // See: issue 10 (S-01): a 16 000-deep chain overflowed the stack of the server's walks.
    #[test]
    fn a_chain_deeper_than_any_stack_is_walked_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("work");
        fs_err::create_dir(&root).unwrap();
        chain(&root, 20_000);
        let mut deepest = 0;
        let walked = walk(&root, &WIDE, &mut |entry| {
            deepest = deepest.max(entry.depth);
            Next::Descend
        })
        .unwrap();
        assert_eq!(walked.entries, 40_000);
        assert_eq!((walked.stopped, walked.too_deep), (None, false));
        assert_eq!(deepest, 20_000);
        remove(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn caps_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        chain(tmp.path(), 50);
        let caps = Caps {
            entries: 30,
            ..WIDE
        };
        let walked = walk(tmp.path(), &caps, &mut |_| Next::Descend).unwrap();
        assert_eq!((walked.entries, walked.stopped), (30, Some(Cap::Entries)));
        assert!(walked.note(&caps, "the listing").is_some());
        let caps = Caps { depth: 3, ..WIDE };
        let mut paths = Vec::new();
        let walked = walk(tmp.path(), &caps, &mut |entry| {
            paths.push(entry.relative().unwrap());
            Next::Descend
        })
        .unwrap();
        assert!(walked.too_deep && walked.stopped.is_none());
        assert_eq!(paths, ["d", "d/d", "d/d/d", "d/d/f", "d/f", "f"]);
    }

    #[test]
    fn links_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs_err::create_dir(&outside).unwrap();
        fs_err::write(outside.join("keep"), "canary").unwrap();
        let root = tmp.path().join("work");
        fs_err::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/b/link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("top")).unwrap();
        let mut seen = Vec::new();
        walk(&root, &WIDE, &mut |entry| {
            seen.push((entry.relative_lossy(), entry.kind()));
            Next::Descend
        })
        .unwrap();
        assert!(seen.contains(&("a/b/link".into(), Kind::Symlink)));
        assert!(!seen.iter().any(|(path, _)| path.contains("keep")));
        remove(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(
            fs_err::read_to_string(outside.join("keep")).unwrap(),
            "canary"
        );
        // A link given as the path itself is removed, not its target.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        remove(&link).unwrap();
        assert!(outside.join("keep").exists());
        remove(&tmp.path().join("missing")).unwrap();
    }

    #[test]
    fn wide_directories_are_removed_in_linear_time() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("work");
        for i in 0..3_000 {
            fs_err::create_dir_all(root.join(format!("d{i}"))).unwrap();
            fs_err::write(root.join(format!("d{i}/f")), "x").unwrap();
        }
        let started = Instant::now();
        remove(&root).unwrap();
        assert!(!root.exists());
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
