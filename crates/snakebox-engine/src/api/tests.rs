//! Every type that crosses [`EngineApi`] goes out as JSON and comes back equal: one test per
//! family (requests, runs, sessions and files, validation, reports, the runs table and
//! artifacts, errors), and one list that does not compile if a type on the trait is not
//! serialisable.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::*;
use crate::{
    ArtifactOrigin, ErrorInfo, ErrorKind, EventKind, ExceptionInfo, FileEncoding, FileEntry,
    ImportFound, ImportOrigin, InputFile, InstallState, NetworkLogEntry, Package, ResourceUse,
    RunKind, ScriptAnalysis, SecurityEvent, SkippedFile, Status, Stream, ValidationProblem,
};

/// A type a wire can carry: it serialises, and deserialises into an owned value.
fn crosses_the_wire<T: Serialize + DeserializeOwned>() {}

/// `value` as JSON and back.
fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> T {
    let json = serde_json::to_string(value).expect("serialises");
    serde_json::from_str(&json).unwrap_or_else(|err| panic!("{err}: {json}"))
}

/// `value` comes back from JSON equal.
fn same<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
    assert_eq!(&round_trip(value), value);
}

#[test]
fn every_type_that_crosses_the_trait_is_serialisable() {
    // Requests.
    crosses_the_wire::<ExecuteRequest>();
    crosses_the_wire::<RunCommand>();
    crosses_the_wire::<CreateSession>();
    crosses_the_wire::<InstallPackages>();
    crosses_the_wire::<WriteFile>();
    crosses_the_wire::<ReadFile>();
    crosses_the_wire::<ListFiles>();
    crosses_the_wire::<ValidateScript>();
    crosses_the_wire::<RunQuery>();
    crosses_the_wire::<OpenArtifact>();
    crosses_the_wire::<ToolCallAudit>();
    // What streams while a call runs.
    crosses_the_wire::<OutputChunk>();
    // Results.
    crosses_the_wire::<WireExecution>();
    crosses_the_wire::<ExecutionResult>();
    crosses_the_wire::<SessionInfo>();
    crosses_the_wire::<SessionList>();
    crosses_the_wire::<InstallStatus>();
    crosses_the_wire::<PackageList>();
    crosses_the_wire::<FileWritten>();
    crosses_the_wire::<FileContent>();
    crosses_the_wire::<FileList>();
    crosses_the_wire::<Validation>();
    crosses_the_wire::<EnvironmentReport>();
    crosses_the_wire::<Vec<RunRecord>>();
    crosses_the_wire::<Option<serde_json::Value>>();
    crosses_the_wire::<Option<LiveOutput>>();
    crosses_the_wire::<Vec<Artifact>>();
    crosses_the_wire::<ArtifactContent>();
    crosses_the_wire::<ArtifactHead>();
    // Errors, and results that may be one.
    crosses_the_wire::<EngineError>();
    crosses_the_wire::<Result<(), EngineError>>();
    crosses_the_wire::<Result<SessionInfo, EngineError>>();
}

#[test]
fn requests_come_back_equal() {
    same(&ExecuteRequest {
        script: "print(1)".into(),
        dependencies: vec!["six==1.16.0".into()],
        session_id: Some("s-0123".into()),
        // A fraction, exactly as the caller gave it.
        timeout_seconds: Some(2.5),
        python_version: Some("3.12".into()),
        files: vec![
            InputFile {
                path: "in.csv".into(),
                content: "a,b\n".into(),
                encoding: FileEncoding::Utf8,
            },
            InputFile {
                path: "blob.bin".into(),
                content: "AAE=".into(),
                encoding: FileEncoding::Base64,
            },
        ],
        network: Some(false),
        allowed_domains: vec!["*.example.com".into()],
        allowed_imports: Some(vec!["math".into()]),
        profile: Some("basic".into()),
        memory_limit_bytes: Some(256 << 20),
        secrets: vec!["API_TOKEN".into()],
    });
    same(&ExecuteRequest::default());
    same(&RunCommand {
        session_id: "s-1".into(),
        command: "ls -la".into(),
        timeout_seconds: None,
    });
    same(&CreateSession {
        python_version: Some("3.12".into()),
        dependencies: vec!["pandas>=2.2".into()],
        name: Some("sales".into()),
        network: Some(true),
        allowed_domains: vec!["api.example.com".into()],
        profile: None,
    });
    same(&InstallPackages {
        session_id: "s-1".into(),
        packages: vec!["six".into()],
        wait: Some(Duration::from_millis(1500)),
    });
    same(&WriteFile {
        session_id: "s-1".into(),
        path: "a/b.txt".into(),
        content: "hi".into(),
        encoding: Some("base64".into()),
    });
    same(&ReadFile {
        session_id: "s-1".into(),
        path: "a/b.txt".into(),
    });
    same(&ListFiles {
        session_id: "s-1".into(),
        path: String::new(),
        depth: 3,
    });
    same(&ValidateScript {
        script: "import os".into(),
        dependencies: vec![],
        python_version: None,
        profile: Some("basic".into()),
        allowed_imports: Some(vec![]),
    });
    same(&RunQuery {
        limit: 50,
        before: Some("e-1".into()),
        session_id: None,
    });
    same(&OpenArtifact {
        execution_id: "e-1".into(),
        path: "out/a b.png".into(),
    });
    same(&ToolCallAudit::Answered {
        tool: "list_sessions".into(),
        status: "ok".into(),
    });
    same(&ToolCallAudit::Refused {
        tool: "nope".into(),
        request: "{}".into(),
    });
    same(&OutputChunk {
        stream: Stream::Stderr,
        text: "line\n".into(),
    });
}

/// A record with every part filled in.
fn full_execution() -> ExecutionResult {
    let mut result = ExecutionResult::new("e-0123".into(), Status::Error);
    result.exit_code = Some(1);
    result.signal = Some(11);
    result.stdout = "out\n".into();
    result.stderr = "Traceback…\n".into();
    result.stdout_truncated = true;
    result.duration_ms = 12;
    result.setup_ms = 3;
    result.timeout_seconds = 30;
    result.python_version = Some("3.12.7".into());
    result.requested_dependencies = vec!["six".into()];
    result.resolved_dependencies = vec![Package {
        name: "six".into(),
        version: "1.16.0".into(),
    }];
    result.environment_reused = true;
    result.error = Some(ErrorInfo {
        message: "m".into(),
        hint: Some("h".into()),
        kind: Some(ErrorKind::Failed),
    });
    result.notes = vec!["timeout rounded up".into()];
    result.result = Some(ValueRepr {
        repr: "{'a': 1}".into(),
        json: Some(serde_json::json!({"a": 1})),
        type_name: "dict".into(),
    });
    result.names = vec!["x".into()];
    result.exception = Some(ExceptionInfo {
        type_name: "ZeroDivisionError".into(),
        message: "division by zero".into(),
        traceback: "…".into(),
        line: Some(2),
    });
    result.artifacts = vec![Artifact {
        name: "figure-1.png".into(),
        size: 4,
        mime_type: "image/png".into(),
        uri: "snakebox://artifacts/e-0123/figure-1.png".into(),
        origin: ArtifactOrigin::Figure,
        inline: true,
        download_url: Some("http://x/files/e-0123/figure-1.png?sig=1".into()),
    }];
    result.skipped_files = vec![SkippedFile {
        name: "link".into(),
        reason: "a symbolic link".into(),
    }];
    result.network_log = vec![NetworkLogEntry {
        host: "example.com".into(),
        port: 443,
        allowed: false,
        reason: "not in the policy".into(),
        address: None,
        bytes_sent: 0,
        bytes_received: 0,
    }];
    result.resource_usage = ResourceUse {
        peak_memory_bytes: Some(1 << 20),
        cpu_time_ms: Some(5),
        process_limit_hits: None,
    };
    result.events = vec![SecurityEvent {
        kind: EventKind::ImportBlocked,
        detail: "import of `os`".into(),
    }];
    result.inline_images = vec![InlineImage {
        mime_type: "image/png".into(),
        data: vec![0x89, b'P', b'N', b'G', 0, 255],
        uri: "snakebox://artifacts/e-0123/figure-1.png".into(),
    }];
    result.session_id = Some("s-1".into());
    result.fresh_interpreter = true;
    result.profile = Some("standard".into());
    result.result_variable = Some(ValueRepr {
        repr: "4".into(),
        json: Some(serde_json::json!(4)),
        type_name: "int".into(),
    });
    result
}

#[test]
fn a_run_comes_back_whole_in_its_wire_form() {
    let full = full_execution();
    let wire = round_trip(&WireExecution::from(full.clone()));
    assert_eq!(ExecutionResult::from(wire), full);
    // Its own form (the tool's structured content) is unchanged: no images' bytes, no
    // compatibility variable.
    let own = serde_json::to_value(&full).expect("serialises");
    assert!(own.get("inline_images").is_none());
    assert!(own.get("result_variable").is_none());
    // Bytes travel as base64, not as a list of numbers.
    let wire = serde_json::to_value(WireExecution::from(full)).expect("serialises");
    assert_eq!(wire["inline_images"][0]["data"], "iVBORwD/");
    same(&ExecutionResult::not_run(
        "e-1".into(),
        EngineError::invalid("bad", "fix it"),
    ));
}

#[test]
fn sessions_and_files_come_back_equal() {
    let package = Package {
        name: "six".into(),
        version: "1.16.0".into(),
    };
    let info = SessionInfo {
        session_id: "s-1".into(),
        name: Some("n".into()),
        python_version: "3.12.7".into(),
        created_at: 1,
        last_used_at: 2,
        requested_packages: vec!["six".into()],
        packages: vec![package.clone()],
        size_bytes: 3,
        interpreter_running: true,
        network: true,
        allowed_domains: vec!["example.com".into()],
        executions: 4,
        profile: "standard".into(),
    };
    same(&info);
    same(&SessionList {
        sessions: vec![info],
        max_sessions: 5,
        max_disk_bytes: 6,
        used_disk_bytes: 7,
        tenant_max_disk_bytes: 8,
        tenant_used_disk_bytes: 9,
        idle_stop_seconds: 10,
        idle_delete_seconds: 11,
    });
    let install = InstallStatus {
        session_id: "s-1".into(),
        state: InstallState::Failed,
        requested: vec!["nope".into()],
        started_at: Some(1),
        finished_at: None,
        error: Some(ErrorInfo {
            message: "no such package".into(),
            hint: None,
            kind: None,
        }),
        log_tail: "…".into(),
        packages: vec![package.clone()],
    };
    same(&install);
    same(&PackageList {
        session_id: "s-1".into(),
        python_version: "3.12.7".into(),
        packages: vec![package],
        requested_packages: vec![],
        install,
    });
    same(&FileWritten {
        session_id: "s-1".into(),
        path: "a".into(),
        size: 1,
    });
    same(&FileContent {
        session_id: "s-1".into(),
        path: "a".into(),
        size: 1,
        encoding: "utf-8".into(),
        content: "x".into(),
    });
    let listing: FileList = serde_json::from_value(serde_json::json!({
        "session_id": "s-1", "path": "", "truncated": true,
        "entries": [{"path": "a", "kind": "file", "size": 1}],
    }))
    .expect("a listing");
    same(&listing);
    crosses_the_wire::<FileEntry>();
}

#[test]
fn a_validation_comes_back_equal() {
    same(&Validation {
        valid: false,
        problems: vec![ValidationProblem {
            kind: "syntax".into(),
            message: "invalid syntax".into(),
            line: Some(1),
            column: Some(7),
            hint: Some("close the bracket".into()),
        }],
        python_version: Some("3.12".into()),
        dependencies: vec!["numpy".into()],
        imports: vec![ImportFound {
            module: "numpy".into(),
            line: 1,
            how: "import".into(),
            origin: ImportOrigin::Dependency,
            allowed: true,
        }],
        analysis: Some(ScriptAnalysis {
            lines: 1,
            functions: 0,
            classes: 0,
            imports: 1,
        }),
        recommendations: vec!["pin numpy".into()],
    });
}

#[tokio::test]
async fn an_environment_report_comes_back_equal() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = EngineConfig::new(data.path().to_path_buf(), crate::BackendKind::None);
    config.warm_pool = 0;
    config.fork_server = false;
    config.warm_cache = false;
    let engine = Engine::new(config).await;
    same(&Engine::report(&engine));
    let caller = Caller::tenant("team-a").expect("a tenant");
    let report = EngineApi::report_for(&engine, &caller).await;
    assert!(report.tenant.is_some());
    same(&report);
    // Every warm state, through its flat wire form.
    for warm in [
        crate::WarmState::Disabled,
        crate::WarmState::Pending,
        crate::WarmState::Running,
        crate::WarmState::Ready { duration_ms: 5 },
        crate::WarmState::Failed {
            message: "no uv".into(),
        },
    ] {
        same(&warm);
    }
}

#[test]
fn runs_artifacts_and_live_output_come_back_equal() {
    same(&RunRecord {
        execution_id: "e-1".into(),
        kind: RunKind::Command,
        session_id: Some("s-1".into()),
        started_at_ms: 1,
        status: "ok".into(),
        duration_ms: Some(2),
        setup_ms: None,
        exit_code: Some(0),
        python_version: None,
        dependencies: vec![],
        script: "ls".into(),
        script_truncated: false,
        script_bytes: Some(2),
        script_sha256: Some("ab".into()),
    });
    same(&ArtifactContent {
        uri: "snakebox://artifacts/e-1/a.bin".into(),
        name: "a.bin".into(),
        mime_type: "application/octet-stream".into(),
        data: vec![0, 1, 2, 255],
    });
    same(&ArtifactHead {
        name: "a.bin".into(),
        mime_type: "application/octet-stream".into(),
        size: 4,
    });
    same(&Some(LiveOutput {
        stdout: "so far\n".into(),
        stderr: String::new(),
        truncated: true,
    }));
}

#[test]
fn an_error_comes_back_with_its_kind_message_and_hint() {
    for kind in [
        ErrorKind::Invalid,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Quota,
        ErrorKind::Unavailable,
        ErrorKind::Failed,
        ErrorKind::Cancelled,
        ErrorKind::Internal,
    ] {
        same(&EngineError::new(kind, "what went wrong"));
        same(&EngineError::new(kind, "what went wrong").with_hint("how to fix it"));
    }
    let json = serde_json::to_value(EngineError::invalid("m", "h")).expect("serialises");
    assert_eq!(
        json,
        serde_json::json!({"kind": "invalid", "message": "m", "hint": "h"})
    );
    same(&Err::<SessionInfo, _>(EngineError::new(
        ErrorKind::NotFound,
        "No session `s-1`",
    )));
}

// The face reports every answered tool call as the API says: runs are the engine's own
// lines (none here), every other tool gets one with its status.
#[test]
fn the_api_decides_which_answered_tool_calls_are_audited() {
    for tool in [
        "execute_python",
        "run_command",
        "execute_code",
        "execute_python_code",
        "execute_terminal_command",
    ] {
        assert!(
            !crate::RequestKind::of_tool(tool).audited_as_tool_call(),
            "{tool}"
        );
        assert_eq!(ToolCallAudit::answered(tool, false), None, "{tool}");
    }
    assert_eq!(
        ToolCallAudit::answered("list_sessions", true),
        Some(ToolCallAudit::Answered {
            tool: "list_sessions".into(),
            status: "error".into(),
        })
    );
    assert_eq!(
        crate::RequestKind::of_tool("check_environment"),
        crate::RequestKind::Other
    );
}
