//! The sessions' disk: a share of it per tenant, each bounded by the kernel while calls run.
//!
//! Every file of a session (workspace, virtual environment, `/tmp`) lives in its tenant's
//! share, `<data>/sessions-v1/shares/<slot>/<session>/`. The slot is the tenant's, recorded in
//! the session database ([`super::store::ShareRow`]): it never changes while the tenant has
//! sessions and is never reused, so it names one tenant's files only. On a root server a share
//! is an ext4 image, `shares/<slot>.img`, sparse (it costs only what is written), of
//! `--tenant-sessions-max-disk` bytes, loop-mounted at `shares/<slot>`: a write past it fails
//! with `ENOSPC` in that tenant's code, while the call runs, whatever the other tenants do.
//! Shares are reserved: together they never pass `--sessions-max-disk` (a tenant whose share
//! would is refused a session, and told why), so the host disk gets at most that, and a
//! tenant holding a share can always fill it. A share is made with its tenant's first
//! session and given back with its last.
//!
//! Why an image per tenant and not quotas in one image: ext4 project quotas need the kernel's
//! quota-file support (`CONFIG_QFMT_V2`), which some kernels lack (the dev and CI machines':
//! an image with the quota feature does not even mount there), and a FUSE file system
//! server, a normal user's only way to mount one, keeps no quotas. An image per tenant is
//! bounded the same way by every mechanism. Why reserved and not overcommitted: sparse images
//! whose sizes add up past `--sessions-max-disk` would no longer bound the host disk, and
//! images nested in one image of that size would see the outer one fill under them, which
//! their file system takes as an I/O error (the tenant's file system turned read-only, not an
//! `ENOSPC`).
//!
//! Sessions kept by earlier versions (in the one image all sessions shared,
//! `<data>/sessions-v1.img`, or in plain directories `sessions-v1/<id>`) are moved into
//! their tenants' shares at start; nothing is removed before its copy is complete.
//!
//! A normal user's server cannot loop-mount (ext4 is not mountable in a user namespace); it
//! serves the same images over FUSE, each with a confined `fuse2fs`, in its own user and mount
//! namespace (`snakebox_sandbox::FuseServers`). Without a way to mount (no `mkfs.ext4`, loop
//! devices, `fuse2fs` or `/dev/fuse`), shares are plain directories and each tenant's use is
//! checked between calls only: [`SessionDisk::mechanism`] says which, and why, and
//! `check_environment` reports it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::image;
use super::store::{ShareRow, Store};
use crate::budget::PerTenant;
use crate::ids::human_bytes;
use crate::{EngineError, ErrorKind};

/// The tenants' shares, under the sessions' directory.
const SHARES_DIR: &str = "shares";

/// How this server bounds each share.
#[derive(Debug)]
enum Bound {
    /// An ext4 image per share, loop-mounted by the kernel (a root server).
    Loop,
    /// An ext4 image per share, served over FUSE by a confined `fuse2fs` in the server's own
    /// user and mount namespace (a normal user's server; see `snakebox_sandbox::FuseServers`).
    Fuse(snakebox_sandbox::FuseServers),
    /// Plain directories, checked between calls only; why.
    Plain(String),
}

/// A share this server has opened.
#[derive(Debug)]
struct Held {
    tenant: String,
    dir: PathBuf,
    /// The share's size (its image's, when the kernel bounds it), or why its files cannot be
    /// reached.
    state: Result<u64, String>,
    /// Its `fuse2fs`, when it is served over FUSE.
    fuse: Option<snakebox_sandbox::FuseMount>,
}

impl Held {
    /// The directory, or why its files cannot be reached (its `fuse2fs` may have ended).
    fn reach(&self) -> Result<PathBuf, String> {
        self.state.as_ref().map_err(Clone::clone)?;
        match &self.fuse {
            Some(fuse) if !fuse.is_alive() => Err(format!(
                "the fuse2fs that served it has ended ({})",
                fuse.said()
            )),
            _ => Ok(self.dir.clone()),
        }
    }
}

/// The tenants' shares of the sessions' disk, and how they are bounded.
#[derive(Debug)]
pub(crate) struct SessionDisk {
    data_dir: PathBuf,
    /// `<data>/sessions-v1/shares`.
    shares: PathBuf,
    bound: Bound,
    /// `--sessions-max-disk`: what every share together may reserve.
    total: u64,
    /// `--tenant-sessions-max-disk`: each tenant's share (`[tenants.NAME] sessions_max_disk`
    /// for one set apart).
    share: PerTenant<u64>,
    /// The shares opened, by slot.
    held: Mutex<HashMap<i64, Held>>,
}

/// The lock every server of a data directory takes to make, mount or give back shares (and
/// to move sessions in from before shares): `<data>/sessions-v1.lock`.
struct Lock(#[expect(dead_code, reason = "held for its drop")] nix::fcntl::Flock<std::fs::File>);

impl Lock {
    fn take(data_dir: &Path) -> Result<Lock, String> {
        let path = data_dir.join("sessions-v1.lock");
        let file = fs_err::File::create(&path).map_err(|err| err.to_string())?;
        nix::fcntl::Flock::lock(file.into_parts().0, nix::fcntl::FlockArg::LockExclusive)
            .map(Lock)
            .map_err(|(_, err)| format!("could not lock `{}`: {err}", path.display()))
    }
}

/// Why a share is not mounted as asked.
#[derive(Debug)]
enum ShareError {
    /// It could not be made or mounted.
    Unusable(String),
    /// Another live server holds it mounted at another size (see [`SessionDisk::open`]).
    HeldAtAnotherSize(String),
}

impl From<String> for ShareError {
    fn from(why: String) -> Self {
        Self::Unusable(why)
    }
}

fn unavailable(message: String, hint: &str) -> EngineError {
    EngineError::new(ErrorKind::Unavailable, message).with_hint(hint)
}

impl SessionDisk {
    /// Open the sessions' directory `root` (`<data>/sessions-v1`) and its database, mount
    /// every tenant's share, and move in the sessions kept before shares.
    ///
    /// # Errors
    /// Sessions are then unavailable on this server (its one-shot runs are not):
    /// the database cannot be opened; sessions of an earlier version could not be moved
    /// (they are left where they were, whole); or another live server of the data directory
    /// holds a share mounted at another size than this server's share: its limit could not
    /// be the one that holds there.
    pub(crate) fn open(
        data_dir: &Path,
        root: &Path,
        total: u64,
        share: PerTenant<u64>,
        bwrap: Option<&Path>,
    ) -> Result<(SessionDisk, Store), EngineError> {
        Self::open_with(data_dir, root, total, share, Bound::probe(bwrap))
    }

    /// [`SessionDisk::open`] with shares bounded by `bound`.
    fn open_with(
        data_dir: &Path,
        root: &Path,
        total: u64,
        share: impl Into<PerTenant<u64>>,
        bound: Bound,
    ) -> Result<(SessionDisk, Store), EngineError> {
        let data_hint = "check that the data directory is writable (--data-dir)";
        let _lock = Lock::take(data_dir).map_err(|why| unavailable(why, data_hint))?;
        make_traversable(root).map_err(|why| unavailable(why, data_hint))?;
        let legacy = Legacy::take(data_dir, root)?;
        // Opened after the sessions of an earlier version came out of their image: their
        // file is imported into the store then (`crate::store`).
        let store = crate::store::Database::open(data_dir)
            .and_then(|database| Store::open(&database))
            .map_err(|err| {
                let err = EngineError::from(err);
                unavailable(
                    format!("Failed to open the sessions' store: {}", err.message),
                    err.hint.as_deref().unwrap_or(data_hint),
                )
            })?;
        let shares = root.join(SHARES_DIR);
        make_traversable(&shares).map_err(|why| unavailable(why, data_hint))?;
        let disk = SessionDisk {
            data_dir: data_dir.to_path_buf(),
            shares,
            bound,
            // An image is never smaller than its minimum, nor the disk that holds one.
            total: total.max(image::MIN_BYTES),
            share: share
                .into()
                .map(|share| share.clamp(image::MIN_BYTES, total.max(image::MIN_BYTES))),
            held: Mutex::new(HashMap::new()),
        };
        if let Bound::Plain(why) = &disk.bound {
            tracing::warn!(
                "each tenant's share of the sessions' disk is checked between calls only: {why}"
            );
        }
        let rows = store.shares().map_err(super::db_error)?;
        for row in &rows {
            disk.open_share(&store, row).map_err(|why| {
                unavailable(
                    why,
                    "start this server with the other's --sessions-max-disk and --tenant-sessions-max-disk, stop the other server first (shares are resized at the next start), or give this one a --data-dir of its own",
                )
            })?;
        }
        let source = legacy
            .as_ref()
            .map_or(root, |legacy| legacy.mount.as_path());
        disk.migrate(&store, source, legacy.is_none())
            .map_err(|why| {
                unavailable(
                    format!("The sessions kept before tenants' shares could not be moved into them: {why}"),
                    "nothing was removed: they are still where they were; free disk space (the data directory's file system) or raise --tenant-sessions-max-disk, then start the server again",
                )
            })?;
        if let Some(legacy) = legacy {
            legacy.finish();
        }
        // Shares whose tenant has no session left (a server stopped between deleting the last
        // one and giving the share back) are given back now.
        if !crate::run::other_live_servers(data_dir) {
            for row in store.shares().map_err(super::db_error)? {
                if matches!(store.count_owned(&row.tenant), Ok(0)) {
                    disk.forget(&store, row.slot);
                }
            }
        }
        Ok((disk, store))
    }

    /// The directory of `tenant`'s share, made (and reserved) with its first session.
    ///
    /// # Errors
    /// `quota` when every share together would pass `--sessions-max-disk`; `unavailable`
    /// when the share could not be made or mounted.
    pub(crate) fn acquire(&self, store: &Store, tenant: &str) -> Result<PathBuf, EngineError> {
        let _lock = Lock::take(&self.data_dir).map_err(|why| {
            unavailable(
                why,
                "check that the data directory is writable (--data-dir)",
            )
        })?;
        if let Some(held) = self.dir_of(tenant) {
            return held.map_err(|why| self.share_unusable(&why));
        }
        let (row, made) = match store.share_of(tenant).map_err(super::db_error)? {
            // Made by another server of this data directory since this one started.
            Some(row) => (row, false),
            None => (
                store
                    .add_share(tenant, self.share.of(tenant), Some(self.total))
                    .map_err(super::db_error)?
                    .ok_or_else(|| self.no_room(store, tenant))?,
                true,
            ),
        };
        let opened = self.open_share(store, &row);
        match (opened, self.dir_of(tenant)) {
            (Ok(()), Some(Ok(dir))) => Ok(dir),
            (Err(why), _) | (Ok(()), Some(Err(why))) => {
                // A share made here that could not be mounted reserves nothing (its tenant has
                // no session yet); another server's is left as it is, files and all.
                if made {
                    self.forget(store, row.slot);
                }
                Err(self.share_unusable(&why))
            }
            (Ok(()), None) => Err(self.share_unusable("it was not opened")),
        }
    }

    /// Give `tenant`'s share back (its last session is gone): unmounted, its image or
    /// directory removed, its reservation freed. Only when no other live server uses the data
    /// directory (one may be creating a session in it now; a later start does it then), and
    /// when `unused` (asked under the shares' lock, which a create takes to get its share)
    /// says no session of the tenant is being created.
    pub(crate) fn release(&self, store: &Store, tenant: &str, unused: impl FnOnce() -> bool) {
        if crate::run::other_live_servers(&self.data_dir) {
            return;
        }
        let Ok(_lock) = Lock::take(&self.data_dir) else {
            return;
        };
        let Ok(Some(row)) = store.share_of(tenant) else {
            return;
        };
        if !matches!(store.count_owned(tenant), Ok(0)) || !unused() {
            return;
        }
        self.forget(store, row.slot);
        tracing::info!(
            slot = row.slot,
            "gave back a tenant's share of the sessions' disk (its last session was deleted)"
        );
    }

    /// Unmount a share and remove its files and its record.
    fn forget(&self, store: &Store, slot: i64) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&slot);
        if let Some(mut fuse) = held.and_then(|held| held.fuse) {
            fuse.release(FUSE_RELEASE_WAIT);
        }
        let dir = self.shares.join(slot.to_string());
        if image::is_mount_point(&dir)
            && let Err(why) = image::unmount(&dir)
        {
            tracing::warn!("{why}");
            return;
        }
        let image = self.image_of(slot);
        if image.exists()
            && let Err(err) = fs_err::remove_file(&image)
        {
            tracing::warn!(%err, "could not remove a share's image");
            return;
        }
        if dir.exists()
            && let Err(err) = crate::tree::remove(&dir)
        {
            tracing::warn!(%err, "could not remove a share's directory");
            return;
        }
        if let Err(err) = store.remove_share(slot) {
            tracing::warn!(%err, "could not record that a share was given back");
        }
    }

    /// The directory of `tenant`'s share when this server holds one (`Err`: why its files
    /// cannot be reached).
    pub(crate) fn dir_of(&self, tenant: &str) -> Option<Result<PathBuf, String>> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.values()
            .find(|held| held.tenant == tenant)
            .map(Held::reach)
    }

    /// Every share's directory that can be reached (for sweeping what no session owns).
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .filter(|held| held.state.is_ok())
            .map(|held| held.dir.clone())
            .collect()
    }

    /// The error of a call on a share that cannot be reached.
    pub(crate) fn share_unusable(&self, why: &str) -> EngineError {
        unavailable(
            format!("Your sessions' share of the disk could not be opened: {why}"),
            "the operator finds the cause in the server's log; the session's files are not removed",
        )
    }

    fn no_room(&self, store: &Store, tenant: &str) -> EngineError {
        let reserved = store.reserved_bytes().unwrap_or(self.total);
        let count = store.shares().map_or(0, |shares| shares.len());
        EngineError::new(
            ErrorKind::Quota,
            format!(
                "The sessions' disk has no room for another tenant's share: {count} tenants' shares reserve {} of {} (--sessions-max-disk), and a share is {} (--tenant-sessions-max-disk)",
                human_bytes(reserved),
                human_bytes(self.total),
                human_bytes(self.share.of(tenant))
            ),
        )
        .with_hint(
            "a share is given back when its tenant's last session is deleted (sessions unused for --session-idle-delete are); the operator can raise --sessions-max-disk or lower --tenant-sessions-max-disk",
        )
    }

    fn image_of(&self, slot: i64) -> PathBuf {
        self.shares.join(format!("{slot}.img"))
    }

    /// Mount (making it first if needed) the share of `row` and hold it.
    ///
    /// # Errors
    /// Only when another live server holds it at another size (see [`SessionDisk::open`]);
    /// a share that cannot be mounted is held with why.
    fn open_share(&self, store: &Store, row: &ShareRow) -> Result<(), String> {
        self.open_share_sized(store, row, self.share.of(&row.tenant))
    }

    /// [`SessionDisk::open_share`] with an image of `size` (sessions moved in from before
    /// shares may need more than a share).
    fn open_share_sized(&self, store: &Store, row: &ShareRow, size: u64) -> Result<(), String> {
        let dir = self.shares.join(row.slot.to_string());
        let image = self.image_of(row.slot);
        let mut fuse = None;
        let state = match &self.bound {
            Bound::Loop => match mount_share(&self.data_dir, &image, &dir, size) {
                Ok(size) => Ok(size),
                Err(ShareError::HeldAtAnotherSize(why)) => return Err(why),
                Err(ShareError::Unusable(why)) => Err(why),
            },
            Bound::Fuse(servers) => {
                serve_share(servers, &self.data_dir, &image, &dir, size).map(|(size, mount)| {
                    fuse = Some(mount);
                    size
                })
            }
            Bound::Plain(why) if image.exists() => Err(format!(
                "its files are in the image `{}`, which this server cannot mount ({why})",
                image.display()
            )),
            Bound::Plain(_) => make_traversable(&dir).map(|()| size),
        };
        match &state {
            Ok(size) => {
                let _ = store.set_share_bytes(row.slot, *size);
            }
            Err(why) => {
                tracing::warn!(
                    slot = row.slot,
                    "a tenant's share of the sessions' disk cannot be used: {why}"
                );
            }
        }
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                row.slot,
                Held {
                    tenant: row.tenant.clone(),
                    dir,
                    state,
                    fuse,
                },
            );
        Ok(())
    }

    /// Move the sessions kept before shares (directories `<id>` in `source`) into their
    /// tenants' shares. Each is copied beside its place and renamed into it when whole, so a
    /// start that stops half-way finds either all of a session or none of it; `remove`: the
    /// originals go once copied (plain directories; an old image goes whole afterwards).
    fn migrate(&self, store: &Store, source: &Path, remove: bool) -> Result<(), String> {
        let mut by_owner: HashMap<String, Vec<String>> = HashMap::new();
        let Ok(entries) = fs_err::read_dir(source) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if !id.starts_with("s-")
                || !super::valid_id(id)
                || !entry.file_type().is_ok_and(|kind| kind.is_dir())
            {
                continue;
            }
            // Unrecorded directories are the remains of a create a killed server left (the
            // orphans' sweep removes them).
            if let Ok(Some(row)) = store.get(id) {
                by_owner.entry(row.owner).or_default().push(id.to_owned());
            }
        }
        for (owner, ids) in by_owner {
            let needed: u64 = ids
                .iter()
                .map(|id| super::files::tree_bytes(&source.join(id)).0)
                .sum();
            let dir = match self.dir_of(&owner) {
                Some(held) => held?,
                None => {
                    // A share, or (when its files need more) room for them, ext4's own
                    // metadata and some to work in.
                    let size = (needed + needed / 4 + (16 << 20)).next_multiple_of(1 << 20);
                    let size = size.max(self.share.of(&owner));
                    let row = store
                        .add_share(&owner, size, None)
                        .map_err(|err| err.to_string())?
                        .ok_or("the share could not be recorded")?;
                    self.open_share_sized(store, &row, size)?;
                    self.dir_of(&owner).ok_or("the share was not opened")??
                }
            };
            for id in ids {
                let from = source.join(&id);
                let into = dir.join(&id);
                if !into.exists() {
                    let partial = dir.join(format!("{id}.moving"));
                    if partial.exists() {
                        crate::tree::remove(&partial).map_err(|err| err.to_string())?;
                    }
                    let renamed = remove && fs_err::rename(&from, &into).is_ok();
                    if !renamed {
                        fs_err::create_dir(&partial).map_err(|err| err.to_string())?;
                        image::copy_tree(&from, &partial)?;
                        fs_err::rename(&partial, &into).map_err(|err| err.to_string())?;
                    }
                    tracing::info!(session = %id, "moved a session into its tenant's share of the sessions' disk");
                }
                if remove && from.exists() {
                    crate::tree::remove(&from).map_err(|err| err.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Start a small watchdog (`/bin/sh`, its own session) that unmounts the shares when this
    /// process is gone, however it ended (a SIGKILL included), unless another live server of
    /// the data directory uses them by then (the same rule as [`SessionDisk::release_all`]).
    /// Without it, a killed server would leave them mounted until the next start.
    pub(crate) fn watch(&self) {
        if !matches!(self.bound, Bound::Loop) {
            return;
        }
        const WATCHDOG: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done
for d in "$3"/*; do p=${d##*/}; [ "$p" != "$1" ] && [ -d "/proc/$p" ] && exit 0; done
for m in "$2"/*; do [ -d "$m" ] && umount -l "$m" 2>/dev/null; done
exit 0"#;
        let mut command = std::process::Command::new("/bin/sh");
        command
            .args(["-c", WATCHDOG, "snakebox-sessions-disk-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&self.shares)
            .arg(crate::run::runs_dir(&self.data_dir))
            .env_clear()
            .env("PATH", image::TOOL_PATH)
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

    /// Unmount every share unless another live server uses this data directory (their files
    /// stay in their images; the next start mounts them again). Shares served over FUSE are
    /// this server's alone (its own mount namespace): each is unmounted, and its `fuse2fs`
    /// writes out what it holds and ends.
    pub(crate) fn release_all(&self) {
        match self.bound {
            Bound::Plain(_) => {}
            Bound::Fuse(_) => {
                let mut mounts: Vec<snakebox_sandbox::FuseMount> = self
                    .held
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .values_mut()
                    .filter_map(|held| held.fuse.take())
                    .collect();
                // All unmounted first, then one bound for all to write out and end.
                for mount in &mounts {
                    mount.detach();
                }
                let deadline = std::time::Instant::now() + FUSE_RELEASE_WAIT;
                for mount in &mut mounts {
                    if !mount.finish(deadline) {
                        tracing::warn!(
                            "a fuse2fs did not end by itself after its share was unmounted: it was ended (its image is checked at the next start)"
                        );
                    }
                }
            }
            Bound::Loop => {
                if crate::run::other_live_servers(&self.data_dir) {
                    return;
                }
                for dir in self.dirs() {
                    if image::is_mount_point(&dir)
                        && let Err(why) = image::unmount(&dir)
                    {
                        tracing::warn!("{why}");
                    }
                }
            }
        }
    }

    /// Whether the kernel bounds each share while calls run.
    pub(crate) fn bounded(&self) -> bool {
        !matches!(self.bound, Bound::Plain(_))
    }

    /// `--tenant-sessions-max-disk`, as this server holds it.
    pub(crate) fn share_bytes(&self) -> u64 {
        self.share.default_value()
    }

    /// What `tenant`'s share holds: its image's size when it has one open, else a share.
    pub(crate) fn share_of(&self, tenant: &str) -> u64 {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .find(|held| held.tenant == tenant)
            .and_then(|held| held.state.as_ref().ok().copied())
            .unwrap_or_else(|| self.share.of(tenant))
    }

    /// Bytes used and free in `tenant`'s share, when the kernel bounds it and it is open.
    pub(crate) fn usage(&self, tenant: &str) -> Option<(u64, u64)> {
        if !self.bounded() {
            return None;
        }
        let dir = self.dir_of(tenant)?.ok()?;
        let stat = nix::sys::statvfs::statvfs(&dir).ok()?;
        let block = stat.fragment_size();
        let free = stat.blocks_available().saturating_mul(block);
        let used = stat
            .blocks()
            .saturating_sub(stat.blocks_free())
            .saturating_mul(block);
        Some((used, free))
    }

    /// How the shares are held, in words, for `tenant` (`None`: the operator's view).
    pub(crate) fn mechanism(&self, store: &Store, tenant: Option<&str>) -> String {
        let reserved = store.reserved_bytes().unwrap_or(0);
        let count = store.shares().map_or(0, |shares| shares.len());
        let shares = format!(
            "shares are reserved: together they hold at most --sessions-max-disk ({}; {count} held now, reserving {})",
            human_bytes(self.total),
            human_bytes(reserved)
        );
        let share = tenant.map_or_else(|| self.share.default_value(), |t| self.share.of(t));
        let own = tenant.map(|tenant| self.share_of(tenant));
        let yours = match own {
            Some(size) if size != share => format!(
                "; your share's image is {} (its files did not fit a smaller one)",
                human_bytes(size)
            ),
            _ => String::new(),
        };
        match &self.bound {
            Bound::Loop => format!(
                "enforced by the kernel while calls run, per tenant: each tenant's sessions live in an ext4 image of its own, its share ({} each, --tenant-sessions-max-disk{yours}), sparse, loop-mounted under `{}`; a write past it fails with ENOSPC (No space left on device) in that tenant's code only; usable space is a little less (ext4's own metadata); {shares}, so the host disk gets at most that",
                human_bytes(share),
                self.shares.display()
            ),
            Bound::Fuse(servers) => format!(
                "enforced while calls run, per tenant: each tenant's sessions live in an ext4 image of its own, its share ({} each, --tenant-sessions-max-disk{yours}), sparse, under `{}`, served over FUSE by `{}` (the server is not root: it mounts in its own user and mount namespace, and each fuse2fs runs in a sandbox holding only its image); a write past it fails with ENOSPC (No space left on device) in that tenant's code only; usable space is a little less (ext4's own metadata); {shares}, so the host disk gets at most that",
                human_bytes(share),
                self.shares.display(),
                servers.fuse2fs().display()
            ),
            Bound::Plain(why) => format!(
                "checked between calls only, not while a call runs ({why}): each tenant's sessions may use {} (--tenant-sessions-max-disk), all tenants' together {} (--sessions-max-disk), and one call can write past them until the next check",
                human_bytes(share),
                human_bytes(self.total)
            ),
        }
    }
}

impl Bound {
    /// A root server with `mkfs.ext4` and loop devices mounts an image per share; a normal
    /// user's server serves them over FUSE when it can; anything else keeps plain directories,
    /// and says why (with what would fix it). `bwrap`: the operator's bubblewrap, which
    /// confines `fuse2fs`.
    fn probe(bwrap: Option<&Path>) -> Bound {
        let found = |name: &str| {
            image::TOOL_PATH
                .split(':')
                .any(|dir| Path::new(dir).join(name).exists())
        };
        let root = nix::unistd::geteuid().is_root();
        let tools: &[&str] = if root {
            &["mkfs.ext4", "mount", "e2fsck", "resize2fs"]
        } else {
            &["mkfs.ext4", "e2fsck", "resize2fs"]
        };
        for tool in tools {
            if !found(tool) {
                return Bound::Plain(format!(
                    "`{tool}` is not installed (e2fsprogs and mount, in {})",
                    image::TOOL_PATH
                ));
            }
        }
        if !root {
            return match snakebox_sandbox::FuseServers::probe(bwrap) {
                Ok(servers) => Bound::Fuse(servers),
                Err(err) => Bound::Plain(format!(
                    "the server is not root, and cannot serve the shares' images over FUSE: {err}{}",
                    err.hint()
                        .map(|hint| format!("; hint: {hint}"))
                        .unwrap_or_default()
                )),
            };
        }
        if !Path::new("/dev/loop-control").exists() {
            return Bound::Plain("this host has no loop devices (/dev/loop-control)".into());
        }
        Bound::Loop
    }
}

/// Make `dir` (and its parents), traversable by the sandbox users: their own directories are
/// below.
fn make_traversable(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::create_dir_all(dir)
        .and_then(|()| fs_err::set_permissions(dir, std::fs::Permissions::from_mode(0o711)))
        .map_err(|err| err.to_string())
}

/// Mount (making it first if needed) the share image `image` of `size` bytes at `dir`, unless
/// it is mounted already at that size. Files of a share kept as a plain directory (by a
/// server that could not mount) are moved in. Returns the image's size.
fn mount_share(data_dir: &Path, image: &Path, dir: &Path, size: u64) -> Result<u64, ShareError> {
    fs_err::create_dir_all(dir).map_err(|err| err.to_string())?;
    if image::is_mount_point(dir) {
        let held = fs_err::metadata(image).map_or(0, |m| m.len());
        if held == size {
            // Another live server's, or left by one that was killed: the same bound.
            return Ok(held);
        }
        if crate::run::other_live_servers(data_dir) {
            return Err(ShareError::HeldAtAnotherSize(format!(
                "a tenant's share of the sessions' disk (`{}`) is mounted at {} by another live server of this data directory, and this one was started with shares of {} (--tenant-sessions-max-disk, by default a part of --sessions-max-disk); it cannot hold its own limit there",
                image.display(),
                human_bytes(held),
                human_bytes(size)
            )));
        }
        // Left mounted by a server that was killed, at another size: mounted anew at this
        // one's (resized below).
        image::unmount(dir)
            .map_err(|why| format!("could not unmount the earlier image to resize it: {why}"))?;
    }
    image::wait_until_detached(image)?;
    let size = if image.exists() {
        image::resize_or_keep(image, size)?
    } else {
        image::make(image, size, None)?;
        size
    };
    mount_over(
        dir,
        || image::loop_mount(image, dir, false),
        |()| {
            let _ = image::unmount(dir);
        },
    )?;
    Ok(size)
}

/// How long the shares' `fuse2fs` have to write out what they hold once unmounted.
const FUSE_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serve the share image `image` of `size` bytes at `dir` over FUSE (making it first if
/// needed): locked for its `fuse2fs`, repaired if that one was killed, resized, then served.
/// `data_dir`: whether another live server of it may hold the image. Returns the image's
/// size and the mount.
fn serve_share(
    servers: &snakebox_sandbox::FuseServers,
    data_dir: &Path,
    image: &Path,
    dir: &Path,
    size: u64,
) -> Result<(u64, snakebox_sandbox::FuseMount), String> {
    let said = |err: snakebox_sandbox::FuseError| {
        format!(
            "{err}{}",
            err.hint()
                .map(|hint| format!("; hint: {hint}"))
                .unwrap_or_default()
        )
    };
    fs_err::create_dir_all(dir).map_err(|err| err.to_string())?;
    if !image.exists() {
        let owner = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        image::make(image, size, Some(owner))?;
    }
    // An earlier server's fuse2fs may still be writing it out; a live one's serves it for
    // good (its namespace is its own): no wait then.
    let wait = if crate::run::other_live_servers(data_dir) {
        std::time::Duration::ZERO
    } else {
        snakebox_sandbox::FUSE_LOCK_WAIT
    };
    let lock = snakebox_sandbox::lock_image(image, wait).map_err(said)?;
    image::repair(image)?;
    let size = image::resize_or_keep(image, size)?;
    let mount = mount_over(
        dir,
        || servers.serve(lock, dir).map_err(said),
        |mut mount| {
            mount.release(FUSE_RELEASE_WAIT);
        },
    )?;
    Ok((size, mount))
}

/// Mount a share's image at `dir` with `mount`, then make it ready: files of a share kept as
/// a plain directory (by a server that could not mount) are moved in (`undo` undoes the
/// mount when they cannot be), the root made traversable, `lost+found` removed.
fn mount_over<T>(
    dir: &Path,
    mount: impl FnOnce() -> Result<T, String>,
    undo: impl FnOnce(T),
) -> Result<T, String> {
    let plain = fs_err::read_dir(dir)
        .map_err(|err| err.to_string())?
        .next()
        .is_some();
    let aside = dir.with_extension("plain");
    if plain {
        fs_err::rename(dir, &aside).map_err(|err| err.to_string())?;
        fs_err::create_dir(dir).map_err(|err| err.to_string())?;
    }
    let mounted = match mount() {
        Ok(mounted) => mounted,
        Err(why) => {
            if plain {
                let _ = fs_err::remove_dir(dir);
                let _ = fs_err::rename(&aside, dir);
            }
            return Err(why);
        }
    };
    if plain {
        if let Err(why) = image::copy_tree(&aside, dir) {
            // Back to how it was: the plain directory, not usable here, said so.
            undo(mounted);
            let _ = fs_err::remove_dir(dir);
            let _ = fs_err::rename(&aside, dir);
            return Err(format!(
                "the share's files kept in a plain directory could not be moved into its image ({why})"
            ));
        }
        if let Err(err) = crate::tree::remove(&aside) {
            tracing::warn!(%err, "could not remove a share's old directory");
        }
    }
    make_traversable(dir)?;
    let lost = dir.join("lost+found");
    if lost.is_dir() {
        let _ = fs_err::remove_dir(&lost);
    }
    Ok(mounted)
}

/// The one image every session shared before shares (`<data>/sessions-v1.img`, made by root
/// servers of earlier versions), mounted read-only aside while its sessions are moved into
/// their tenants' shares, and removed once they all are.
struct Legacy {
    image: PathBuf,
    mount: PathBuf,
}

impl Legacy {
    /// Mount the old image aside (unmounting it from `root`, where a killed server may have
    /// left it) and copy the session database out of it into `root`.
    fn take(data_dir: &Path, root: &Path) -> Result<Option<Legacy>, EngineError> {
        let image = root.with_extension("img");
        if !image.exists() {
            return Ok(None);
        }
        let hint = "nothing was removed: the sessions are still in that image";
        if crate::run::other_live_servers(data_dir) {
            return Err(unavailable(
                format!(
                    "The sessions of this data directory are still in `{}`, the one image all sessions shared before tenants' shares, and another live server (of an earlier version) uses it",
                    image.display()
                ),
                &format!(
                    "stop that server, then start this one: it moves each tenant's sessions into its own share; {hint}"
                ),
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(unavailable(
                format!(
                    "The sessions of this data directory are in `{}`, an image a root server made, which this server (not root) cannot mount",
                    image.display()
                ),
                &format!(
                    "start the server once as root (it moves each tenant's sessions into its own share), or use another --data-dir; {hint}"
                ),
            ));
        }
        let shown = image.display().to_string();
        let moving = |why: String| {
            unavailable(
                format!(
                    "The sessions kept in `{shown}` could not be opened to move them into tenants' shares: {why}"
                ),
                hint,
            )
        };
        if image::is_mount_point(root) {
            image::unmount(root).map_err(moving)?;
        }
        image::wait_until_detached(&image).map_err(moving)?;
        let mount = image.with_extension("img.d");
        fs_err::create_dir_all(&mount).map_err(|err| moving(err.to_string()))?;
        if image::is_mount_point(&mount) {
            image::unmount(&mount).map_err(moving)?;
        }
        image::loop_mount(&image, &mount, true).map_err(moving)?;
        let legacy = Legacy { image, mount };
        // The database comes out first (once: a start that stopped half-way copied it).
        // (Not when it was taken out and imported into the store already.)
        if !root.join("sessions.db").exists()
            && !root
                .join(format!("sessions.db{}", crate::store::IMPORTED_SUFFIX))
                .exists()
        {
            for name in ["sessions.db-wal", "sessions.db-shm", "sessions.db"] {
                let from = legacy.mount.join(name);
                if from.exists() {
                    fs_err::copy(&from, root.join(name)).map_err(|err| moving(err.to_string()))?;
                }
            }
        }
        Ok(Some(legacy))
    }

    /// Every session is in its share: unmount and remove the old image.
    fn finish(self) {
        let _ = image::unmount(&self.mount);
        let _ = fs_err::remove_dir(&self.mount);
        match fs_err::remove_file(&self.image) {
            Ok(()) => tracing::info!(
                image = %self.image.display(),
                "every session is in its tenant's share of the sessions' disk: removed the image they shared"
            ),
            Err(err) => tracing::warn!(%err, "could not remove the image the sessions shared"),
        }
    }
}

impl Drop for Legacy {
    fn drop(&mut self) {
        if image::is_mount_point(&self.mount) {
            let _ = image::unmount(&self.mount);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::store::SessionRow;

    fn plain() -> Bound {
        Bound::Plain("tests keep plain directories".into())
    }

    fn row(id: &str, owner: &str) -> SessionRow {
        SessionRow {
            id: id.into(),
            name: None,
            interpreter: "/usr/bin/python3".into(),
            python_version: "3.11.2".into(),
            base_requirements: Vec::new(),
            requirements: Vec::new(),
            packages: Vec::new(),
            venv_bytes: 0,
            work_bytes: 0,
            created_at: 1,
            last_used_at: 1,
            executions: 0,
            network: false,
            network_names: Vec::new(),
            owner: owner.into(),
            profile: None,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn shares_are_reserved_within_the_disk_and_given_back() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sessions-v1");
        let (disk, store) =
            SessionDisk::open_with(data.path(), &root, 100 * MIB, 40 * MIB, plain()).unwrap();
        let a = disk.acquire(&store, "a").unwrap();
        let b = disk.acquire(&store, "b").unwrap();
        assert!(a.is_dir() && b.is_dir() && a != b);
        assert_eq!(
            disk.acquire(&store, "a").unwrap(),
            a,
            "one share per tenant"
        );
        // 40 + 40 + 40 > 100: a third tenant is refused, and told the totals only.
        let refused = disk.acquire(&store, "c").unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Quota);
        assert!(
            refused
                .message
                .contains("2 tenants' shares reserve 80 MiB of 100 MiB"),
            "{}",
            refused.message
        );
        assert!(!refused.message.contains("`a`") && !refused.message.contains("`b`"));
        assert!(refused.hint.unwrap().contains("--tenant-sessions-max-disk"));
        // A tenant with a session keeps its share; one without gives it back.
        store.insert(&row("s-1", "a")).unwrap();
        disk.release(&store, "a", || true);
        assert!(a.is_dir() && disk.dir_of("a").is_some());
        disk.release(&store, "b", || false);
        assert!(b.is_dir(), "a create of b's was going on");
        disk.release(&store, "b", || true);
        assert!(!b.exists() && disk.dir_of("b").is_none());
        let c = disk.acquire(&store, "c").unwrap();
        assert_ne!(c, b, "a slot is never reused");
        assert_eq!(store.reserved_bytes().unwrap(), 80 * MIB);
    }

    #[test]
    fn sessions_kept_in_plain_directories_move_into_their_tenants_shares() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sessions-v1");
        fs_err::create_dir_all(&root).unwrap();
        {
            let store = Store::at(&root.join("sessions.db"));
            for (id, owner) in [("s-a1", "a"), ("s-a2", "a"), ("s-b1", "b")] {
                store.insert(&row(id, owner)).unwrap();
                fs_err::create_dir_all(root.join(id).join("work")).unwrap();
                fs_err::write(root.join(id).join("work/f.txt"), id).unwrap();
            }
        }
        // Unrecorded: left for the orphans' sweep.
        fs_err::create_dir_all(root.join("s-orphan")).unwrap();
        let (disk, store) =
            SessionDisk::open_with(data.path(), &root, 100 * MIB, 40 * MIB, plain()).unwrap();
        for (id, owner) in [("s-a1", "a"), ("s-a2", "a"), ("s-b1", "b")] {
            let share = disk.dir_of(owner).unwrap().unwrap();
            let moved = fs_err::read_to_string(share.join(id).join("work/f.txt")).unwrap();
            assert_eq!(moved, id);
            assert!(!root.join(id).exists(), "{id} is still in its old place");
        }
        assert!(root.join("s-orphan").is_dir());
        assert_eq!(store.shares().unwrap().len(), 2);
        // Opening again finds them where they are.
        drop((disk, store));
        let (disk, _store) =
            SessionDisk::open_with(data.path(), &root, 100 * MIB, 40 * MIB, plain()).unwrap();
        let share = disk.dir_of("a").unwrap().unwrap();
        assert!(share.join("s-a2/work/f.txt").is_file());
    }

    #[test]
    fn a_share_in_an_image_this_server_cannot_mount_is_reported_not_replaced() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sessions-v1");
        let (disk, store) =
            SessionDisk::open_with(data.path(), &root, 100 * MIB, 40 * MIB, plain()).unwrap();
        let share = disk.acquire(&store, "a").unwrap();
        store.insert(&row("s-1", "a")).unwrap();
        let slot = store.share_of("a").unwrap().unwrap().slot;
        drop((disk, store));
        // As a root server would have left it.
        fs_err::write(root.join(SHARES_DIR).join(format!("{slot}.img")), "").unwrap();
        let (disk, store) =
            SessionDisk::open_with(data.path(), &root, 100 * MIB, 40 * MIB, plain()).unwrap();
        let why = disk.dir_of("a").unwrap().unwrap_err();
        assert!(why.contains("which this server cannot mount"), "{why}");
        let refused = disk.acquire(&store, "a").unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Unavailable);
        assert!(share.is_dir(), "nothing was removed");
    }

    /// The one image all sessions shared before shares, as a root server of an earlier
    /// version left it: moved into per-tenant images, each loop-mounted, and removed. Needs
    /// root and e2fsprogs (skipped otherwise).
    #[test]
    fn the_image_all_sessions_shared_is_split_into_tenants_shares() {
        if !matches!(Bound::probe(None), Bound::Loop) {
            // Skipped: needs a root server's loop devices and e2fsprogs.
            return;
        }
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sessions-v1");
        let old = root.with_extension("img");
        fs_err::create_dir_all(&root).unwrap();
        image::make(&old, 64 * MIB, None).unwrap();
        image::loop_mount(&old, &root, false).unwrap();
        {
            let store = Store::at(&root.join("sessions.db"));
            for (id, owner) in [("s-a1", "a"), ("s-b1", "b")] {
                store.insert(&row(id, owner)).unwrap();
                fs_err::create_dir_all(root.join(id).join("work")).unwrap();
                fs_err::write(root.join(id).join("work/f.txt"), id).unwrap();
            }
        }
        // Left mounted, as by a server that was killed.
        let (disk, store) =
            SessionDisk::open_with(data.path(), &root, 256 * MIB, 64 * MIB, Bound::Loop).unwrap();
        struct Unmount<'a>(&'a SessionDisk);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                self.0.release_all();
            }
        }
        let _unmount = Unmount(&disk);
        for (id, owner) in [("s-a1", "a"), ("s-b1", "b")] {
            let share = disk.dir_of(owner).unwrap().unwrap();
            assert!(
                image::is_mount_point(&share),
                "{owner}'s share is not mounted"
            );
            let moved = fs_err::read_to_string(share.join(id).join("work/f.txt")).unwrap();
            assert_eq!(moved, id);
        }
        assert!(!old.exists(), "the shared image is still there");
        assert!(!image::is_mount_point(&root));
        assert_eq!(store.get("s-a1").unwrap().unwrap().owner, "a");
        assert_eq!(store.reserved_bytes().unwrap(), 128 * MIB);
    }
}
