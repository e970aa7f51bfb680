//! A normal user's server in a user and mount namespace of its own, so that it may mount.
//!
//! A root server caps each run's `/work` with a size- and inode-limited tmpfs mounted on the
//! host directory the server collects the run's files from ([`crate::ScratchDir`]). A normal
//! user cannot mount there, and `/work` stayed a plain directory: one run could fill the disk
//! of the data directory (720 MiB written under a 512 MiB limit, issue 33). tmpfs may be
//! mounted by anyone inside a user namespace they made (the kernel allows it to every user
//! namespace's owner), so before it starts any thread, a normal user's server unshares a
//! user namespace that maps only its own uid and gid to themselves, and a mount namespace
//! owned by it. Nothing else changes: the server keeps its uid (every non-root path stays the
//! non-root one), holds capabilities only over its own mounts, and loses them at `exec`
//! (uv, bwrap and every program it starts run as the user, as before; bwrap's own user
//! namespace nests in this one). Its mounts are invisible outside it and die with it, so a
//! killed server leaves none behind.

use std::sync::atomic::{AtomicBool, Ordering};

static ENTERED: AtomicBool = AtomicBool::new(false);

/// Whether this process lives in a user and mount namespace of its own ([`enter`] worked).
#[must_use]
pub fn entered() -> bool {
    ENTERED.load(Ordering::Relaxed)
}

/// For a normal user's process: unshare a user namespace mapping only its own ids and a
/// mount namespace, and stop mount events from reaching the host's (`/` made a slave).
/// Root does nothing (it may mount where it is). Must be called while the process has one
/// thread: the kernel refuses a new user namespace to a threaded process.
///
/// # Errors
/// When the kernel refuses (unprivileged user namespaces disabled, or threads running); the
/// process is then unchanged and `/work` stays a plain directory (reported as not capped).
pub fn enter() -> std::io::Result<()> {
    use nix::sched::CloneFlags;
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    if uid.is_root() {
        return Ok(());
    }
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)?;
    // An unprivileged writer of gid_map must give up setgroups first.
    fs_err::write("/proc/self/setgroups", "deny")?;
    fs_err::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    fs_err::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    // Mounts made here never propagate back (the copied mounts are locked to the host's
    // anyway); the host's later mounts still reach us.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_SLAVE,
        None::<&str>,
    )?;
    ENTERED.store(true, Ordering::Relaxed);
    Ok(())
}
