//! Fixtures for the official MCP conformance suite (`@modelcontextprotocol/conformance`).
//!
//! The suite's server scenarios call tools and read resources of fixed names
//! (`test_simple_text`, `test://static-text`, …) to check that a server's protocol layer
//! carries each kind of content, error and progress notification correctly. snakebox's
//! own tools produce all of these kinds (text, images, resource links, `isError` results,
//! progress), but not under those names, so a server started with the hidden
//! `serve --conformance-fixtures` flag adds them beside its own tools. They touch no engine
//! state and run no code; nothing else is different. Scenarios for features snakebox does not
//! offer (prompts, sampling, elicitation, subscriptions, logging) are listed, each with why, in
//! `tests/clients/conformance-not-applicable.yml`.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolResult, ContentBlock, ProgressNotificationParam, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};

use crate::SnakeboxServer;

/// A 1×1 red PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A WAV header with no samples (44 bytes: RIFF, fmt  PCM mono 8 kHz 8-bit, empty data).
const WAV_EMPTY: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

/// The prefix of every fixture resource.
const SCHEME: &str = "test://";
const TEMPLATE: &str = "test://template/{id}/data";

#[tool_router(router = conformance_router, vis = "pub(crate)")]
impl SnakeboxServer {
    #[tool(description = "Conformance fixture: returns one text block.")]
    async fn test_simple_text(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(
            "This is a simple text response for testing.",
        )]))
    }

    #[tool(description = "Conformance fixture: returns one PNG image.")]
    async fn test_image_content(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::image(
            PNG_1X1,
            "image/png",
        )]))
    }

    #[tool(description = "Conformance fixture: returns one WAV audio block.")]
    async fn test_audio_content(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::audio(
            WAV_EMPTY,
            "audio/wav",
        )]))
    }

    #[tool(description = "Conformance fixture: returns one embedded text resource.")]
    async fn test_embedded_resource(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::resource(
            ResourceContents::text(
                "This is an embedded resource content.",
                "test://embedded-resource",
            ),
        )]))
    }

    #[tool(description = "Conformance fixture: returns text, an image and a resource.")]
    async fn test_multiple_content_types(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![
            ContentBlock::text("Multiple content types test:"),
            ContentBlock::image(PNG_1X1, "image/png"),
            ContentBlock::resource(
                ResourceContents::text(
                    r#"{"test":"data","value":123}"#,
                    "test://mixed-content-resource",
                )
                .with_mime_type("application/json"),
            ),
        ]))
    }

    #[tool(description = "Conformance fixture: always an error result.")]
    async fn test_error_handling(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::error(vec![ContentBlock::text(
            "This tool intentionally returns an error for testing",
        )]))
    }

    #[tool(description = "Conformance fixture: reports progress 0, 50 and 100 of 100.")]
    async fn test_tool_with_progress(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let token = context.meta.get_progress_token();
        for (i, step) in [0.0, 50.0, 100.0].into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(token) = &token {
                let mut param = ProgressNotificationParam::new(token.clone(), step);
                param.total = Some(100.0);
                let _ = context.peer.notify_progress(param).await;
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            "Tool with progress executed successfully",
        )]))
    }
}

/// The fixture tools, to add to a server's own.
pub(crate) fn router() -> ToolRouter<SnakeboxServer> {
    SnakeboxServer::conformance_router()
}

/// Whether `uri` names a fixture resource.
pub(crate) fn is_fixture_uri(uri: &str) -> bool {
    uri.starts_with(SCHEME)
}

/// The fixture resources, listed after the server's own.
pub(crate) fn resources() -> Vec<Resource> {
    vec![
        Resource::new("test://static-text", "static-text").with_mime_type("text/plain"),
        Resource::new("test://static-binary", "static-binary").with_mime_type("image/png"),
    ]
}

/// The fixture resource template.
pub(crate) fn template() -> ResourceTemplate {
    ResourceTemplate::new(TEMPLATE, "template-data").with_mime_type("application/json")
}

/// Read a fixture resource.
///
/// # Errors
/// An unknown `test://` URI (resource not found).
pub(crate) fn read(uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let contents = match uri {
        "test://static-text" => {
            ResourceContents::text("This is the content of the static text resource.", uri)
        }
        "test://static-binary" => ResourceContents::blob(PNG_1X1, uri).with_mime_type("image/png"),
        _ => {
            let id = uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'))
                .ok_or_else(|| {
                    ErrorData::resource_not_found(format!("No fixture resource `{uri}`"), None)
                })?;
            let body = serde_json::json!({
                "id": id,
                "templateTest": true,
                "data": format!("Data for ID: {id}"),
            });
            ResourceContents::text(body.to_string(), uri).with_mime_type("application/json")
        }
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_resources_substitute_the_id_and_refuse_other_shapes() {
        let read_text = |uri: &str| match read(uri).map(|r| r.contents.into_iter().next()) {
            Ok(Some(ResourceContents::TextResourceContents { text, .. })) => Some(text),
            _ => None,
        };
        let text = read_text("test://template/123/data").unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(value["id"], "123");
        assert_eq!(value["data"], "Data for ID: 123");
        for bad in [
            "test://template//data",
            "test://template/1/2/data",
            "test://other",
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
        assert!(is_fixture_uri("test://static-text"));
        assert!(!is_fixture_uri("snakebox://artifacts/x/y"));
    }
}
