//! Work the server does on the host for a tenant's call, outside any sandbox: the session file
//! tools (reads, writes, listings that walk a workspace), the size measure of a workspace after
//! a call, reads of the runs table and of artifacts, the start of a session's interpreter
//! (forking its sandbox, stopping another to make room), and the faces' shaping of each
//! answer (`EngineHost::host_work`).
//!
//! Why: each of these takes a thread of the runtime's blocking pool and the host's CPU and
//! disk, which no sandbox slot or cgroup counts. Unbounded, one tenant's hundred `list_files`
//! of a deep tree are a hundred threads walking at once, and another tenant's `read_file`
//! waits for the CPU behind all of them (issue 32, item 1: "file tools that walk trees"). So
//! host work runs on a bounded number of threads handed out by the same fair mechanism as the
//! sandbox slots ([`FairSlots`]): a freed thread goes to the waiting tenant that holds the
//! fewest, and over HTTP one tenant holds at most a quarter of them (half the cores' worth,
//! at least one: once its directories are cached, a walk is CPU-bound in the kernel, and half
//! the threads let one tenant's listings take every core; measured in BENCHMARKS.md). Another
//! tenant's host work then waits at most for one piece of work to end, whatever one tenant
//! queued.
//!
//! The threads are the host work's own, and a sandbox's work (which a CPU cgroup weighs per
//! tenant) goes before them: where the backend has a CPU cgroup for them
//! ([`snakebox_sandbox::HostWorkGroup`], cgroup v1), they join it and all of them together
//! weigh a quarter of one tenant; elsewhere they run at niceness [`HOST_WORK_NICE`], which
//! orders them only against the server's other threads (niceness counts within one
//! scheduling group). So a flood of `list_files` costs another tenant's run less than the
//! flood's threads would take at the server's own priority (BENCHMARKS.md, issue 32).
//!
//! A piece of host work never waits for another (nor for a sandbox slot) while it holds one,
//! so none can wait on itself.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use crate::tenants::FairSlots;
use crate::{Caller, EngineError};

pub use snakebox_sandbox::off_the_runtime;

/// The niceness of the host-work threads (see the module documentation).
pub(crate) const HOST_WORK_NICE: libc::c_int = 5;

/// One piece of host work, as its thread runs it.
type Job = Box<dyn FnOnce() + Send>;

/// The host-work threads and who holds them.
pub(crate) struct HostWork {
    slots: Arc<FairSlots>,
    threads: usize,
    /// To the threads; they end once this is dropped (with the engine).
    jobs: std::sync::mpsc::Sender<Job>,
}

impl HostWork {
    /// Room for `threads` pieces of host work at once, on as many threads of its own, each
    /// in `group` when there is one; `shared`: several tenants use the server (HTTP), so each
    /// may hold at most a quarter of them (at least one).
    pub(crate) fn new(
        threads: usize,
        shared: bool,
        group: Option<snakebox_sandbox::HostWorkGroup>,
    ) -> HostWork {
        let threads = threads.max(2);
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let group = group.map(Arc::new);
        for n in 0..threads {
            let queue = Arc::clone(&queue);
            let group = group.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("snakebox-host-{n}"))
                .spawn(move || {
                    if let Some(group) = group
                        && let Err(err) = group.join_this_thread()
                    {
                        tracing::warn!(%err, "a host-work thread could not join its CPU cgroup");
                    }
                    // SAFETY: setpriority(2) on this thread only; no memory is involved.
                    unsafe {
                        let thread = libc::id_t::try_from(libc::gettid()).unwrap_or(0);
                        libc::setpriority(libc::PRIO_PROCESS, thread, HOST_WORK_NICE);
                    }
                    loop {
                        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(err) = spawned {
                tracing::warn!(%err, "could not start a host-work thread");
            }
        }
        HostWork {
            slots: FairSlots::new(threads, shared.then_some((threads / 4).max(1))),
            threads,
            jobs,
        }
    }

    /// Two per core: host work is file-system work, which waits on the disk part of its time.
    pub(crate) fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
    }

    /// How many pieces of host work may run at once.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Do `work` for `caller` on a blocking thread once one of the host-work slots is theirs
    /// (in the fair order), and give the slot back when it ends. `action` names the work in
    /// the error should it panic.
    ///
    /// # Errors
    /// When the work panicked (an `internal` error naming `action`).
    pub(crate) async fn run<R: Send + 'static>(
        &self,
        caller: &Caller,
        action: &str,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let slot = self.slots.share(caller).slot().await?;
        let (done, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let out = std::panic::catch_unwind(AssertUnwindSafe(work));
            // The slot goes first: once the caller has the answer, the work is over.
            drop(slot);
            let _ = done.send(out);
        });
        let failed = |why: &str| {
            EngineError::internal(
                format!("Failed to {action}: {why}"),
                "check the data directory's disk space and permissions",
            )
        };
        self.jobs
            .send(job)
            .map_err(|_| failed("the host-work threads have stopped"))?;
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(_)) => Err(failed("it panicked")),
            Err(_) => Err(failed("its thread ended")),
        }
    }

    /// One of the host-work slots for `caller`, taken in the fair order, for host work that
    /// must run where it is (it borrows what a host-work thread cannot take along): starting a
    /// session's interpreter, with the stops that make room for it. The work counts against
    /// the tenant's part of the host work as if it ran on a host-work thread, and should run
    /// under [`off_the_runtime`]; the slot is given back when the returned guard is dropped.
    ///
    /// # Errors
    /// As [`FairSlots`] when the slot cannot be had (the server is stopping).
    pub(crate) async fn hold(&self, caller: &Caller) -> Result<crate::tenants::Slot, EngineError> {
        self.slots.share(caller).slot().await
    }

    /// Pieces of host work running now (every tenant's).
    pub(crate) fn busy(&self) -> usize {
        self.slots.busy()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_tenant_holds_at_most_a_quarter_and_another_goes_first() {
        let host = Arc::new(HostWork::new(8, true, None));
        let noisy = Caller::tenant("noisy").unwrap();
        let quiet = Caller::tenant("quiet").unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut flood = Vec::new();
        for _ in 0..10 {
            let (host, noisy, running, most) = (
                Arc::clone(&host),
                noisy.clone(),
                Arc::clone(&running),
                Arc::clone(&most),
            );
            let mut released = released.clone();
            flood.push(tokio::spawn(async move {
                let handle = tokio::runtime::Handle::current();
                host.run(&noisy, "test", move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    handle.block_on(async {
                        while !*released.borrow_and_update() {
                            let _ = released.changed().await;
                        }
                    });
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        // The flood holds its quarter; the quiet tenant's work runs at once, beside it.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(host.busy(), 2);
        let quiet_ran = host.run(&quiet, "test", || 42).await;
        assert_eq!(quiet_ran.ok(), Some(42));
        let _ = release.send(true);
        for work in flood {
            assert!(work.await.is_ok_and(|r| r.is_ok()));
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "the noisy tenant held more than a quarter"
        );
    }

    #[tokio::test]
    async fn host_work_runs_behind_the_server_and_survives_a_panic() {
        let host = HostWork::new(2, false, None);
        let caller = Caller::local();
        // SAFETY: getpriority(2) of the calling thread.
        let nice = host
            .run(&caller, "test", || unsafe {
                libc::getpriority(libc::PRIO_PROCESS, 0)
            })
            .await;
        assert_eq!(nice.ok(), Some(HOST_WORK_NICE));
        let panicked = host.run(&caller, "test", || panic!("a bug")).await;
        assert!(panicked.is_err_and(|err| err.message.contains("panicked")));
        // Both threads (and their slots) are still there.
        for _ in 0..4 {
            assert_eq!(host.run(&caller, "test", || 7).await.ok(), Some(7));
        }
        assert_eq!(host.busy(), 0);
    }
}
