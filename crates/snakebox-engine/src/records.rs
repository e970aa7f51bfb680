//! What runs left, as callers read it: the artifact store and the runs table, each read on
//! the bounded host-work threads in the caller's name. A service of its own so that the
//! listing and reading of what a run kept needs only those two stores and the host-work
//! threads, never the rest of the engine.

use std::sync::Arc;

use crate::artifacts::{ArtifactContent, ArtifactFile, ArtifactPrune, ArtifactStore};
use crate::history::{History, RunQuery, RunRecord};
use crate::host_work::HostWork;
use crate::result::Artifact;
use crate::{Caller, EngineError, ErrorKind};

/// The artifacts and the runs table, read for callers.
pub(crate) struct Records {
    artifacts: ArtifactStore,
    history: Arc<History>,
    host: Arc<HostWork>,
}

impl Records {
    pub(crate) fn new(
        artifacts: ArtifactStore,
        history: Arc<History>,
        host: Arc<HostWork>,
    ) -> Records {
        Records {
            artifacts,
            history,
            host,
        }
    }

    /// The content of one of `caller`'s artifacts (`snakebox://artifacts/<execution_id>/<path>`).
    ///
    /// # Errors
    /// An invalid URI (absolute or `..` paths included), an unknown or expired artifact, or
    /// another caller's (not found, as if it did not exist).
    pub(crate) async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        let store = self.artifacts.clone();
        let uri = uri.to_string();
        let caller = caller.clone();
        let who = caller.clone();
        let read = self
            .host
            .run(&who, "read the artifact", move || store.read(&caller, &uri))
            .await?;
        Ok(read?)
    }

    /// One of `caller`'s artifacts opened for a download: `path` of `execution_id` (as an
    /// artifact URI names it, decoded).
    ///
    /// # Errors
    /// As [`Records::read_artifact`].
    pub(crate) async fn open_artifact(
        &self,
        caller: &Caller,
        execution_id: &str,
        path: &str,
    ) -> Result<ArtifactFile, EngineError> {
        let store = self.artifacts.clone();
        let (caller, execution_id, path) =
            (caller.clone(), execution_id.to_owned(), path.to_owned());
        let who = caller.clone();
        let opened = self
            .host
            .run(&who, "open the artifact", move || {
                store.open(&caller, &execution_id, &path)
            })
            .await?;
        Ok(opened?)
    }

    /// `caller`'s artifacts of the most recent runs, newest first.
    pub(crate) async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        let store = self.artifacts.clone();
        let caller = caller.clone();
        let who = caller.clone();
        self.host
            .run(&who, "list the artifacts", move || {
                store.list(&caller, limit)
            })
            .await
            .unwrap_or_default()
    }

    /// `caller`'s runs (one-shot runs, session cells and commands) that `query` selects,
    /// newest first; a run still going has status `running`.
    pub(crate) async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        let caller = caller.clone();
        let history = Arc::clone(&self.history);
        let who = caller.clone();
        self.host
            .run(&who, "list the runs", move || history.list(&caller, &query))
            .await
            .unwrap_or_default()
    }

    /// One of `caller`'s runs by execution id.
    ///
    /// # Errors
    /// `not_found` for an id that is not one of `caller`'s runs (another caller's included,
    /// answered exactly as an id that never existed) or that has been forgotten.
    pub(crate) async fn run_record(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<RunRecord, EngineError> {
        let history = Arc::clone(&self.history);
        let (who, wanted) = (caller.clone(), id.to_owned());
        self.host
            .run(caller, "read the run", move || history.get(&who, &wanted))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| {
                EngineError::new(ErrorKind::NotFound, format!("No run `{id}`")).with_hint(
                    "list the runs to see those that are kept (each tenant's newest, within its budget of runs, for 30 days)",
                )
            })
    }

    /// The result one of `caller`'s finished runs returned (stdout, stderr, result value,
    /// exception, artifacts, network log), as the JSON the tool answered with; `None` while it
    /// runs, for another caller's run (as for an unknown id), for runs recorded before results
    /// were kept, and for a result too large to keep.
    pub(crate) async fn run_output(&self, caller: &Caller, id: &str) -> Option<serde_json::Value> {
        let history = Arc::clone(&self.history);
        let (who, wanted) = (caller.clone(), id.to_owned());
        let json = self
            .host
            .run(caller, "read the run's result", move || {
                history.output(&who, &wanted)
            })
            .await
            .ok()
            .flatten()?;
        serde_json::from_str(&json).ok()
    }

    /// The artifact store (location and retention rule).
    pub(crate) fn artifact_store(&self) -> &ArtifactStore {
        &self.artifacts
    }

    /// Remove artifacts past the store's retention rule (age, then size quota).
    pub(crate) async fn prune_artifacts(&self) -> ArtifactPrune {
        let store = self.artifacts.clone();
        tokio::task::spawn_blocking(move || store.prune(None))
            .await
            .unwrap_or_default()
    }
}
