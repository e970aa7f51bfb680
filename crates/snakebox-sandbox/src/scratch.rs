//! Size-capped scratch directories on the host.
//!
//! A run's working directory must be visible to the server (to collect the files it produces)
//! yet bounded in size: a plain host directory would let a run fill the disk that holds the
//! data directory (catalogue R-08), since `RLIMIT_FSIZE` caps one file, not their number. When
//! the server may mount (it is root), the directory becomes a tmpfs with `size=` and
//! `nr_inodes=` caps, owned by the sandbox uid; its pages are charged to the memory cgroup of
//! the process that writes them, so a run cannot use it to exceed its memory limit either.
//! A normal user's server mounts it too, inside the mount namespace of its own that it
//! entered at start ([`crate::own_mounts`]); where that was refused, the directory stays
//! plain and the cap is reported as not enforced.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::error::SpawnError;

/// Inodes per MiB of scratch: plenty for real work, a bound for "a million empty files".
const INODES_PER_MIB: u64 = 256;

/// A directory that may be a size-capped tmpfs; unmounted when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    mounted: bool,
}

impl ScratchDir {
    /// Make the existing directory `path` a tmpfs of at most `size_bytes`, owned by `owner`
    /// (uid, gid) or by us, mode 0700. Without the privilege to mount (a normal user's server
    /// outside a mount namespace of its own), `path` is left as it is and
    /// [`ScratchDir::is_capped`] says so.
    ///
    /// # Errors
    /// When the mount itself fails for a reason other than missing privilege.
    pub fn cap(
        path: &Path,
        size_bytes: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<ScratchDir, SpawnError> {
        if !nix::unistd::geteuid().is_root() && !crate::own_mounts::entered() {
            return Ok(ScratchDir::uncapped(path));
        }
        let (uid, gid) = owner.unwrap_or_else(|| {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        });
        let inodes = (size_bytes / (1024 * 1024)).max(1) * INODES_PER_MIB;
        let options = format!("size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}");
        nix::mount::mount(
            Some("snakebox-scratch"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|errno| SpawnError::Path {
            path: path.to_path_buf(),
            source: std::io::Error::from(errno),
        })?;
        Ok(ScratchDir {
            path: path.to_path_buf(),
            mounted: true,
        })
    }

    /// `path` left as it is: no cap on this host (a [`crate::Staging`] whose sandboxes write
    /// elsewhere enforces their size there).
    #[must_use]
    pub fn uncapped(path: &Path) -> ScratchDir {
        ScratchDir {
            path: path.to_path_buf(),
            mounted: false,
        }
    }

    /// Whether the size cap is really in force.
    #[must_use]
    pub fn is_capped(&self) -> bool {
        self.mounted
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.mounted {
            // Detach: a lingering reference (a process that is still being reaped) must not
            // keep the directory from being removed.
            match nix::mount::umount2(&self.path, MntFlags::MNT_DETACH) {
                // Already gone: the server's stop released every mount of its run directories
                // (`Engine::release_host`) before this one was dropped.
                Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
                Err(err) => {
                    tracing::warn!(path = %self.path.display(), %err, "could not unmount a scratch directory");
                }
            }
        }
    }
}

/// Unmount whatever scratch tmpfs is left at `path` by a server that died (best effort).
pub(crate) fn release_stale_scratch(path: &Path) {
    if nix::unistd::geteuid().is_root() {
        let _ = nix::mount::umount2(path, MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::print_stderr)] // The skip reason is for the person running the tests.
    fn scratch_is_capped_when_root_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        fs_err::create_dir(&work).unwrap();
        let scratch = ScratchDir::cap(&work, 1024 * 1024, None).unwrap();
        if !scratch.is_capped() {
            eprintln!("skipped: not root, scratch directories stay plain");
            return;
        }
        // Proof of life: small writes work; the cap: a write past 1 MiB fails with ENOSPC.
        fs_err::write(work.join("small"), b"ok").unwrap();
        let big = vec![0_u8; 2 * 1024 * 1024];
        let err = fs_err::write(work.join("big"), &big).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
        drop(scratch);
        // Unmounted: the tmpfs and its files are gone, the directory is plain again.
        assert!(!work.join("small").exists());
    }
}
