//! Byte-compiling new environments after their first run, off the hot path.
//!
//! A server publishes a new environment as soon as it is downloaded and verified against its
//! `RECORD`s, without bytecode (compiling a large package set takes seconds: most of a first
//! run's time). The call that built it queues the environment here when it ends; one
//! background task then compiles a copy of it as package code in a run's sandbox, holding a
//! slot of `--max-concurrent-runs` as every sandbox does, and the cache publishes the checked
//! copy in its place ([`snakebox_env::EnvCache::complete`]). An environment is taken up at most
//! once per server; one published by a server that stopped before compiling it is taken up at
//! its next use.

use std::sync::{Arc, Mutex, PoisonError};

use snakebox_env::{Environment, Interpreter};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::Unavailable;
use crate::lifecycle::Calls;
use crate::pool::Keeper;

/// One environment to compile: its interpreter and key.
type Job = (Interpreter, String);

/// The queue between calls and the background task.
#[derive(Debug)]
pub(crate) struct CompileQueue {
    sender: UnboundedSender<Job>,
    receiver: Mutex<Option<UnboundedReceiver<Job>>>,
}

impl Default for CompileQueue {
    fn default() -> Self {
        let (sender, receiver) = unbounded_channel();
        Self {
            sender,
            receiver: Mutex::new(Some(receiver)),
        }
    }
}

/// Queues its environment for compilation when dropped (at the end of the call that holds it,
/// so that the compilation does not compete with that call's run).
pub(crate) struct CompileAfter {
    sender: UnboundedSender<Job>,
    job: Option<Job>,
}

impl Drop for CompileAfter {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            let _ = self.sender.send(job);
        }
    }
}

/// Compilation as a service: the cache, the queue, a slot for each compilation, and the
/// pool's keeper (fork servers of a compiled copy take over when it is published).
pub(crate) struct Compiler {
    cache: Result<Arc<snakebox_env::EnvCache>, Unavailable>,
    compiles: CompileQueue,
    calls: Arc<Calls>,
    keeper: Arc<Keeper>,
}

impl Compiler {
    pub(crate) fn new(
        cache: Result<Arc<snakebox_env::EnvCache>, Unavailable>,
        calls: Arc<Calls>,
        keeper: Arc<Keeper>,
    ) -> Compiler {
        Compiler {
            cache,
            compiles: CompileQueue::default(),
            calls,
            keeper,
        }
    }

    /// Whether `environment` still needs compiling and is now this call's to queue: the guard
    /// queues it when the call ends. `None` when there is nothing to do (compiled, taken up
    /// already, or no background task: a one-shot command's builds compile before they
    /// publish).
    pub(crate) fn compile_after(&self, environment: &Environment) -> Option<CompileAfter> {
        let cache = self.cache.as_ref().ok()?;
        if environment.compiled || !cache.defers_compilation() {
            return None;
        }
        cache
            .take_for_compilation(environment)
            .then(|| CompileAfter {
                sender: self.compiles.sender.clone(),
                job: Some((environment.interpreter.clone(), environment.key.clone())),
            })
    }

    /// Start the background task (once; `None` without a cache): from now on the cache
    /// publishes new environments before compiling them.
    pub(crate) fn start_compiles(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let cache = self.cache.as_ref().ok()?;
        let jobs = self
            .compiles
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        cache.defer_compilation(true);
        Some(tokio::spawn(Arc::clone(self).run_compiles(jobs)))
    }

    /// The background task: compile each queued environment in turn, each holding a slot of
    /// the concurrency cap. Ends when the engine stops (a compilation cut short leaves the
    /// environment as it was: the next server takes it up again).
    async fn run_compiles(self: Arc<Self>, mut jobs: UnboundedReceiver<Job>) {
        let Ok(cache) = &self.cache else {
            return;
        };
        let stop = self.calls.lifecycle.stop_token();
        loop {
            let job = tokio::select! {
                job = jobs.recv() => job,
                () = stop.cancelled() => None,
            };
            let Some((interpreter, key)) = job else {
                break;
            };
            let work = async {
                let _slot = self.calls.server_slot().await?;
                // The fork servers of the environment are started anew from the checked copy
                // before it is published, and take over at once after (before the compilation
                // counts as completed).
                let published = cache
                    .complete(
                        &interpreter,
                        &key,
                        |copy| self.keeper.fork_servers_of_copy(&key, copy),
                        |fork_servers| self.keeper.adopt_fork_servers(fork_servers),
                    )
                    .await;
                Ok::<_, crate::EngineError>(published)
            };
            let outcome = tokio::select! {
                outcome = work => outcome,
                () = stop.cancelled() => break,
            };
            match outcome {
                Ok(Ok(true)) => tracing::info!(%key, "environment compiled in the background"),
                Ok(Ok(false)) => tracing::debug!(%key, "nothing to compile"),
                Ok(Err(err)) => {
                    tracing::warn!(%key, error = %err, "could not compile an environment; it stays uncompiled")
                }
                Err(err) => {
                    tracing::warn!(%key, error = %err.message, "no slot to compile an environment")
                }
            }
        }
    }
}
