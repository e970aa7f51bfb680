//! The audit log: an append-only JSON-lines file of every tracked call (a one-shot run, a
//! session cell, a session command), written by the runs table's writer thread so no call
//! waits for it. Each call gets two lines with its execution id: `started` when it is
//! admitted (who, what kind, the code's SHA-256 and size, the dependencies asked for) and
//! `finished` when it returns (status, durations, exit code, Python, security events). A call
//! whose server was killed in between has only its `started` line: the log says what began,
//! whatever happened next.
//!
//! `<data>/audit/audit.jsonl` (the directory and files are the server user's alone) is
//! rotated by size: past [`MAX_FILE_BYTES`] it becomes `audit.jsonl.1`, the older ones move up
//! one, and the oldest past [`KEEP_ROTATED`] is removed. `snakebox audit` reads them, oldest
//! first. Scripts are not kept here (the runs table keeps their start), only their hash.
//! A log that cannot be written (a full disk) costs the log, never a call: it is reported once
//! in the server's log, and writing is tried again with the next line.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::events::SecurityEvent;

/// The directory under the data directory.
pub const AUDIT_DIR: &str = "audit";
/// The file written to.
const FILE: &str = "audit.jsonl";
/// Size past which the file is rotated.
pub(crate) const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Rotated files kept (`audit.jsonl.1` … `.N`).
pub(crate) const KEEP_ROTATED: usize = 4;

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

/// The writer's handle on the log.
pub(crate) struct AuditLog {
    dir: PathBuf,
    max_bytes: u64,
    file: Option<fs_err::File>,
    size: u64,
    /// Whether the last write failed (so a failing disk is logged once, not per line).
    failing: bool,
}

impl AuditLog {
    pub(crate) fn new(data_dir: &Path) -> AuditLog {
        AuditLog::with_max_bytes(data_dir, MAX_FILE_BYTES)
    }

    pub(crate) fn with_max_bytes(data_dir: &Path, max_bytes: u64) -> AuditLog {
        AuditLog {
            dir: data_dir.join(AUDIT_DIR),
            max_bytes,
            file: None,
            size: 0,
            failing: false,
        }
    }

    fn open(&mut self) -> std::io::Result<()> {
        use fs_err::os::unix::fs::OpenOptionsExt;
        use std::os::unix::fs::PermissionsExt;
        if self.file.is_none() {
            fs_err::create_dir_all(&self.dir)?;
            fs_err::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
            let file = fs_err::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(self.dir.join(FILE))?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(())
    }

    /// Move `audit.jsonl` to `.1`, each `.N` to `.N+1`, dropping the oldest.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let path = |n: usize| self.dir.join(format!("{FILE}.{n}"));
        match fs_err::remove_file(path(KEEP_ROTATED)) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
        for n in (1..KEEP_ROTATED).rev() {
            match fs_err::rename(path(n), path(n + 1)) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
        fs_err::rename(self.dir.join(FILE), path(1))?;
        self.open()
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.open()?;
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        if let Some(file) = self.file.as_mut() {
            file.write_all(line)?;
            self.size += line.len() as u64;
        }
        Ok(())
    }

    /// Append `entry` as one line.
    pub(crate) fn append(&mut self, entry: &AuditEntry) {
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        match self.write(&line) {
            Ok(()) => self.failing = false,
            Err(err) => {
                // Reopen next time (the file may have been moved or the disk freed).
                self.file = None;
                if !self.failing {
                    tracing::warn!(%err, dir = %self.dir.display(), "could not write the audit log");
                }
                self.failing = true;
            }
        }
    }
}

/// The audit log's files under `data_dir`, oldest first.
#[must_use]
pub fn audit_files(data_dir: &Path) -> Vec<PathBuf> {
    let dir = data_dir.join(AUDIT_DIR);
    let mut files: Vec<PathBuf> = (1..=KEEP_ROTATED)
        .rev()
        .map(|n| dir.join(format!("{FILE}.{n}")))
        .collect();
    files.push(dir.join(FILE));
    files.into_iter().filter(|path| path.exists()).collect()
}

/// Every entry of the audit log under `data_dir`, oldest first; a line that is not an entry
/// (cut by a full disk) is counted in the second value and skipped.
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
    Ok((entries, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> AuditEntry {
        AuditEntry {
            at_ms: n,
            phase: "started".into(),
            execution_id: format!("e-{n}"),
            tenant: "team-a".into(),
            kind: "execute".into(),
            code_sha256: Some(code_hash("print(1)")),
            code_bytes: Some(8),
            ..AuditEntry::default()
        }
    }

    #[test]
    fn lines_are_appended_rotated_and_read_back_oldest_first() {
        let data = tempfile::tempdir().unwrap();
        let mut log = AuditLog::with_max_bytes(data.path(), 1000);
        for n in 0..40 {
            log.append(&entry(n));
        }
        let files = audit_files(data.path());
        assert_eq!(files.len(), KEEP_ROTATED + 1, "{files:?}");
        for file in &files {
            assert!(fs_err::metadata(file).unwrap().len() <= 1000);
        }
        let (entries, bad) = read_audit(data.path()).unwrap();
        assert_eq!(bad, 0);
        // The oldest were dropped with the oldest file; what is left is in order, to the end.
        let ids: Vec<u64> = entries.iter().map(|e| e.at_ms).collect();
        assert_eq!(ids.last(), Some(&39));
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        assert!(ids[0] > 0, "something was rotated away");
        // Private to the server user.
        use std::os::unix::fs::PermissionsExt;
        let mode = fs_err::metadata(data.path().join(AUDIT_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let mode = fs_err::metadata(&files[0]).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_cut_line_is_skipped_and_counted() {
        let data = tempfile::tempdir().unwrap();
        let mut log = AuditLog::new(data.path());
        log.append(&entry(1));
        let path = data.path().join(AUDIT_DIR).join(FILE);
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
}
