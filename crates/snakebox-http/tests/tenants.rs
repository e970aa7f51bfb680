//! What one tenant may see of another's over HTTP, each in a few lines (`snakebox-test`: the
//! real router over a real engine on the `none` backend, each tenant with a key of its own).
#![allow(clippy::unwrap_used)]

use serde_json::json;
use snakebox_test::TestEngine;

#[tokio::test]
async fn a_tenants_session_is_not_found_for_another() {
    let test = TestEngine::new().await;
    let http = test.http();
    let (a, b) = (http.with_key("team-a"), http.with_key("team-b"));
    let id = a
        .call_tool("create_session", json!({}))
        .await
        .str("session_id")
        .to_owned();
    let theirs = b
        .call_tool("execute_python", json!({"script": "1", "session_id": id}))
        .await;
    assert!(theirs.is_error, "{}", theirs.text);
    assert!(
        theirs.text.contains(&format!("No session `{id}`")),
        "{}",
        theirs.text
    );
    let mine = a
        .call_tool("execute_python", json!({"script": "1", "session_id": id}))
        .await;
    assert!(!mine.is_error, "{}", mine.text);
}
