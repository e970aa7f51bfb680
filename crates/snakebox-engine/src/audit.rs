//! The audit log: an append-only JSON-lines log of every tracked call (a one-shot run, a
//! session cell, a session command) and of every other tool call, written by the runs
//! table's writer thread so no call waits for it. A run gets two lines with its execution id:
//! `started` when it is admitted (who, what kind, the code's SHA-256 and size, the
//! dependencies asked for) and `finished` when it returns (status, durations, exit code,
//! Python, security events). A call whose server was killed in between has only its
//! `started` line: the log says what began, whatever happened next. A tool that runs no code
//! gets one `call` line; a call refused before it ran (an unknown tool, arguments that do not
//! fit) records that it was refused, with the size and SHA-256 of what was sent, never what
//! was sent.
//!
//! Every line is bounded, whatever a request carries ([`MAX_LINE_BYTES`]): scripts are kept
//! here only as their hash and size (the runs table keeps their start), and every value a
//! caller chose (a dependency, a session id, a profile or tool name) is cut at
//! [`MAX_FIELD_BYTES`], a cut value ending with its size and hash ([`cap_text`]).
//!
//! Each tenant has its own files, `<data>/audit/tenants/<tenant>.jsonl` (the directories and
//! files are the server user's alone), rotated by size within the tenant's budget
//! ([`crate::StoreBudgets::audit_bytes`]): past a fifth of it the file becomes
//! `<tenant>.jsonl.1`, the older ones move up one, and the tenant's oldest are removed while
//! its files together exceed the budget. A tenant flooding the log rotates away only its own
//! lines. `snakebox audit` reads every tenant's files (and the single `audit.jsonl*` of
//! earlier versions), oldest first. A log that cannot be written (a full disk) costs the log,
//! never a call: it is reported once in the server's log, and writing is tried again with the
//! next line.
//!
//! With `--database postgres://…` the lines go to the deployment's PostgreSQL instead
//! (`snakebox_audit`, one row per line, the same JSON; [`pg`]), where every front's lines are
//! read together; each tenant's budget is its lines' bytes there, and past it the tenant's
//! own oldest lines are removed. [`AuditSink`] is the seam between the two.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::budget::PerTenant;
use crate::budget::{Budget, Ledger, Store, Usage};
use crate::events::SecurityEvent;

mod pg;

pub use pg::read_audit_table;
pub(crate) use pg::{PgAudit, tenant_bytes as pg_tenant_bytes};

/// The directory under the data directory.
pub const AUDIT_DIR: &str = "audit";
/// The directory of the tenants' files, under [`AUDIT_DIR`].
const TENANTS_DIR: &str = "tenants";
/// The single file of earlier versions (read, never written).
const LEGACY_FILE: &str = "audit.jsonl";
/// Rotated files of the single file of earlier versions that are read.
const LEGACY_ROTATED: usize = 4;
/// A tenant's budget is split into this many files: its current file rotates past
/// `budget / FILES_PER_BUDGET`.
const FILES_PER_BUDGET: u64 = 5;
/// Open files kept between writes (tenants beyond it reopen theirs).
const MAX_OPEN_FILES: usize = 64;
/// Longest value a caller chose that a line keeps whole (a dependency, a session id, a
/// profile or tool name); a longer one is cut and ends with its size and hash.
pub(crate) const MAX_FIELD_BYTES: usize = 200;
/// Most dependencies a line lists; the rest are one entry with their count, size and hash.
pub(crate) const MAX_DEPENDENCIES: usize = 24;
/// Most security events a line lists (the result has them all).
const MAX_EVENTS: usize = 16;
/// What [`cap_text`] adds to a value it cuts, at most.
const CAP_SUFFIX_BYTES: usize = 64;
/// Longest detail of an event in a line.
const MAX_DETAIL_BYTES: usize = 256;
/// Longest line, whatever a request carries.
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// One line of the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `started` or `finished` (a run), `call` (a tool that runs no code).
    pub phase: String,
    /// The call's execution id (a `call` line has an id of its own).
    pub execution_id: String,
    /// The tenant that made the call.
    pub tenant: String,
    /// `execute`, `session_cell` or `command`; `tool` for a `call` line.
    pub kind: String,
    /// The tool called (`call` lines: `check_environment`, `list_sessions`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The profile the run was held to (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The session it ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// SHA-256 of the script, the cell's code or the command (`started`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_sha256: Option<String>,
    /// Its size in bytes (`started`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_bytes: Option<u64>,
    /// The `dependencies` argument (`started`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// How it ended (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Wall-clock milliseconds of the run (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Milliseconds preparing its environment (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_ms: Option<u64>,
    /// The process's exit code (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The Python version it ran with (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_version: Option<String>,
    /// What the run used, where the host measured it (`finished`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_usage: Option<crate::ResourceUse>,
    /// What the server stopped or refused (`finished`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<SecurityEvent>,
    /// A call refused before it ran (`call` lines with status `refused`): the size in bytes
    /// of what was sent (the tool's name and its arguments as JSON), never what was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// Its SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sha256: Option<String>,
}

impl AuditEntry {
    /// Cut every value a caller chose to its bound, so the line stays within
    /// [`MAX_LINE_BYTES`] (values the server made, times and counts, are small already).
    /// Values cut before (by the runs table's writer, [`cap_text`]) pass unchanged.
    pub(crate) fn bounded(mut self) -> AuditEntry {
        const FIELD: usize = MAX_FIELD_BYTES + CAP_SUFFIX_BYTES;
        let cap = |value: &mut Option<String>| {
            if let Some(text) = value.as_mut() {
                *text = cap_text(text, FIELD);
            }
        };
        cap(&mut self.tool);
        cap(&mut self.profile);
        cap(&mut self.session_id);
        cap(&mut self.status);
        cap(&mut self.python_version);
        cap(&mut self.code_sha256);
        cap(&mut self.request_sha256);
        self.execution_id = cap_text(&self.execution_id, FIELD);
        self.tenant = cap_text(&self.tenant, FIELD);
        self.phase = cap_text(&self.phase, FIELD);
        self.kind = cap_text(&self.kind, FIELD);
        if self.dependencies.len() > MAX_DEPENDENCIES + 1 {
            self.dependencies = cap_list(&self.dependencies, MAX_DEPENDENCIES, MAX_FIELD_BYTES);
        } else {
            for dependency in &mut self.dependencies {
                *dependency = cap_text(dependency, FIELD);
            }
        }
        if self.events.len() > MAX_EVENTS {
            let more = self.events.len() - (MAX_EVENTS - 1);
            let kind = self.events[MAX_EVENTS - 1].kind;
            self.events.truncate(MAX_EVENTS - 1);
            self.events.push(SecurityEvent {
                kind,
                detail: format!("and {more} more events (the result lists them all)"),
            });
        }
        for event in &mut self.events {
            event.detail = cap_text(&event.detail, MAX_DETAIL_BYTES);
        }
        self
    }

    /// The entry as one line of JSON (with its newline), at most [`MAX_LINE_BYTES`]: should
    /// the bounded fields still not fit, the lists are summarised.
    pub(crate) fn line(&self) -> Option<Vec<u8>> {
        let mut line = serde_json::to_vec(&self.clone().bounded()).ok()?;
        if line.len() >= MAX_LINE_BYTES {
            let mut shorter = self.clone().bounded();
            shorter.dependencies = cap_list(&self.dependencies, 0, 0);
            shorter.events.truncate(1);
            line = serde_json::to_vec(&shorter).ok()?;
        }
        line.push(b'\n');
        Some(line)
    }
}

/// `text` when it is at most `max` bytes; else its first `max` bytes (cut at a character
/// boundary), `…`, and the whole value's size and the start of its SHA-256, so two cut values
/// can still be told apart and matched with what the caller sent.
#[must_use]
pub fn cap_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}… [{} bytes, sha256 {}]",
        &text[..cut],
        text.len(),
        &code_hash(text)[..16]
    )
}

/// At most `max_items` of `items`, each cut at `max_each` bytes ([`cap_text`]); the rest are
/// one last entry with their count, and the size and hash of the whole list.
pub(crate) fn cap_list(items: &[String], max_items: usize, max_each: usize) -> Vec<String> {
    let mut kept: Vec<String> = items
        .iter()
        .take(max_items)
        .map(|item| cap_text(item, max_each))
        .collect();
    if items.len() > max_items {
        let whole = serde_json::to_string(items).unwrap_or_default();
        kept.push(format!(
            "… and {} more [the list: {} bytes, sha256 {}]",
            items.len() - max_items,
            whole.len(),
            &code_hash(&whole)[..16]
        ));
    }
    kept
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC), for people.
#[must_use]
pub fn utc_text(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The hex SHA-256 of `code`.
pub(crate) fn code_hash(code: &str) -> String {
    Sha256::digest(code.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// One tenant's current file, open for appending.
struct Open {
    file: fs_err::File,
    /// Its size.
    size: u64,
}

/// The writer's handle on the log.
pub(crate) struct AuditLog {
    /// `<data>/audit`.
    dir: PathBuf,
    /// Each tenant's budget: bytes of its files together.
    budget: PerTenant<u64>,
    /// Tenants' current files, open.
    open: HashMap<String, Open>,
    ledger: Arc<Ledger>,
    /// Whether the last write failed (so a failing disk is logged once, not per line).
    failing: bool,
}

/// The directory of the tenants' files under `data_dir`.
fn tenants_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(AUDIT_DIR).join(TENANTS_DIR)
}

/// `tenant`'s current file (`n == 0`) or its `n`th rotated one.
fn tenant_file(tenants: &Path, tenant: &str, n: usize) -> PathBuf {
    if n == 0 {
        tenants.join(format!("{tenant}.jsonl"))
    } else {
        tenants.join(format!("{tenant}.jsonl.{n}"))
    }
}

/// `tenant`'s rotated files that exist, newest first (`.1`, `.2`, …), with their sizes.
fn rotated(tenants: &Path, tenant: &str) -> Vec<(PathBuf, u64)> {
    (1..)
        .map(|n| tenant_file(tenants, tenant, n))
        .map_while(|path| fs_err::metadata(&path).ok().map(|meta| (path, meta.len())))
        .collect()
}

/// Bytes of `tenant`'s audit files together.
pub(crate) fn tenant_bytes(data_dir: &Path, tenant: &str) -> u64 {
    let tenants = tenants_dir(data_dir);
    let current = fs_err::metadata(tenant_file(&tenants, tenant, 0)).map_or(0, |m| m.len());
    current
        + rotated(&tenants, tenant)
            .iter()
            .map(|(_, size)| size)
            .sum::<u64>()
}

impl AuditLog {
    pub(crate) fn new(
        data_dir: &Path,
        budget: impl Into<PerTenant<u64>>,
        ledger: Arc<Ledger>,
    ) -> AuditLog {
        let budget = budget.into();
        AuditLog {
            dir: data_dir.join(AUDIT_DIR),
            budget,
            open: HashMap::new(),
            ledger,
            failing: false,
        }
    }

    fn tenants(&self) -> PathBuf {
        self.dir.join(TENANTS_DIR)
    }

    /// The size past which `tenant`'s current file is rotated.
    fn file_max(&self, tenant: &str) -> u64 {
        (self.budget.of(tenant) / FILES_PER_BUDGET).max(1)
    }

    fn open(&mut self, tenant: &str) -> std::io::Result<()> {
        use fs_err::os::unix::fs::OpenOptionsExt;
        use std::os::unix::fs::PermissionsExt;
        if self.open.contains_key(tenant) {
            return Ok(());
        }
        if self.open.len() >= MAX_OPEN_FILES {
            self.open.clear();
        }
        let tenants = self.tenants();
        fs_err::create_dir_all(&tenants)?;
        for dir in [&self.dir, &tenants] {
            fs_err::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let file = fs_err::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(tenant_file(&tenants, tenant, 0))?;
        let size = file.metadata()?.len();
        self.open.insert(tenant.to_owned(), Open { file, size });
        Ok(())
    }

    /// Move `tenant`'s current file to `.1`, each `.N` to `.N+1`, then remove the tenant's
    /// oldest files while they exceed its budget, less the room its new current file may
    /// take before the next rotation: the tenant's files together stay within its budget.
    fn rotate(&mut self, tenant: &str) -> std::io::Result<()> {
        self.open.remove(tenant);
        let tenants = self.tenants();
        let older = rotated(&tenants, tenant);
        for n in (1..=older.len()).rev() {
            fs_err::rename(
                tenant_file(&tenants, tenant, n),
                tenant_file(&tenants, tenant, n + 1),
            )?;
        }
        fs_err::rename(
            tenant_file(&tenants, tenant, 0),
            tenant_file(&tenants, tenant, 1),
        )?;
        // The tenant's files, oldest first: the only ones its budget may remove.
        let mut files = rotated(&tenants, tenant);
        files.reverse();
        let held = Usage {
            items: files.len() as u64,
            bytes: files.iter().map(|(_, size)| size).sum(),
        };
        let (remove, _) = crate::budget::excess(
            held,
            Budget::bytes(self.budget.of(tenant).saturating_sub(self.file_max(tenant))),
            files
                .into_iter()
                .map(|(path, size)| (path, Usage::one(size))),
        );
        for path in &remove {
            fs_err::remove_file(path)?;
        }
        self.ledger.removed(
            Store::Audit,
            tenant,
            remove.len() as u64,
            &crate::ids::human_bytes(self.budget.of(tenant)),
        );
        self.open(tenant)
    }

    fn write(&mut self, tenant: &str, line: &[u8]) -> std::io::Result<()> {
        self.open(tenant)?;
        let size = self.open.get(tenant).map_or(0, |open| open.size);
        if size > 0 && size + line.len() as u64 > self.file_max(tenant) {
            self.rotate(tenant)?;
        }
        if let Some(open) = self.open.get_mut(tenant) {
            open.file.write_all(line)?;
            open.size += line.len() as u64;
        }
        Ok(())
    }

    /// Append `entry` as one line of its tenant's file (cut to its bounds first).
    pub(crate) fn append(&mut self, entry: &AuditEntry) {
        // A tenant name is a plain name (a file name); anything else is not written.
        if !crate::is_plain_name(&entry.tenant) {
            tracing::warn!("an audit line without a valid tenant was not written");
            return;
        }
        let Some(line) = entry.line() else {
            return;
        };
        match self.write(&entry.tenant, &line) {
            Ok(()) => self.failing = false,
            Err(err) => {
                // Reopen next time (the file may have been moved or the disk freed).
                self.open.remove(&entry.tenant);
                if !self.failing {
                    tracing::warn!(%err, dir = %self.dir.display(), "could not write the audit log");
                }
                self.failing = true;
            }
        }
    }
}

/// Where the writer appends audit lines: each tenant's files in the data directory, or the
/// deployment's PostgreSQL.
pub(crate) enum AuditSink {
    /// `<data>/audit/tenants/<tenant>.jsonl`, rotated.
    Files(AuditLog),
    /// `snakebox_audit`.
    Table(PgAudit),
}

impl AuditSink {
    /// Append the lines of one batch, in order (a failure costs the log, never a call).
    pub(crate) fn append_batch(&mut self, entries: &[AuditEntry]) {
        match self {
            AuditSink::Files(log) => {
                for entry in entries {
                    log.append(entry);
                }
            }
            AuditSink::Table(table) => table.append_batch(entries),
        }
    }
}

/// The audit log's files under `data_dir`: the single file of earlier versions, oldest first,
/// then each tenant's (by name), oldest first.
#[must_use]
pub fn audit_files(data_dir: &Path) -> Vec<PathBuf> {
    let dir = data_dir.join(AUDIT_DIR);
    let mut files: Vec<PathBuf> = (1..=LEGACY_ROTATED)
        .rev()
        .map(|n| dir.join(format!("{LEGACY_FILE}.{n}")))
        .collect();
    files.push(dir.join(LEGACY_FILE));
    files.retain(|path| path.exists());
    let tenants_dir = tenants_dir(data_dir);
    let mut tenants: Vec<String> = fs_err::read_dir(&tenants_dir)
        .map(|read| {
            read.filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().into_string().ok()?;
                    let tenant = name.strip_suffix(".jsonl")?;
                    crate::is_plain_name(tenant).then(|| tenant.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    tenants.sort();
    for tenant in tenants {
        let mut own: Vec<PathBuf> = rotated(&tenants_dir, &tenant)
            .into_iter()
            .map(|(path, _)| path)
            .rev()
            .collect();
        own.push(tenant_file(&tenants_dir, &tenant, 0));
        files.extend(own);
    }
    files
}

/// Every entry of the audit log under `data_dir`, oldest first (every tenant's, by time); a
/// line that is not an entry (cut by a full disk) is counted in the second value and
/// skipped.
///
/// # Errors
/// A file that exists but cannot be read.
pub fn read_audit(data_dir: &Path) -> std::io::Result<(Vec<AuditEntry>, usize)> {
    let mut entries = Vec::new();
    let mut bad = 0;
    for path in audit_files(data_dir) {
        let reader = std::io::BufReader::new(fs_err::File::open(&path)?);
        for line in reader.split(b'\n') {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<AuditEntry>(&line) {
                Ok(entry) => entries.push(entry),
                Err(_) => bad += 1,
            }
        }
    }
    // Each file is in order; the tenants' files are merged by time (stable: a call's
    // `started` line stays before its `finished` line of the same millisecond).
    entries.sort_by_key(|entry| entry.at_ms);
    Ok((entries, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tenant: &str, n: u64) -> AuditEntry {
        AuditEntry {
            at_ms: n,
            phase: "started".into(),
            execution_id: format!("e-{n}"),
            tenant: tenant.into(),
            kind: "execute".into(),
            code_sha256: Some(code_hash("print(1)")),
            code_bytes: Some(8),
            ..AuditEntry::default()
        }
    }

    fn log_of(data: &Path, budget: u64) -> AuditLog {
        AuditLog::new(data, budget, Arc::new(Ledger::default()))
    }

    #[test]
    fn a_tenant_rotates_within_its_own_budget_and_another_keeps_every_line() {
        let data = tempfile::tempdir().unwrap();
        let ledger = Arc::new(Ledger::default());
        let mut log = AuditLog::new(data.path(), 5000, Arc::clone(&ledger));
        log.append(&entry("team-b", 0));
        log.append(&entry("team-b", 1));
        for n in 2..200 {
            log.append(&entry("team-a", n));
        }
        let tenants = tenants_dir(data.path());
        assert!(tenant_bytes(data.path(), "team-a") <= 5000);
        for (path, size) in rotated(&tenants, "team-a") {
            assert!(size <= 1000, "{}: {size}", path.display());
        }
        assert!(ledger.counts("team-a").audit_files_removed > 0);
        assert_eq!(ledger.counts("team-b").audit_files_removed, 0);
        let (entries, bad) = read_audit(data.path()).unwrap();
        assert_eq!(bad, 0);
        let ids = |tenant: &str| -> Vec<u64> {
            entries
                .iter()
                .filter(|e| e.tenant == tenant)
                .map(|e| e.at_ms)
                .collect()
        };
        // team-b's lines, written before team-a's flood, are all there.
        assert_eq!(ids("team-b"), [0, 1]);
        // team-a lost its own oldest; what is left is in order, to the end.
        let a = ids("team-a");
        assert_eq!(a.last(), Some(&199));
        assert!(a.windows(2).all(|w| w[1] == w[0] + 1), "{a:?}");
        assert!(a[0] > 2, "nothing of team-a was rotated away");
        // Oldest first, every tenant's together.
        assert!(entries.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        // Private to the server user.
        use std::os::unix::fs::PermissionsExt;
        for dir in [data.path().join(AUDIT_DIR), tenants.clone()] {
            let mode = fs_err::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        let files = audit_files(data.path());
        let mode = fs_err::metadata(&files[0]).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A new writer (a restart) counts what is on disk.
        let mut again = log_of(data.path(), 5000);
        for n in 200..260 {
            again.append(&entry("team-a", n));
        }
        assert!(tenant_bytes(data.path(), "team-a") <= 5000);
    }

    #[test]
    fn a_cut_line_is_skipped_and_counted() {
        let data = tempfile::tempdir().unwrap();
        let mut log = log_of(data.path(), 1 << 20);
        log.append(&entry("local", 1));
        let path = tenant_file(&tenants_dir(data.path()), "local", 0);
        let mut text = fs_err::read_to_string(&path).unwrap();
        text.push_str("{\"at_ms\": 2, \"pha");
        fs_err::write(&path, text).unwrap();
        let (entries, bad) = read_audit(data.path()).unwrap();
        assert_eq!((entries.len(), bad), (1, 1));
        assert_eq!(
            entries[0].code_sha256.as_deref(),
            Some("d287bb7f9d15abdc5b6e98536263815744b6ef21c8f3c839fc434ca70d8efe99")
        );
    }

    #[test]
    fn the_single_file_of_earlier_versions_is_still_read() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join(AUDIT_DIR);
        fs_err::create_dir_all(&dir).unwrap();
        let old = |n| String::from_utf8(entry("local", n).line().unwrap()).unwrap();
        fs_err::write(dir.join("audit.jsonl.1"), old(1)).unwrap();
        fs_err::write(dir.join(LEGACY_FILE), old(3)).unwrap();
        log_of(data.path(), 1 << 20).append(&entry("local", 2));
        let (entries, _) = read_audit(data.path()).unwrap();
        let at: Vec<u64> = entries.iter().map(|e| e.at_ms).collect();
        assert_eq!(at, [1, 2, 3]);
    }

    #[test]
    fn a_line_is_bounded_whatever_the_call_carried() {
        let huge = "x".repeat(1 << 20);
        let worst = AuditEntry {
            tool: Some(huge.clone()),
            profile: Some(huge.clone()),
            session_id: Some(huge.clone()),
            status: Some(huge.clone()),
            python_version: Some(huge.clone()),
            dependencies: (0..300)
                .map(|n| format!("{}{n}", &huge[..64 << 10]))
                .collect(),
            events: (0..1000)
                .map(|_| SecurityEvent {
                    kind: crate::EventKind::NetworkDenied,
                    detail: huge[..4096].to_owned(),
                })
                .collect(),
            ..entry("local", 1)
        };
        let line = worst.line().unwrap();
        assert!(line.len() <= MAX_LINE_BYTES, "{}", line.len());
        let back: AuditEntry = serde_json::from_slice(&line).unwrap();
        assert!(back.tool.unwrap().ends_with(&format!(
            "… [{} bytes, sha256 {}]",
            huge.len(),
            &code_hash(&huge)[..16]
        )));
        assert_eq!(back.dependencies.len(), MAX_DEPENDENCIES + 1);
        assert!(
            back.dependencies[MAX_DEPENDENCIES].starts_with("… and 276 more"),
            "{:?}",
            back.dependencies.last()
        );
        assert!(back.events.len() <= MAX_EVENTS);
        // Bounding twice changes nothing (the runs table's writer cuts values first).
        let once = cap_text(&huge, MAX_FIELD_BYTES);
        assert_eq!(cap_text(&once, MAX_FIELD_BYTES + CAP_SUFFIX_BYTES), once);
        let list = cap_list(&worst.dependencies, MAX_DEPENDENCIES, MAX_FIELD_BYTES);
        let twice = AuditEntry {
            dependencies: list.clone(),
            ..AuditEntry::default()
        };
        assert_eq!(twice.bounded().dependencies, list);
        // Short values are kept whole, and a cut is made at a character boundary.
        assert_eq!(cap_text("numpy>=2", MAX_FIELD_BYTES), "numpy>=2");
        assert!(cap_text(&"é".repeat(200), 101).starts_with(&"é".repeat(50)));
    }
}
