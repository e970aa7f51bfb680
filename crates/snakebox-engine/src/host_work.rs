//! Work the server does on the host for a tenant's call, outside any sandbox: the session file
//! tools (reads, writes, listings that walk a workspace), the size measure of a workspace after
//! a call, reads of the runs table and of artifacts.
//!
//! Why: each of these takes a thread of the runtime's blocking pool and the host's CPU and
//! disk, which no sandbox slot or cgroup counts. Unbounded, one tenant's hundred `list_files`
//! of a deep tree are a hundred threads walking at once, and another tenant's `read_file`
//! waits for the CPU behind all of them (issue 32, item 1: "file tools that walk trees"). So
//! host work runs on a bounded number of threads handed out by the same fair mechanism as the
//! sandbox slots ([`FairSlots`]): a freed thread goes to the waiting tenant that holds the
//! fewest, and over HTTP one tenant holds at most half of them. Another tenant's host work
//! then waits at most for one piece of work to end, whatever one tenant queued.
//!
//! A piece of host work never waits for another (nor for a sandbox slot) while it holds one,
//! so none can wait on itself.

use std::sync::Arc;

use crate::tenants::FairSlots;
use crate::{Caller, EngineError};

/// The host-work threads and who holds them.
pub(crate) struct HostWork {
    slots: Arc<FairSlots>,
    threads: usize,
}

impl HostWork {
    /// Room for `threads` pieces of host work at once; `shared`: several tenants use the
    /// server (HTTP), so each may hold at most half of them.
    pub(crate) fn new(threads: usize, shared: bool) -> HostWork {
        let threads = threads.max(2);
        HostWork {
            slots: FairSlots::new(threads, shared.then_some(threads / 2)),
            threads,
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
        let done = tokio::task::spawn_blocking(move || {
            let out = work();
            drop(slot);
            out
        })
        .await;
        done.map_err(|err| {
            EngineError::internal(
                format!("Failed to {action}: {err}"),
                "check the data directory's disk space and permissions",
            )
        })
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
    async fn one_tenant_holds_at_most_half_and_another_goes_first() {
        let host = Arc::new(HostWork::new(4, true));
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
                host.run(&noisy, "test", move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let handle = tokio::runtime::Handle::current();
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
        // The flood holds its half; the quiet tenant's work runs at once, beside it.
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
            "the noisy tenant held more than half"
        );
    }
}
