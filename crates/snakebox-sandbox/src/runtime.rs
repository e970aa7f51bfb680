//! Blocking work inside async code without holding up the runtime's other tasks. The engine
//! and the faces use it for work that belongs to one call and must run where it is (shaping a
//! large answer, starting a session's interpreter); the fork server for a child it must fork
//! for a run, which waits for the child's pidfd (issue 32, item 1: one tenant's blocking work
//! on a runtime worker queues every other request on that worker behind it).

/// Do `work` on this thread without holding up the runtime's other tasks: on a
/// multi-threaded runtime the worker hands its queue to another thread while `work` runs
/// (`block_in_place`), so another tenant's request is not queued behind it; elsewhere (a
/// current-thread runtime, no runtime) it just runs. For short, CPU-bound or blocking work
/// that belongs to the call itself and must not wait for a host-work slot: shaping a large
/// answer, starting a session's interpreter, forking a run's sandbox (issue 32, item 1).
pub fn off_the_runtime<R>(work: impl FnOnce() -> R) -> R {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::off_the_runtime;

    /// With one worker, a task spawned before blocking work still runs during it: the
    /// worker's queue went to another thread (without `block_in_place` the flag never flips
    /// while the only worker is blocked).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_off_the_runtime_leaves_the_workers_queue_to_others() {
        // On the one worker (the test's own body runs beside the workers, not on one).
        let on_the_worker = tokio::spawn(async {
            let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let set = Arc::clone(&flag);
            let other = tokio::spawn(async move { set.store(true, Ordering::SeqCst) });
            let saw = off_the_runtime(|| {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
                while !flag.load(Ordering::SeqCst) && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                flag.load(Ordering::SeqCst)
            });
            let _ = other.await;
            saw
        });
        let saw = on_the_worker.await.unwrap();
        assert!(saw, "the other task waited behind the blocking work");
    }

    #[test]
    fn work_off_the_runtime_runs_anywhere() {
        assert_eq!(off_the_runtime(|| 7), 7);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { off_the_runtime(|| 8) }), 8);
    }
}
