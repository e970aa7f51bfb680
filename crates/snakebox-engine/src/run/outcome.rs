//! How a run ended, in the caller's terms: one mapping, for every kind of run (a one-shot
//! script, a session's command, a session's cell), from the way it ended (a sandbox's
//! termination, or a live interpreter's exchange) to a status, and for a limit or a crash the
//! message and the hint that say what happened and what to do. The limits named are the run's
//! own (what its sandbox was given), never the server's.

use std::time::Duration;

use snakebox_sandbox::{ExchangeEnd, Termination};

use crate::ids::human_bytes;
use crate::result::{ErrorInfo, Status};

/// What ran, for the words of the message and the hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// A one-shot script.
    Script,
    /// A session's shell command (its sandbox ends with it).
    Command,
    /// A session's cell, in the session's long-lived interpreter: an end other than an
    /// answer stops the interpreter, and its variables are lost.
    Cell,
}

/// How a run ended, whatever ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    TimedOut,
    Cancelled,
    MemoryLimit,
    CpuLimit,
    /// Its process ended by itself: with a code, or killed by a signal nobody sent on purpose.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// A cell's interpreter answered, with the cell's exit code (its process goes on).
    Answered {
        code: i32,
    },
}

impl Ending {
    /// A sandbox's outcome.
    pub(crate) fn of(outcome: &snakebox_sandbox::Outcome) -> Ending {
        match outcome.termination {
            Termination::TimedOut => Ending::TimedOut,
            Termination::Cancelled => Ending::Cancelled,
            Termination::MemoryLimit => Ending::MemoryLimit,
            Termination::CpuLimit => Ending::CpuLimit,
            Termination::Exited => Ending::Exited {
                code: outcome.exit_code,
                signal: outcome.signal,
            },
        }
    }

    /// A live interpreter's exchange; `code` is the cell's exit code when it answered.
    pub(crate) fn of_exchange(
        end: &ExchangeEnd,
        code: i32,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) -> Ending {
        match end {
            ExchangeEnd::Answered => Ending::Answered { code },
            ExchangeEnd::TimedOut => Ending::TimedOut,
            ExchangeEnd::Cancelled => Ending::Cancelled,
            ExchangeEnd::MemoryLimit => Ending::MemoryLimit,
            ExchangeEnd::Exited => Ending::Exited {
                code: exit_code,
                signal,
            },
        }
    }
}

/// What a cell's end that stops the interpreter costs the session.
const LOST: &str = "variables are lost; files in the workspace and installed packages remain, and the next call starts a new interpreter";

/// A sandbox's outcome as a status and an explanation (see [`describe`]).
pub(crate) fn classify(
    outcome: &snakebox_sandbox::Outcome,
    ran: Ran,
    limits: &snakebox_sandbox::Limits,
    timeout: Duration,
) -> (Status, Option<ErrorInfo>) {
    describe(Ending::of(outcome), ran, limits.memory_bytes, timeout)
}

/// The status of a run that ended so, and for a limit or a crash the message and the hint;
/// `memory_bytes` and `timeout` are the run's own limits.
pub(crate) fn describe(
    ending: Ending,
    ran: Ran,
    memory_bytes: Option<u64>,
    timeout: Duration,
) -> (Status, Option<ErrorInfo>) {
    let error = |message: String, hint: Option<&str>| {
        Some(ErrorInfo {
            kind: None,
            message,
            hint: hint.map(str::to_owned),
        })
    };
    let what = match ran {
        Ran::Script => "script",
        Ran::Command => "command",
        Ran::Cell => "code",
    };
    let memory = memory_bytes.map_or_else(|| "(unset)".to_string(), human_bytes);
    match (ending, ran) {
        (Ending::Answered { code: 0 }, _)
        | (Ending::Exited { code: Some(0), .. }, Ran::Script | Ran::Command) => (Status::Ok, None),
        (Ending::Answered { .. }, _) => (Status::Error, None),
        (Ending::TimedOut, Ran::Cell) => (
            Status::Timeout,
            error(
                format!(
                    "The code ran longer than its timeout of {} s; the session's interpreter was stopped: {LOST}",
                    timeout.as_secs()
                ),
                Some(
                    "raise timeout_seconds (up to the server's --max-timeout) or make the code faster",
                ),
            ),
        ),
        (Ending::TimedOut, _) => (
            Status::Timeout,
            error(
                format!(
                    "The {what} ran longer than its timeout of {} s and was stopped; output printed before that is kept",
                    timeout.as_secs()
                ),
                Some(&format!(
                    "raise timeout_seconds (up to the server's --max-timeout) or make the {what} faster"
                )),
            ),
        ),
        (Ending::Cancelled, Ran::Cell) => (
            Status::Cancelled,
            error(
                format!("The call was cancelled; the session's interpreter was stopped: {LOST}"),
                None,
            ),
        ),
        (Ending::Cancelled, _) => (
            Status::Cancelled,
            error(
                "The run was cancelled by the client; output printed before that is kept".into(),
                None,
            ),
        ),
        (Ending::MemoryLimit, Ran::Cell) => (
            Status::MemoryLimit,
            error(
                format!(
                    "The session's interpreter exceeded its memory limit of {memory} and was stopped: {LOST}"
                ),
                Some(
                    "process the data in smaller pieces, or create the session under a profile with more memory (check_environment lists them), or ask the operator to raise --memory-limit",
                ),
            ),
        ),
        (Ending::MemoryLimit, _) => (
            Status::MemoryLimit,
            error(
                format!("The {what} exceeded its memory limit of {memory} and was stopped"),
                Some(
                    "process the data in smaller pieces, or ask the operator to raise --memory-limit",
                ),
            ),
        ),
        (Ending::CpuLimit, _) => (
            Status::CpuLimit,
            error(
                format!("The {what} used up its CPU-time limit and was stopped"),
                Some(&format!(
                    "make the {what} do less work, or ask the operator to raise --cpu-limit"
                )),
            ),
        ),
        (Ending::Exited { code, signal }, Ran::Cell) => {
            let how = match (code, signal) {
                (_, Some(signal)) => format!("was killed by signal {signal}"),
                (Some(code), None) => format!("exited with code {code}"),
                (None, None) => "ended".to_owned(),
            };
            (
                Status::Error,
                error(
                    format!("The session's interpreter {how} during this call: {LOST}"),
                    Some("use exceptions or sys.exit() rather than os._exit() to stop a cell"),
                ),
            )
        }
        // A death by a signal we did not send is a crash the caller must be able to see.
        (
            Ending::Exited {
                signal: Some(signal),
                ..
            },
            _,
        ) => (
            Status::Error,
            error(
                format!(
                    "The {what} was killed by {}",
                    crate::result::signal_name(signal)
                ),
                Some(match signal {
                    6 => {
                        "the process aborted (abort(), a failed C assertion or a fatal error in native code)"
                    }
                    11 | 7 => {
                        "a crash in native code (an extension module, ctypes) or a stack overflow"
                    }
                    25 => "a file grew past the per-file size limit",
                    31 => "a system call the sandbox forbids was attempted",
                    _ => "check stderr for what the process was doing",
                }),
            ),
        ),
        (Ending::Exited { .. }, _) => (Status::Error, None),
    }
}

#[cfg(test)]
mod tests {
    use super::{Ending, Ran, describe};
    use crate::result::Status;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(7);

    /// Every ending of every kind of run: the status, and the words that must be there.
    #[test]
    fn every_way_a_run_ends_has_one_status_and_message() {
        let exited = |code, signal| Ending::Exited { code, signal };
        let table: &[(Ending, Ran, Status, &str)] = &[
            (exited(Some(0), None), Ran::Script, Status::Ok, ""),
            (exited(Some(0), None), Ran::Command, Status::Ok, ""),
            (exited(Some(3), None), Ran::Script, Status::Error, ""),
            (
                exited(Some(0), None),
                Ran::Cell,
                Status::Error,
                "interpreter exited with code 0 during this call",
            ),
            (
                exited(None, Some(9)),
                Ran::Cell,
                Status::Error,
                "killed by signal 9",
            ),
            (
                exited(None, Some(11)),
                Ran::Script,
                Status::Error,
                "The script was killed by",
            ),
            (
                exited(None, Some(31)),
                Ran::Command,
                Status::Error,
                "The command was killed by",
            ),
            (Ending::Answered { code: 0 }, Ran::Cell, Status::Ok, ""),
            (Ending::Answered { code: 1 }, Ran::Cell, Status::Error, ""),
            (
                Ending::TimedOut,
                Ran::Script,
                Status::Timeout,
                "The script ran longer than its timeout of 7 s",
            ),
            (
                Ending::TimedOut,
                Ran::Command,
                Status::Timeout,
                "The command ran longer than its timeout of 7 s",
            ),
            (
                Ending::TimedOut,
                Ran::Cell,
                Status::Timeout,
                "timeout of 7 s; the session's interpreter was stopped: variables are lost",
            ),
            (
                Ending::Cancelled,
                Ran::Script,
                Status::Cancelled,
                "cancelled by the client",
            ),
            (
                Ending::Cancelled,
                Ran::Cell,
                Status::Cancelled,
                "interpreter was stopped",
            ),
            (
                Ending::MemoryLimit,
                Ran::Script,
                Status::MemoryLimit,
                "memory limit of 256 MiB",
            ),
            (
                Ending::MemoryLimit,
                Ran::Command,
                Status::MemoryLimit,
                "The command exceeded its memory limit of 256 MiB",
            ),
            (
                Ending::MemoryLimit,
                Ran::Cell,
                Status::MemoryLimit,
                "interpreter exceeded its memory limit of 256 MiB",
            ),
            (
                Ending::CpuLimit,
                Ran::Script,
                Status::CpuLimit,
                "The script used up its CPU-time limit",
            ),
        ];
        for (ending, ran, status, words) in table {
            let (got, error) = describe(*ending, *ran, Some(256 << 20), T);
            assert_eq!(got, *status, "{ending:?} {ran:?}");
            let message = error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            assert!(message.contains(words), "{ending:?} {ran:?}: {message}");
            assert_eq!(
                words.is_empty(),
                error.is_none(),
                "{ending:?} {ran:?}: {message}"
            );
        }
    }
}
