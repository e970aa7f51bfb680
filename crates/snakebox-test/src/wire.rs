//! A loopback wire: an [`EngineApi`] that sends every request to JSON and back before the
//! engine sees it, and every result, error and output chunk to JSON and back before the face
//! sees it. A face built over it ([`crate::TestEngine::over_the_wire`]) works only if every
//! type crossing the API survives a wire whole, which is what a remote engine (a
//! `snakebox agent`, issue 35) needs of it.
//!
//! What it simulates, and what not: the bytes of a real connection are JSON here too, but
//! nothing is framed, sent or authenticated. The caller travels as a real wire carries it, as
//! the connection's identity rather than a field of the request: re-made from its name on the
//! far side. Cancellation passes as the token itself (on a wire: the connection closing).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;
use snakebox_engine::{
    Artifact, ArtifactContent, ArtifactDownload, Caller, CreateSession, EngineApi, EngineError,
    EnvironmentReport, ExecuteRequest, ExecutionResult, FileContent, FileList, FileWritten,
    InstallPackages, InstallStatus, ListFiles, LiveOutput, OpenArtifact, OutputChunk, OutputSink,
    PackageList, ReadFile, RunCommand, RunQuery, RunRecord, SessionInfo, SessionList,
    ToolCallAudit, ValidateScript, Validation, WireExecution, WriteFile,
};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::unbounded_channel;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// An engine behind a loopback wire (see the module documentation).
pub struct Loopback {
    engine: Arc<dyn EngineApi>,
    crossings: AtomicUsize,
}

impl Loopback {
    /// `engine` behind the wire.
    #[must_use]
    pub fn new(engine: Arc<dyn EngineApi>) -> Loopback {
        Loopback {
            engine,
            crossings: AtomicUsize::new(0),
        }
    }

    /// How many values have crossed so far (requests, results, chunks): a test's proof that
    /// its calls went through the wire.
    #[must_use]
    pub fn crossings(&self) -> usize {
        self.crossings.load(Ordering::SeqCst)
    }

    /// `value` as JSON and back, as the far side reads it.
    ///
    /// # Panics
    /// When it does not survive: the failure this wire exists to catch.
    fn across<T: Serialize + DeserializeOwned>(&self, value: &T) -> T {
        self.crossings.fetch_add(1, Ordering::SeqCst);
        let json = serde_json::to_string(value).unwrap_or_else(|err| {
            panic!("{} does not serialise: {err}", std::any::type_name::<T>())
        });
        serde_json::from_str(&json).unwrap_or_else(|err| {
            panic!(
                "{} does not come back from its JSON: {err}: {json}",
                std::any::type_name::<T>()
            )
        })
    }

    /// The caller as the far side knows it: from the connection's identity (its name).
    fn identity(caller: &Caller) -> Caller {
        Caller::tenant(caller.id()).expect("a caller's name is a valid tenant name")
    }

    /// A sink for the far side whose chunks cross to `near` one by one; the task ends when
    /// the far side drops its sink.
    fn stream(
        self: &Arc<Self>,
        near: Option<OutputSink>,
    ) -> (Option<OutputSink>, Option<JoinHandle<()>>) {
        let Some(near) = near else {
            return (None, None);
        };
        let (far, mut chunks) = unbounded_channel::<OutputChunk>();
        let wire = Arc::clone(self);
        let task = tokio::spawn(async move {
            while let Some(chunk) = chunks.recv().await {
                let _ = near.send(wire.across(&chunk));
            }
        });
        (Some(far), Some(task))
    }

    /// A run's record across, whole (its wire form), after every chunk it streamed.
    async fn run_across(
        &self,
        result: ExecutionResult,
        streaming: Option<JoinHandle<()>>,
    ) -> ExecutionResult {
        if let Some(streaming) = streaming {
            let _ = streaming.await;
        }
        self.across(&WireExecution::from(result)).into()
    }
}

/// The loopback as the faces hold it (`Arc<dyn EngineApi>`): a shared [`Loopback`].
#[derive(Clone)]
pub struct Wire(pub Arc<Loopback>);

#[async_trait::async_trait]
impl EngineApi for Wire {
    async fn execute(
        &self,
        caller: &Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        let wire = &self.0;
        let request = wire.across(&request);
        let (far, streaming) = wire.stream(output);
        let result = wire
            .engine
            .execute(&Loopback::identity(caller), request, cancel, far)
            .await;
        wire.run_across(result, streaming).await
    }

    async fn run_command(
        &self,
        caller: &Caller,
        request: RunCommand,
        cancel: CancellationToken,
        output: Option<OutputSink>,
    ) -> ExecutionResult {
        let wire = &self.0;
        let request = wire.across(&request);
        let (far, streaming) = wire.stream(output);
        let result = wire
            .engine
            .run_command(&Loopback::identity(caller), request, cancel, far)
            .await;
        wire.run_across(result, streaming).await
    }

    async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let answer = wire
            .engine
            .create_session(&Loopback::identity(caller), request)
            .await;
        wire.across(&answer)
    }

    async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        let wire = &self.0;
        let answer = wire.engine.list_sessions(&Loopback::identity(caller)).await;
        wire.across(&answer)
    }

    async fn delete_session(&self, caller: &Caller, session_id: &str) -> Result<(), EngineError> {
        let wire = &self.0;
        let id: String = wire.across(&session_id.to_owned());
        let answer = wire
            .engine
            .delete_session(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn reset_session(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<SessionInfo, EngineError> {
        let wire = &self.0;
        let id: String = wire.across(&session_id.to_owned());
        let answer = wire
            .engine
            .reset_session(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn install_packages(
        &self,
        caller: &Caller,
        request: InstallPackages,
        progress: Option<OutputSink>,
    ) -> Result<InstallStatus, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        // An install may go on after its answer: its progress streams on; not waited for.
        let (far, _streaming) = wire.stream(progress);
        let answer = wire
            .engine
            .install_packages(&Loopback::identity(caller), request, far)
            .await;
        wire.across(&answer)
    }

    async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        let wire = &self.0;
        let id: String = wire.across(&session_id.to_owned());
        let answer = wire
            .engine
            .list_packages(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn write_file(
        &self,
        caller: &Caller,
        request: WriteFile,
    ) -> Result<FileWritten, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let answer = wire
            .engine
            .write_file(&Loopback::identity(caller), request)
            .await;
        wire.across(&answer)
    }

    async fn read_file(
        &self,
        caller: &Caller,
        request: ReadFile,
    ) -> Result<FileContent, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let answer = wire
            .engine
            .read_file(&Loopback::identity(caller), request)
            .await;
        wire.across(&answer)
    }

    async fn list_files(
        &self,
        caller: &Caller,
        request: ListFiles,
    ) -> Result<FileList, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let answer = wire
            .engine
            .list_files(&Loopback::identity(caller), request)
            .await;
        wire.across(&answer)
    }

    async fn validate(
        &self,
        caller: &Caller,
        request: ValidateScript,
    ) -> Result<Validation, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let answer = wire
            .engine
            .validate(&Loopback::identity(caller), request)
            .await;
        wire.across(&answer)
    }

    async fn report_for(&self, caller: &Caller) -> EnvironmentReport {
        let wire = &self.0;
        let answer = wire.engine.report_for(&Loopback::identity(caller)).await;
        wire.across(&answer)
    }

    async fn list_runs(&self, caller: &Caller, query: RunQuery) -> Vec<RunRecord> {
        let wire = &self.0;
        let query = wire.across(&query);
        let answer = wire
            .engine
            .list_runs(&Loopback::identity(caller), query)
            .await;
        wire.across(&answer)
    }

    async fn run_record(
        &self,
        caller: &Caller,
        execution_id: &str,
    ) -> Result<RunRecord, EngineError> {
        let wire = &self.0;
        let id: String = wire.across(&execution_id.to_owned());
        let answer = wire
            .engine
            .run_record(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn run_output(&self, caller: &Caller, execution_id: &str) -> Option<serde_json::Value> {
        let wire = &self.0;
        let id: String = wire.across(&execution_id.to_owned());
        let answer = wire
            .engine
            .run_output(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn live_output(&self, caller: &Caller, execution_id: &str) -> Option<LiveOutput> {
        let wire = &self.0;
        let id: String = wire.across(&execution_id.to_owned());
        let answer = wire
            .engine
            .live_output(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn cancel_run(&self, caller: &Caller, execution_id: &str) -> Result<(), EngineError> {
        let wire = &self.0;
        let id: String = wire.across(&execution_id.to_owned());
        let answer = wire
            .engine
            .cancel_run(&Loopback::identity(caller), &id)
            .await;
        wire.across(&answer)
    }

    async fn list_artifacts(&self, caller: &Caller, limit: usize) -> Vec<Artifact> {
        let wire = &self.0;
        let limit: usize = wire.across(&limit);
        let answer = wire
            .engine
            .list_artifacts(&Loopback::identity(caller), limit)
            .await;
        wire.across(&answer)
    }

    async fn read_artifact(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ArtifactContent, EngineError> {
        let wire = &self.0;
        let uri: String = wire.across(&uri.to_owned());
        let answer = wire
            .engine
            .read_artifact(&Loopback::identity(caller), &uri)
            .await;
        wire.across(&answer)
    }

    async fn open_artifact(
        &self,
        caller: &Caller,
        request: OpenArtifact,
    ) -> Result<ArtifactDownload, EngineError> {
        let wire = &self.0;
        let request = wire.across(&request);
        let opened = wire
            .engine
            .open_artifact(&Loopback::identity(caller), request)
            .await;
        let mut opened = match opened {
            Ok(opened) => opened,
            Err(error) => return Err(wire.across(&error)),
        };
        // The head as a response's headers, the bytes as its body.
        let head = wire.across(&opened.head);
        let mut bytes = Vec::new();
        opened
            .body
            .read_to_end(&mut bytes)
            .await
            .map_err(|err| EngineError::internal(format!("the body broke: {err}"), "retry"))?;
        Ok(ArtifactDownload {
            head,
            body: Box::pin(std::io::Cursor::new(bytes)),
        })
    }

    async fn audit_tool_call(&self, caller: &Caller, audit: ToolCallAudit) {
        let wire = &self.0;
        let audit = wire.across(&audit);
        wire.engine
            .audit_tool_call(&Loopback::identity(caller), audit)
            .await;
    }
}
