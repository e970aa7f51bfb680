//! One ext4 file-system image of the sessions' disk: made sparse, checked and resized when its
//! size should change, and loop-mounted by a root server (`nosuid,nodev`).
//!
//! It exists apart from [`super::disk`] so that the shares' policy (who gets an image, how
//! big, when it is given back) reads without the mechanics of `mkfs.ext4`, `e2fsck`,
//! `resize2fs`, `mount` and loop devices, which every image shares.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// Where `mkfs.ext4` and `mount` are looked for (the server's own `PATH` may be anything).
pub(super) const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The smallest image: ext4's own metadata leaves little of less.
pub(super) const MIN_BYTES: u64 = crate::MIN_SESSIONS_DISK_SHARE;

/// How long a start waits for an earlier server's loop device on an image to go.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `path` is the root of a mount (a different device from its parent's).
pub(super) fn is_mount_point(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs_err::metadata(path), path.parent()) else {
        return false;
    };
    fs_err::metadata(parent).is_ok_and(|up| up.dev() != meta.dev())
}

/// One of the image tools, found on [`TOOL_PATH`] only, with a clean environment and no input.
fn tool(program: &str) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(std::process::Stdio::null());
    command
}

/// Run one of the image tools; its stderr is the error.
pub(super) fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let output = tool(program)
        .args(args)
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

/// Make a sparse ext4 image of `size` bytes at `image` (built beside it, then renamed into
/// place). `owner`: who owns its root directory (the server's own user when it is not root).
pub(super) fn make(image: &Path, size: u64, owner: Option<(u32, u32)>) -> Result<(), String> {
    let temp = image.with_extension("img.new");
    let file = fs_err::File::create(&temp).map_err(|err| err.to_string())?;
    file.set_len(size).map_err(|err| err.to_string())?;
    drop(file);
    // No reserved blocks (the quota is the sessions'), metadata initialised lazily (the image
    // stays sparse), and no discard (it would punch holes the tools do not need).
    let mut extended = "lazy_itable_init=1,lazy_journal_init=1,nodiscard".to_owned();
    if let Some((uid, gid)) = owner {
        extended.push_str(&format!(",root_owner={uid}:{gid}"));
    }
    let made = run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-L".as_ref(),
            "snakebox-sess".as_ref(),
            "-E".as_ref(),
            extended.as_ref(),
            temp.as_os_str(),
        ],
    );
    if let Err(why) = made {
        let _ = fs_err::remove_file(&temp);
        return Err(why);
    }
    fs_err::rename(&temp, image).map_err(|err| err.to_string())
}

/// Check the (unmounted) image with `e2fsck`, repairing what is safe without asking: a
/// server killed while it wrote leaves it to be checked.
pub(super) fn check(image: &Path) -> Result<(), String> {
    // -p: repair what is safe without asking; exit codes 0-1 mean clean or fixed.
    let checked = tool("e2fsck")
        .args(["-f", "-p"])
        .arg(image)
        .output()
        .map_err(|err| format!("`e2fsck` could not run: {err}"))?;
    if matches!(checked.status.code(), Some(0 | 1)) {
        Ok(())
    } else {
        Err(format!(
            "`e2fsck` found problems: {}",
            String::from_utf8_lossy(&checked.stdout).trim()
        ))
    }
}

/// Repair the (unmounted) image if it was not cleanly unmounted (`e2fsck -p`: what is safe
/// without asking; nothing when it is clean). `fuse2fs` keeps no journal: an image whose
/// `fuse2fs` was killed needs this before it is served again.
pub(super) fn repair(image: &Path) -> Result<(), String> {
    let checked = tool("e2fsck")
        .arg("-p")
        .arg(image)
        .output()
        .map_err(|err| format!("`e2fsck` could not run: {err}"))?;
    match checked.status.code() {
        Some(0) => Ok(()),
        Some(1 | 2) => {
            tracing::warn!(
                image = %image.display(),
                "repaired a sessions' disk image that was not cleanly unmounted: {}",
                String::from_utf8_lossy(&checked.stdout).trim()
            );
            Ok(())
        }
        _ => Err(format!(
            "`e2fsck -p` found problems it does not repair without asking (run `e2fsck -f {}` by hand while no server uses it): {}",
            image.display(),
            String::from_utf8_lossy(&checked.stdout).trim()
        )),
    }
}

/// Bring the (unmounted) image to `size` bytes when its share's size changed: checked with
/// `e2fsck`, then grown or shrunk with `resize2fs` (shrinking fails, and the image keeps its
/// size, when its files do not fit). Returns the image's size.
pub(super) fn resize(image: &Path, size: u64) -> Result<u64, String> {
    let current = fs_err::metadata(image)
        .map_err(|err| err.to_string())?
        .len();
    if current == size {
        return Ok(current);
    }
    check(image)?;
    let kib = format!("{}K", size / 1024);
    let set_len = || -> Result<(), String> {
        fs_err::OpenOptions::new()
            .write(true)
            .open(image)
            .and_then(|file| file.set_len(size))
            .map_err(|err| err.to_string())
    };
    if size > current {
        set_len()?;
        run("resize2fs", &[image.as_os_str(), kib.as_ref()])?;
    } else {
        run("resize2fs", &[image.as_os_str(), kib.as_ref()])?;
        set_len()?;
    }
    Ok(size)
}

/// [`resize`], keeping the image's size (and saying so in the log) when it cannot be
/// resized. Returns the size it has.
pub(super) fn resize_or_keep(image: &Path, size: u64) -> Result<u64, String> {
    match resize(image, size) {
        Ok(resized) => Ok(resized),
        Err(why) => {
            let kept = fs_err::metadata(image)
                .map_err(|err| err.to_string())?
                .len();
            tracing::warn!(
                image = %image.display(),
                "a sessions' disk image stays {} (not the {} asked for): {why}",
                crate::ids::human_bytes(kept),
                crate::ids::human_bytes(size)
            );
            Ok(kept)
        }
    }
}

/// Wait until no loop device has `image` as its backing file: an earlier server's lazy
/// unmount may not be over (its interpreters still dying hold files), and checking, resizing
/// or mounting the image now would race the old mount's last superblock write, which would
/// undo a resize.
///
/// # Errors
/// One still does after a while.
pub(super) fn wait_until_detached(image: &Path) -> Result<(), String> {
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    while loop_device_of(image).is_some() {
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the image `{}` is still attached to {} (an earlier server's sandboxes still hold it); \
                 stop what still runs from that server, or `losetup -d` it",
                image.display(),
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

/// Loop-mount `image` at `dir` (a root server's way), `nosuid,nodev`.
pub(super) fn loop_mount(image: &Path, dir: &Path, read_only: bool) -> Result<(), String> {
    let options = if read_only {
        "loop,ro,nosuid,nodev"
    } else {
        "loop,nosuid,nodev"
    };
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            options.as_ref(),
            image.as_os_str(),
            dir.as_os_str(),
        ],
    )
}

/// Unmount `dir` lazily: interpreters still dying may hold files; the loop device is freed
/// (autoclear) when the last of them goes.
pub(super) fn unmount(dir: &Path) -> Result<(), String> {
    nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)
        .map_err(|err| format!("could not unmount `{}`: {err}", dir.display()))
}

/// Copy the tree `from` into the directory `into` (owners, modes and times kept), with
/// `cp -a`: what a move between two file systems is.
pub(super) fn copy_tree(from: &Path, into: &Path) -> Result<(), String> {
    let mut source = from.as_os_str().to_owned();
    source.push("/.");
    run("cp", &["-a".as_ref(), source.as_os_str(), into.as_os_str()])
}
