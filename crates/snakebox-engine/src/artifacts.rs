//! Files out: the artifact store.
//!
//! After a run, every regular file the script created or changed in its working directory is
//! copied into `<data>/artifacts-v1/<execution_id>/files/<path>`, next to a `manifest.json`,
//! and is readable as `snakebox://artifacts/<execution_id>/<path>` until the retention rule
//! removes it: entries older than `max_age` go, and each tenant keeps its artifacts within its
//! own budget ([`crate::StoreBudgets::artifact_bytes`]): past it, that tenant's oldest go
//! ([`crate::budget`]). The store's total (`max_bytes`) never removes another tenant's
//! files either: a run whose files would take the store past it makes room by removing its
//! own tenant's oldest, and when that is not enough its files are not kept (the result says
//! so). An entry removed before its time keeps its manifest (a tombstone, without its files)
//! until it would have expired, so reading it says why it is gone.
//!
//! The working directory belongs to untrusted code, so collection trusts nothing in it: every
//! directory is opened relative to its parent with `O_NOFOLLOW | O_DIRECTORY`, every file is
//! classified with `fstatat(AT_SYMLINK_NOFOLLOW)` and then opened with `O_NOFOLLOW` and checked
//! again on the open descriptor (same inode, still a regular file), symbolic links, FIFOs,
//! sockets and devices are skipped, files with more than one hard link are skipped (they may
//! be a host file's other name), and sizes, counts and the walk itself are bounded. An entry is
//! built in a temporary directory and renamed into place, so readers never see half of it.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::stat::FileStat;
use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Ledger, Store, Usage};
use crate::result::{Artifact, ArtifactOrigin, InlineImage, SkippedFile};
use snakebox_fs::RelativePath;

/// The URI scheme and authority of artifacts.
pub const URI_PREFIX: &str = "snakebox://artifacts/";
/// The RFC 6570 template of artifact URIs (for `resources/templates/list`).
pub const URI_TEMPLATE: &str = "snakebox://artifacts/{execution_id}/{+path}";
/// Versioned bucket under the data directory.
const BUCKET: &str = "artifacts-v1";
const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";

/// Most files kept from one run.
pub(crate) const MAX_FILES_PER_RUN: usize = 100;
/// Largest single file kept.
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;
/// Most bytes kept from one run (also bounded by the store's quota).
pub(crate) const MAX_RUN_BYTES: u64 = 128 << 20;
/// Directory entries examined per run before the walk gives up.
const MAX_ENTRIES: usize = 10_000;
/// Deepest directory examined.
const MAX_DEPTH: usize = 32;
/// Largest image sent inline; larger ones are only linked.
pub(crate) const INLINE_IMAGE_MAX_BYTES: usize = 1 << 20;
/// Most images sent inline in one reply.
pub(crate) const MAX_INLINE_IMAGES: usize = 4;
/// Most skipped files listed (the rest are counted in one line).
const MAX_SKIPPED_LISTED: usize = 50;
/// Unfinished entries older than this are debris from a crash.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// The per-run bounds, in words (for `check_environment`).
pub(crate) fn limits_text() -> String {
    format!(
        "up to {MAX_FILES_PER_RUN} files per run, {} MiB per file, {} MiB per run; hidden files (.name) and symbolic links, hard links, FIFOs, sockets and devices are not kept; up to {MAX_INLINE_IMAGES} images of at most {} MiB inline per reply",
        MAX_FILE_BYTES >> 20,
        MAX_RUN_BYTES >> 20,
        INLINE_IMAGE_MAX_BYTES >> 20
    )
}

/// Why an artifact cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Not a `snakebox://artifacts/<execution_id>/<path>` URI, or an unsafe path.
    #[error("Invalid artifact URI `{uri}`: {reason}")]
    InvalidUri {
        /// The URI as given (shortened).
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No such artifact (never existed, or removed by the retention rule).
    #[error("No artifact `{0}` (it never existed or was removed by the retention rule)")]
    NotFound(String),
    /// The artifact existed and was removed before its time, by its own tenant's budget
    /// (or to make room for that tenant's newer artifacts in a full store).
    #[error("Artifact `{uri}` was removed {why}")]
    Removed {
        /// The URI.
        uri: String,
        /// Why, and the bound that removed it.
        why: String,
        /// Which bound: `tenant_budget` or `store_full`.
        reason: String,
    },
    /// Reading failed.
    #[error("Failed to read artifact `{uri}`")]
    Io {
        /// The URI.
        uri: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::Hint for ArtifactError {
    fn kind(&self) -> crate::error::ErrorKind {
        use ArtifactError as E;
        match self {
            E::InvalidUri { .. } => crate::error::ErrorKind::Invalid,
            E::NotFound(_) | E::Removed { .. } => crate::error::ErrorKind::NotFound,
            E::Io { .. } => crate::error::ErrorKind::Internal,
        }
    }
    fn hint(&self) -> Option<String> {
        use ArtifactError as E;
        match self {
            E::InvalidUri { .. } => Some(format!("artifact URIs look like `{}`", URI_TEMPLATE)),
            E::NotFound(_) => Some(
                "list the artifacts (resources/list) to see those that are kept; artifacts \
                 expire after the retention period"
                    .to_owned(),
            ),
            E::Removed { reason, .. } if reason == STORE_FULL => Some(
                "read or download files soon after their run, or ask the operator to raise \
                 `[artifacts] max_size`; another tenant's use never removes your files"
                    .to_owned(),
            ),
            E::Removed { .. } => Some(
                "read or download files soon after their run (your tenant's oldest go first), \
                 or ask the operator to raise `[tenants] artifacts_max_size`; another tenant's \
                 use never removes your files"
                    .to_owned(),
            ),
            E::Io { .. } => {
                Some("check the data directory's disk space and permissions".to_owned())
            }
        }
    }
}

/// The content of one artifact.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArtifactContent {
    /// Its URI.
    pub uri: String,
    /// Path relative to the run's working directory.
    pub name: String,
    /// MIME type.
    pub mime_type: String,
    /// The bytes (base64 in JSON).
    #[serde(with = "crate::base64_bytes")]
    pub data: Vec<u8>,
}

/// One artifact opened for a download (see [`ArtifactStore::open`]).
#[derive(Debug)]
pub struct ArtifactFile {
    /// Path relative to the run's working directory.
    pub name: String,
    /// MIME type.
    pub mime_type: String,
    /// Its size in bytes when opened (the store never changes a kept file).
    pub size: u64,
    /// The file, at its start.
    pub file: std::fs::File,
}

/// An image the runner produced (a figure, or the last expression), already decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GeneratedImage {
    /// Preferred name (`figure-1.png`, `result.png`); renamed if a file has that name.
    pub(crate) name: String,
    pub(crate) origin: ArtifactOrigin,
    pub(crate) mime_type: &'static str,
    pub(crate) data: Vec<u8>,
}

/// What collection kept, skipped and inlined.
#[derive(Debug, Default)]
pub(crate) struct Collection {
    pub(crate) artifacts: Vec<Artifact>,
    pub(crate) skipped: Vec<SkippedFile>,
    pub(crate) inline: Vec<InlineImage>,
    pub(crate) notes: Vec<String>,
}

/// What identifies one version of a file: any write, `utime`, `chmod` or rename changes it
/// (the change time cannot be set by the file's owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Fingerprint {
    fn of(stat: &FileStat) -> Self {
        Fingerprint {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: stat.st_size,
            mtime: (stat.st_mtime, stat.st_mtime_nsec),
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

/// The regular files of a working directory before a run (its inputs), so that only what
/// the run created or changed becomes an artifact.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Baseline(HashMap<String, Fingerprint>);

impl Baseline {
    /// Fingerprint every regular file under `work` (same confinement as collection).
    pub(crate) fn snapshot(work: &Path) -> Baseline {
        let mut files = HashMap::new();
        let _ = walk(work, &mut |relative, entry| {
            if let WalkEntry::Regular { stat, .. } = entry {
                files.insert(relative.to_string(), Fingerprint::of(&stat));
            }
            true
        });
        Baseline(files)
    }

    fn unchanged(&self, relative: &str, stat: &FileStat) -> bool {
        self.0.get(relative) == Some(&Fingerprint::of(stat))
    }
}

/// One entry met by the walk.
enum WalkEntry {
    /// A regular file with one link, opened without following links.
    Regular { fd: OwnedFd, stat: FileStat },
    /// Something that is not copied, and why.
    Skipped(String),
}

/// How far the walk of a working directory goes (see [`crate::tree`]).
const WALK_CAPS: crate::tree::Caps = crate::tree::Caps {
    entries: MAX_ENTRIES as u64,
    depth: usize::MAX, // deep directories are reported as skipped by `walk` itself
    time: Duration::from_secs(20),
};

/// Walk `root` depth-first in name order without following links (see [`crate::tree`]),
/// calling `visit` with the path relative to `root` of every non-directory entry. Hidden
/// entries (`.name`) and `__pycache__` are ignored. `visit` returns false to stop. Returns a
/// note when a bound stopped the walk.
fn walk(root: &Path, visit: &mut dyn FnMut(&str, WalkEntry) -> bool) -> Option<String> {
    use crate::tree::{Kind, Next};
    let walked = crate::tree::walk(root, &WALK_CAPS, &mut |entry| {
        let Some(relative) = entry.relative() else {
            let lossy = entry.relative_lossy();
            return if visit(&lossy, WalkEntry::Skipped("file name is not UTF-8".into())) {
                Next::Skip
            } else {
                Next::Stop
            };
        };
        let name = entry.name.to_bytes();
        if name.starts_with(b".") || name == b"__pycache__" {
            return Next::Skip;
        }
        let walked = match entry.kind() {
            Kind::Directory if entry.depth >= MAX_DEPTH => {
                WalkEntry::Skipped(format!("directory nested deeper than {MAX_DEPTH} levels"))
            }
            Kind::Directory => return Next::Descend,
            Kind::Symlink => WalkEntry::Skipped("symbolic link (links are never followed)".into()),
            Kind::Fifo => WalkEntry::Skipped("FIFO (only regular files are kept)".into()),
            Kind::Socket => WalkEntry::Skipped("socket (only regular files are kept)".into()),
            Kind::Device => WalkEntry::Skipped("device (only regular files are kept)".into()),
            Kind::Other => WalkEntry::Skipped("not a regular file".into()),
            Kind::File if entry.stat.st_nlink > 1 => {
                WalkEntry::Skipped("hard link (a file with several names is not copied)".into())
            }
            Kind::File => open_regular(entry),
        };
        if visit(&relative, walked) {
            Next::Skip
        } else {
            Next::Stop
        }
    });
    walked
        .ok()
        .and_then(|walked| walked.note(&WALK_CAPS, "the list of the working directory's files"))
}

/// Open a file that the walk saw as a regular file with one link, and check on the descriptor
/// that it is still that file with one link (it may have been swapped in between).
fn open_regular(entry: &crate::tree::Entry<'_>) -> WalkEntry {
    match entry.open_file() {
        Ok(Some((fd, stat))) if stat.st_nlink <= 1 => WalkEntry::Regular { fd, stat },
        Ok(_) => WalkEntry::Skipped("changed while being examined".into()),
        Err(err) => WalkEntry::Skipped(format!("could not be opened: {err}")),
    }
}

fn local_tenant() -> String {
    crate::LOCAL_TENANT.to_owned()
}

/// `Removed::reason` of an entry removed by its tenant's budget.
const TENANT_BUDGET: &str = "tenant_budget";
/// `Removed::reason` of an entry removed to make room for its tenant's newer ones in a full
/// store.
const STORE_FULL: &str = "store_full";

/// Why an execution's artifacts were removed before their time.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Removed {
    at_unix_ms: u64,
    /// [`TENANT_BUDGET`] or [`STORE_FULL`].
    reason: String,
    /// The bound that removed them, in words.
    why: String,
}

/// The manifest of one execution's artifacts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    execution_id: String,
    /// The tenant whose run made them ([`crate::Caller`]); manifests written before owners
    /// were recorded are the local tenant's.
    #[serde(default = "local_tenant")]
    owner: String,
    created_unix_ms: u64,
    total_bytes: u64,
    artifacts: Vec<ManifestEntry>,
    /// Set when the files were removed before their time (the manifest stays, a tombstone,
    /// until the entry would have expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    removed: Option<Removed>,
}

impl Manifest {
    /// Bytes it holds in the store (a tombstone: none).
    fn live_bytes(&self) -> u64 {
        if self.removed.is_some() {
            0
        } else {
            self.total_bytes
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ManifestEntry {
    name: String,
    size: u64,
    mime_type: String,
    origin: String,
}

/// The store of artifacts under the data directory, with its retention rule.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    root: PathBuf,
    max_age: Duration,
    /// The store's total.
    max_bytes: u64,
    /// Each tenant's budget.
    tenant_bytes: crate::budget::PerTenant<u64>,
    ledger: Arc<Ledger>,
}

/// What one pruning pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArtifactPrune {
    /// Executions removed because they were older than the maximum age.
    pub expired: usize,
    /// Executions removed (each tenant's oldest first) to get its artifacts under its
    /// budget.
    pub evicted: usize,
    /// Bytes kept after pruning.
    pub kept_bytes: u64,
}

impl ArtifactStore {
    /// A store at `<data_dir>/artifacts-v1` keeping entries for `max_age` and at most
    /// `max_bytes` in total (each tenant may hold all of it, until
    /// `ArtifactStore::with_tenant_budget`).
    #[must_use]
    pub fn new(data_dir: &Path, max_age: Duration, max_bytes: u64) -> Self {
        ArtifactStore {
            root: data_dir.join(BUCKET),
            max_age,
            max_bytes,
            tenant_bytes: crate::budget::PerTenant::uniform(max_bytes),
            ledger: Arc::new(Ledger::default()),
        }
    }

    /// Each tenant keeps at most `bytes` of artifacts; removals are counted in `ledger`.
    #[must_use]
    pub(crate) fn with_tenant_budget(
        mut self,
        bytes: impl Into<crate::budget::PerTenant<u64>>,
        ledger: Arc<Ledger>,
    ) -> Self {
        self.tenant_bytes = bytes.into();
        self.ledger = ledger;
        self
    }

    /// Where the store lives.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The retention rule, in words.
    #[must_use]
    pub fn retention(&self) -> String {
        format!(
            "artifacts are kept {} hours, then removed; each tenant keeps up to {} (past it, its own oldest runs' artifacts are removed first), and the store up to {} (a run that would pass it makes room by removing its own tenant's oldest, or keeps no files); another tenant's use never removes a tenant's artifacts, and a read of one removed early says why",
            self.max_age.as_secs() / 3600,
            crate::ids::human_bytes(self.tenant_bytes.default_value()),
            crate::ids::human_bytes(self.max_bytes)
        )
    }

    /// `caller`'s budget in the store, what it holds now (`None`: the budget alone) and what
    /// its budget removed since the server started.
    pub(crate) fn report(&self, viewer: Option<&crate::Caller>) -> crate::budget::StoreReport {
        let used = viewer.map(|caller| {
            let mut held = Usage::default();
            for (_, manifest) in self.entries() {
                if let Some(m) = manifest
                    .filter(|m| m.removed.is_none() && !self.expired(m) && caller.owns(&m.owner))
                {
                    held.add(Usage::one(m.total_bytes));
                }
            }
            held
        });
        let budget = viewer.map_or_else(
            || self.tenant_bytes.default_value(),
            |caller| self.tenant_bytes.of(caller.id()),
        );
        crate::budget::StoreReport {
            budget: format!(
                "{} per tenant; past it, the tenant's own oldest runs' artifacts are removed (a read of one says so)",
                crate::ids::human_bytes(budget)
            ),
            max_items: None,
            max_bytes: Some(budget),
            used_items: used.map(|u| u.items),
            used_bytes: used.map(|u| u.bytes),
            removed: viewer.map_or(0, |c| self.ledger.counts(c.id()).artifacts_removed),
        }
    }

    /// Copy what the run created or changed under `work` (and the generated images) into
    /// the store as `execution_id`'s artifacts, owned by `caller`, then apply the retention
    /// rule.
    pub(crate) fn collect(
        &self,
        caller: &crate::Caller,
        execution_id: &str,
        work: &Path,
        baseline: &Baseline,
        images: Vec<GeneratedImage>,
    ) -> Collection {
        self.collect_seen(caller, execution_id, work, baseline, images, None)
    }

    /// [`ArtifactStore::collect`], also returning what `work` holds now: the fingerprint of
    /// every regular file the walk met, exactly what [`Baseline::snapshot`] would take right
    /// after it (a session's next call starts from it instead of walking the workspace again).
    pub(crate) fn collect_and_fingerprint(
        &self,
        caller: &crate::Caller,
        execution_id: &str,
        work: &Path,
        baseline: &Baseline,
        images: Vec<GeneratedImage>,
    ) -> (Collection, Baseline) {
        let mut seen = HashMap::new();
        let collection = self.collect_seen(
            caller,
            execution_id,
            work,
            baseline,
            images,
            Some(&mut seen),
        );
        (collection, Baseline(seen))
    }

    fn collect_seen(
        &self,
        caller: &crate::Caller,
        execution_id: &str,
        work: &Path,
        baseline: &Baseline,
        images: Vec<GeneratedImage>,
        mut seen: Option<&mut HashMap<String, Fingerprint>>,
    ) -> Collection {
        let mut collection = Collection::default();
        let mut entry = Entry::new(self, execution_id, caller.id());
        let run_budget = MAX_RUN_BYTES
            .min(self.max_bytes)
            .min(self.tenant_bytes.of(caller.id()));
        let mut skipped_total = 0usize;
        let mut skip = |collection: &mut Collection, name: &str, reason: String| {
            skipped_total += 1;
            if collection.skipped.len() < MAX_SKIPPED_LISTED {
                collection.skipped.push(SkippedFile {
                    name: name.to_string(),
                    reason,
                });
            }
        };
        let note = walk(work, &mut |relative, walked| {
            let (fd, stat) = match walked {
                WalkEntry::Skipped(reason) => {
                    skip(&mut collection, relative, reason);
                    return true;
                }
                WalkEntry::Regular { fd, stat } => (fd, stat),
            };
            if let Some(seen) = seen.as_deref_mut() {
                seen.insert(relative.to_string(), Fingerprint::of(&stat));
            }
            if baseline.unchanged(relative, &stat) {
                return true;
            }
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            if entry.files.len() >= MAX_FILES_PER_RUN {
                skip(
                    &mut collection,
                    relative,
                    format!("more than {MAX_FILES_PER_RUN} files; only the first are kept"),
                );
            } else if size > MAX_FILE_BYTES {
                skip(
                    &mut collection,
                    relative,
                    format!(
                        "{size} bytes is larger than the {} MiB limit per file",
                        MAX_FILE_BYTES >> 20
                    ),
                );
            } else if entry.bytes + size > run_budget {
                skip(
                    &mut collection,
                    relative,
                    format!(
                        "the run's files would exceed {} MiB in total",
                        run_budget >> 20
                    ),
                );
            } else {
                match entry.add_file(relative, fd, size) {
                    Ok(()) => {}
                    Err(reason) => skip(&mut collection, relative, reason),
                }
            }
            true
        });
        if let Some(note) = note {
            collection.notes.push(note);
        }
        for image in images {
            if entry.bytes + image.data.len() as u64 > run_budget {
                collection.notes.push(format!(
                    "{} was not kept: the run's artifacts would exceed {} MiB",
                    image.name,
                    run_budget >> 20
                ));
                continue;
            }
            if let Err(err) = entry.add_generated(image) {
                collection.notes.push(err);
            }
        }
        if skipped_total > collection.skipped.len() {
            collection.notes.push(format!(
                "{} more files were skipped",
                skipped_total - collection.skipped.len()
            ));
        }
        match entry.finish() {
            Ok(Some((artifacts, inline, notes))) => {
                collection.artifacts = artifacts;
                collection.inline = inline;
                collection.notes.extend(notes);
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(%err, "could not store artifacts");
                collection
                    .notes
                    .push(format!("the run's files could not be stored: {err}"));
            }
        }
        if !collection.artifacts.is_empty() && !self.make_room(caller, execution_id) {
            self.ledger.refused(caller.id());
            remove(&self.root.join(execution_id));
            collection.artifacts.clear();
            collection.inline.clear();
            collection.notes.push(format!(
                "the run's files were not kept: the artifact store is full ({} for all tenants together, `[artifacts] max_size`) and none of this tenant's older artifacts are left to make room; another tenant's are never removed for it",
                crate::ids::human_bytes(self.max_bytes)
            ));
        }
        collection
    }

    /// After `execution_id` of `caller` was stored: expire old entries, hold `caller`'s
    /// tenant to its budget, then make room in the store as a whole, in both cases by
    /// removing only that tenant's oldest (never `execution_id`). Whether `execution_id`
    /// may stay (`false`: the store is full of other tenants' artifacts).
    fn make_room(&self, caller: &crate::Caller, execution_id: &str) -> bool {
        let mut live = Vec::new();
        for (dir, manifest) in self.entries() {
            match manifest {
                Some(m) if self.expired(&m) && m.execution_id != execution_id => remove(&dir),
                Some(m) => live.push((dir, m)),
                None => {}
            }
        }
        live.sort_by_key(|(_, m)| m.created_unix_ms);
        self.hold_to_budget(caller.id(), &mut live, Some(execution_id));
        let total: u64 = live.iter().map(|(_, m)| m.live_bytes()).sum();
        if total <= self.max_bytes {
            return true;
        }
        // The store as a whole is full: only this tenant's own oldest may make room.
        let mine: Vec<(PathBuf, Usage)> = live
            .iter()
            .filter(|(_, m)| {
                caller.owns(&m.owner) && m.removed.is_none() && m.execution_id != execution_id
            })
            .map(|(dir, m)| (dir.clone(), Usage::one(m.total_bytes)))
            .collect();
        let held = Usage {
            items: live.len() as u64,
            bytes: total,
        };
        let (gone, freed) = crate::budget::excess(held, Budget::bytes(self.max_bytes), mine);
        let why = format!(
            "to make room for newer artifacts of the same tenant: the artifact store was full ({} for all tenants together, `[artifacts] max_size`)",
            crate::ids::human_bytes(self.max_bytes)
        );
        for dir in &gone {
            tombstone(dir, STORE_FULL, &why);
        }
        self.ledger.removed(
            Store::Artifacts,
            caller.id(),
            gone.len() as u64,
            &crate::ids::human_bytes(self.max_bytes),
        );
        total - freed.bytes <= self.max_bytes
    }

    /// Remove `tenant`'s oldest entries among `live` (oldest first; never `keep`) until its
    /// artifacts fit its budget; the removed ones become tombstones. Returns how many.
    fn hold_to_budget(
        &self,
        tenant: &str,
        live: &mut [(PathBuf, Manifest)],
        keep: Option<&str>,
    ) -> usize {
        let mut held = Usage::default();
        let mut candidates = Vec::new();
        for (i, (dir, m)) in live.iter().enumerate() {
            if m.owner != tenant || m.removed.is_some() {
                continue;
            }
            held.add(Usage::one(m.total_bytes));
            if keep != Some(m.execution_id.as_str()) {
                candidates.push(((i, dir.clone()), Usage::one(m.total_bytes)));
            }
        }
        let budget = self.tenant_bytes.of(tenant);
        let (gone, _) = crate::budget::excess(held, Budget::bytes(budget), candidates);
        let why = format!(
            "by its own tenant's budget: the tenant's artifacts exceeded {} (`[tenants] artifacts_max_size`), and its oldest are removed first",
            crate::ids::human_bytes(budget)
        );
        for (i, dir) in &gone {
            if let Some(removed) = tombstone(dir, TENANT_BUDGET, &why) {
                live[*i].1.removed = Some(removed);
            }
        }
        self.ledger.removed(
            Store::Artifacts,
            tenant,
            gone.len() as u64,
            &crate::ids::human_bytes(budget),
        );
        gone.len()
    }

    /// The manifest entry of the artifact named by `uri`, when `caller` may read it: its
    /// execution's directory, its checked path and its entry.
    fn find(
        &self,
        caller: &crate::Caller,
        uri: &str,
    ) -> Result<(PathBuf, RelativePath, ManifestEntry), ArtifactError> {
        let (execution_id, path) = parse_uri(uri)?;
        let dir = self.root.join(&execution_id);
        let manifest = read_manifest(&dir).ok_or_else(|| ArtifactError::NotFound(uri.into()))?;
        // Another caller's artifact is not found, exactly as one that never existed.
        if self.expired(&manifest) || !caller.owns(&manifest.owner) {
            return Err(ArtifactError::NotFound(uri.into()));
        }
        let name = path.to_string();
        let removed = manifest.removed;
        let entry = manifest
            .artifacts
            .into_iter()
            .find(|a| a.name == name)
            .ok_or_else(|| ArtifactError::NotFound(uri.into()))?;
        // The caller's own artifact, removed before its time: say why.
        if let Some(removed) = removed {
            return Err(ArtifactError::Removed {
                uri: artifact_uri(&execution_id, &entry.name),
                why: format!(
                    "on {} UTC {}",
                    crate::audit::utc_text(removed.at_unix_ms / 1000),
                    removed.why
                ),
                reason: removed.reason,
            });
        }
        Ok((dir, path, entry))
    }

    /// The content of the artifact named by `uri`.
    ///
    /// # Errors
    /// An invalid or unsafe URI, an artifact that does not exist (or expired), an I/O error.
    pub fn read(
        &self,
        caller: &crate::Caller,
        uri: &str,
    ) -> Result<ArtifactContent, ArtifactError> {
        let (dir, path, entry) = self.find(caller, uri)?;
        // Confined like every caller-given path, though the store is the server's own.
        let data = snakebox_fs::read(&dir.join(FILES), &path, MAX_FILE_BYTES)
            .map_err(|err| fs_error(uri, err))?;
        let execution_id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(ArtifactContent {
            uri: artifact_uri(&execution_id, &entry.name),
            name: entry.name,
            mime_type: entry.mime_type,
            data,
        })
    }

    /// The artifact `path` of `execution_id`, opened for reading as a stream (a download):
    /// the same checks as [`ArtifactStore::read`], without reading it whole.
    ///
    /// # Errors
    /// An invalid execution id or path (`..` included), an artifact that does not exist (or
    /// expired, or is another caller's), an I/O error.
    pub fn open(
        &self,
        caller: &crate::Caller,
        execution_id: &str,
        path: &str,
    ) -> Result<ArtifactFile, ArtifactError> {
        if execution_id.contains(['/', '?', '#', '%']) {
            return Err(ArtifactError::InvalidUri {
                uri: execution_id.chars().take(200).collect(),
                reason: "the execution id is not valid".into(),
            });
        }
        let uri = artifact_uri(execution_id, path);
        let (dir, path, entry) = self.find(caller, &uri)?;
        let root = snakebox_fs::open_root(&dir.join(FILES), &entry.name)
            .map_err(|err| fs_error(&uri, err))?;
        let (file, stat) = snakebox_fs::open_file(std::os::fd::AsFd::as_fd(&root), &path)
            .map_err(|err| fs_error(&uri, err))?;
        Ok(ArtifactFile {
            size: u64::try_from(stat.st_size).unwrap_or(0),
            name: entry.name,
            mime_type: entry.mime_type,
            file,
        })
    }

    /// The artifacts of the most recent executions, newest first, at most `limit`.
    #[must_use]
    pub fn list(&self, caller: &crate::Caller, limit: usize) -> Vec<Artifact> {
        let mut manifests: Vec<Manifest> = self
            .entries()
            .into_iter()
            .filter_map(|(_, manifest)| manifest)
            .filter(|m| m.removed.is_none() && !self.expired(m) && caller.owns(&m.owner))
            .collect();
        manifests.sort_by_key(|m| std::cmp::Reverse(m.created_unix_ms));
        manifests
            .iter()
            .flat_map(|m| {
                m.artifacts.iter().map(|a| Artifact {
                    name: a.name.clone(),
                    size: a.size,
                    mime_type: a.mime_type.clone(),
                    uri: artifact_uri(&m.execution_id, &a.name),
                    origin: origin_from(&a.origin),
                    inline: false,
                    download_url: None,
                })
            })
            .take(limit)
            .collect()
    }

    /// Apply the retention rule: remove entries older than the maximum age (tombstones
    /// included), then hold each tenant to its budget by removing its own oldest (never
    /// `keep`, the entry just written), and debris of interrupted runs.
    pub fn prune(&self, keep: Option<&str>) -> ArtifactPrune {
        let mut report = ArtifactPrune::default();
        let mut live = Vec::new();
        for (dir, manifest) in self.entries() {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with(".tmp-") {
                let stale = fs_err::metadata(&dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_TEMP);
                if stale {
                    remove(&dir);
                }
                continue;
            }
            match manifest {
                None => remove(&dir),
                Some(m) if self.expired(&m) && keep != Some(m.execution_id.as_str()) => {
                    remove(&dir);
                    if m.removed.is_none() {
                        report.expired += 1;
                    }
                }
                Some(m) => live.push((dir, m)),
            }
        }
        live.sort_by_key(|(_, m)| m.created_unix_ms);
        let mut tenants: Vec<String> = live.iter().map(|(_, m)| m.owner.clone()).collect();
        tenants.sort();
        tenants.dedup();
        for tenant in tenants {
            report.evicted += self.hold_to_budget(&tenant, &mut live, keep);
        }
        report.kept_bytes = live.iter().map(|(_, m)| m.live_bytes()).sum();
        report
    }

    fn expired(&self, manifest: &Manifest) -> bool {
        now_ms().saturating_sub(manifest.created_unix_ms)
            > u64::try_from(self.max_age.as_millis()).unwrap_or(u64::MAX)
    }

    /// Every directory in the store with its manifest (when readable).
    fn entries(&self) -> Vec<(PathBuf, Option<Manifest>)> {
        let Ok(read) = fs_err::read_dir(&self.root) else {
            return Vec::new();
        };
        read.filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| {
                let path = e.path();
                let manifest = if e.file_name().to_string_lossy().starts_with(".tmp-") {
                    None
                } else {
                    read_manifest(&path)
                };
                (path, manifest)
            })
            .collect()
    }
}

/// One execution's entry being built in a temporary directory.
struct Entry<'a> {
    store: &'a ArtifactStore,
    execution_id: String,
    owner: String,
    temp: PathBuf,
    created: bool,
    files: Vec<(String, u64, ArtifactOrigin, String)>,
    bytes: u64,
}

impl<'a> Entry<'a> {
    fn new(store: &'a ArtifactStore, execution_id: &str, owner: &str) -> Self {
        Entry {
            store,
            execution_id: execution_id.to_string(),
            owner: owner.to_string(),
            temp: store.root.join(format!(".tmp-{execution_id}")),
            created: false,
            files: Vec::new(),
            bytes: 0,
        }
    }

    fn target(&mut self, name: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        if !self.created {
            fs_err::create_dir_all(self.temp.join(FILES)).map_err(|e| e.to_string())?;
            fs_err::set_permissions(&self.temp, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| e.to_string())?;
            self.created = true;
        }
        let path = self.temp.join(FILES).join(name);
        if let Some(parent) = path.parent() {
            fs_err::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        Ok(path)
    }

    /// Copy at most `size` bytes from an open file of the working directory.
    fn add_file(&mut self, name: &str, fd: OwnedFd, size: u64) -> Result<(), String> {
        let target = self.target(name)?;
        let mut out = fs_err::File::create(&target).map_err(|e| e.to_string())?;
        let source = std::fs::File::from(fd);
        // The file may still grow (a process of the run that survived): copy what fstat saw.
        let copied = std::io::copy(&mut source.take(size), &mut out)
            .map_err(|e| format!("could not be copied: {e}"))?;
        let mime = mime_type(name);
        self.bytes += copied;
        self.files.push((
            name.to_string(),
            copied,
            ArtifactOrigin::File,
            mime.to_string(),
        ));
        Ok(())
    }

    fn add_generated(&mut self, image: GeneratedImage) -> Result<(), String> {
        let name = self.free_name(&image.name);
        let target = self.target(&name)?;
        fs_err::write(&target, &image.data).map_err(|e| e.to_string())?;
        self.bytes += image.data.len() as u64;
        self.files.push((
            name,
            image.data.len() as u64,
            image.origin,
            image.mime_type.to_string(),
        ));
        Ok(())
    }

    /// `figure-1.png`, or `figure-1-2.png` when the script wrote a file of that name.
    fn free_name(&self, wanted: &str) -> String {
        let taken = |name: &str| self.files.iter().any(|(n, ..)| n == name);
        if !taken(wanted) {
            return wanted.to_string();
        }
        let (stem, ext) = wanted.rsplit_once('.').unwrap_or((wanted, ""));
        (2..)
            .map(|n| format!("{stem}-{n}.{ext}"))
            .find(|name| !taken(name))
            .unwrap_or_default()
    }

    /// Write the manifest, rename the entry into place and pick the inline images (with a
    /// note for each image left out for its size in pixels).
    #[allow(clippy::type_complexity)]
    fn finish(self) -> Result<Option<(Vec<Artifact>, Vec<InlineImage>, Vec<String>)>, String> {
        if self.files.is_empty() {
            return Ok(None);
        }
        // Inline candidates: generated images first (value, then figures), then image files.
        let mut order: Vec<usize> = (0..self.files.len()).collect();
        order.sort_by_key(|&i| match self.files[i].2 {
            ArtifactOrigin::Value => 0,
            ArtifactOrigin::Figure => 1,
            ArtifactOrigin::File => 2,
        });
        let mut inline = Vec::new();
        let mut notes = Vec::new();
        let mut inline_flags = vec![false; self.files.len()];
        for i in order {
            if inline.len() >= MAX_INLINE_IMAGES {
                break;
            }
            let (name, size, _, _) = &self.files[i];
            if !is_image_name(name) || *size > INLINE_IMAGE_MAX_BYTES as u64 {
                continue;
            }
            let Ok(data) = fs_err::read(self.temp.join(FILES).join(name)) else {
                continue;
            };
            let Some(mime) = image_mime(&data, name) else {
                continue;
            };
            if let Some((width, height)) = pixel_size(&data)
                && width.max(height) > MAX_INLINE_PIXELS
            {
                notes.push(format!(
                    "{name} ({width}x{height} px) is not shown inline: model providers refuse \
                     images over {MAX_INLINE_PIXELS} px on a side; it is kept as an artifact"
                ));
                continue;
            }
            inline_flags[i] = true;
            inline.push(InlineImage {
                mime_type: mime.to_string(),
                data,
                uri: artifact_uri(&self.execution_id, name),
            });
        }
        let manifest = Manifest {
            removed: None,
            execution_id: self.execution_id.clone(),
            owner: self.owner.clone(),
            created_unix_ms: now_ms(),
            total_bytes: self.bytes,
            artifacts: self
                .files
                .iter()
                .map(|(name, size, origin, mime)| ManifestEntry {
                    name: name.clone(),
                    size: *size,
                    mime_type: mime.clone(),
                    origin: origin_name(*origin).into(),
                })
                .collect(),
        };
        let text = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
        fs_err::write(self.temp.join(MANIFEST), text).map_err(|e| e.to_string())?;
        let dest = self.store.root.join(&self.execution_id);
        fs_err::rename(&self.temp, &dest).map_err(|e| e.to_string())?;
        let artifacts = self
            .files
            .iter()
            .zip(inline_flags)
            .map(|((name, size, origin, mime), inline)| Artifact {
                name: name.clone(),
                size: *size,
                mime_type: mime.clone(),
                uri: artifact_uri(&self.execution_id, name),
                origin: *origin,
                inline,
                download_url: None,
            })
            .collect();
        Ok(Some((artifacts, inline, notes)))
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        // Only an entry that failed before its rename leaves its temporary directory behind.
        if self.created && self.temp.exists() {
            remove(&self.temp);
        }
    }
}

fn remove(dir: &Path) {
    if let Err(err) = crate::tree::remove(dir) {
        tracing::warn!(%err, "could not remove an artifact directory");
    }
}

/// Remove the files of the entry at `dir` and mark its manifest removed (`reason`, `why`),
/// so a read of one of them says why it is gone; what was written, when it could be.
fn tombstone(dir: &Path, reason: &str, why: &str) -> Option<Removed> {
    let mut manifest = read_manifest(dir)?;
    let removed = Removed {
        at_unix_ms: now_ms(),
        reason: reason.to_owned(),
        why: why.to_owned(),
    };
    manifest.removed = Some(removed.clone());
    // The manifest first (readers then see a tombstone, never a manifest without files).
    let written = serde_json::to_vec(&manifest)
        .map_err(std::io::Error::other)
        .and_then(|text| {
            let temp = dir.join(format!("{MANIFEST}.tmp"));
            fs_err::write(&temp, text)?;
            fs_err::rename(&temp, dir.join(MANIFEST))
        });
    match written {
        Ok(()) => {
            remove(&dir.join(FILES));
            Some(removed)
        }
        Err(err) => {
            tracing::warn!(%err, "could not mark an artifact directory removed; removing it whole");
            remove(dir);
            None
        }
    }
}

fn read_manifest(dir: &Path) -> Option<Manifest> {
    let text = fs_err::read(dir.join(MANIFEST)).ok()?;
    serde_json::from_slice(&text).ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn origin_name(origin: ArtifactOrigin) -> &'static str {
    match origin {
        ArtifactOrigin::File => "file",
        ArtifactOrigin::Figure => "figure",
        ArtifactOrigin::Value => "value",
    }
}

fn origin_from(name: &str) -> ArtifactOrigin {
    match name {
        "figure" => ArtifactOrigin::Figure,
        "value" => ArtifactOrigin::Value,
        _ => ArtifactOrigin::File,
    }
}

/// `snakebox://artifacts/<execution_id>/<path>`, each path segment percent-encoded.
#[must_use]
pub(crate) fn artifact_uri(execution_id: &str, name: &str) -> String {
    format!("{URI_PREFIX}{execution_id}/{}", encode_artifact_path(name))
}

/// An artifact's path as URIs and download links write it: unreserved characters and `/`
/// as they are, every other byte percent-encoded.
#[must_use]
pub fn encode_artifact_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A failure of the confined reader, as an artifact error.
fn fs_error(uri: &str, err: snakebox_fs::FsError) -> ArtifactError {
    match err {
        snakebox_fs::FsError::NotFound { .. } => ArtifactError::NotFound(uri.into()),
        other => ArtifactError::Io {
            uri: uri.into(),
            source: std::io::Error::other(other.with_cause()),
        },
    }
}

/// Split an artifact URI into its execution id and checked path.
fn parse_uri(uri: &str) -> Result<(String, RelativePath), ArtifactError> {
    let invalid = |reason: &str| ArtifactError::InvalidUri {
        uri: uri.chars().take(200).collect(),
        reason: reason.into(),
    };
    let rest = uri
        .strip_prefix(URI_PREFIX)
        .ok_or_else(|| invalid("it does not start with `snakebox://artifacts/`"))?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (execution_id, path) = rest
        .split_once('/')
        .ok_or_else(|| invalid("expected snakebox://artifacts/<execution_id>/<path>"))?;
    if execution_id.is_empty()
        || execution_id.len() > 64
        || !execution_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid("the execution id is not valid"));
    }
    let decoded = percent_decode(path).ok_or_else(|| invalid("bad percent-encoding"))?;
    let path = RelativePath::parse_entry(&decoded).map_err(|err| invalid(&err.to_string()))?;
    Ok((execution_id.to_string(), path))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn extension(name: &str) -> String {
    name.rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default()
}

fn is_image_name(name: &str) -> bool {
    matches!(
        extension(name).as_str(),
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "svg"
    )
}

/// The width and height of a PNG, GIF or JPEG image, from its header; `None` for other
/// formats (and for a header too short or malformed to say).
pub(crate) fn pixel_size(data: &[u8]) -> Option<(u32, u32)> {
    let be16 = |at: usize| {
        Some(u32::from(u16::from_be_bytes([
            *data.get(at)?,
            *data.get(at + 1)?,
        ])))
    };
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        let word = |at: usize| Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?));
        return Some((word(16)?, word(20)?));
    }
    if data.starts_with(b"GIF8") {
        let le16 = |at: usize| {
            Some(u32::from(u16::from_le_bytes([
                *data.get(at)?,
                *data.get(at + 1)?,
            ])))
        };
        return Some((le16(6)?, le16(8)?));
    }
    if !data.starts_with(&[0xff, 0xd8]) {
        return None;
    }
    // JPEG: walk the segments to the first start-of-frame (SOF0..SOF15 but DHT, JPG, DAC).
    let mut at = 2;
    loop {
        while *data.get(at)? != 0xff {
            at += 1;
        }
        while *data.get(at)? == 0xff {
            at += 1;
        }
        let marker = *data.get(at)?;
        at += 1;
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            return Some((be16(at + 5)?, be16(at + 3)?));
        }
        if marker == 0xd9 || marker == 0xda {
            return None;
        }
        at += usize::try_from(be16(at)?).ok()?;
    }
}

/// Model providers refuse images larger than this on a side.
pub(crate) const MAX_INLINE_PIXELS: u32 = 8000;

/// The MIME type of image bytes, checked against their content (a `.png` that is not a PNG
/// is not sent as an image).
#[must_use]
pub fn image_mime(data: &[u8], name: &str) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() > 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else if extension(name) == "svg"
        && std::str::from_utf8(data).is_ok_and(|text| text.contains("<svg"))
    {
        Some("image/svg+xml")
    } else {
        None
    }
}

/// A MIME type from a file name.
#[must_use]
pub(crate) fn mime_type(name: &str) -> &'static str {
    match extension(name).as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "txt" | "log" | "text" => "text/plain",
        "md" => "text/markdown",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "xml" => "application/xml",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "py" => "text/x-python",
        "js" => "text/javascript",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "parquet" => "application/vnd.apache.parquet",
        "npy" | "npz" | "pkl" | "pickle" | "bin" => "application/octet-stream",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        _ => "application/octet-stream",
    }
}

/// Whether content of this MIME type is returned as text by `resources/read` (when it is
/// valid UTF-8).
#[must_use]
pub fn is_text_mime(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/x-ndjson"
                | "application/xml"
                | "application/yaml"
                | "application/toml"
                | "image/svg+xml"
        )
}

#[cfg(test)]
mod pixel_tests {
    use super::pixel_size;

    #[test]
    fn sizes_are_read_from_png_gif_and_jpeg_headers() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&9000_u32.to_be_bytes());
        png.extend_from_slice(&30_u32.to_be_bytes());
        assert_eq!(pixel_size(&png), Some((9000, 30)));
        let gif = b"GIF89a\x40\x1f\x02\x00";
        assert_eq!(pixel_size(gif), Some((8000, 2)));
        // SOI, an APP0 segment of 4 bytes, then SOF0: length, precision, height 600, width 800.
        let jpeg = [
            0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x00, 0x00, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x02,
            0x58, 0x03, 0x20,
        ];
        assert_eq!(pixel_size(&jpeg), Some((800, 600)));
        assert_eq!(pixel_size(b"\x89PNG\r\n\x1a\n"), None);
        assert_eq!(pixel_size(&[0xff, 0xd8, 0xff]), None);
        assert_eq!(pixel_size(b"<svg/>"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> ArtifactStore {
        ArtifactStore::new(dir, Duration::from_secs(3600), 1 << 30)
    }

    fn names(collection: &Collection) -> Vec<&str> {
        collection
            .artifacts
            .iter()
            .map(|a| a.name.as_str())
            .collect()
    }

    #[test]
    fn uris_round_trip_and_unsafe_ones_are_refused() {
        let uri = artifact_uri("abc123", "data/out file.csv");
        assert_eq!(uri, "snakebox://artifacts/abc123/data/out%20file.csv");
        let (id, components) = parse_uri(&uri).unwrap();
        assert_eq!(id, "abc123");
        assert_eq!(components.names(), ["data", "out file.csv"]);
        for bad in [
            "file:///etc/passwd",
            "snakebox://artifacts/abc123",
            "snakebox://artifacts/abc123/../x",
            "snakebox://artifacts/abc123/%2E%2E/x",
            "snakebox://artifacts/abc123//etc/passwd",
            "snakebox://artifacts/abc123/%2Fetc%2Fpasswd",
            "snakebox://artifacts/../x/y",
            "snakebox://artifacts/abc123/a%00b",
            "snakebox://artifacts/abc123/%zz",
        ] {
            assert!(
                matches!(parse_uri(bad), Err(ArtifactError::InvalidUri { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn new_and_changed_files_are_kept_unchanged_inputs_are_not() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        fs_err::write(work.path().join("input.csv"), "a\n").unwrap();
        fs_err::write(work.path().join("changed.txt"), "old").unwrap();
        let baseline = Baseline::snapshot(work.path());
        std::thread::sleep(Duration::from_millis(20));
        fs_err::write(work.path().join("changed.txt"), "new").unwrap();
        fs_err::create_dir_all(work.path().join("out/deep")).unwrap();
        fs_err::write(work.path().join("out/deep/result.json"), "{}").unwrap();
        fs_err::create_dir_all(work.path().join(".cache")).unwrap();
        fs_err::write(work.path().join(".cache/x"), "hidden").unwrap();

        let store = store(data.path());
        let collection = store.collect(
            &crate::Caller::local(),
            "e1",
            work.path(),
            &baseline,
            Vec::new(),
        );
        assert_eq!(names(&collection), ["changed.txt", "out/deep/result.json"]);
        assert!(collection.skipped.is_empty(), "{:?}", collection.skipped);
        let json = &collection.artifacts[1];
        assert_eq!(json.mime_type, "application/json");
        assert_eq!(json.uri, "snakebox://artifacts/e1/out/deep/result.json");
        let content = store.read(&crate::Caller::local(), &json.uri).unwrap();
        assert_eq!(content.data, b"{}");
        assert_eq!(
            store
                .read(&crate::Caller::local(), &collection.artifacts[0].uri)
                .unwrap()
                .data,
            b"new"
        );
        assert!(matches!(
            store.read(&crate::Caller::local(), "snakebox://artifacts/e1/input.csv"),
            Err(ArtifactError::NotFound(_))
        ));
        assert!(matches!(
            store.read(
                &crate::Caller::local(),
                "snakebox://artifacts/e1/out/../../e1/manifest.json"
            ),
            Err(ArtifactError::InvalidUri { .. })
        ));
    }

    #[test]
    fn what_a_collection_saw_is_the_next_runs_baseline() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(work.path().join("sub")).unwrap();
        fs_err::write(work.path().join("sub/same.bin"), "aaaa").unwrap();
        fs_err::write(work.path().join("kept.txt"), "k").unwrap();
        let store = store(data.path());
        let caller = crate::Caller::local();
        let (first, seen) = store.collect_and_fingerprint(
            &caller,
            "e1",
            work.path(),
            &Baseline::default(),
            Vec::new(),
        );
        assert_eq!(names(&first), ["kept.txt", "sub/same.bin"]);
        // Exactly what a snapshot takes now.
        assert_eq!(seen, Baseline::snapshot(work.path()));
        // Nothing changed since: nothing collected, the same view.
        let (second, again) =
            store.collect_and_fingerprint(&caller, "e2", work.path(), &seen, Vec::new());
        assert!(second.artifacts.is_empty());
        assert_eq!(again, seen);
        // The same size, new bytes, in a subdirectory: collected.
        std::thread::sleep(Duration::from_millis(20));
        fs_err::write(work.path().join("sub/same.bin"), "bbbb").unwrap();
        let (third, _) =
            store.collect_and_fingerprint(&caller, "e3", work.path(), &again, Vec::new());
        assert_eq!(names(&third), ["sub/same.bin"]);
    }

    #[test]
    fn links_special_files_and_oversized_files_are_skipped() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), "host secret").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", work.path().join("passwd")).unwrap();
        std::os::unix::fs::symlink(outside.path(), work.path().join("dirlink")).unwrap();
        std::fs::hard_link(outside.path().join("secret"), work.path().join("hard")).unwrap();
        nix::unistd::mkfifo(
            &work.path().join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let big = fs_err::File::create(work.path().join("sparse.bin")).unwrap();
        big.set_len(2 << 30).unwrap();
        fs_err::write(work.path().join("ok.txt"), "fine").unwrap();

        let store = store(data.path());
        let collection = store.collect(
            &crate::Caller::local(),
            "e2",
            work.path(),
            &Baseline::default(),
            Vec::new(),
        );
        assert_eq!(names(&collection), ["ok.txt"]);
        let reasons: HashMap<&str, &str> = collection
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason.as_str()))
            .collect();
        assert!(reasons["passwd"].contains("symbolic link"), "{reasons:?}");
        assert!(reasons["dirlink"].contains("symbolic link"), "{reasons:?}");
        assert!(reasons["hard"].contains("hard link"), "{reasons:?}");
        assert!(reasons["fifo"].contains("FIFO"), "{reasons:?}");
        assert!(reasons["sparse.bin"].contains("limit"), "{reasons:?}");
        // Nothing of the host file reached the store.
        let stored = data.path().join(BUCKET).join("e2").join(FILES);
        assert_eq!(fs_err::read_dir(&stored).unwrap().count(), 1);
    }

    #[test]
    fn generated_images_are_stored_named_and_inlined_within_bounds() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let png = b"\x89PNG\r\n\x1a\nrest".to_vec();
        fs_err::write(work.path().join("figure-1.png"), &png).unwrap();
        fs_err::write(work.path().join("fake.png"), "not an image").unwrap();
        let mut huge = png.clone();
        huge.resize(INLINE_IMAGE_MAX_BYTES + 1, 0);
        fs_err::write(work.path().join("huge.png"), &huge).unwrap();
        let images = vec![GeneratedImage {
            name: "figure-1.png".into(),
            origin: ArtifactOrigin::Figure,
            mime_type: "image/png",
            data: png.clone(),
        }];
        let store = store(data.path());
        let collection = store.collect(
            &crate::Caller::local(),
            "e3",
            work.path(),
            &Baseline::default(),
            images,
        );
        assert_eq!(
            names(&collection),
            ["fake.png", "figure-1.png", "huge.png", "figure-1-2.png"]
        );
        let inline: Vec<&str> = collection
            .artifacts
            .iter()
            .filter(|a| a.inline)
            .map(|a| a.name.as_str())
            .collect();
        // The figure first, then the real image file; not the fake or the huge one.
        assert_eq!(inline, ["figure-1.png", "figure-1-2.png"]);
        assert_eq!(collection.inline.len(), 2);
        assert_eq!(
            collection.inline[0].uri,
            "snakebox://artifacts/e3/figure-1-2.png"
        );
        assert_eq!(collection.artifacts[3].origin, ArtifactOrigin::Figure);
    }

    fn collect_as(store: &ArtifactStore, tenant: &str, id: &str, work: &Path) -> Collection {
        let collection = store.collect(
            &crate::Caller::tenant(tenant).unwrap(),
            id,
            work,
            &Baseline::default(),
            Vec::new(),
        );
        std::thread::sleep(Duration::from_millis(5));
        collection
    }

    #[test]
    fn a_tenant_over_its_budget_loses_its_own_oldest_and_a_read_says_why() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        fs_err::write(work.path().join("a.bin"), vec![0u8; 1000]).unwrap();
        let ledger = Arc::new(Ledger::default());
        let store = ArtifactStore::new(data.path(), Duration::from_secs(3600), 1 << 20)
            .with_tenant_budget(2500, Arc::clone(&ledger));
        let (a, b) = (
            crate::Caller::tenant("a").unwrap(),
            crate::Caller::tenant("b").unwrap(),
        );
        collect_as(&store, "b", "b1", work.path());
        for id in ["a1", "a2", "a3", "a4"] {
            collect_as(&store, "a", id, work.path());
        }
        // b's file, older than all of a's, is still there; a kept its newest two.
        assert!(store.read(&b, "snakebox://artifacts/b1/a.bin").is_ok());
        assert!(store.read(&a, "snakebox://artifacts/a3/a.bin").is_ok());
        assert!(store.read(&a, "snakebox://artifacts/a4/a.bin").is_ok());
        for gone in ["a1", "a2"] {
            let uri = format!("snakebox://artifacts/{gone}/a.bin");
            let err = store.read(&a, &uri).unwrap_err();
            assert!(matches!(err, ArtifactError::Removed { .. }), "{err:?}");
            let message = err.to_string();
            assert!(
                message.contains("own tenant's budget") && message.contains("2500 B"),
                "{message}"
            );
            assert!(
                crate::error::Hint::hint(&err)
                    .unwrap()
                    .contains("artifacts_max_size")
            );
            // To another tenant it is as if it never existed; and so is a name it never had.
            assert!(matches!(
                store.read(&b, &uri),
                Err(ArtifactError::NotFound(_))
            ));
            let other = format!("snakebox://artifacts/{gone}/b.bin");
            assert!(matches!(
                store.read(&a, &other),
                Err(ArtifactError::NotFound(_))
            ));
        }
        assert_eq!(store.list(&a, 10).len(), 2);
        assert_eq!(ledger.counts("a").artifacts_removed, 2);
        assert_eq!(ledger.counts("b").artifacts_removed, 0);
        let report = store.report(Some(&a));
        assert_eq!(
            (report.used_items, report.used_bytes),
            (Some(2), Some(2000))
        );
        // The tombstones hold no files.
        assert!(!data.path().join(BUCKET).join("a1").join(FILES).exists());
    }

    #[test]
    fn a_full_store_is_made_room_in_by_the_writing_tenant_only() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        fs_err::write(work.path().join("a.bin"), vec![0u8; 1000]).unwrap();
        let ledger = Arc::new(Ledger::default());
        let store = ArtifactStore::new(data.path(), Duration::from_secs(3600), 2500)
            .with_tenant_budget(1 << 20, Arc::clone(&ledger));
        let (a, b) = (
            crate::Caller::tenant("a").unwrap(),
            crate::Caller::tenant("b").unwrap(),
        );
        collect_as(&store, "b", "b1", work.path());
        collect_as(&store, "b", "b2", work.path());
        // a has nothing to make room with: its files are not kept, b's stay.
        let refused = collect_as(&store, "a", "a1", work.path());
        assert!(refused.artifacts.is_empty());
        assert!(
            refused
                .notes
                .iter()
                .any(|n| n.contains("artifact store is full")),
            "{:?}",
            refused.notes
        );
        assert!(store.read(&b, "snakebox://artifacts/b1/a.bin").is_ok());
        assert!(matches!(
            store.read(&a, "snakebox://artifacts/a1/a.bin"),
            Err(ArtifactError::NotFound(_))
        ));
        assert_eq!(ledger.counts("a").artifacts_refused, 1);
        // b writing more makes room with its own oldest, and says so when it is read.
        let kept = collect_as(&store, "b", "b3", work.path());
        assert_eq!(kept.artifacts.len(), 1);
        let err = store.read(&b, "snakebox://artifacts/b1/a.bin").unwrap_err();
        assert!(err.to_string().contains("artifact store was full"), "{err}");
        assert!(store.read(&b, "snakebox://artifacts/b2/a.bin").is_ok());
    }

    #[test]
    fn retention_removes_expired_then_oldest_over_quota() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        fs_err::write(work.path().join("a.bin"), vec![0u8; 1000]).unwrap();
        let small = ArtifactStore::new(data.path(), Duration::from_secs(3600), 2500);
        for id in ["r1", "r2", "r3"] {
            small.collect(
                &crate::Caller::local(),
                id,
                work.path(),
                &Baseline::default(),
                Vec::new(),
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // 3000 bytes > 2500: the oldest went when r3 arrived.
        assert!(
            small
                .read(&crate::Caller::local(), "snakebox://artifacts/r1/a.bin")
                .is_err()
        );
        assert!(
            small
                .read(&crate::Caller::local(), "snakebox://artifacts/r2/a.bin")
                .is_ok()
        );
        assert!(
            small
                .read(&crate::Caller::local(), "snakebox://artifacts/r3/a.bin")
                .is_ok()
        );
        assert_eq!(small.list(&crate::Caller::local(), 10).len(), 2);
        assert_eq!(
            small.list(&crate::Caller::local(), 10)[0].uri,
            "snakebox://artifacts/r3/a.bin"
        );

        let expired = ArtifactStore::new(data.path(), Duration::ZERO, 1 << 30);
        std::thread::sleep(Duration::from_millis(5));
        assert!(matches!(
            expired.read(&crate::Caller::local(), "snakebox://artifacts/r3/a.bin"),
            Err(ArtifactError::NotFound(_))
        ));
        let report = expired.prune(None);
        assert_eq!(report.expired, 2);
        assert_eq!(
            fs_err::read_dir(data.path().join(BUCKET)).unwrap().count(),
            0
        );
    }

    #[test]
    fn many_files_are_bounded() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        for i in 0..(MAX_FILES_PER_RUN + 5) {
            fs_err::write(work.path().join(format!("f{i:04}")), "x").unwrap();
        }
        let collection = store(data.path()).collect(
            &crate::Caller::local(),
            "e4",
            work.path(),
            &Baseline::default(),
            Vec::new(),
        );
        assert_eq!(collection.artifacts.len(), MAX_FILES_PER_RUN);
        assert_eq!(collection.skipped.len(), 5);
    }
}
