//! The run loop shared by every backend: drain stdout, stderr and the control channel
//! concurrently into capped buffers, wait for the child, the wall clock or cancellation, then
//! tear the whole tree down and classify how the run ended.
//!
//! The run ends when the *direct child* ends (not at pipe EOF: a daemon may hold the pipes
//! open forever). At that point everything else of the run is killed, and the pipes are
//! drained for a short grace period only.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::capture::{Forwarder, StreamCapture, finish_pair};
use crate::error::SpawnError;
use crate::{Captured, Limits, OutputChunk, Stream, Termination};

/// Largest control-channel message kept (the rest is drained and dropped).
pub const CONTROL_MAX_BYTES: usize = 16 << 20;

/// The tag of the line with which a command reports, on its control channel, how it really
/// ended: `<tag>exited N` or `<tag>signaled N`, as the channel's last line.
///
/// Why: bubblewrap (and the fork server's init, which mimics it) reports a death of the
/// command by signal N as exit status 128 + N, so from outside `os._exit(137)` and a SIGKILL
/// look the same. A process in the sandbox that waits for the command (the runners fork one
/// at start: it waits, reports the true wait status here, then ends the same way) tells them
/// apart. Without such a line, or when it contradicts the status we saw, 129-192 stays a
/// death by signal. The command's own code can write to the channel too, so a report can
/// only change how a status we saw is *read* (exit code or signal of the same number): it
/// never hides a timeout, a cancellation or a memory kill, which come from the supervisor and
/// the cgroup.
pub const END_REPORT_TAG: &[u8] = b"\x1esnakebox-end ";

/// How a command ended, as its in-sandbox reaper reported it (see [`END_REPORT_TAG`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReport {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

impl EndReport {
    /// Parse the end report in the last line of `control`, and remove that line: the rest of
    /// the channel belongs to the command (its record is expected as the last line there).
    pub(crate) fn take(control: &mut Vec<u8>) -> Option<EndReport> {
        let body_end = control.len() - control.iter().rev().take_while(|&&b| b == b'\n').count();
        let line_start = control[..body_end]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        let report = Self::parse(&control[line_start..body_end])?;
        control.truncate(line_start);
        Some(report)
    }

    /// Parse one line (without its newline).
    pub(crate) fn parse(line: &[u8]) -> Option<EndReport> {
        let rest = line.strip_prefix(END_REPORT_TAG)?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (kind, number) = rest.trim().split_once(' ')?;
        let number: i32 = number.parse().ok()?;
        match kind {
            "exited" if (0..=255).contains(&number) => Some(EndReport::Exited(number)),
            "signaled" if (1..=64).contains(&number) => Some(EndReport::Signaled(number)),
            _ => None,
        }
    }
}

/// Read a wait status of the direct child: `(exit code, signal)`. With `shell_style_signals`
/// (bwrap, the fork server's init), 129-192 is a death by signal N - 128 unless the
/// command's reaper reported exactly that exit code.
pub(crate) fn read_status(
    status: ExitStatus,
    shell_style_signals: bool,
    report: Option<EndReport>,
) -> (Option<i32>, Option<i32>) {
    let (exit_code, signal) = (status.code(), status.signal());
    match exit_code {
        Some(code)
            if shell_style_signals
                && (129..=128 + 64).contains(&code)
                && report != Some(EndReport::Exited(code)) =>
        {
            (None, Some(code - 128))
        }
        _ => (exit_code, signal),
    }
}

/// The last streamed chunk once the output budget is spent, while the command may go on
/// printing: what follows is not streamed (the result says what it kept).
pub(crate) const BUDGET_SPENT_NOTE: &str = "\n[snakebox: the output limit is reached; further output is not streamed, and the result keeps its beginning and end]\n";

/// How long we keep reading the pipes after the tree was killed.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// What [`Teardown::kill_all_and_wait`] returns.
pub(crate) type Waiting<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// Kills everything that belongs to one run. Called after the direct child ends, on timeout,
/// on cancellation and when the run future is dropped; must be idempotent and must not block
/// for long.
pub(crate) trait Teardown: Send + Sync {
    /// SIGKILL every process of the run.
    fn kill_all(&self);
    /// SIGKILL what of the run is there now, without waiting for it to go (the supervisor
    /// waits with [`Teardown::kill_all_and_wait`] once the output is read). By default
    /// [`Teardown::kill_all`].
    fn kill_now(&self) {
        self.kill_all();
    }
    /// SIGKILL every process of the run and wait until none is left, without holding up the
    /// runtime's thread while they exit. By default [`Teardown::kill_all`].
    fn kill_all_and_wait(&self) -> Waiting<'_> {
        Box::pin(async move { self.kill_all() })
    }
    /// Whether the run hit its memory limit (OOM kill counted by the cgroup).
    fn memory_exceeded(&self) -> bool {
        false
    }
    /// What the run used, as far as this host measures it (before `release`).
    fn usage(&self) -> crate::ResourceUsage {
        crate::ResourceUsage::default()
    }
    /// The file that sets the run cgroup's CPU weight (see [`crate::CpuShare`]); `None`
    /// where there is no cpu cgroup of ours.
    fn cpu_knob(&self) -> Option<crate::cgroup::CpuKnob> {
        None
    }
    /// Free what the run held once everything is dead (its cgroup). Idempotent.
    fn release(&self) {}
    /// Whether the sandbox never executed the command (its own setup failed), read after the
    /// direct child ended and [`finish_status_task`] returned. Backends that cannot tell say no.
    fn setup_failed(&self) -> bool {
        false
    }
}

/// Attach the cgroup of the run `teardown` ends to `share` (see [`crate::CpuShare`]); with
/// `then`, the cgroup gets that weight once the attachment is dropped. Inert where the run has
/// no cpu cgroup of ours; a weight that cannot be written leaves the run as it was (logged).
pub(crate) fn attach_cpu(
    teardown: &dyn Teardown,
    share: &crate::CpuShare,
    then: Option<crate::CpuWeight>,
) -> crate::CpuAttachment {
    let Some(knob) = teardown.cpu_knob() else {
        return crate::CpuAttachment::none();
    };
    share.attach(knob, then).unwrap_or_else(|err| {
        tracing::warn!(error = %err, "could not set a sandbox's CPU weight");
        crate::CpuAttachment::none()
    })
}

/// Let the task that follows the sandbox's status (native: bwrap's JSON status) read to its
/// end, which comes when the direct child has ended, then stop it; bounded.
pub(crate) async fn finish_status_task(task: Option<tokio::task::JoinHandle<()>>) {
    if let Some(mut task) = task
        && tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
    {
        task.abort();
    }
}

/// The error to return instead of an outcome when the direct child ended with status 1
/// without the sandbox ever executing the command: bwrap's own setup failed (for example
/// `Creating new namespace failed`), which must not read as the command's `exit 1`.
pub(crate) fn setup_failure(
    run: &RawRun,
    teardown: &dyn Teardown,
) -> Option<crate::error::SandboxError> {
    (run.stop == Stop::Exited && run.status.code() == Some(1) && teardown.setup_failed()).then(
        || {
            let text = run.stderr.text.trim();
            let start = text.len().saturating_sub(2000);
            let start = (start..text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(text.len());
            crate::error::NamespaceError::SetupFailed {
                stderr: text[start..].to_string(),
            }
            .into()
        },
    )
}

/// The process whose end is the end of a run: a spawned child (bwrap, or the command itself
/// without isolation), or a run forked by the fork server.
pub(crate) trait DirectChild: Send {
    /// Its pid, for error messages (0 when it has none of ours).
    fn pid(&self) -> u32;
    /// Wait until it ends.
    fn wait(&mut self) -> impl std::future::Future<Output = std::io::Result<ExitStatus>> + Send;
    /// Start killing it (the teardown kills the rest of the tree).
    fn start_kill(&mut self);
}

impl DirectChild for tokio::process::Child {
    fn pid(&self) -> u32 {
        self.id().unwrap_or(0)
    }
    fn wait(&mut self) -> impl std::future::Future<Output = std::io::Result<ExitStatus>> + Send {
        tokio::process::Child::wait(self)
    }
    fn start_kill(&mut self) {
        let _ = tokio::process::Child::start_kill(self);
    }
}

/// Kills the tree if the run future is dropped before it finished.
struct KillOnDrop<'a> {
    teardown: &'a dyn Teardown,
    armed: bool,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.teardown.kill_all();
        }
    }
}

/// Why the supervisor stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The direct child ended.
    Exited,
    /// Wall time reached.
    TimedOut,
    /// `cancel` fired.
    Cancelled,
}

/// What the supervisor saw.
#[derive(Debug)]
pub(crate) struct RawRun {
    pub(crate) status: ExitStatus,
    pub(crate) stop: Stop,
    pub(crate) stdout: Captured,
    pub(crate) stderr: Captured,
    pub(crate) control: Vec<u8>,
    pub(crate) duration: Duration,
}

/// Supervise a run until its direct child ends, time runs out or `cancel` fires, draining
/// `stdout`, `stderr` and `control` meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn supervise<C: DirectChild>(
    mut child: C,
    stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
    stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    control: Option<OwnedFd>,
    limits: &Limits,
    cancel: CancellationToken,
    output: Option<UnboundedSender<OutputChunk>>,
    teardown: &dyn Teardown,
    started: Instant,
) -> Result<RawRun, SpawnError> {
    let mut guard = KillOnDrop {
        teardown,
        armed: true,
    };
    let pid = child.pid();
    let budget = limits.max_output_bytes;
    let forward_budget = Arc::new(AtomicUsize::new(
        usize::try_from(budget).unwrap_or(usize::MAX),
    ));

    let forward_budget_spent = Arc::new(AtomicBool::new(false));
    let out_cap = Arc::new(Mutex::new(StreamCapture::new(budget)));
    let err_cap = Arc::new(Mutex::new(StreamCapture::new(budget)));
    let mut readers = tokio::task::JoinSet::new();
    if let Some(stdout) = stdout {
        readers.spawn(drain(
            stdout,
            Stream::Stdout,
            out_cap.clone(),
            output.clone(),
            forward_budget.clone(),
            forward_budget_spent.clone(),
        ));
    }
    if let Some(stderr) = stderr {
        readers.spawn(drain(
            stderr,
            Stream::Stderr,
            err_cap.clone(),
            output.clone(),
            forward_budget.clone(),
            forward_budget_spent.clone(),
        ));
    }
    drop(output);
    let control_buf = Arc::new(Mutex::new(Vec::new()));
    if let Some(fd) = control {
        let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(|source| {
            SpawnError::Descriptor {
                what: "control channel",
                source,
            }
        })?;
        readers.spawn(drain_control(receiver, control_buf.clone()));
    }

    let deadline = tokio::time::Instant::from_std(started) + limits.wall_time;
    let (status, stop) = tokio::select! {
        status = child.wait() => (status, Stop::Exited),
        () = tokio::time::sleep_until(deadline) => (Err(std::io::ErrorKind::TimedOut.into()), Stop::TimedOut),
        () = cancel.cancelled() => (Err(std::io::ErrorKind::Interrupted.into()), Stop::Cancelled),
    };
    // Whatever ended the wait, nothing of the run may outlive it.
    teardown.kill_now();
    let status = match (stop, status) {
        (Stop::Exited, Ok(status)) => status,
        (Stop::Exited, Err(source)) => return Err(SpawnError::Wait { pid, source }),
        _ => {
            child.start_kill();
            child
                .wait()
                .await
                .map_err(|source| SpawnError::Wait { pid, source })?
        }
    };
    let duration = started.elapsed();
    // A second sweep catches what a fork bomb created while the first one ran, and the call
    // goes on only once nothing of the run is left.
    teardown.kill_all_and_wait().await;
    guard.armed = false;

    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    readers.abort_all();

    let (stdout, stderr) = {
        let out = out_cap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let err = err_cap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        finish_pair(&out, &err, budget)
    };
    let control = std::mem::take(
        &mut *control_buf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    Ok(RawRun {
        status,
        stop,
        stdout,
        stderr,
        control,
        duration,
    })
}

async fn drain(
    mut pipe: impl AsyncRead + Unpin,
    stream: Stream,
    capture: Arc<Mutex<StreamCapture>>,
    output: Option<UnboundedSender<OutputChunk>>,
    forward_budget: Arc<AtomicUsize>,
    forward_budget_spent: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut forwarder = Forwarder::default();
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let data = &buf[..n];
        capture
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(data);
        if let Some(tx) = &output {
            let allowed = forward_budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    Some(left.saturating_sub(n))
                })
                .unwrap_or(0)
                .min(n);
            if let Some(text) = forwarder.text(data, allowed) {
                let _ = tx.send(OutputChunk { stream, text });
            }
            if allowed < n && !forward_budget_spent.swap(true, Ordering::Relaxed) {
                let _ = tx.send(OutputChunk {
                    stream,
                    text: BUDGET_SPENT_NOTE.into(),
                });
            }
        }
    }
}

async fn drain_control(mut pipe: tokio::net::unix::pipe::Receiver, keep: Arc<Mutex<Vec<u8>>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut kept = keep
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = CONTROL_MAX_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// How one run ended, from what the supervisor saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ending {
    pub(crate) exit_code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) termination: Termination,
}

/// The outcome of a finished run: what the supervisor captured, classified (see [`classify`]).
pub(crate) fn outcome(
    mut run: RawRun,
    limits: &Limits,
    shell_style_signals: bool,
    memory_hit: bool,
    usage: crate::ResourceUsage,
) -> crate::Outcome {
    let report = EndReport::take(&mut run.control);
    let ending = classify(&run, limits, shell_style_signals, memory_hit, report);
    crate::Outcome {
        exit_code: ending.exit_code,
        signal: ending.signal,
        termination: ending.termination,
        stdout: run.stdout,
        stderr: run.stderr,
        control: run.control,
        duration: run.duration,
        usage,
    }
}

/// Classify a run. `shell_style_signals`: the direct child reports a signal death of the
/// command as exit code `128 + signal` (bwrap does). `memory_hit`: the cgroup counted an OOM.
/// `report`: how the command's reaper said it ended (see [`read_status`]).
pub(crate) fn classify(
    run: &RawRun,
    limits: &Limits,
    shell_style_signals: bool,
    memory_hit: bool,
    report: Option<EndReport>,
) -> Ending {
    let (exit_code, signal) = read_status(run.status, shell_style_signals, report);
    let cpu_hit = limits.cpu_time.is_some_and(|cpu| {
        signal == Some(libc::SIGXCPU) || (signal == Some(libc::SIGKILL) && run.duration >= cpu)
    });
    let termination = match run.stop {
        Stop::TimedOut => Termination::TimedOut,
        Stop::Cancelled => Termination::Cancelled,
        Stop::Exited if memory_hit => Termination::MemoryLimit,
        Stop::Exited if cpu_hit => Termination::CpuLimit,
        Stop::Exited => Termination::Exited,
    };
    Ending {
        exit_code,
        signal,
        termination,
    }
}

/// Aborts a task when dropped: a helper task that must not outlive the call it serves, however
/// the call ends (its future may be dropped).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            wall_time: Duration::from_secs(10),
            cpu_time: Some(Duration::from_secs(2)),
            memory_bytes: None,
            max_processes: None,
            max_output_bytes: 100,
            scratch_bytes: None,
            file_size_bytes: None,
            open_files: None,
            cpu_millicores: None,
        }
    }

    fn run(raw: i32, stop: Stop, secs: u64) -> RawRun {
        RawRun {
            status: ExitStatus::from_raw(raw),
            stop,
            stdout: Captured::default(),
            stderr: Captured::default(),
            control: Vec::new(),
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn classify_table() {
        let l = limits();
        let cases = [
            // (wait status, stop, secs, bwrap-style, memory, expected)
            (
                0,
                Stop::Exited,
                0,
                false,
                false,
                (Some(0), None, Termination::Exited),
            ),
            (
                3 << 8,
                Stop::Exited,
                0,
                false,
                false,
                (Some(3), None, Termination::Exited),
            ),
            (
                libc::SIGXCPU,
                Stop::Exited,
                2,
                false,
                false,
                (None, Some(libc::SIGXCPU), Termination::CpuLimit),
            ),
            (
                (128 + 9) << 8,
                Stop::Exited,
                3,
                true,
                false,
                (None, Some(9), Termination::CpuLimit),
            ),
            (
                (128 + 9) << 8,
                Stop::Exited,
                0,
                true,
                false,
                (None, Some(9), Termination::Exited),
            ),
            (
                (128 + 9) << 8,
                Stop::Exited,
                0,
                true,
                true,
                (None, Some(9), Termination::MemoryLimit),
            ),
            (
                9,
                Stop::TimedOut,
                10,
                true,
                false,
                (None, Some(9), Termination::TimedOut),
            ),
            (
                9,
                Stop::Cancelled,
                1,
                false,
                false,
                (None, Some(9), Termination::Cancelled),
            ),
            (
                (137) << 8,
                Stop::Exited,
                0,
                false,
                false,
                (Some(137), None, Termination::Exited),
            ),
        ];
        for (raw, stop, secs, bwrap, mem, (code, sig, term)) in cases {
            let e = classify(&run(raw, stop, secs), &l, bwrap, mem, None);
            assert_eq!(
                (e.exit_code, e.signal, e.termination),
                (code, sig, term),
                "case {raw} {stop:?}"
            );
        }
    }

    // See: issue 10: `os._exit(137)` and `sys.exit(130)` were reported as deaths by
    // SIGKILL and SIGINT.
    #[test]
    fn an_end_report_tells_exit_codes_from_signals() {
        let l = limits();
        let bwrap_137 = || run((128 + 9) << 8, Stop::Exited, 0);
        let cases = [
            (None, (None, Some(9))),
            (Some(EndReport::Exited(137)), (Some(137), None)),
            (Some(EndReport::Signaled(9)), (None, Some(9))),
            // A report that contradicts what we saw changes nothing.
            (Some(EndReport::Exited(130)), (None, Some(9))),
            (Some(EndReport::Exited(0)), (None, Some(9))),
        ];
        for (report, (code, sig)) in cases {
            let e = classify(&bwrap_137(), &l, true, false, report);
            assert_eq!((e.exit_code, e.signal), (code, sig), "{report:?}");
            assert_eq!(e.termination, Termination::Exited);
        }
        // Limits are the supervisor's and the cgroup's: a report hides none of them.
        let e = classify(&bwrap_137(), &l, true, true, Some(EndReport::Exited(137)));
        assert_eq!(e.termination, Termination::MemoryLimit);
        let e = classify(
            &run(9, Stop::TimedOut, 10),
            &l,
            true,
            false,
            Some(EndReport::Exited(137)),
        );
        assert_eq!(e.termination, Termination::TimedOut);
    }

    #[test]
    fn the_end_report_is_taken_from_the_last_line_only() {
        let mut control = b"\n{\"exit_code\": 0}\n\x1esnakebox-end exited 137\n".to_vec();
        assert_eq!(EndReport::take(&mut control), Some(EndReport::Exited(137)));
        assert_eq!(control, b"\n{\"exit_code\": 0}\n");
        // A report followed by anything else is not the reaper's last word.
        let forged = b"\x1esnakebox-end exited 137\n{\"exit_code\": 0}\n";
        let mut control = forged.to_vec();
        assert_eq!(EndReport::take(&mut control), None);
        assert_eq!(control, forged);
        for bad in [
            &b"\x1esnakebox-end exited 300"[..],
            b"\x1esnakebox-end signaled 0",
            b"\x1esnakebox-end died 9",
            b"snakebox-end exited 1",
            b"",
        ] {
            assert_eq!(EndReport::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            EndReport::parse(b"\x1esnakebox-end signaled 6"),
            Some(EndReport::Signaled(6))
        );
    }
}
