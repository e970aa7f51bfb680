//! The faces with a wire between them and the engine (issue 34, item 2): every engine call of
//! these tests crosses `snakebox_test::wire` (requests, results, errors and output chunks to
//! JSON and back), and each behaviour is what a client sees without the wire.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::json;
use snakebox_engine::{Caller, ErrorKind, ExecuteRequest, OutputChunk, RunQuery, Stream};
use snakebox_test::TestEngine;
use snakebox_test::http::get;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn runs_sessions_files_validation_and_the_report_work_through_a_wire() {
    let test = TestEngine::new().await;
    let (mcp, wire) = test.mcp_over_the_wire().await;

    // A one-shot run, with an artifact read back through the resource.
    let run = mcp
        .call(
            "execute_python",
            json!({"script": "open('out.txt', 'w').write('saved')\nprint('hello')\n6 * 7"}),
        )
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert_eq!(run.str("status"), "ok");
    assert_eq!(run.str("stdout"), "hello\n");
    assert_eq!(run.structured["result"]["json"], 42, "{}", run.text);
    let uri = run.structured["artifacts"][0]["uri"].as_str().unwrap();
    let contents = mcp.read_resource(uri).await.unwrap();
    let text = serde_json::to_value(&contents).unwrap();
    assert_eq!(text[0]["text"], "saved", "{text}");

    // A session: create, two cells, its files, a command, close.
    let session = mcp
        .call("create_session", json!({"name": "over-a-wire"}))
        .await;
    assert!(!session.is_error, "{}", session.text);
    let id = session.str("session_id").to_owned();
    mcp.call(
        "execute_python",
        json!({"script": "x = 41", "session_id": id}),
    )
    .await;
    let cell = mcp
        .call(
            "execute_python",
            json!({"script": "print(x + 1)", "session_id": id}),
        )
        .await;
    assert_eq!(cell.str("stdout"), "42\n", "{}", cell.text);
    let written = mcp
        .call(
            "write_file",
            json!({"session_id": id, "path": "data/in.txt", "content": "a,b\n"}),
        )
        .await;
    assert!(!written.is_error, "{}", written.text);
    let read = mcp
        .call(
            "read_file",
            json!({"session_id": id, "path": "data/in.txt"}),
        )
        .await;
    assert_eq!(read.str("content"), "a,b\n", "{}", read.text);
    let listed = mcp
        .call("list_files", json!({"session_id": id, "depth": 2}))
        .await;
    assert!(
        listed.text.contains("data/in.txt (4 bytes)"),
        "{}",
        listed.text
    );
    let command = mcp
        .call(
            "run_command",
            json!({"session_id": id, "command": "cat data/in.txt"}),
        )
        .await;
    assert_eq!(command.str("stdout"), "a,b\n", "{}", command.text);
    let packages = mcp.call("list_packages", json!({"session_id": id})).await;
    assert!(!packages.is_error, "{}", packages.text);
    assert_eq!(packages.str("session_id"), id);
    let nothing = mcp
        .call(
            "install_packages",
            json!({"session_id": id, "packages": []}),
        )
        .await;
    assert!(nothing.is_error, "{}", nothing.text);
    assert!(
        nothing.text.contains("No packages given"),
        "{}",
        nothing.text
    );
    let reset = mcp.call("reset_session", json!({"session_id": id})).await;
    assert!(!reset.is_error, "{}", reset.text);
    let sessions = mcp.call("list_sessions", json!({})).await;
    assert_eq!(sessions.structured["sessions"][0]["name"], "over-a-wire");
    let closed = mcp.call("delete_session", json!({"session_id": id})).await;
    assert!(!closed.is_error, "{}", closed.text);

    // An error crosses with its kind, message and hint.
    let gone = mcp
        .call("execute_python", json!({"script": "1", "session_id": id}))
        .await;
    assert!(gone.is_error, "{}", gone.text);
    assert!(
        gone.text.contains("hint: call list_sessions"),
        "{}",
        gone.text
    );
    assert_eq!(gone.structured["error"]["kind"], "not_found");

    // Validation answers exactly as without the wire.
    let script = json!({"script": "import os\nprint('hi'", "allowed_imports": ["math"]});
    let through = mcp.call("validate_script", script.clone()).await;
    let direct = test.mcp().await.call("validate_script", script).await;
    assert_eq!(through.structured, direct.structured);
    assert_eq!(through.structured["valid"], false);

    // The report, the caller's view.
    let report = mcp.call("check_environment", json!({})).await;
    assert_eq!(
        report.structured["sandbox_backend"], "none",
        "{}",
        report.text
    );
    assert_eq!(report.structured["tenant"]["name"], "local");

    assert!(wire.crossings() > 30, "{} crossings", wire.crossings());
}

#[tokio::test]
async fn output_streams_through_the_wire_before_the_result() {
    let test = TestEngine::new().await;
    let (handle, wire) = test.over_the_wire();
    let (sink, mut chunks) = tokio::sync::mpsc::unbounded_channel::<OutputChunk>();
    let request = ExecuteRequest {
        script: "import sys\nprint('out', flush=True)\nprint('err', file=sys.stderr)".into(),
        ..ExecuteRequest::default()
    };
    let result = handle
        .api()
        .execute(
            &Caller::local(),
            request,
            CancellationToken::new(),
            Some(sink),
        )
        .await;
    assert_eq!(result.stdout, "out\n");
    // Every chunk arrived before the result did.
    let mut seen = Vec::new();
    while let Ok(chunk) = chunks.try_recv() {
        seen.push(chunk);
    }
    let text = |stream: Stream| -> String {
        seen.iter()
            .filter(|chunk| chunk.stream == stream)
            .map(|chunk| chunk.text.as_str())
            .collect()
    };
    assert_eq!(text(Stream::Stdout), "out\n", "{seen:?}");
    assert_eq!(text(Stream::Stderr), "err\n", "{seen:?}");
    assert!(wire.crossings() >= 4);
}

#[tokio::test]
async fn a_cancelled_call_is_cancelled_through_the_wire() {
    let test = TestEngine::new().await;
    let (handle, _wire) = test.over_the_wire();
    let cancel = CancellationToken::new();
    let api = Arc::clone(handle.api());
    let running = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let request = ExecuteRequest {
                script: "import time\ntime.sleep(30)".into(),
                ..ExecuteRequest::default()
            };
            api.execute(&Caller::local(), request, cancel, None).await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    cancel.cancel();
    let result = running.await.unwrap();
    assert_eq!(
        result.status,
        snakebox_engine::Status::Cancelled,
        "{result:?}"
    );
}

#[tokio::test]
async fn the_compatibility_tools_result_variable_crosses_the_wire() {
    let test =
        TestEngine::with(|config| config.compat_tools = vec![snakebox_engine::CompatToolSet::Ibm])
            .await;
    let (mcp, _wire) = test.mcp_over_the_wire().await;
    let reply = mcp
        .call(
            "execute_code",
            json!({"code": "result = 2 + 2\nprint(f'The answer is: {result}')"}),
        )
        .await;
    assert_eq!(reply.structured["result"], 4, "{}", reply.text);
}

#[tokio::test]
async fn a_download_link_and_metrics_work_through_the_wire() {
    let test = TestEngine::new().await;
    let (http, wire) = test.http_over_the_wire();
    let client = http.with_key("team-a");
    let run = client
        .call_tool(
            "execute_python",
            json!({"script": "open('b.bin', 'wb').write(bytes(range(256)))"}),
        )
        .await;
    let url = run.structured["artifacts"][0]["download_url"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = &url[url.find("/files/").unwrap()..];
    let reply = http.send(get(path)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.body, (0..=255u8).collect::<Vec<u8>>());
    let metrics = client.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(wire.crossings() >= 4);
}

#[tokio::test]
async fn the_runs_table_crosses_the_wire() {
    let test = TestEngine::new().await;
    let (handle, _wire) = test.over_the_wire();
    let (api, caller) = (handle.api(), Caller::local());
    let request = ExecuteRequest {
        script: "print('kept')".into(),
        ..ExecuteRequest::default()
    };
    let run = api
        .execute(&caller, request, CancellationToken::new(), None)
        .await;
    let query = RunQuery {
        limit: 10,
        ..RunQuery::default()
    };
    let listed = api.list_runs(&caller, query).await;
    assert_eq!(listed[0].execution_id, run.execution_id, "{listed:?}");
    let record = api.run_record(&caller, &run.execution_id).await.unwrap();
    assert_eq!(record.script, "print('kept')");
    let output = api.run_output(&caller, &run.execution_id).await.unwrap();
    assert_eq!(output["stdout"], "kept\n", "{output}");
    // Not running: no live output, and a cancel is refused as not found, with its hint.
    assert!(api.live_output(&caller, &run.execution_id).await.is_none());
    let refused = api
        .cancel_run(&caller, &run.execution_id)
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::NotFound, "{refused:?}");
    let missing = api.run_record(&caller, "nope").await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert!(missing.hint.is_some());
    // Another tenant sees none of it.
    let other = Caller::tenant("team-b").unwrap();
    assert!(
        api.list_runs(
            &other,
            RunQuery {
                limit: 10,
                ..RunQuery::default()
            }
        )
        .await
        .is_empty()
    );
}
