//! How a run ended, in the caller's terms: the sandbox's termination mapped to a status, and
//! for a limit or a crash the message and the hint that say what happened and what to do.

use std::time::Duration;

use snakebox_sandbox::Termination;

use crate::ids::human_bytes;
use crate::result::{ErrorInfo, Status};

/// Map the sandbox's outcome to a status, with an explanation for the limits.
pub(crate) fn classify(
    outcome: &snakebox_sandbox::Outcome,
    limits: &snakebox_sandbox::Limits,
    timeout: Duration,
) -> (Status, Option<ErrorInfo>) {
    match outcome.termination {
        Termination::TimedOut => (
            Status::Timeout,
            Some(ErrorInfo {
                kind: None,
                message: format!(
                    "The script ran longer than its timeout of {} s and was stopped; output printed before that is kept",
                    timeout.as_secs()
                ),
                hint: Some(
                    "raise timeout_seconds (up to the server's --max-timeout) or make the script faster".into(),
                ),
            }),
        ),
        Termination::Cancelled => (
            Status::Cancelled,
            Some(ErrorInfo {
                kind: None,
                message: "The run was cancelled by the client; output printed before that is kept"
                    .into(),
                hint: None,
            }),
        ),
        Termination::MemoryLimit => (
            Status::MemoryLimit,
            Some(ErrorInfo {
                kind: None,
                message: format!(
                    "The script exceeded its memory limit of {} and was stopped",
                    limits
                        .memory_bytes
                        .map_or_else(|| "(unset)".to_string(), human_bytes)
                ),
                hint: Some(
                    "process the data in smaller pieces, or ask the operator to raise --memory-limit".into(),
                ),
            }),
        ),
        Termination::CpuLimit => (
            Status::CpuLimit,
            Some(ErrorInfo {
                kind: None,
                message: "The script used up its CPU-time limit and was stopped".into(),
                hint: Some("make the script do less work, or ask the operator to raise --cpu-limit".into()),
            }),
        ),
        Termination::Exited if outcome.exit_code == Some(0) => (Status::Ok, None),
        Termination::Exited => match outcome.signal {
            // A death by a signal we did not send is a crash the caller must be able to see.
            Some(signal) => (
                Status::Error,
                Some(ErrorInfo {
                    kind: None,
                    message: format!(
                        "The script was killed by {}",
                        crate::result::signal_name(signal)
                    ),
                    hint: Some(match signal {
                        6 => "the process aborted (abort(), a failed C assertion or a fatal error in native code)".into(),
                        11 | 7 => "a crash in native code (an extension module, ctypes) or a stack overflow".into(),
                        25 => "a file grew past the per-file size limit".into(),
                        31 => "a system call the sandbox forbids was attempted".into(),
                        _ => "check stderr for what the process was doing".into(),
                    }),
                }),
            ),
            None => (Status::Error, None),
        },
    }
}
