//! The sessions' disk: one ext4 file-system image, sparse, exactly `--sessions-max-disk` in
//! size, loop-mounted at `<data>/sessions-v1`, so that every file of every session (workspace,
//! virtual environment, `/tmp`, the session database) lives inside it.
//!
//! Why: the quota must hold *while* a call runs (catalogue S-02: one call wrote 512 MiB with
//! 64 MiB left, because the quota was only checked between calls). Polling is no bound; the
//! kernel is. A write past the image's end fails with `ENOSPC` in the session's code, whatever
//! it does, and the host disk gets at most the image's size (the backing file is sparse, so it
//! only costs what is written). The image persists in the data directory, so the bound and the
//! files survive a restart; the mount does not need to (it is made again at start, or reused
//! when a server that was killed left it).
//!
//! Only a root server can loop-mount. Elsewhere (or when `mkfs.ext4`/`mount` are missing or
//! refuse), sessions keep a plain directory and the quota is checked between calls only:
//! [`SessionDisk::mechanism`] says which, and `check_environment` reports it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The image file, next to the mount point.
const IMAGE_SUFFIX: &str = "img";

/// Where `mkfs.ext4` and `mount` are looked for (the server's own `PATH` may be anything).
const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// How the sessions' disk quota is held.
#[derive(Debug)]
pub(crate) struct SessionDisk {
    /// The mount point (`<data>/sessions-v1`).
    root: PathBuf,
    image: PathBuf,
    /// `Ok(size)`: the kernel bounds it (an image of `size` bytes is mounted at `root`);
    /// `Err(why)`: it does not, and why.
    enforced: Result<u64, String>,
}

impl SessionDisk {
    /// Mount (making it first if needed) the image of `size` bytes at `root`; on any failure,
    /// keep `root` a plain directory and say why.
    ///
    /// # Errors
    /// When another live server of the data directory holds the image mounted at another size
    /// than `size`: this server's limit could not be the one that holds, so its sessions are
    /// refused (with what to do), rather than run under the other server's.
    pub(crate) fn open(root: &Path, size: u64) -> Result<SessionDisk, String> {
        let image = root.with_extension(IMAGE_SUFFIX);
        let enforced = if is_root() {
            match mount_image(root, &image, size) {
                Ok(size) => Ok(size),
                Err(ImageError::Unbounded(why)) => Err(why),
                Err(ImageError::HeldAtAnotherSize(why)) => return Err(why),
            }
        } else {
            Err("the server is not root, so it cannot mount a file-system image for them".into())
        };
        if let Err(why) = &enforced {
            tracing::warn!("sessions' disk quota is checked between calls only: {why}");
        }
        Ok(SessionDisk {
            root: root.to_path_buf(),
            image,
            enforced,
        })
    }

    /// How the quota is held, in words (for `check_environment`).
    pub(crate) fn mechanism(&self) -> String {
        match &self.enforced {
            Ok(size) => format!(
                "enforced by the kernel while calls run: every session's files live in one ext4 image of {} (`{}`, sparse, loop-mounted at `{}`); a write past it fails with ENOSPC, so the host disk gets at most that; usable space is a little less (ext4's own metadata)",
                crate::ids::human_bytes(*size),
                self.image.display(),
                self.root.display()
            ),
            Err(why) => format!(
                "checked between calls only, not while a call runs ({why}): one call can write past the quota until the next check"
            ),
        }
    }

    /// Bytes free in the image (for a note when a call filled it), when it is mounted.
    pub(crate) fn free_bytes(&self) -> Option<u64> {
        self.enforced.as_ref().ok()?;
        let stat = nix::sys::statvfs::statvfs(&self.root).ok()?;
        Some(stat.blocks_available().saturating_mul(stat.fragment_size()))
    }

    /// Start a small watchdog (`/bin/sh`, its own session) that unmounts the image when this
    /// process is gone, however it ended (a SIGKILL included), unless another live server of
    /// the data directory uses it by then (the same rule as [`SessionDisk::release`]).
    /// Without it, a killed server would leave the image mounted until the next start.
    pub(crate) fn watch(&self, runs: &Path) {
        if self.enforced.is_err() {
            return;
        }
        const WATCHDOG: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done
for d in "$3"/*; do p=${d##*/}; [ "$p" != "$1" ] && [ -d "/proc/$p" ] && exit 0; done
exec umount -l "$2""#;
        let mut command = Command::new("/bin/sh");
        command
            .args(["-c", WATCHDOG, "snakebox-sessions-disk-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&self.root)
            .arg(runs)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: setsid is async-signal-safe; it only detaches the child from our process
        // group and session, so signals meant for us do not end it first.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        match command.spawn() {
            // Not waited for: it outlives us by design (reaped by init once we are gone).
            Ok(child) => drop(child),
            Err(err) => tracing::warn!(%err, "could not start the sessions' disk watchdog"),
        }
    }

    /// Unmount the image unless another live server uses this data directory (its files stay
    /// in the image; the next start mounts it again). `runs` is the directory where each
    /// running server keeps `<pid>/`.
    pub(crate) fn release(&self, runs: &Path) {
        if self.enforced.is_err() || !is_mount_point(&self.root) {
            return;
        }
        let others = runs.parent().is_some_and(crate::run::other_live_servers);
        if others {
            return;
        }
        // Lazy: interpreters still dying may hold files; the loop device is freed (autoclear)
        // when the last of them goes.
        if let Err(err) = nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(%err, "could not unmount the sessions' disk image");
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether `path` is the root of a mount (a different device from its parent's).
fn is_mount_point(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs_err::metadata(path), path.parent()) else {
        return false;
    };
    fs_err::metadata(parent).is_ok_and(|up| up.dev() != meta.dev())
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|err| format!("`{program}` could not run: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program}` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Bring the (unmounted) image to `size` bytes when `--sessions-max-disk` changed: checked
/// with `e2fsck`, then grown or shrunk with `resize2fs` (shrinking fails, and the image keeps
/// its size, when the sessions' files do not fit). Returns the image's size.
fn resize(image: &Path, size: u64) -> Result<u64, String> {
    let current = fs_err::metadata(image)
        .map_err(|err| err.to_string())?
        .len();
    if current == size {
        return Ok(current);
    }
    // -p: repair what is safe without asking; exit codes 0-1 mean clean or fixed.
    let checked = Command::new("e2fsck")
        .args(["-f", "-p"])
        .arg(image)
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|err| format!("`e2fsck` could not run: {err}"))?;
    if !matches!(checked.status.code(), Some(0 | 1)) {
        return Err(format!(
            "`e2fsck` found problems: {}",
            String::from_utf8_lossy(&checked.stdout).trim()
        ));
    }
    let kib = format!("{}K", size / 1024);
    if size > current {
        let file = fs_err::OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(|err| err.to_string())?;
        file.set_len(size).map_err(|err| err.to_string())?;
        run("resize2fs", &[image.as_os_str(), kib.as_ref()])?;
    } else {
        run("resize2fs", &[image.as_os_str(), kib.as_ref()])?;
        let file = fs_err::OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(|err| err.to_string())?;
        file.set_len(size).map_err(|err| err.to_string())?;
    }
    Ok(size)
}

/// How long a start waits for an earlier server's loop device on the image to go.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Wait until no loop device has `image` as its backing file.
///
/// # Errors
/// One still does after `limit`.
fn wait_until_detached(image: &Path, limit: std::time::Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + limit;
    while loop_device_of(image).is_some() {
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the image is still attached to {} (an earlier server's sandboxes still hold it); \
                 stop what still runs from that server, or `losetup -d` it",
                loop_device_of(image).unwrap_or_default()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

/// The loop device (`/dev/loopN`) whose backing file is `image`, if any.
fn loop_device_of(image: &Path) -> Option<String> {
    let image = fs_err::canonicalize(image).ok()?;
    fs_err::read_dir("/sys/block")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let backing = fs_err::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            (Path::new(backing.trim_end()) == image)
                .then(|| format!("/dev/{}", entry.file_name().to_string_lossy()))
        })
}

/// Make the image if it is missing, and mount it at `root` (unless it is mounted already).
/// Sessions kept by a version without the image (files directly in `root`) are copied in.
/// Why the image is not mounted as asked.
#[derive(Debug)]
enum ImageError {
    /// It could not be made or mounted: sessions keep a plain directory, checked between calls.
    Unbounded(String),
    /// Another live server holds it mounted at another size (see [`SessionDisk::open`]).
    HeldAtAnotherSize(String),
}

impl From<String> for ImageError {
    fn from(why: String) -> Self {
        Self::Unbounded(why)
    }
}

fn mount_image(root: &Path, image: &Path, size: u64) -> Result<u64, ImageError> {
    let lock_path = root.with_extension("lock");
    let lock = fs_err::File::create(&lock_path).map_err(|err| err.to_string())?;
    // Two servers starting on one data directory must not both make or mount the image.
    let _lock = nix::fcntl::Flock::lock(lock.into_parts().0, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, err)| format!("could not lock `{}`: {err}", lock_path.display()))?;
    fs_err::create_dir_all(root).map_err(|err| err.to_string())?;
    let size = size.max(32 << 20);
    if is_mount_point(root) {
        let held = fs_err::metadata(image).map_or(0, |m| m.len());
        if held == size {
            // Another live server's, or left by one that was killed: the same bound.
            let stat = nix::sys::statvfs::statvfs(root).map_err(|err| err.to_string())?;
            return Ok(stat.blocks().saturating_mul(stat.fragment_size()));
        }
        if root.parent().is_some_and(crate::run::other_live_servers) {
            return Err(ImageError::HeldAtAnotherSize(format!(
                "the sessions' disk image `{}` is mounted at {} by another live server of this data directory, and this one was started with a limit of {} (--sessions-max-disk); it cannot hold its own limit there",
                image.display(),
                crate::ids::human_bytes(held),
                crate::ids::human_bytes(size)
            )));
        }
        // Left mounted by a server that was killed, at another size: mounted anew at this
        // one's (resized below).
        nix::mount::umount2(root, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|err| format!("could not unmount the earlier image to resize it: {err}"))?;
    }
    // An earlier server's lazy unmount may not be over (its interpreters still dying hold
    // files, so its loop device is still attached): checking, resizing or mounting the image
    // now would race the old mount's last superblock write, which would undo a resize.
    wait_until_detached(image, DETACH_WAIT)?;
    if !image.exists() {
        let temp = image.with_extension("img.new");
        let file = fs_err::File::create(&temp).map_err(|err| err.to_string())?;
        file.set_len(size).map_err(|err| err.to_string())?;
        drop(file);
        // No reserved blocks (the quota is the sessions'), metadata initialised lazily (the
        // image stays sparse), the root only traversable (the session directories are below).
        run(
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                "-m".as_ref(),
                "0".as_ref(),
                "-L".as_ref(),
                "snakebox-sess".as_ref(),
                "-E".as_ref(),
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard".as_ref(),
                temp.as_os_str(),
            ],
        )?;
        fs_err::rename(&temp, image).map_err(|err| err.to_string())?;
    }
    let image_size = match resize(image, size) {
        Ok(resized) => resized,
        Err(why) => {
            let kept = fs_err::metadata(image)
                .map_err(|err| err.to_string())?
                .len();
            tracing::warn!(
                image = %image.display(),
                "the sessions' disk image stays {} (not the {} asked for): {why}",
                crate::ids::human_bytes(kept),
                crate::ids::human_bytes(size)
            );
            kept
        }
    };
    // Files of sessions kept before the image existed move in after the mount.
    let legacy = fs_err::read_dir(root)
        .map_err(|err| err.to_string())?
        .next()
        .is_some();
    let aside = root.with_extension("pre-image");
    if legacy {
        fs_err::rename(root, &aside).map_err(|err| err.to_string())?;
        fs_err::create_dir(root).map_err(|err| err.to_string())?;
    }
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,nosuid,nodev".as_ref(),
            image.as_os_str(),
            root.as_os_str(),
        ],
    )?;
    if legacy {
        let mut from = aside.clone().into_os_string();
        from.push("/.");
        if let Err(why) = run("cp", &["-a".as_ref(), from.as_os_str(), root.as_os_str()]) {
            // Back to how it was: the plain directory, unbounded, said so.
            let _ = nix::mount::umount2(root, nix::mount::MntFlags::MNT_DETACH);
            let _ = fs_err::remove_dir(root);
            let _ = fs_err::rename(&aside, root);
            return Err(ImageError::Unbounded(format!(
                "the sessions kept before the disk image could not be moved into it ({why})"
            )));
        }
        if let Err(err) = crate::tree::remove(&aside) {
            tracing::warn!(%err, "could not remove the sessions' old directory");
        }
    }
    let lost = root.join("lost+found");
    if lost.is_dir() {
        let _ = fs_err::remove_dir(&lost);
    }
    Ok(image_size)
}
