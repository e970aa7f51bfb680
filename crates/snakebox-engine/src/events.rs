//! Security events: what the server saw a call's code run into — a limit, a refused
//! connection, a refusal of policy, a sandbox that could not be set up. Derived once, from a
//! call's finished record (`ExecutionResult::derive_events`), in the one place every tracked
//! call passes (`Calls::tracked`), so the caller (`events` in the result), the runs table, the
//! audit log and the `snakebox_security_events_total` counter all tell the same story.
//!
//! Most kinds are what the server itself observed (a limit's cgroup counter, the proxy's
//! refusal, the output it cut). Three come from the run's own report, so a script can hide
//! them from its own result but never forge one for another call: `import_blocked` and
//! `exec_blocked` (the runner's hooks saw the attempt the policy refused) and `disk_limit` (a
//! write refused at the scratch or file-size limit, seen as the script's `ENOSPC` error or
//! its `SIGXFSZ` death). What nothing observes (forks refused where no pids cgroup counts
//! them) is felt by the script as an error of its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most `network_denied` events kept per call (the network log has them all).
pub(crate) const MAX_NETWORK_EVENTS: usize = 20;

/// What kind of decision or limit it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The wall-time limit ended the run.
    Timeout,
    /// The memory limit ended the run.
    MemoryLimit,
    /// The CPU-time limit ended the run.
    CpuLimit,
    /// Output past the output limit was cut.
    OutputLimit,
    /// New processes or threads were refused at the process limit.
    ProcessLimit,
    /// A write was refused at the run's writable-space (scratch) or file-size limit.
    DiskLimit,
    /// The output held terminal escape sequences, shown as `\xNN` in the text result.
    OutputEscaped,
    /// The network policy refused a connection.
    NetworkDenied,
    /// A cap of the server or the tenant refused the call (quota, rate, sessions, disk).
    QuotaRefused,
    /// The sandbox or the environment could not be set up; the code never ran.
    SetupFailed,
    /// An import of the script's own code outside its `allowed_imports` (refused before the
    /// run, or stopped by the runner's import guard).
    ImportBlocked,
    /// A program start (`execve`) the run's profile denies; the runner saw the attempt, the
    /// sandbox's seccomp program refused it.
    ExecBlocked,
    /// The call asked for what its profile does not allow (a package, a wider limit, a
    /// profile not offered to its tenant); refused before anything ran.
    PolicyRefused,
}

impl EventKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [EventKind; 13] = [
        EventKind::Timeout,
        EventKind::MemoryLimit,
        EventKind::CpuLimit,
        EventKind::OutputLimit,
        EventKind::ProcessLimit,
        EventKind::DiskLimit,
        EventKind::OutputEscaped,
        EventKind::NetworkDenied,
        EventKind::QuotaRefused,
        EventKind::SetupFailed,
        EventKind::ImportBlocked,
        EventKind::ExecBlocked,
        EventKind::PolicyRefused,
    ];

    /// The name used on the wire and as the metric's label.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Timeout => "timeout",
            EventKind::MemoryLimit => "memory_limit",
            EventKind::CpuLimit => "cpu_limit",
            EventKind::OutputLimit => "output_limit",
            EventKind::ProcessLimit => "process_limit",
            EventKind::DiskLimit => "disk_limit",
            EventKind::OutputEscaped => "output_escaped",
            EventKind::NetworkDenied => "network_denied",
            EventKind::QuotaRefused => "quota_refused",
            EventKind::SetupFailed => "setup_failed",
            EventKind::ImportBlocked => "import_blocked",
            EventKind::ExecBlocked => "exec_blocked",
            EventKind::PolicyRefused => "policy_refused",
        }
    }
}

/// One decision the server made about a call, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecurityEvent {
    /// timeout, memory_limit, cpu_limit, output_limit, process_limit, disk_limit,
    /// output_escaped, network_denied, quota_refused, setup_failed, import_blocked,
    /// exec_blocked or policy_refused.
    pub kind: EventKind,
    /// What happened, for a person.
    pub detail: String,
}

pub(crate) fn event(kind: EventKind, detail: impl Into<String>) -> SecurityEvent {
    SecurityEvent {
        kind,
        detail: detail.into(),
    }
}

/// The event of an import that the import policy (the call's `allowed_imports`, or its
/// profile's) does not cover, at `line` of the script.
pub(crate) fn import_blocked(module: &str, line: Option<u32>) -> SecurityEvent {
    let at = line.map_or_else(String::new, |line| format!(" (line {line})"));
    event(
        EventKind::ImportBlocked,
        format!("import of `{module}`{at} is outside the import policy"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_under_its_wire_name() {
        for kind in EventKind::ALL {
            let wire = serde_json::to_value(kind).unwrap();
            assert_eq!(wire, kind.as_str());
            assert_eq!(EventKind::ALL.iter().filter(|k| **k == kind).count(), 1);
        }
    }
}
