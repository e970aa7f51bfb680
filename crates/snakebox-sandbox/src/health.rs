//! Whether sandboxes can start here lately, for `check_environment`.
//!
//! The backend's probe proves at startup that a sandbox starts; a condition that arrives later
//! (the server's user out of processes or user namespaces) makes runs fail while the report
//! would still say ready. So the [`crate::Sandbox`] notes each run's start: the last failure
//! of a sandbox to start is kept until a sandbox starts again.

use std::sync::Mutex;
use std::time::Instant;

use crate::error::{NamespaceError, SandboxError};

/// The last failure to start a sandbox, cleared when one starts.
#[derive(Debug, Default)]
pub(crate) struct StartHealth {
    failure: Mutex<Option<(Instant, String, Option<String>)>>,
}

impl StartHealth {
    /// Note how a run (or an exchange with a long-lived sandbox) ended: a sandbox that never
    /// started is remembered, any result forgets it.
    pub(crate) fn note(&self, result: Result<(), &SandboxError>) {
        let mut failure = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Err(err @ SandboxError::Namespace(NamespaceError::SetupFailed { .. })) => {
                *failure = Some((Instant::now(), err.to_string(), err.hint()));
            }
            Ok(_) => *failure = None,
            Err(_) => {}
        }
    }

    /// The last failure, if no sandbox started since: (message, hint).
    pub(crate) fn failure(&self) -> Option<(String, Option<String>)> {
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failure.as_ref().map(|(at, message, hint)| {
            (
                format!(
                    "The last sandbox could not start ({} s ago) and none has started since: {message}",
                    at.elapsed().as_secs()
                ),
                hint.clone(),
            )
        })
    }
}
