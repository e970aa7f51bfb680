//! The MCP face of snakebox: tool definitions (rmcp), argument checks and result shaping.
//!
//! Thin by design: every handler converts typed parameters into an engine request, calls the
//! [`snakebox_engine::Engine`], and returns the record both as `structuredContent` (with an
//! object-rooted `outputSchema`) and as text sections that clients written for
//! `mcp-python-exec-sandbox` already understand. Problems with the *values* of arguments are
//! tool results with `isError: true` and a hint; protocol errors are kept for malformed
//! requests only. The same handler serves every transport.

mod sessions;
mod tools;

use std::sync::Arc;

use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{RoleServer, ServiceExt};
use snakebox_engine::Engine;

pub use tools::SnakeboxServer;

/// Largest JSON-RPC line read from stdio. Larger than any script we accept, so an oversized
/// script reaches the tool and gets a clear error instead of being dropped by the transport.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Serve MCP over stdin/stdout until the client disconnects.
///
/// # Errors
/// When the transport fails to start or breaks.
pub async fn serve_stdio(engine: Arc<Engine>) -> anyhow::Result<()> {
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let transport = AsyncRwTransport::<RoleServer, _, _>::new(stdin, stdout)
        .with_max_line_length(MAX_MESSAGE_BYTES);
    let service = SnakeboxServer::new(engine).serve(transport).await?;
    service.waiting().await?;
    Ok(())
}
