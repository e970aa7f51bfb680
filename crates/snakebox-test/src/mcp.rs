//! The MCP face in process: rmcp's own client talks to `SnakeboxServer` over an in-memory
//! duplex stream, as a client on stdio would, with no process or socket between them.

use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use serde_json::Value;
use snakebox_engine::{Caller, Engine};
use snakebox_server::SnakeboxServer;

use crate::ToolReply;

/// Room for a whole reply in the in-memory stream.
const STREAM_BYTES: usize = 1 << 20;

/// A connected MCP client of one caller; its server stops when it is dropped.
pub struct McpClient {
    client: RunningService<RoleClient, ()>,
}

impl McpClient {
    /// A client of a server over `engine` whose calls are all `caller`'s.
    ///
    /// # Panics
    /// When the initialisation handshake fails.
    pub async fn connect(engine: &Arc<Engine>, caller: Caller) -> McpClient {
        McpClient::connect_to(SnakeboxServer::for_caller(Arc::clone(engine), caller)).await
    }

    /// A client of `server` (one built otherwise than [`McpClient::connect`] does).
    ///
    /// # Panics
    /// When the initialisation handshake fails.
    pub async fn connect_to(server: SnakeboxServer) -> McpClient {
        let (server_side, client_side) = tokio::io::duplex(STREAM_BYTES);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(server_side).await {
                let _ = running.waiting().await;
            }
        });
        let client = ().serve(client_side).await.expect("the MCP handshake");
        McpClient { client }
    }

    /// Call `tool` with `arguments` (a JSON object).
    ///
    /// # Panics
    /// When the server answers with a protocol error instead of a result (see
    /// [`McpClient::try_call`]).
    pub async fn call(&self, tool: &str, arguments: Value) -> ToolReply {
        self.try_call(tool, arguments)
            .await
            .unwrap_or_else(|err| panic!("{tool}: a protocol error, not a result: {err}"))
    }

    /// Call `tool` with `arguments`: its result, or the protocol error (unknown tool, an
    /// argument misspelled or of the wrong type…).
    ///
    /// # Errors
    /// The server's protocol error, or the transport's.
    ///
    /// # Panics
    /// When `arguments` is not a JSON object.
    pub async fn try_call(&self, tool: &str, arguments: Value) -> Result<ToolReply, ServiceError> {
        let arguments = match arguments {
            Value::Object(map) => map,
            other => panic!("a tool's arguments are an object, not {other}"),
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = self.client.call_tool(params).await?;
        let raw = serde_json::to_value(&result).expect("a result is JSON");
        Ok(ToolReply::from_result(raw))
    }

    /// Every tool the server lists, all pages.
    ///
    /// # Panics
    /// When the listing fails.
    pub async fn list_tools(&self) -> Vec<Tool> {
        self.client.list_all_tools().await.expect("tools/list")
    }

    /// The names of [`McpClient::list_tools`].
    pub async fn tool_names(&self) -> Vec<String> {
        let tools = self.list_tools().await;
        tools.iter().map(|tool| tool.name.to_string()).collect()
    }

    /// `resources/read` of `uri`: its contents, or the protocol error (an unknown or another
    /// caller's resource is one).
    ///
    /// # Errors
    /// The server's protocol error, or the transport's.
    pub async fn read_resource(&self, uri: &str) -> Result<Vec<ResourceContents>, ServiceError> {
        let params = ReadResourceRequestParams::new(uri);
        Ok(self.client.read_resource(params).await?.contents)
    }

    /// The rmcp client itself, for what the methods above do not cover.
    #[must_use]
    pub fn peer(&self) -> &RunningService<RoleClient, ()> {
        &self.client
    }

    /// Close the connection (the server's side ends with it).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}
