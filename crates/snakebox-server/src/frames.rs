//! The stdio framing between the process's stdin/stdout and rmcp: newline-delimited
//! JSON-RPC frames of bounded size, each read and answered per JSON-RPC 2.0 before rmcp
//! sees it.
//!
//! Why it exists: rmcp's own stdio transport (`AsyncRwTransport`, rmcp 3.9) leaves clients
//! waiting. It ignores lines that are not JSON (no `-32700`), answers messages it cannot read
//! with a `-32600` that has no id (wrong-typed fields, ids past 64 bits, a stray `result`, a
//! lone surrogate, nesting past 128 levels), drops an oversized line without a word, keeps the
//! largest line's buffer for the life of the connection, and, given two requests in flight
//! with the same id, answers only one. A client then hangs until its own timeout. rmcp is a
//! dependency we cannot change, so this layer stands in front of it and keeps the rule:
//! every request with an id gets exactly one reply with that id, every line that is not JSON
//! a `-32700`, and a line over the limit an error naming the limit, its memory released.
//!
//! Shape: a reader task ([`codec`] for the bounded lines, [`classify`] for what each is)
//! hands rmcp the messages it can read through an in-memory [`Transport`], and answers the
//! rest itself; one writer task owns stdout and writes whole lines only, rmcp's and ours.
//! The ids of requests in flight are kept (with their raw text, so the reply carries the id
//! exactly as the client wrote it, `1.0` stays `1.0`) until rmcp answers them or the client
//! cancels them; a request reusing one of them is answered at once with an error.
//!
//! It is stdio-specific: the HTTP face gets its bodies whole from axum.

mod classify;
mod codec;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, RequestId, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use self::classify::{Reply, Verdict, classify, recover_id};
use self::codec::{Frame, FrameCodec};

/// Default bound on one incoming message (one line), in bytes.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Frames whose buffer was at least this large have their memory handed back to the system
/// once they are read (see [`release_memory`]).
const RELEASE_ABOVE: usize = 1024 * 1024;

/// Lines waiting for stdout; a writer that cannot keep up slows the readers down.
const OUTGOING: usize = 64;

/// A line for stdout, and who waits for it to be written (rmcp's sends do: its drain at the
/// end of the connection counts on them).
struct Outgoing {
    line: Vec<u8>,
    written: Option<oneshot::Sender<()>>,
}

/// Requests in flight, by the id rmcp knows them by, with the id's raw text.
type InFlight = Arc<Mutex<HashMap<RequestId, Box<RawValue>>>>;

/// The rmcp side of the layer: a [`Transport`] over channels. [`start`] makes it.
pub(crate) struct FramedStdio {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    outgoing: mpsc::Sender<Outgoing>,
    in_flight: InFlight,
}

/// Start the layer over `input` and `output` (stdin and stdout, or test pipes): the reader
/// and writer tasks, and the transport to hand to rmcp. `eof` is cancelled when the input
/// ends.
pub(crate) fn start<R, W>(
    input: R,
    output: W,
    max_frame_bytes: usize,
    eof: CancellationToken,
) -> FramedStdio
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (to_rmcp, incoming) = mpsc::channel(OUTGOING);
    let (outgoing, lines) = mpsc::channel(OUTGOING);
    let in_flight = InFlight::default();
    tokio::spawn(write_lines(output, lines));
    tokio::spawn(read_frames(
        input,
        max_frame_bytes,
        to_rmcp,
        outgoing.clone(),
        Arc::clone(&in_flight),
        eof,
    ));
    FramedStdio {
        incoming,
        outgoing,
        in_flight,
    }
}

impl Transport<RoleServer> for FramedStdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let line = render(&item, &self.in_flight);
        let outgoing = self.outgoing.clone();
        async move {
            let closed = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed");
            let line = line.map_err(std::io::Error::other)?;
            let (written, done) = oneshot::channel();
            outgoing
                .send(Outgoing {
                    line,
                    written: Some(written),
                })
                .await
                .map_err(|_| closed())?;
            done.await.map_err(|_| closed())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// One line of rmcp's output. A reply ends its request's time in flight and carries the id
/// as the client wrote it.
fn render(item: &ServerJsonRpcMessage, in_flight: &InFlight) -> Result<Vec<u8>, serde_json::Error> {
    let id = match item {
        ServerJsonRpcMessage::Response(response) => Some(&response.id),
        ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    };
    let raw = id.and_then(|id| lock(in_flight).remove(id));
    let mut line = match raw {
        Some(raw) if raw.get() != serde_json::to_string(&id)?.as_str() => {
            // The client wrote the id otherwise (`1.0`, `"\u0041"`): give it back as written.
            #[derive(Serialize)]
            struct Exact<'a> {
                jsonrpc: &'static str,
                id: &'a RawValue,
                #[serde(flatten)]
                rest: serde_json::Map<String, serde_json::Value>,
            }
            let mut rest = match serde_json::to_value(item)? {
                serde_json::Value::Object(rest) => rest,
                _ => serde_json::Map::new(),
            };
            rest.remove("jsonrpc");
            rest.remove("id");
            serde_json::to_vec(&Exact {
                jsonrpc: "2.0",
                id: &raw,
                rest,
            })?
        }
        _ => serde_json::to_vec(item)?,
    };
    line.push(b'\n');
    Ok(line)
}

fn lock(in_flight: &InFlight) -> std::sync::MutexGuard<'_, HashMap<RequestId, Box<RawValue>>> {
    // A panic while holding the lock leaves a map that is still whole.
    in_flight
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The only writer of stdout: whole lines, in the order they come.
async fn write_lines<W: AsyncWrite + Unpin>(mut output: W, mut lines: mpsc::Receiver<Outgoing>) {
    while let Some(Outgoing { line, written }) = lines.recv().await {
        let result = match output.write_all(&line).await {
            Ok(()) => output.flush().await,
            Err(err) => Err(err),
        };
        if let Err(err) = result {
            tracing::warn!(%err, "cannot write to stdout; replies are lost");
            return;
        }
        if let Some(written) = written {
            let _ = written.send(());
        }
    }
}

/// Read frames until the input ends: forward what rmcp can read, answer the rest.
async fn read_frames<R: AsyncRead + Unpin>(
    input: R,
    max_frame_bytes: usize,
    to_rmcp: mpsc::Sender<ClientJsonRpcMessage>,
    outgoing: mpsc::Sender<Outgoing>,
    in_flight: InFlight,
    eof: CancellationToken,
) {
    let mut frames = FramedRead::with_capacity(input, FrameCodec::new(max_frame_bytes), 64 * 1024);
    while let Some(frame) = frames.next().await {
        let (verdict, size) = match frame {
            Ok(Frame::Line(line)) => (classify(&line), line.capacity()),
            Ok(Frame::Oversized { head, length }) => {
                (too_large(&head, length, max_frame_bytes), max_frame_bytes)
            }
            Err(err) => {
                tracing::warn!(%err, "cannot read stdin; stopping");
                break;
            }
        };
        if size >= RELEASE_ABOVE {
            release_memory();
        }
        let replies = match verdict {
            Verdict::Skip => continue,
            Verdict::Drop(why) => {
                tracing::debug!("{why}");
                continue;
            }
            Verdict::Reply(reply) => reply_line(&[reply], false),
            Verdict::Batch(replies) => reply_line(&replies, true),
            Verdict::Forward { message, id } => match admit(&message, id, &in_flight) {
                Ok(()) => {
                    if to_rmcp.send(*message).await.is_err() {
                        // rmcp has stopped reading: the service is gone.
                        break;
                    }
                    continue;
                }
                Err(reply) => reply_line(&[reply], false),
            },
        };
        match replies {
            Ok(line) => {
                if outgoing
                    .send(Outgoing {
                        line,
                        written: None,
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Err(err) => tracing::error!(%err, "cannot render an error reply"),
        }
    }
    eof.cancel();
}

/// A request enters the in-flight table, unless its id is already there; a cancellation
/// takes its request out (rmcp sends no reply to a cancelled request).
fn admit(
    message: &ClientJsonRpcMessage,
    raw: Option<Box<RawValue>>,
    in_flight: &InFlight,
) -> Result<(), Reply> {
    match message {
        ClientJsonRpcMessage::Request(request) => {
            let raw = match raw {
                Some(raw) => raw,
                None => serde_json::value::to_raw_value(&request.id).map_err(|err| {
                    Reply::invalid(
                        None,
                        format!("Invalid request: {err}"),
                        "use a string or integer id",
                    )
                })?,
            };
            let mut table = lock(in_flight);
            if table.contains_key(&request.id) {
                return Err(Reply::invalid(
                    Some(raw),
                    format!(
                        "Invalid request: a request with the id {} is still in flight",
                        request.id
                    ),
                    "give every request its own id; an id may be used again once its reply has arrived",
                ));
            }
            table.insert(request.id.clone(), raw);
        }
        ClientJsonRpcMessage::Notification(notification) => {
            if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                && let Some(id) = &cancelled.params.request_id
            {
                lock(in_flight).remove(id);
            }
        }
        _ => {}
    }
    Ok(())
}

/// The reply to a line over the limit: its id when the head holds one, the limit, a hint.
fn too_large(head: &[u8], length: u64, limit: usize) -> Verdict {
    let head = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(err) => std::str::from_utf8(&head[..err.valid_up_to()]).unwrap_or_default(),
    };
    let id = recover_id(head);
    Verdict::Reply(Reply {
        id,
        error: rmcp::model::ErrorData::invalid_request(
            format!(
                "Invalid request: the message is larger than the limit of {limit} bytes (it has at least {length})"
            ),
            Some(serde_json::json!({
                "limit_bytes": limit,
                "hint": "send less in one call (large files in parts, or a smaller script), or raise the server's --max-frame-bytes",
            })),
        ),
    })
}

/// Error replies as one line: one object, or an array for a batch.
fn reply_line(replies: &[Reply], batch: bool) -> Result<Vec<u8>, serde_json::Error> {
    let texts = replies
        .iter()
        .map(Reply::to_value_text)
        .collect::<Result<Vec<_>, _>>()?;
    let mut line = if batch {
        format!("[{}]", texts.join(","))
    } else {
        texts.join("\n")
    }
    .into_bytes();
    line.push(b'\n');
    Ok(line)
}

/// Hand freed memory back to the system. A large frame's buffer is freed by now, but glibc
/// keeps freed heap memory for reuse (after a large free it raises its thresholds), so the
/// process would stay as large as its largest message.
fn release_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
