//! The MCP face of snakebox: tool definitions (rmcp), argument checks and result shaping.
//!
//! Thin by design: every handler converts typed parameters into an engine request, calls the
//! engine through [`snakebox_engine::EngineApi`] (in this process, or over a wire), and returns the record both as `structuredContent` (with an
//! object-rooted `outputSchema`) and as text sections that clients written for
//! `mcp-python-exec-sandbox` already understand. Problems with the *values* of arguments are
//! tool results with `isError: true` and a hint; protocol errors are kept for malformed
//! requests only. The same handler serves every transport.

mod arguments;
mod compat;
mod conformance;
mod frames;
mod progress;
mod schemas;
mod sessions;
mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use snakebox_engine::{EngineHandle, StopReason};
use tokio_util::sync::CancellationToken;

pub use frames::DEFAULT_MAX_FRAME_BYTES;
pub use tools::{DownloadLinks, Downloads, RequestGone, SnakeboxServer};

/// Serve MCP over stdin/stdout until the client closes our input or `stop` resolves (a
/// signal, in the binary). Either way the engine stops taking calls and cancels those in
/// flight ([`EngineHost::begin_shutdown`](snakebox_engine::EngineHost::begin_shutdown)); their replies (status `cancelled`) are written before
/// this returns, waiting at most `drain` for them. The caller then releases the host with
/// `Engine::shutdown`.
///
/// Messages pass through the stdio framing (`frames`): one per line, at most
/// `max_frame_bytes` long, each answered per JSON-RPC 2.0 before rmcp sees it.
///
/// # Errors
/// When the transport fails to start or breaks.
pub async fn serve_stdio(
    engine: impl Into<EngineHandle>,
    stop: impl Future<Output = StopReason>,
    drain: Duration,
    max_frame_bytes: usize,
) -> anyhow::Result<StopReason> {
    let input_closed = CancellationToken::new();
    // Once a session runs, rmcp is told of the end of input only after the calls in flight
    // have been answered: rmcp waits just 5 s for replies once its input ends.
    let release = CancellationToken::new();
    let _release_on_return = release.clone().drop_guard();
    // rmcp's pipes: non-blocking when stdin and stdout are pipes (as MCP clients start us).
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let transport = frames::start(
        stdin,
        stdout,
        max_frame_bytes,
        input_closed.clone(),
        release.clone(),
    );
    let handle: EngineHandle = engine.into();
    let engine = Arc::clone(handle.host());
    let serving = SnakeboxServer::new(handle).serve(transport);
    tokio::pin!(serving, stop);
    let service = loop {
        tokio::select! {
            service = &mut serving => match service {
                Ok(service) => break service,
                // The input ended before a session began (no `initialize`): a clean stop,
                // as the end of input is after one.
                Err(_) if input_closed.is_cancelled() => {
                    engine.begin_shutdown(StopReason::InputClosed);
                    return Ok(StopReason::InputClosed);
                }
                Err(err) => return Err(err.into()),
            },
            reason = &mut stop => {
                engine.begin_shutdown(reason);
                return Ok(reason);
            }
            // Before a session, nothing is in flight: rmcp sees the end at once.
            () = input_closed.cancelled(), if !release.is_cancelled() => release.cancel(),
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
    // At end of input, let rmcp see it now (the replies are out); on a signal, ask the
    // service to stop (it sends the replies that are ready, then closes).
    if reason == StopReason::InputClosed {
        release.cancel();
    } else {
        cancel.cancel();
    }
    waiting.await?;
    Ok(reason)
}
