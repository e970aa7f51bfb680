//! The MCP face in process: a real rmcp client talks to `SnakeboxServer` over an in-memory
//! duplex stream, with a real engine behind it (the `none` backend, so no privilege is
//! needed: what is under test is the protocol face, its tools and its callers).
#![allow(clippy::unwrap_used)]

use serde_json::json;
use snakebox_test::{TestEngine, ToolReply};

#[tokio::test]
async fn tools_are_listed_and_a_script_runs() {
    let test = TestEngine::new().await;
    let client = test.mcp().await;
    let tools = client.list_tools().await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in [
        "execute_python",
        "validate_script",
        "check_environment",
        "create_session",
    ] {
        assert!(names.contains(&expected), "{names:?}");
    }
    // Every tool has an object-rooted output schema.
    assert!(tools.iter().all(|t| t.output_schema.is_some()), "{names:?}");
    let result = client
        .call("execute_python", json!({"script": "print(6 * 7)\n6 * 7"}))
        .await;
    assert!(!result.is_error, "{result:?}");
    let data = result.structured;
    assert_eq!(data["status"], "ok", "{data}");
    assert_eq!(data["stdout"], "42\n");
    assert_eq!(data["result"]["repr"], "42", "{data}");
    client.close().await;
}

#[tokio::test]
async fn two_callers_of_one_engine_see_only_their_own_sessions() {
    let test = TestEngine::new().await;
    let a = test.mcp_as("team-a").await;
    let b = test.mcp_as("team-b").await;
    let created = a.call("create_session", json!({"name": "a's work"})).await;
    let id = created.str("session_id").to_owned();
    let listed = |result: ToolReply| -> Vec<String> {
        result.structured["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        listed(a.call("list_sessions", json!({})).await),
        vec![id.clone()]
    );
    assert!(listed(b.call("list_sessions", json!({})).await).is_empty());
    // B running code in A's session is refused as for an unknown session, and A's stays.
    let refused = b
        .call(
            "execute_python",
            json!({"script": "print(1)", "session_id": id}),
        )
        .await;
    let text = refused.raw.to_string();
    assert!(text.contains("No session"), "{text}");
    assert!(!text.contains("a's work"), "{text}");
    assert_eq!(
        listed(a.call("list_sessions", json!({})).await),
        vec![id.clone()]
    );
    a.call("delete_session", json!({"session_id": id})).await;
    a.close().await;
    b.close().await;
}
