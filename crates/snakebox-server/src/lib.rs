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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{RoleServer, ServiceExt};
use snakebox_engine::{Engine, StopReason};
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

pub use tools::{RequestGone, SnakeboxServer};

/// Largest JSON-RPC line read from stdio. Larger than any script we accept, so an oversized
/// script reaches the tool and gets a clear error instead of being dropped by the transport.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Serve MCP over stdin/stdout until the client closes our input or `stop` resolves (a
/// signal, in the binary). Either way the engine stops taking calls and cancels those in
/// flight ([`Engine::begin_shutdown`]); their replies (status `cancelled`) are written before
/// this returns, waiting at most `drain` for them. The caller then releases the host with
/// [`Engine::shutdown`].
///
/// # Errors
/// When the transport fails to start or breaks.
pub async fn serve_stdio(
    engine: Arc<Engine>,
    stop: impl Future<Output = StopReason>,
    drain: Duration,
) -> anyhow::Result<StopReason> {
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let input_closed = CancellationToken::new();
    let stdin = NotifyEof {
        inner: stdin,
        eof: input_closed.clone(),
    };
    let transport = AsyncRwTransport::<RoleServer, _, _>::new(stdin, stdout)
        .with_max_line_length(MAX_MESSAGE_BYTES);
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

/// Standard input that tells when it reaches its end: the client closed it, the server stops
/// at once (rmcp only waits a few seconds for the replies of calls in flight).
struct NotifyEof<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for NotifyEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let wants = buf.remaining() > 0;
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled
            && wants
            && buf.filled().len() == before
        {
            self.eof.cancel();
        }
        polled
    }
}
