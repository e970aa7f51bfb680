//! The MCP face in process: a real rmcp client talks to [`SnakeboxServer`] over an in-memory
//! duplex stream, with a real engine behind it (the `none` backend, so no privilege is
//! needed: what is under test is the protocol face, its tools and its callers).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};
use snakebox_engine::BackendKind;
use snakebox_engine::{Caller, Engine, EngineConfig};
use snakebox_server::SnakeboxServer;

async fn engine(data: &std::path::Path) -> Arc<Engine> {
    let mut config = EngineConfig::new(data.to_path_buf(), BackendKind::None);
    config.warm_pool = 0;
    config.fork_server = false;
    config.warm_cache = false;
    Arc::new(Engine::new(config).await)
}

/// A connected client of a server over `engine` whose calls are all `caller`'s.
async fn connect(engine: &Arc<Engine>, caller: Caller) -> RunningService<RoleClient, ()> {
    let (server_side, client_side) = tokio::io::duplex(1 << 20);
    let server = SnakeboxServer::for_caller(Arc::clone(engine), caller);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_side).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_side).await.unwrap()
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap());
    client.call_tool(params).await.unwrap()
}

#[tokio::test]
async fn tools_are_listed_and_a_script_runs() {
    let data = tempfile::tempdir().unwrap();
    let engine = engine(data.path()).await;
    let client = connect(&engine, Caller::local()).await;
    let tools = client.list_all_tools().await.unwrap();
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
    let result = call(
        &client,
        "execute_python",
        json!({"script": "print(6 * 7)\n6 * 7"}),
    )
    .await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let data = result.structured_content.unwrap();
    assert_eq!(data["status"], "ok", "{data}");
    assert_eq!(data["stdout"], "42\n");
    assert_eq!(data["result"]["repr"], "42", "{data}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn two_callers_of_one_engine_see_only_their_own_sessions() {
    let data = tempfile::tempdir().unwrap();
    let engine = engine(data.path()).await;
    let a = connect(&engine, Caller::tenant("team-a").unwrap()).await;
    let b = connect(&engine, Caller::tenant("team-b").unwrap()).await;
    let created = call(&a, "create_session", json!({"name": "a's work"})).await;
    let id = created.structured_content.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = |result: CallToolResult| -> Vec<String> {
        result.structured_content.unwrap()["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        listed(call(&a, "list_sessions", json!({})).await),
        vec![id.clone()]
    );
    assert!(listed(call(&b, "list_sessions", json!({})).await).is_empty());
    // B running code in A's session is refused as for an unknown session, and A's stays.
    let refused = call(
        &b,
        "execute_python",
        json!({"script": "print(1)", "session_id": id}),
    )
    .await;
    let text = serde_json::to_string(&refused).unwrap();
    assert!(text.contains("No session"), "{text}");
    assert!(!text.contains("a's work"), "{text}");
    assert_eq!(
        listed(call(&a, "list_sessions", json!({})).await),
        vec![id.clone()]
    );
    call(&a, "delete_session", json!({"session_id": id})).await;
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}
