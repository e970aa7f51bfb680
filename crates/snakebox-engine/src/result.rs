//! The shape of what an execution returns: one structured record that the server turns into
//! `structuredContent` and into the peer-compatible text sections.
//!
//! It lives in the engine (not the server) because the CLI prints the same record.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::error::ErrorInfo;
use crate::error::ErrorKind;
use crate::events::{EventKind, MAX_NETWORK_EVENTS, SecurityEvent, event};

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The script exited with code 0.
    Ok,
    /// The script exited with a non-zero code or was killed by a signal.
    Error,
    /// The wall-time limit was reached; the process tree was killed.
    Timeout,
    /// The caller cancelled the request; the process tree was killed.
    Cancelled,
    /// The memory limit was reached.
    MemoryLimit,
    /// The CPU-time limit was reached.
    CpuLimit,
    /// The script never ran: the environment could not be prepared (bad dependency, no
    /// interpreter for the requested version, install failure).
    SetupFailed,
    /// The request itself was invalid (bad argument values); nothing ran.
    InvalidRequest,
}

impl Status {
    /// The status of an execution that an error of `kind` stopped before its code ran: what
    /// the request got wrong (`invalid`, `not_found`, `conflict` with what it names) is
    /// `invalid_request`, a cancel `cancelled`, anything else `setup_failed`.
    #[must_use]
    pub fn not_run(kind: ErrorKind) -> Status {
        match kind {
            ErrorKind::Invalid | ErrorKind::NotFound | ErrorKind::Conflict => {
                Status::InvalidRequest
            }
            ErrorKind::Cancelled => Status::Cancelled,
            _ => Status::SetupFailed,
        }
    }

    /// Every status, in the order the docs list them.
    pub const ALL: [Status; 8] = [
        Status::Ok,
        Status::Error,
        Status::Timeout,
        Status::Cancelled,
        Status::MemoryLimit,
        Status::CpuLimit,
        Status::SetupFailed,
        Status::InvalidRequest,
    ];

    /// The name used on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Cancelled => "cancelled",
            Status::MemoryLimit => "memory_limit",
            Status::CpuLimit => "cpu_limit",
            Status::SetupFailed => "setup_failed",
            Status::InvalidRequest => "invalid_request",
        }
    }
}

/// A package installed in the environment the script ran in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Package {
    /// Distribution name.
    pub name: String,
    /// Installed version.
    pub version: String,
}

/// What a run used, as the host measured it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
pub struct ResourceUse {
    /// The most memory its processes held at once, in bytes (RSS and page cache charged to
    /// the run).
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all its processes, in milliseconds (hosts with cgroup v2).
    pub cpu_time_ms: Option<u64>,
    /// How many times a new process or thread was refused at the process limit.
    pub process_limit_hits: Option<u64>,
}

/// The complete record of one `execute_python` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecutionResult {
    /// Unique id of this execution.
    pub execution_id: String,
    /// How it ended: ok, error, timeout, cancelled, memory_limit, cpu_limit, setup_failed,
    /// invalid_request.
    pub status: Status,
    /// Process exit code (absent when the script never ran or was killed by a signal).
    pub exit_code: Option<i32>,
    /// The signal that killed the script, when it died of one it did not get from us (a crash:
    /// SIGSEGV, SIGABRT, ...). Limits and timeouts are reported by `status` instead.
    pub signal: Option<i32>,
    /// Standard output (head and tail kept when longer than the output limit).
    pub stdout: String,
    /// Standard error (head and tail kept when longer than the output limit).
    pub stderr: String,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Whether the wall-time limit ended the run.
    pub timed_out: bool,
    /// Wall-clock milliseconds of the run itself (environment preparation excluded).
    pub duration_ms: u64,
    /// Milliseconds spent preparing the environment (0 when a cached one was reused).
    pub setup_ms: u64,
    /// The timeout that was applied, in seconds.
    pub timeout_seconds: u64,
    /// Full version of the interpreter used (e.g. `3.11.7`), when one was chosen.
    pub python_version: Option<String>,
    /// Requirements asked for (script metadata merged with the `dependencies` argument).
    pub requested_dependencies: Vec<String>,
    /// Packages installed in the environment the script ran in.
    pub resolved_dependencies: Vec<Package>,
    /// Whether a cached environment was reused.
    pub environment_reused: bool,
    /// The failure that is not the script's own (setup, limits, invalid request).
    pub error: Option<ErrorInfo>,
    /// Notes about adjustments made to the request (e.g. a timeout clamped to the maximum).
    pub notes: Vec<String>,
    /// The value of the script's last expression, as a notebook shows it (absent when the
    /// last statement is not an expression or its value is `None`).
    pub result: Option<ValueRepr>,
    /// Names the run defined at top level (variables, functions, classes, imports).
    pub names: Vec<String>,
    /// The uncaught exception, with a traceback that points at the script's own lines.
    pub exception: Option<ExceptionInfo>,
    /// Files the run created or changed in its working directory, and the images it produced
    /// (figures, an image as the last expression), kept in the artifact store.
    pub artifacts: Vec<Artifact>,
    /// Files of the working directory that were not kept, with the reason.
    pub skipped_files: Vec<SkippedFile>,
    /// Every connection the run asked the network proxy for, allowed or refused, with the
    /// reason and the bytes moved: tells a policy block from a network error. Empty when the
    /// run had no network or made no connection.
    pub network_log: Vec<crate::NetworkLogEntry>,
    /// What the run used, as the host measured it from its cgroup (each `null` where this
    /// host cannot measure it, or when nothing ran).
    pub resource_usage: ResourceUse,
    /// What the server stopped or refused, and why: a limit reached (time, memory, CPU,
    /// output), a connection the network policy refused, a quota, a sandbox that could not be
    /// set up. Empty when nothing was.
    pub events: Vec<crate::SecurityEvent>,
    /// Images also returned inline as `image` content (bounded in size and number).
    #[serde(skip)]
    pub inline_images: Vec<InlineImage>,
    /// The session this run belongs to (absent for one-shot runs).
    pub session_id: Option<String>,
    /// True when this run started a new interpreter for its session, so variables from
    /// earlier calls are gone (files and packages remain).
    pub fresh_interpreter: bool,
    /// The profile the run was held to (`check_environment` lists what each enforces).
    pub profile: Option<String>,
    /// The value of a top-level variable named `result` when the script left one (what
    /// IBM's python sandbox server calls the result); given by its compatibility tools only.
    #[serde(skip)]
    pub result_variable: Option<ValueRepr>,
}

/// A value as a notebook shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ValueRepr {
    /// `repr()` of the value (capped).
    pub repr: String,
    /// The value as JSON, when it is plain data (dict, list, str, number, bool, None).
    pub json: Option<serde_json::Value>,
    /// The value's type name.
    pub type_name: String,
}

/// An uncaught exception.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExceptionInfo {
    /// Exception class name, e.g. `ZeroDivisionError`.
    pub type_name: String,
    /// `str()` of the exception.
    pub message: String,
    /// Formatted traceback, limited to the script's own frames.
    pub traceback: String,
    /// Line of the script where it was raised, when known.
    pub line: Option<u32>,
}

/// A file produced by a run, kept in the artifact store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Artifact {
    /// Path relative to the run's working directory (for figures: `figure-N.png`; for an
    /// image that was the last expression: `result.png`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type guessed from the name (images: from their content).
    pub mime_type: String,
    /// Resource URI to read it with `resources/read`:
    /// `snakebox://artifacts/<execution_id>/<name>`.
    pub uri: String,
    /// Where it came from: `file` (written by the script), `figure` (a matplotlib figure),
    /// `value` (the last expression, e.g. a PIL image).
    pub origin: ArtifactOrigin,
    /// Whether it is also in the reply as inline `image` content.
    pub inline: bool,
    /// Over HTTP only: a signed, expiring URL that downloads it with a plain `GET`, no API
    /// key (the link is the credential; it expires, see the server's `[http]` settings).
    /// `null` on stdio.
    #[serde(default)]
    pub download_url: Option<String>,
}

/// Where an artifact came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactOrigin {
    /// A file the script created or changed in its working directory.
    File,
    /// A matplotlib figure (shown with `plt.show()` or left open).
    Figure,
    /// The value of the last expression (a PIL image or a matplotlib figure).
    Value,
}

/// A file of the working directory that was not kept as an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SkippedFile {
    /// Path relative to the working directory.
    pub name: String,
    /// Why: a symbolic link, a hard link, a FIFO/socket/device, or a size or count limit.
    pub reason: String,
}

/// An image sent inline with the reply (not part of the structured record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineImage {
    /// `image/png`, `image/jpeg`, `image/gif`, `image/webp` or `image/svg+xml`.
    pub mime_type: String,
    /// The image bytes (base64 in JSON).
    #[serde(with = "crate::base64_bytes")]
    pub data: Vec<u8>,
    /// The artifact it is a copy of.
    pub uri: String,
}

impl ExecutionResult {
    /// Take over what the sandbox saw of a finished run: exit code, the signal that killed it
    /// (only when nothing of ours did: a timeout or a limit says so in `status`), output and
    /// its truncation, time-out and duration.
    pub(crate) fn record_outcome(&mut self, outcome: snakebox_sandbox::Outcome) {
        use snakebox_sandbox::Termination;
        self.exit_code = outcome.exit_code;
        self.signal = outcome
            .signal
            .filter(|_| outcome.termination == Termination::Exited);
        self.stdout_truncated = outcome.stdout.truncated;
        self.stderr_truncated = outcome.stderr.truncated;
        self.stdout = outcome.stdout.text;
        self.stderr = outcome.stderr.text;
        self.timed_out = outcome.termination == Termination::TimedOut;
        self.duration_ms = crate::ids::millis(outcome.duration);
        let usage = outcome.usage;
        self.resource_usage = ResourceUse {
            peak_memory_bytes: usage.peak_memory_bytes,
            cpu_time_ms: usage.cpu_time_ms,
            process_limit_hits: usage.process_limit_hits,
        };
    }

    /// A result for an execution that `error` stopped before its code ran; its status
    /// follows the error's kind (`invalid_request`, `cancelled`, else `setup_failed`).
    #[must_use]
    pub fn not_run(execution_id: String, error: crate::error::EngineError) -> Self {
        let mut result = ExecutionResult::new(execution_id, Status::not_run(error.kind));
        result.error = Some(error.into());
        result
    }

    /// An empty record with this id and status; callers fill in what they know.
    #[must_use]
    pub fn new(execution_id: String, status: Status) -> Self {
        ExecutionResult {
            execution_id,
            status,
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            timed_out: false,
            duration_ms: 0,
            setup_ms: 0,
            timeout_seconds: 0,
            python_version: None,
            requested_dependencies: Vec::new(),
            resolved_dependencies: Vec::new(),
            environment_reused: false,
            error: None,
            notes: Vec::new(),
            result: None,
            names: Vec::new(),
            exception: None,
            artifacts: Vec::new(),
            skipped_files: Vec::new(),
            network_log: Vec::new(),
            events: Vec::new(),
            resource_usage: ResourceUse::default(),
            inline_images: Vec::new(),
            session_id: None,
            fresh_interpreter: false,
            profile: None,
            result_variable: None,
        }
    }

    /// The text form, with the sections of `mcp-python-exec-sandbox` so that clients written
    /// for it keep working.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(error) = &self.error {
            out.push_str(&format!(
                "--- error: {} ---\n{}\n",
                self.status.as_str(),
                error.message
            ));
            if let Some(hint) = &error.hint {
                out.push_str(&format!("hint: {hint}\n"));
            }
        }
        if !self.stdout.is_empty() {
            out.push_str("--- stdout ---\n");
            push_unmarked(&mut out, &self.stdout);
        }
        if !self.stderr.is_empty() {
            out.push_str("--- stderr ---\n");
            push_unmarked(&mut out, &self.stderr);
        }
        if let Some(value) = &self.result {
            out.push_str("--- result ---\n");
            push_unmarked(&mut out, &value.repr);
        }
        if !self.artifacts.is_empty() {
            out.push_str("--- artifacts ---\n");
            for artifact in &self.artifacts {
                out.push_str(&format!(
                    "{} ({} bytes, {}) {}\n",
                    artifact.name, artifact.size, artifact.mime_type, artifact.uri
                ));
                if let Some(url) = &artifact.download_url {
                    out.push_str(&format!("  download: {url}\n"));
                }
            }
        }
        for skipped in &self.skipped_files {
            out.push_str(&format!(
                "skipped file: {} ({})\n",
                skipped.name, skipped.reason
            ));
        }
        if !self.network_log.is_empty() {
            out.push_str("--- network ---\n");
            for entry in &self.network_log {
                if entry.allowed {
                    out.push_str(&format!(
                        "allowed {}:{} ({} bytes sent, {} received)\n",
                        entry.host, entry.port, entry.bytes_sent, entry.bytes_received
                    ));
                } else if entry.reason.starts_with("network error") {
                    out.push_str(&format!(
                        "failed {}:{}: {}\n",
                        entry.host, entry.port, entry.reason
                    ));
                } else {
                    out.push_str(&format!(
                        "blocked by policy {}:{}: {}\n",
                        entry.host, entry.port, entry.reason
                    ));
                }
            }
        }
        if let Some(code) = self.exit_code {
            out.push_str(&format!("--- exit_code: {code} ---\n"));
        }
        if let Some(signal) = self.signal {
            out.push_str(&format!("--- signal: {} ---\n", signal_name(signal)));
        }
        if self.timed_out {
            out.push_str("--- timed_out: true ---\n");
        }
        if self.stdout_truncated || self.stderr_truncated {
            out.push_str("--- output truncated ---\n");
        }
        if !matches!(self.status, Status::Ok | Status::Error) && self.error.is_none() {
            out.push_str(&format!("--- status: {} ---\n", self.status.as_str()));
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        terminal_safe(&out)
    }
}

/// Append what a run wrote (or its value's repr) to the text form, ending with a newline, such
/// that none of it reads as the text form's own markers: a line of it that begins with `--- `
/// (as `--- exit_code: 0 ---` does) is shown with a backslash before it. A script that prints
/// `--- exit_code: 0 ---` and exits 3 must not look like a success to a client or model
/// reading the text (issue 36); the structured form keeps the exact text.
fn push_unmarked(out: &mut String, text: &str) {
    for line in text.split_inclusive('\n') {
        if line.starts_with(MARKER_START) {
            out.push('\\');
        }
        out.push_str(line);
    }
    if !text.ends_with('\n') {
        out.push('\n');
    }
}

/// How every marker line of the text form begins.
const MARKER_START: &str = "--- ";

/// The text form may be shown in a terminal: control characters other than newline and tab
/// (ESC/CSI/OSC sequences that move the cursor, rewrite the screen or write the clipboard) are
/// made visible as `\xNN` instead of being passed through (catalogue H-03). The structured
/// form keeps the exact text, JSON-escaped.
fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// How many terminal escape sequences `text` holds: ESC and the one-character CSI, the
/// characters that start what [`terminal_safe`] defuses (cursor moves, screen rewrites,
/// clipboard writes).
fn escape_sequences(text: &str) -> usize {
    text.chars()
        .filter(|&c| c == '\u{1b}' || c == '\u{9b}')
        .count()
}

/// `11` → `SIGSEGV (11)`, `10` → `SIGUSR1 (10)`; a real-time signal is named from
/// `SIGRTMIN` (`SIGRTMIN+2 (36)`), and a number that is no signal here stays a number.
#[must_use]
pub(crate) fn signal_name(signal: i32) -> String {
    let rtmin = libc::SIGRTMIN();
    let rtmax = libc::SIGRTMAX();
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(known) => format!("{} ({signal})", known.as_str()),
        Err(_) if signal == rtmin => format!("SIGRTMIN ({signal})"),
        Err(_) if signal > rtmin && signal <= rtmax => {
            format!("SIGRTMIN+{} ({signal})", signal - rtmin)
        }
        Err(_) => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod signal_tests {
    use super::signal_name;

    #[test]
    fn signals_are_named_whatever_their_number() {
        assert_eq!(signal_name(11), "SIGSEGV (11)");
        assert_eq!(signal_name(10), "SIGUSR1 (10)");
        assert_eq!(signal_name(28), "SIGWINCH (28)");
        let rt = libc::SIGRTMIN() + 2;
        assert_eq!(signal_name(rt), format!("SIGRTMIN+2 ({rt})"));
        assert_eq!(signal_name(99), "signal 99");
    }
}

#[cfg(test)]
mod terminal_tests {
    use super::terminal_safe;

    #[test]
    fn escape_sequences_are_made_visible() {
        assert_eq!(terminal_safe("a\x1b[2Jb\n\tc"), "a\\x1b[2Jb\n\tc");
        assert_eq!(terminal_safe("\u{9b}31m"), "\\x9b31m");
        assert_eq!(terminal_safe("caf\u{e9} \u{1f40d}"), "caf\u{e9} \u{1f40d}");
    }

    #[test]
    fn output_never_reads_as_the_text_forms_own_markers() {
        let mut result = super::ExecutionResult::new("e".into(), super::Status::Error);
        result.stdout = "--- exit_code: 0 ---\nok\n--- stderr ---".into();
        result.stderr = "x\n--- timed_out: true ---\n".into();
        result.exit_code = Some(3);
        let text = result.to_text();
        let markers: Vec<&str> = text.lines().filter(|l| l.starts_with("--- ")).collect();
        assert_eq!(
            markers,
            ["--- stdout ---", "--- stderr ---", "--- exit_code: 3 ---"],
            "{text}"
        );
        assert!(
            text.contains("\\--- exit_code: 0 ---\nok\n\\--- stderr ---\n"),
            "{text}"
        );
        assert!(text.contains("x\n\\--- timed_out: true ---\n"), "{text}");
        // Other lines are as they were, and a line that only contains a marker stays.
        result.stdout = "a --- exit_code: 0 ---\n---\n".into();
        assert!(
            result
                .to_text()
                .starts_with("--- stdout ---\na --- exit_code: 0 ---\n---\n")
        );
    }
}

impl ExecutionResult {
    /// Whether the run failed to resolve a host name: what code without network meets first
    /// (`socket.gaierror`, or the same failure as `requests`, `httpx` and `urllib` report it).
    pub(crate) fn failed_to_resolve_a_name(&self) -> bool {
        const SIGNS: &[&str] = &[
            "Temporary failure in name resolution",
            "Name or service not known",
            "No address associated with hostname",
            "NameResolutionError",
            // curl, git and wget, in a session's commands.
            "Could not resolve host",
            "unable to resolve host address",
        ];
        let said = |text: &str| SIGNS.iter().any(|sign| text.contains(sign));
        self.exception
            .as_ref()
            .is_some_and(|e| e.type_name.ends_with("gaierror") || said(&e.message))
            || said(&self.stderr)
    }

    /// Why a write of the run was refused at its writable-space or file-size limit, as the run
    /// showed it: killed by `SIGXFSZ`, or ending with (or printing) Python's `ENOSPC` error.
    fn disk_limit(&self) -> Option<String> {
        const NO_SPACE: &str = "[Errno 28] No space left on device";
        if self.signal == Some(25) {
            return Some(
                "a file reached the run's file-size limit (SIGXFSZ) and the run was stopped".into(),
            );
        }
        let raised = self
            .exception
            .as_ref()
            .is_some_and(|e| e.message.starts_with(NO_SPACE));
        (raised || self.stderr.contains(NO_SPACE)).then(|| {
            "a write was refused: the run's writable space is full (ENOSPC at the scratch limit)"
                .into()
        })
    }

    /// The security events of this finished call, in the order they are reported.
    #[must_use]
    pub(crate) fn derive_events(&self) -> Vec<SecurityEvent> {
        let result = self;
        let mut events = Vec::new();
        let error = result.error.as_ref();
        let message = || error.map_or(String::new(), |e| e.message.clone());
        match result.status {
            Status::Timeout => events.push(event(
                EventKind::Timeout,
                format!(
                    "the run reached its time limit of {} s and was stopped",
                    result.timeout_seconds
                ),
            )),
            Status::MemoryLimit => events.push(event(EventKind::MemoryLimit, {
                let message = message();
                if message.is_empty() {
                    "the run reached its memory limit and was stopped".to_owned()
                } else {
                    message
                }
            })),
            Status::CpuLimit => events.push(event(EventKind::CpuLimit, {
                let message = message();
                if message.is_empty() {
                    "the run reached its CPU-time limit and was stopped".to_owned()
                } else {
                    message
                }
            })),
            Status::SetupFailed => events.push(event(EventKind::SetupFailed, message())),
            _ => {}
        }
        if error.and_then(|e| e.kind) == Some(ErrorKind::Quota) {
            events.push(event(EventKind::QuotaRefused, message()));
        }
        if let Some(hits) = result
            .resource_usage
            .process_limit_hits
            .filter(|&hits| hits > 0)
        {
            events.push(event(
                EventKind::ProcessLimit,
                format!(
                    "{hits} new process(es) or thread(s) were refused at the process limit (EAGAIN)"
                ),
            ));
        }
        let cut: Vec<&str> = [
            (result.stdout_truncated, "stdout"),
            (result.stderr_truncated, "stderr"),
        ]
        .into_iter()
        .filter_map(|(cut, name)| cut.then_some(name))
        .collect();
        if !cut.is_empty() {
            events.push(event(
                EventKind::OutputLimit,
                format!(
                    "{} passed the output limit: its middle was cut, the head and tail kept",
                    cut.join(" and ")
                ),
            ));
        }
        if let Some(detail) = result.disk_limit() {
            events.push(event(EventKind::DiskLimit, detail));
        }
        let escaped: Vec<String> = [(&result.stdout, "stdout"), (&result.stderr, "stderr")]
            .into_iter()
            .filter_map(|(text, name)| {
                let count = escape_sequences(text);
                (count > 0).then(|| format!("{name} held {count}"))
            })
            .collect();
        if !escaped.is_empty() {
            events.push(event(
                EventKind::OutputEscaped,
                format!(
                    "{} terminal escape sequence(s) (ESC or CSI): the text result shows them as \\xNN, the structured result keeps them",
                    escaped.join(" and ")
                ),
            ));
        }
        let denied: Vec<_> = result
            .network_log
            .iter()
            .filter(|entry| !entry.allowed && !entry.reason.starts_with("network error"))
            .collect();
        for entry in denied.iter().take(MAX_NETWORK_EVENTS) {
            events.push(event(
                EventKind::NetworkDenied,
                format!("{}:{}: {}", entry.host, entry.port, entry.reason),
            ));
        }
        if denied.len() > MAX_NETWORK_EVENTS {
            events.push(event(
                EventKind::NetworkDenied,
                format!(
                    "{} more refused connections (see network_log)",
                    denied.len() - MAX_NETWORK_EVENTS
                ),
            ));
        }
        events
    }
}

#[cfg(test)]
mod event_tests {
    use super::*;

    fn derive(result: &ExecutionResult) -> Vec<crate::SecurityEvent> {
        result.derive_events()
    }
    use crate::NetworkLogEntry;
    use crate::error::ErrorInfo;
    use crate::events::EventKind;

    fn entry(host: &str, allowed: bool, reason: &str) -> NetworkLogEntry {
        NetworkLogEntry {
            host: host.into(),
            port: 443,
            allowed,
            reason: reason.into(),
            address: None,
            bytes_sent: 0,
            bytes_received: 0,
        }
    }

    #[test]
    fn a_clean_run_has_no_events() {
        let mut result = ExecutionResult::new("e".into(), Status::Ok);
        result.network_log = vec![entry("a.test", true, "allowed")];
        assert!(derive(&result).is_empty());
        // The script's own failure is not a decision of the server's.
        assert!(derive(&ExecutionResult::new("e".into(), Status::Error)).is_empty());
    }

    #[test]
    fn limits_refusals_and_cuts_are_reported() {
        let mut result = ExecutionResult::new("e".into(), Status::Timeout);
        result.timeout_seconds = 3;
        result.stdout_truncated = true;
        result.network_log = vec![
            entry("blocked.test", false, "not in the allowlist"),
            entry("down.test", false, "network error: connection refused"),
        ];
        let events = derive(&result);
        let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::Timeout,
                EventKind::OutputLimit,
                EventKind::NetworkDenied
            ]
        );
        assert!(events[0].detail.contains("3 s"));
        assert_eq!(events[2].detail, "blocked.test:443: not in the allowlist");

        let mut quota = ExecutionResult::new("e".into(), Status::InvalidRequest);
        quota.error = Some(ErrorInfo {
            message: "The tenant's runs per minute are used up".into(),
            hint: None,
            kind: Some(ErrorKind::Quota),
        });
        assert_eq!(derive(&quota)[0].kind, EventKind::QuotaRefused);
    }

    #[test]
    fn disk_limits_and_escape_sequences_are_reported() {
        let mut full = ExecutionResult::new("e".into(), Status::Error);
        full.exception = Some(ExceptionInfo {
            type_name: "OSError".into(),
            message: "[Errno 28] No space left on device".into(),
            traceback: String::new(),
            line: Some(3),
        });
        assert_eq!(derive(&full)[0].kind, EventKind::DiskLimit);
        let mut printed = ExecutionResult::new("e".into(), Status::Ok);
        printed.stderr = "OSError: [Errno 28] No space left on device: 'big'\n".into();
        assert_eq!(derive(&printed)[0].kind, EventKind::DiskLimit);
        let mut killed = ExecutionResult::new("e".into(), Status::Error);
        killed.signal = Some(25);
        assert!(derive(&killed)[0].detail.contains("SIGXFSZ"));

        let mut escaped = ExecutionResult::new("e".into(), Status::Ok);
        escaped.stdout = "\u{1b}[2J\u{1b}]52;c;aGk=\u{7}done\r\n".into();
        let events = derive(&escaped);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::OutputEscaped);
        assert!(
            events[0].detail.starts_with("stdout held 2 "),
            "{}",
            events[0].detail
        );
        // A carriage return (progress bars) is no escape sequence.
        escaped.stdout = "50%\r100%\n".into();
        assert!(derive(&escaped).is_empty());
    }

    #[test]
    fn a_flood_of_refusals_is_summed_up() {
        let mut result = ExecutionResult::new("e".into(), Status::Ok);
        result.network_log = (0..50)
            .map(|i| entry(&format!("h{i}.test"), false, "private address"))
            .collect();
        let events = derive(&result);
        assert_eq!(events.len(), MAX_NETWORK_EVENTS + 1);
        assert!(events[MAX_NETWORK_EVENTS].detail.starts_with("30 more"));
    }
}
