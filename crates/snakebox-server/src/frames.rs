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
//! cancels them; a request reusing one of them is answered at once with an error. Until
//! rmcp's session has begun, notifications and responses are held back: rmcp would end the
//! connection on them.
//!
//! It is stdio-specific: the HTTP face gets its bodies whole from axum.

mod classify;
mod codec;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetMeta, ProtocolVersion, RequestId,
    ServerJsonRpcMessage,
};
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

/// What the reader and rmcp's replies share.
#[derive(Default)]
struct State {
    /// Requests in flight, by the id rmcp knows them by, with the id as the client wrote it.
    in_flight: Mutex<HashMap<RequestId, Box<RawValue>>>,
    /// rmcp has begun a session. Before that rmcp ends the whole connection on a
    /// notification or a response (rmcp 3.9, `serve_server`), so those are held back.
    open: AtomicBool,
}

/// The rmcp side of the layer: a [`Transport`] over channels. [`start`] makes it.
pub(crate) struct FramedStdio {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    outgoing: mpsc::Sender<Outgoing>,
    state: Arc<State>,
}

/// Start the layer over `input` and `output` (stdin and stdout, or test pipes): the reader
/// and writer tasks, and the transport to hand to rmcp. `eof` is cancelled when the input
/// ends; rmcp's input ends when `release` is cancelled after that (the caller answers the
/// calls in flight first: rmcp gives them only 5 s once its input has ended).
pub(crate) fn start<R, W>(
    input: R,
    output: W,
    max_frame_bytes: usize,
    eof: CancellationToken,
    release: CancellationToken,
) -> FramedStdio
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (to_rmcp, incoming) = mpsc::channel(OUTGOING);
    let (outgoing, lines) = mpsc::channel(OUTGOING);
    let state = Arc::new(State::default());
    tokio::spawn(write_lines(output, lines));
    tokio::spawn(read_frames(
        input,
        max_frame_bytes,
        to_rmcp,
        outgoing.clone(),
        Arc::clone(&state),
        eof,
        release,
    ));
    FramedStdio {
        incoming,
        outgoing,
        state,
    }
}

impl Transport<RoleServer> for FramedStdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let line = render(&item, &self.state);
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
fn render(item: &ServerJsonRpcMessage, state: &State) -> Result<Vec<u8>, serde_json::Error> {
    let id = match item {
        ServerJsonRpcMessage::Response(response) => Some(&response.id),
        ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    };
    let raw = id.and_then(|id| lock(state).remove(id));
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

fn lock(state: &State) -> std::sync::MutexGuard<'_, HashMap<RequestId, Box<RawValue>>> {
    // A panic while holding the lock leaves a map that is still whole.
    state
        .in_flight
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
    state: Arc<State>,
    eof: CancellationToken,
    release: CancellationToken,
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
            Verdict::Forward { message, id } => match admit(&message, id, &state) {
                Ok(false) => continue,
                Ok(true) => {
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
    release.cancelled().await;
    drop(to_rmcp);
}

/// Whether a message goes to rmcp. A request enters the in-flight table, unless its id is
/// already there (then it is answered here); a cancellation takes its request out (rmcp
/// sends no reply to a cancelled request); a notification or response before rmcp's session
/// has begun is held back (no reply is owed to either).
fn admit(
    message: &ClientJsonRpcMessage,
    raw: Option<Box<RawValue>>,
    state: &State,
) -> Result<bool, Reply> {
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
            let mut table = lock(state);
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
            if begins_session(&request.request) {
                state.open.store(true, Ordering::Release);
            }
            Ok(true)
        }
        _ if !state.open.load(Ordering::Acquire) => {
            tracing::warn!(
                "a notification or response before `initialize` was dropped (it would end the connection)"
            );
            Ok(false)
        }
        ClientJsonRpcMessage::Notification(notification) => {
            if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                && let Some(id) = &cancelled.params.request_id
            {
                lock(state).remove(id);
            }
            Ok(true)
        }
        _ => Ok(true),
    }
}

/// Whether rmcp begins a session on this request (rmcp 3.9, `serve_server`): an
/// `initialize`, or (MCP 2026-07-28, no handshake) a request other than `ping` and
/// `server/discover` that carries the protocol version and the client's capabilities in its
/// `_meta`. rmcp answers any other request before a session on its own and keeps waiting.
fn begins_session(request: &ClientRequest) -> bool {
    match request {
        ClientRequest::InitializeRequest(_) => true,
        ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
        request => {
            let meta = request.get_meta();
            meta.protocol_version().is_some()
                && meta
                    .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                    .is_empty()
        }
    }
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

#[cfg(test)]
mod tests {
    use rmcp::ServiceExt;
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// A server with rmcp's default handlers (ping, empty lists).
    #[derive(Clone)]
    struct Plain;
    impl rmcp::ServerHandler for Plain {}

    /// The layer and a plain rmcp server over in-memory pipes: (client's writer, client's
    /// line reader, the end-of-input token).
    async fn served(
        limit: usize,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
        CancellationToken,
    ) {
        let (client_out, server_in) = tokio::io::duplex(1 << 16);
        let (server_out, client_in) = tokio::io::duplex(1 << 16);
        let eof = CancellationToken::new();
        let transport = start(server_in, server_out, limit, eof.clone(), eof.clone());
        tokio::spawn(async move {
            if let Ok(service) = Plain.serve(transport).await {
                let _ = service.waiting().await;
            }
        });
        (client_out, BufReader::new(client_in).lines(), eof)
    }

    async fn reply(lines: &mut tokio::io::Lines<BufReader<tokio::io::DuplexStream>>) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
            .await
            .expect("a reply in time")
            .expect("readable")
            .expect("a line")
    }

    #[tokio::test]
    async fn the_layer_answers_what_rmcp_cannot_take_and_forwards_the_rest() {
        let (mut input, mut lines, eof) = served(1024).await;
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let frames = [
            init.to_string(),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
            "not json".to_owned(),
            r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#.to_owned(),
            format!(
                r#"{{"jsonrpc":"2.0","id":"big","method":"ping","params":{{"pad":"{}"}}}}"#,
                "x".repeat(2000)
            ),
        ];
        for frame in &frames {
            input
                .write_all(format!("{frame}\n").as_bytes())
                .await
                .unwrap();
        }
        let mut got: Vec<Value> = Vec::new();
        for _ in 0..3 {
            got.push(serde_json::from_str(&reply(&mut lines).await).unwrap());
        }
        let by_id = |id: Value| got.iter().find(|m| m["id"] == id).cloned();
        assert!(
            by_id(json!(0)).is_some_and(|m| m.get("result").is_some()),
            "{got:?}"
        );
        assert_eq!(
            by_id(Value::Null).unwrap()["error"]["code"],
            -32700,
            "{got:?}"
        );
        let big = by_id(json!("big")).unwrap();
        assert_eq!(big["error"]["code"], -32600);
        assert_eq!(big["error"]["data"]["limit_bytes"], 1024);

        // An id written as a float comes back as written; rmcp knows it as 7.
        input
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":7.0,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        assert_eq!(
            reply(&mut lines).await,
            r#"{"jsonrpc":"2.0","id":7.0,"result":{}}"#
        );
        input
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"\\u0041\",\"method\":\"ping\"}\n")
            .await
            .unwrap();
        assert_eq!(
            reply(&mut lines).await,
            r#"{"jsonrpc":"2.0","id":"\u0041","result":{}}"#
        );

        // The end of input ends the stream and says so.
        drop(input);
        tokio::time::timeout(std::time::Duration::from_secs(10), eof.cancelled())
            .await
            .expect("end of input seen");
    }
}
