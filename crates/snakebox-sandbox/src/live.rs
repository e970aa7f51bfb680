//! Long-lived sandboxes: a command started once, under the same policy as a one-shot run,
//! that then answers many requests (a session's interpreter).
//!
//! The sandbox is set up exactly like [`crate::Sandbox::run`] sets up a run (the same bwrap
//! argument list, seccomp programs, staging, cgroup and rlimits; the cgroup's memory and
//! process limits hold for the sandbox's whole life). What differs is the conversation:
//!
//! - requests go to the command's **stdin**, a private pipe from the server (never the MCP
//!   stream); the command should move it away from descriptor 0 so that user code reading
//!   stdin sees end of file instead of the next request;
//! - each answer is one line on the **control channel** (descriptor 3, as for one-shot runs)
//!   that starts with the request's marker; other lines are dropped, so code in the sandbox
//!   that writes to the channel cannot make a later request take an earlier answer;
//! - stdout and stderr are read per request until a **marker** the caller chose for that
//!   request (the command prints it on both streams when the request is done), so the output
//!   of each request is attributed to it and capped with the usual shared budget;
//! - the wall-time limit is per request: when it is reached (or the caller cancels), the whole
//!   tree is killed, like a one-shot run, and the sandbox is dead from then on.
//!
//! [`LiveSandbox`] is the façade the engine holds; behind it is a backend's [`LiveHandle`].
//! Both backends here keep the conversation above over byte streams of ours ([`PipedLive`]):
//! a process backend's child, and the docker backend's one long-lived container, whose stdin
//! is a request FIFO only the server writes, whose output comes from the engine's attach
//! stream, whose control channel is the FIFO of a one-shot container, and which is killed
//! through the engine's API (see `crate::docker::live`). A backend elsewhere (a test's, a
//! remote one) implements [`LiveHandle`] its own way and keeps the same promises.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::backend::SandboxFuture;
use crate::capture::{Forwarder, StreamCapture, finish_pair};
use crate::error::{SandboxError, SpawnError};
use crate::process::Started;
use crate::staging::Staged;
use crate::supervise::{CONTROL_MAX_BYTES, EndReport, Teardown, read_status};
use crate::{Captured, Limits, OutputChunk, Stream};

/// How long the pipes are still read after the tree was killed.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// How long stdout and stderr may lag behind an answer before the exchange ends without their
/// markers (the command may have closed its stdout).
const MARKER_GRACE: Duration = Duration::from_millis(250);

/// How one exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeEnd {
    /// The command answered and is still running, ready for the next request.
    Answered,
    /// The command exited (or crashed) before answering; the sandbox is dead.
    Exited,
    /// The request's wall-time limit was reached; the tree was killed.
    TimedOut,
    /// The caller cancelled; the tree was killed.
    Cancelled,
    /// The sandbox hit its memory limit and the command was killed.
    MemoryLimit,
}

/// What one request/answer exchange with a [`LiveSandbox`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exchange {
    /// How it ended.
    pub end: ExchangeEnd,
    /// Exit code when the command exited normally during this exchange.
    pub exit_code: Option<i32>,
    /// Signal number when it was killed by a signal during this exchange.
    pub signal: Option<i32>,
    /// Standard output of this request (up to its marker).
    pub stdout: Captured,
    /// Standard error of this request (up to its marker).
    pub stderr: Captured,
    /// The answer line from the control channel (without its newline); empty when none came.
    pub answer: Vec<u8>,
    /// Wall-clock duration of the exchange.
    pub duration: Duration,
}

/// A running sandbox that answers requests; see the module documentation. Dropping it kills
/// the whole tree. The owning façade over whatever a backend made ([`LiveHandle`]): what the
/// engine holds, whichever backend started it.
pub struct LiveSandbox {
    handle: Box<dyn LiveHandle>,
    /// Where a sandbox that never started is noted (set by [`crate::Sandbox::spawn`]).
    pub(crate) health: Option<Arc<crate::health::StartHealth>>,
    /// Its mounts and their staging, staged around each request (set by
    /// [`crate::Sandbox::spawn`]).
    pub(crate) staged: Option<crate::staging::Staged>,
}

/// What a backend's long-lived sandbox does (see the module documentation): the seam behind
/// [`LiveSandbox`]. The process backends and docker implement it in this crate; a backend
/// elsewhere implements it and hands its handle to [`LiveSandbox::new`]. Dropping the handle
/// must kill whatever of the sandbox still runs.
pub trait LiveHandle: Send + std::fmt::Debug {
    /// Whether the command is still running (it may have exited between exchanges).
    fn is_alive(&mut self) -> bool;

    /// Attach the sandbox's CPU to `share` while the returned attachment is held (see
    /// [`LiveSandbox::attach_cpu`]). By default inert: no cpu cgroup of ours.
    fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        let _ = share;
        crate::CpuAttachment::none()
    }

    /// Kill the whole tree and wait for it (see [`LiveSandbox::kill`]). Idempotent.
    fn kill(&mut self) -> SandboxFuture<'_, ()>;

    /// One request and its answer (see [`LiveSandbox::exchange`]).
    fn exchange<'a>(
        &'a mut self,
        request: &'a [u8],
        marker: &'a [u8],
        timeout: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Exchange, SandboxError>>;
}

impl std::fmt::Debug for LiveSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.fmt(f)
    }
}

impl LiveSandbox {
    /// The façade over a backend's live sandbox.
    #[must_use]
    pub fn new(handle: Box<dyn LiveHandle>) -> LiveSandbox {
        LiveSandbox {
            handle,
            health: None,
            staged: None,
        }
    }

    /// Whether the command is still running (it may have exited between exchanges).
    pub fn is_alive(&mut self) -> bool {
        self.handle.is_alive()
    }

    /// Attach its cgroup to `share` (see [`crate::CpuShare`]) while the returned attachment is
    /// held: for one request, so that a sandbox between requests does not weigh on its
    /// holder's share. Once it is dropped the sandbox waits at the background weight (what it
    /// keeps running between requests may wait for all other work). Inert where there is no
    /// cpu cgroup of ours (a container, no cgroups).
    pub fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        self.handle.attach_cpu(share)
    }

    /// Kill the whole tree and wait for the direct child. Idempotent.
    pub async fn kill(&mut self) {
        self.handle.kill().await;
    }

    /// Send `request` to the command's stdin and collect its answer: one line on the control
    /// channel, plus stdout and stderr up to `marker` on each. Within `timeout` (then the tree
    /// is killed), and until `cancel` fires (likewise). `output` receives the request's output
    /// while it is produced (capped like the captured text).
    ///
    /// What the engine wrote into the sandbox's mounts is staged in first, and what the
    /// sandbox wrote staged out after (see [`crate::Staging`]).
    ///
    /// # Errors
    /// When waiting for the process fails, the sandbox's own setup failed (it never ran the
    /// command), or its files cannot be staged. A dead sandbox is not an error: the exchange
    /// ends at once with [`ExchangeEnd::Exited`].
    pub async fn exchange(
        &mut self,
        request: &[u8],
        marker: &[u8],
        timeout: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Exchange, SandboxError> {
        if let Some(staged) = &self.staged {
            staged.stage_in()?;
        }
        let result = self
            .handle
            .exchange(request, marker, timeout, cancel, output)
            .await;
        if let Some(health) = &self.health {
            health.note(result.as_ref().map(|_| ()));
        }
        let staged_out = self.staged.as_ref().map_or(Ok(()), Staged::stage_out);
        let exchange = result?;
        staged_out?;
        Ok(exchange)
    }
}

/// A live sandbox whose conversation goes over byte streams of ours: requests on a writer,
/// output on two readers, answers on a pipe, and a [`LiveChild`] whose end is the sandbox's.
/// What both a local process and a container of the docker backend are.
pub(crate) struct PipedLive {
    child: Box<dyn LiveChild>,
    teardown: Arc<dyn Teardown>,
    requests: Option<Writer>,
    stdout: Option<Reader>,
    stderr: Option<Reader>,
    control: Option<tokio::net::unix::pipe::Receiver>,
    /// Bytes read past the end of the previous exchange (stdout, stderr, control).
    carry: [Vec<u8>; 3],
    info_task: Option<tokio::task::JoinHandle<()>>,
    shell_style_signals: bool,
    max_output_bytes: u64,
    dead: bool,
}

/// Where a live sandbox's requests go.
pub(crate) type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
/// One of a live sandbox's output streams.
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// The command of a [`PipedLive`]: a process of ours (`tokio::process::Child`), or a container
/// of an engine (the docker backend's).
pub(crate) trait LiveChild: Send {
    /// Its pid, for errors (none for a container).
    fn id(&self) -> Option<u32> {
        None
    }
    /// Its exit status, if it has ended.
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>>;
    /// Start killing it (without waiting).
    fn start_kill(&mut self) -> std::io::Result<()>;
    /// Wait for its end (cancel-safe).
    fn wait(&mut self) -> SandboxFuture<'_, std::io::Result<ExitStatus>>;
}

impl LiveChild for tokio::process::Child {
    fn id(&self) -> Option<u32> {
        tokio::process::Child::id(self)
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        tokio::process::Child::try_wait(self)
    }

    fn start_kill(&mut self) -> std::io::Result<()> {
        tokio::process::Child::start_kill(self)
    }

    fn wait(&mut self) -> SandboxFuture<'_, std::io::Result<ExitStatus>> {
        Box::pin(tokio::process::Child::wait(self))
    }
}

/// What a [`PipedLive`] is made of.
pub(crate) struct PipedParts {
    pub(crate) child: Box<dyn LiveChild>,
    pub(crate) teardown: Arc<dyn Teardown>,
    pub(crate) requests: Option<Writer>,
    pub(crate) stdout: Option<Reader>,
    pub(crate) stderr: Option<Reader>,
    pub(crate) control: Option<OwnedFd>,
    pub(crate) info_task: Option<tokio::task::JoinHandle<()>>,
    /// The direct child reports a signal death of the command as exit code `128 + signal`.
    pub(crate) shell_style_signals: bool,
}

impl std::fmt::Debug for PipedLive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSandbox")
            .field("pid", &self.child.id())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl PipedLive {
    /// A live sandbox of `parts`, whose output per request is capped as `limits` say.
    pub(crate) fn new(parts: PipedParts, limits: &Limits) -> Result<PipedLive, SandboxError> {
        let control = match parts.control {
            Some(fd) => Some(tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(
                |source| SpawnError::Descriptor {
                    what: "control channel",
                    source,
                },
            )?),
            None => None,
        };
        Ok(PipedLive {
            child: parts.child,
            teardown: parts.teardown,
            requests: parts.requests,
            stdout: parts.stdout,
            stderr: parts.stderr,
            control,
            carry: Default::default(),
            info_task: parts.info_task,
            shell_style_signals: parts.shell_style_signals,
            max_output_bytes: limits.max_output_bytes,
            dead: false,
        })
    }

    /// A freshly started local process (see [`crate::process::Started::into_live`]).
    pub(crate) fn process(started: Started, limits: &Limits) -> Result<PipedLive, SandboxError> {
        let mut child = started.child;
        PipedLive::new(
            PipedParts {
                requests: child.stdin.take().map(|w| Box::new(w) as Writer),
                stdout: child.stdout.take().map(|r| Box::new(r) as Reader),
                stderr: child.stderr.take().map(|r| Box::new(r) as Reader),
                child: Box::new(child),
                teardown: started.teardown,
                control: started.control_read,
                info_task: started.info_task,
                shell_style_signals: started.shell_style_signals,
            },
            limits,
        )
    }
}

impl LiveHandle for PipedLive {
    fn is_alive(&mut self) -> bool {
        if self.dead {
            return false;
        }
        if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
            self.teardown.kill_all();
            self.teardown.release();
            self.dead = true;
        }
        !self.dead
    }

    fn attach_cpu(&self, share: &crate::CpuShare) -> crate::CpuAttachment {
        crate::supervise::attach_cpu(
            self.teardown.as_ref(),
            share,
            Some(crate::CpuWeight::BACKGROUND),
        )
    }

    fn kill(&mut self) -> SandboxFuture<'_, ()> {
        Box::pin(async move {
            self.teardown.kill_all();
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
            self.teardown.kill_all();
            self.teardown.release();
            if let Some(task) = self.info_task.take() {
                task.abort();
            }
            self.dead = true;
        })
    }

    fn exchange<'a>(
        &'a mut self,
        request: &'a [u8],
        marker: &'a [u8],
        timeout: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Exchange, SandboxError>> {
        Box::pin(self.exchange_piped(request, marker, timeout, cancel, output))
    }
}

impl PipedLive {
    async fn exchange_piped(
        &mut self,
        request: &[u8],
        marker: &[u8],
        timeout: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Exchange, SandboxError> {
        let started = Instant::now();
        let budget = self.max_output_bytes;
        let mut captures = [StreamCapture::new(budget), StreamCapture::new(budget)];
        let mut forwarders = [Forwarder::default(), Forwarder::default()];
        let mut forward_left = usize::try_from(budget).unwrap_or(usize::MAX);
        let mut told_spent = false;
        let mut scanners = [Until::new(marker), Until::new(marker)];
        let mut answer = Line::expecting(marker);
        let mut keep = |index: usize, data: &[u8], captures: &mut [StreamCapture; 2]| {
            if data.is_empty() {
                return;
            }
            captures[index].push(data);
            if let Some(tx) = &output {
                let allowed = forward_left.min(data.len());
                forward_left -= allowed;
                let stream = if index == 0 {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                };
                if let Some(text) = forwarders[index].text(data, allowed) {
                    let _ = tx.send(OutputChunk { stream, text });
                }
                if allowed < data.len() && !told_spent {
                    told_spent = true;
                    let _ = tx.send(OutputChunk {
                        stream,
                        text: crate::supervise::BUDGET_SPENT_NOTE.into(),
                    });
                }
            }
        };

        if self.dead {
            return Ok(Exchange {
                end: ExchangeEnd::Exited,
                exit_code: None,
                signal: None,
                stdout: Captured::default(),
                stderr: Captured::default(),
                answer: Vec::new(),
                duration: started.elapsed(),
            });
        }

        // Whatever the previous exchange read past its end comes first.
        for (index, scanner) in scanners.iter_mut().enumerate() {
            let carried = std::mem::take(&mut self.carry[index]);
            let emitted = scanner.feed(&carried);
            keep(index, &emitted, &mut captures);
            if let Some(rest) = scanner.rest.take() {
                self.carry[index] = rest;
            }
        }
        let carried = std::mem::take(&mut self.carry[2]);
        // The channel's last bytes: after a death, its last line may be the reaper's report.
        let mut control_tail = Tail::default();
        control_tail.push(&carried);
        if let Some(rest) = answer.feed(&carried) {
            self.carry[2] = rest;
        }

        let deadline = tokio::time::Instant::now() + timeout;
        let mut ended: Option<ExchangeEnd> = None;
        let mut status: Option<ExitStatus> = None;
        let mut grace: Option<tokio::time::Instant> = None;

        // 1. The request. A child that died makes the write fail; the loop below sees it exit.
        if let Some(stdin) = self.requests.as_mut() {
            tokio::select! {
                result = async {
                    stdin.write_all(request).await?;
                    stdin.flush().await
                } => {
                    if let Err(err) = result {
                        tracing::debug!(%err, "could not write a request to a live sandbox");
                    }
                }
                () = tokio::time::sleep_until(deadline) => ended = Some(ExchangeEnd::TimedOut),
                () = cancel.cancelled() => ended = Some(ExchangeEnd::Cancelled),
            }
            if ended.is_some() {
                self.teardown.kill_all();
                grace = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            }
        }

        // 2. The answer and the request's output.
        // Small at first (most requests print little and answer in one short line), grown
        // to the full size once a read fills one: a request does not zero and fault in
        // 192 KiB it will not use.
        let mut bufs = [vec![0u8; FIRST_READ], vec![0u8; FIRST_READ]];
        let mut control_buf = vec![0u8; FIRST_READ];
        let mut open = [
            self.stdout.is_some(),
            self.stderr.is_some(),
            self.control.is_some(),
        ];
        loop {
            // While alive, a stream is read until its marker; after a death, until EOF.
            let want = |i: usize, open: &[bool; 3], ended: Option<ExchangeEnd>| {
                open[i] && (ended.is_some() || !scanners[i].found)
            };
            let want_out = want(0, &open, ended);
            let want_err = want(1, &open, ended);
            let want_control = open[2] && (ended.is_some() || !answer.done);
            if ended.is_none() && answer.done && !want_out && !want_err {
                ended = Some(ExchangeEnd::Answered);
                break;
            }
            if ended.is_some() && !want_out && !want_err && !want_control {
                break;
            }
            if ended.is_none() && answer.done && grace.is_none() {
                grace = Some(tokio::time::Instant::now() + MARKER_GRACE);
            }
            let [out_buf, err_buf] = &mut bufs;
            tokio::select! {
                read = read_some(self.stdout.as_mut(), out_buf), if want_out => {
                    match read {
                        Ok(0) | Err(_) => open[0] = false,
                        Ok(n) => {
                            let emitted = scanners[0].feed(&out_buf[..n]);
                            keep(0, &emitted, &mut captures);
                            grow_if_filled(out_buf, n);
                        }
                    }
                }
                read = read_some(self.stderr.as_mut(), err_buf), if want_err => {
                    match read {
                        Ok(0) | Err(_) => open[1] = false,
                        Ok(n) => {
                            let emitted = scanners[1].feed(&err_buf[..n]);
                            keep(1, &emitted, &mut captures);
                            grow_if_filled(err_buf, n);
                        }
                    }
                }
                read = read_some(self.control.as_mut(), &mut control_buf), if want_control => {
                    match read {
                        Ok(0) | Err(_) => open[2] = false,
                        Ok(n) => {
                            control_tail.push(&control_buf[..n]);
                            if let Some(rest) = answer.feed(&control_buf[..n]) {
                                self.carry[2] = rest;
                            }
                            grow_if_filled(&mut control_buf, n);
                        }
                    }
                }
                waited = self.child.wait(), if ended.is_none() => {
                    status = waited.ok();
                    ended = Some(ExchangeEnd::Exited);
                    self.teardown.kill_all();
                    grace = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                () = tokio::time::sleep_until(deadline), if ended.is_none() => {
                    ended = Some(ExchangeEnd::TimedOut);
                    self.teardown.kill_all();
                    grace = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                () = cancel.cancelled(), if ended.is_none() => {
                    ended = Some(ExchangeEnd::Cancelled);
                    self.teardown.kill_all();
                    grace = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                () = sleep_until_opt(grace) => {
                    if ended.is_none() {
                        ended = Some(ExchangeEnd::Answered);
                    }
                    break;
                }
            }
        }
        for (index, scanner) in scanners.iter_mut().enumerate() {
            if ended != Some(ExchangeEnd::Answered) || !scanner.found {
                // No marker will come: what is held back is output too.
                let tail = std::mem::take(&mut scanner.pending);
                keep(index, &tail, &mut captures);
            } else if let Some(rest) = scanner.rest.take() {
                self.carry[index].extend_from_slice(&rest);
            }
        }

        let mut end = ended.unwrap_or(ExchangeEnd::Exited);
        let (mut exit_code, mut signal) = (None, None);
        let mut never_ran = false;
        if end != ExchangeEnd::Answered {
            // Nothing of the sandbox may outlive a failed exchange.
            self.teardown.kill_all();
            let status = match status {
                Some(status) => status,
                None => {
                    let _ = self.child.start_kill();
                    let pid = self.child.id().unwrap_or(0);
                    self.child
                        .wait()
                        .await
                        .map_err(|source| SpawnError::Wait { pid, source })?
                }
            };
            self.teardown.kill_all();
            let report = EndReport::take(&mut control_tail.0);
            (exit_code, signal) = read_status(status, self.shell_style_signals, report);
            if end == ExchangeEnd::Exited {
                crate::supervise::finish_status_task(self.info_task.take()).await;
                never_ran = status.code() == Some(1) && self.teardown.setup_failed();
            }
            if end == ExchangeEnd::Exited && self.teardown.memory_exceeded() {
                end = ExchangeEnd::MemoryLimit;
            }
            self.teardown.release();
            if let Some(task) = self.info_task.take() {
                task.abort();
            }
            self.requests = None;
            self.dead = true;
        }
        let (stdout, stderr) = finish_pair(&captures[0], &captures[1], budget);
        if never_ran {
            // The sandbox's own setup failed (see `supervise::setup_failure`).
            let err: SandboxError = crate::error::NamespaceError::SetupFailed {
                stderr: stderr.text.trim().to_string(),
            }
            .into();
            return Err(err);
        }
        Ok(Exchange {
            end,
            exit_code,
            signal,
            stdout,
            stderr,
            answer: if answer.done { answer.line } else { Vec::new() },
            duration: started.elapsed(),
        })
    }
}

impl Drop for PipedLive {
    fn drop(&mut self) {
        if !self.dead {
            self.teardown.kill_all();
            let _ = self.child.start_kill();
        }
        self.teardown.release();
        if let Some(task) = self.info_task.take() {
            task.abort();
        }
    }
}

/// The read buffers' size at the start of an exchange, and once grown.
const FIRST_READ: usize = 4 * 1024;
const FULL_READ: usize = 64 * 1024;

/// Grow a read buffer that the last read filled (more is coming, in larger pieces).
fn grow_if_filled(buf: &mut Vec<u8>, read: usize) {
    if read == buf.len() && buf.len() < FULL_READ {
        buf.resize(FULL_READ, 0);
    }
}

async fn read_some<R: AsyncRead + Unpin>(
    reader: Option<&mut R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match reader {
        Some(reader) => reader.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Splits a stream at a marker: bytes before it are output, bytes after it belong to whatever
/// comes next. Holds back the last `marker.len() - 1` bytes, which may be the marker's start.
#[derive(Debug)]
struct Until {
    marker: Vec<u8>,
    pending: Vec<u8>,
    found: bool,
    /// Bytes after the marker, once found.
    rest: Option<Vec<u8>>,
}

impl Until {
    fn new(marker: &[u8]) -> Self {
        Until {
            marker: marker.to_vec(),
            pending: Vec::new(),
            found: marker.is_empty(),
            rest: None,
        }
    }

    /// Feed bytes; returns those that are certainly output.
    fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        if self.found {
            self.rest
                .get_or_insert_with(Vec::new)
                .extend_from_slice(data);
            return Vec::new();
        }
        self.pending.extend_from_slice(data);
        let m = self.marker.len();
        if let Some(at) = self
            .pending
            .windows(m)
            .position(|window| window == self.marker.as_slice())
        {
            self.found = true;
            self.rest = Some(self.pending[at + m..].to_vec());
            self.pending.truncate(at);
            return std::mem::take(&mut self.pending);
        }
        let hold = (m - 1).min(self.pending.len());
        let tail = self.pending.split_off(self.pending.len() - hold);
        std::mem::replace(&mut self.pending, tail)
    }
}

/// The last bytes read from a channel (enough for its last short line).
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

impl Tail {
    const KEEP: usize = 256;

    fn push(&mut self, data: &[u8]) {
        self.0
            .extend_from_slice(&data[data.len().saturating_sub(Self::KEEP)..]);
        let excess = self.0.len().saturating_sub(Self::KEEP);
        self.0.drain(..excess);
    }
}

/// One answer line from the control channel (capped at [`CONTROL_MAX_BYTES`]).
#[derive(Debug, Default)]
struct Line {
    line: Vec<u8>,
    done: bool,
    /// The request's marker: only a line that starts with it is this request's answer (the
    /// marker is removed from the answer).
    want: Vec<u8>,
}

impl Line {
    /// The answer line of the request whose marker is `marker`. Lines without it are dropped:
    /// the command's code shares the process with the responder and can write to the channel
    /// too, so a line it wrote (or a real answer left over from an earlier request) must not
    /// be taken as this request's answer, nor shift every later answer by one.
    fn expecting(marker: &[u8]) -> Line {
        Line {
            want: marker.to_vec(),
            ..Line::default()
        }
    }

    /// Feed bytes; returns the bytes after the answer line's end, once it ended.
    fn feed(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if self.done {
            return Some(data.to_vec());
        }
        let mut data = data;
        loop {
            let Some(at) = data.iter().position(|&b| b == b'\n') else {
                self.append(data);
                return None;
            };
            self.append(&data[..at]);
            let rest = &data[at + 1..];
            if self.line.starts_with(&self.want) {
                self.line.drain(..self.want.len());
                self.done = true;
                return Some(rest.to_vec());
            }
            self.line.clear();
            data = rest;
        }
    }

    fn append(&mut self, part: &[u8]) {
        let room = CONTROL_MAX_BYTES.saturating_sub(self.line.len());
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(data: &[u8], marker: &[u8], chunk: usize) -> (Vec<u8>, bool, Vec<u8>) {
        let mut until = Until::new(marker);
        let mut out = Vec::new();
        for part in data.chunks(chunk.max(1)) {
            out.extend(until.feed(part));
        }
        let found = until.found;
        if !found {
            out.extend(std::mem::take(&mut until.pending));
        }
        (out, found, until.rest.unwrap_or_default())
    }

    #[test]
    fn marker_is_found_across_chunk_boundaries() {
        let data = b"hello\nworld\x1eEND-42\x1eafter";
        for chunk in 1..data.len() + 1 {
            let (out, found, rest) = split(data, b"\x1eEND-42\x1e", chunk);
            assert_eq!(out, b"hello\nworld", "chunk {chunk}");
            assert!(found);
            assert_eq!(rest, b"after", "chunk {chunk}");
        }
    }

    #[test]
    fn without_marker_everything_is_output() {
        let (out, found, _) = split(b"no marker here \x1eEND", b"\x1eEND-42\x1e", 4);
        assert!(!found);
        assert_eq!(out, b"no marker here \x1eEND");
    }

    #[test]
    fn answer_lines_without_the_marker_are_dropped() {
        let mut line = Line::expecting(b"<<7>>");
        // A forged line and a stale answer come first; then this request's answer.
        assert_eq!(line.feed(b"{\"forged\":1}\n<<6>>{\"n\":6}\n<<7"), None);
        assert_eq!(line.feed(b">>{\"n\":7}\nnext"), Some(b"next".to_vec()));
        assert_eq!(line.line, b"{\"n\":7}");
    }

    #[test]
    fn answer_line_keeps_what_follows() {
        let mut line = Line::default();
        assert_eq!(line.feed(b"{\"a\":"), None);
        assert_eq!(line.feed(b"1}\n{\"b\""), Some(b"{\"b\"".to_vec()));
        assert!(line.done);
        assert_eq!(line.line, b"{\"a\":1}");
    }
}
