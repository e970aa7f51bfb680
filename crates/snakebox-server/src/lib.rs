//! The MCP face of snakebox: tool definitions (rmcp), argument checks and result shaping.
//!
//! Thin by design: every handler converts typed parameters into an engine request, calls the
//! [`snakebox_engine::Engine`], and returns the record both as `structuredContent` (with an
//! object-rooted `outputSchema`) and as text sections that clients written for
//! `mcp-python-exec-sandbox` already understand. Problems with the *values* of arguments are
//! tool results with `isError: true` and a hint; protocol errors are kept for malformed
//! requests only. The same handler serves every transport.

mod frames;
mod sessions;
mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use snakebox_engine::{Engine, StopReason};
use tokio_util::sync::CancellationToken;

pub use frames::DEFAULT_MAX_FRAME_BYTES;
pub use tools::SnakeboxServer;

/// Serve MCP over stdin/stdout until the client closes our input or `stop` resolves (a
/// signal, in the binary). Either way the engine stops taking calls and cancels those in
/// flight ([`Engine::begin_shutdown`]); their replies (status `cancelled`) are written before
/// this returns, waiting at most `drain` for them. The caller then releases the host with
/// [`Engine::shutdown`].
///
/// Messages pass through the stdio framing ([`frames`]): one per line, at most
/// `max_frame_bytes` long, each answered per JSON-RPC 2.0 before rmcp sees it.
///
/// # Errors
/// When the transport fails to start or breaks.
pub async fn serve_stdio(
    engine: Arc<Engine>,
    stop: impl Future<Output = StopReason>,
    drain: Duration,
    max_frame_bytes: usize,
) -> anyhow::Result<StopReason> {
    let input_closed = CancellationToken::new();
    let transport = frames::start(
        tokio::io::stdin(),
        tokio::io::stdout(),
        max_frame_bytes,
        input_closed.clone(),
    );
    tokio::pin!(stop);
    let service = tokio::select! {
        service = SnakeboxServer::new(Arc::clone(&engine)).serve(transport) => service?,
        reason = &mut stop => {
            engine.begin_shutdown(reason);
            return Ok(reason);
        }
    };
    let cancel = service.cancellation_token();
    let waiting = service.waiting();
    tokio::pin!(waiting);
    let reason = tokio::select! {
        quit = &mut waiting => {
            // The transport ended by itself (its input closed before we saw it).
            engine.begin_shutdown(StopReason::InputClosed);
            quit?;
            return Ok(StopReason::InputClosed);
        }
        () = input_closed.cancelled() => StopReason::InputClosed,
        reason = &mut stop => reason,
    };
    engine.begin_shutdown(reason);
    let cut_short = engine.wait_idle(drain).await;
    if cut_short > 0 {
        tracing::warn!(
            cut_short,
            "calls still running after the drain deadline; their replies are lost"
        );
    }
    // At end of input the service is already draining its replies; on a signal, ask it to
    // (it sends the replies that are ready, then closes).
    if reason != StopReason::InputClosed {
        cancel.cancel();
    }
    waiting.await?;
    Ok(reason)
}
