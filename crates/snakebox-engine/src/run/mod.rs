//! One run of user code, whichever path starts it (a one-shot run, cold, pooled or forked; a
//! session's interpreter or command; a validation compile): where its files live on the host
//! ([`layout`]), what its sandbox is ([`spec`]), and how its end is reported ([`outcome`]).
//! The record the runner writes inside the sandbox is read by [`crate::runner`].

mod layout;
mod outcome;
mod spec;

pub(crate) use layout::{
    RunDir, other_live_servers, remove_own_run_dirs, remove_stale_run_dirs, runs_dir,
    server_runs_dir,
};
pub(crate) use outcome::{Ending, Ran, classify, describe};
pub(crate) use spec::{
    EXEC_DENY_NAME, RunNetwork, RunShape, SANDBOX_INPUT_DIR, Sandboxes, View, proxy_args,
    run_environment, sandbox_policy,
};
