//! Behaviours of the MCP face as a client sees them, each in a few lines (`snakebox-test`: a
//! real engine on the `none` backend, rmcp's client in process).
#![allow(clippy::unwrap_used)]

use serde_json::json;
use snakebox_test::TestEngine;

#[tokio::test]
async fn a_one_shot_run_returns_its_stdout() {
    let test = TestEngine::new().await;
    let mcp = test.mcp().await;
    let reply = mcp
        .call("execute_python", json!({"script": "print('hello')"}))
        .await;
    assert!(!reply.is_error, "{}", reply.text);
    assert_eq!(reply.str("status"), "ok");
    assert_eq!(reply.str("stdout"), "hello\n");
}

#[tokio::test]
async fn a_session_keeps_a_variable_across_cells() {
    let test = TestEngine::new().await;
    let mcp = test.mcp().await;
    let session = mcp.call("create_session", json!({})).await;
    let id = session.str("session_id");
    mcp.call(
        "execute_python",
        json!({"script": "x = 41", "session_id": id}),
    )
    .await;
    let reply = mcp
        .call(
            "execute_python",
            json!({"script": "print(x + 1)", "session_id": id}),
        )
        .await;
    assert_eq!(reply.str("stdout"), "42\n", "{}", reply.text);
}

#[tokio::test]
async fn an_unknown_session_is_an_error_with_a_hint() {
    let test = TestEngine::new().await;
    let mcp = test.mcp().await;
    let reply = mcp
        .call(
            "execute_python",
            json!({"script": "1", "session_id": "nope"}),
        )
        .await;
    assert!(reply.is_error, "{}", reply.text);
    assert!(reply.text.contains("No session `nope`"), "{}", reply.text);
    assert!(
        reply.text.contains("hint: call list_sessions"),
        "{}",
        reply.text
    );
}

#[tokio::test]
async fn a_misspelled_argument_is_refused_with_the_one_meant() {
    let test = TestEngine::new().await;
    let mcp = test.mcp().await;
    let err = mcp
        .try_call("execute_python", json!({"script": "1", "sesion_id": "s"}))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("unknown argument `sesion_id`"),
        "{message}"
    );
    assert!(message.contains("did you mean `session_id`?"), "{message}");
}
