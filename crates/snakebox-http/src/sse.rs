//! The legacy HTTP+SSE transport (MCP 2024-11-05), for the clients that still speak it
//! (seed 002's users reach their server through `supergateway --sse …/sse?api_key=KEY`; some
//! clients fall back to it when `POST /sse` fails).
//!
//! `GET /sse` opens an event stream whose first event, `endpoint`, names where to post:
//! `/messages?sessionId=<128 random bits>`. Every message the client posts there (answered
//! `202 Accepted`) goes to an MCP service of its own for this stream, the same handler stdio
//! uses, bound to the tenant that opened the stream; the service's messages come back as
//! `message` events, with keep-alive comments between them. A post to a session of another
//! tenant, or to one that is gone, is "not found" like a session id that never existed. When
//! the stream closes, its service ends and the session id is forgotten.
//!
//! The key that opened the stream authorises every post: each is checked against the live key
//! store when it arrives (a revoked key's posts are refused, 401), and the stream itself ends
//! within a second of the revocation (the edge watches it, [`crate::live`]), which ends the
//! session and its calls.

use crate::refusal::refusal;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use serde::Deserialize;
use snakebox_engine::{Caller, EngineHandle};
use snakebox_server::SnakeboxServer;

use crate::live::{Credential, LiveKeys};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard, PollSender};

/// Messages queued for one session's service before a post waits.
const QUEUE: usize = 64;
/// How long a post waits for room in a full queue before it is refused.
const POST_WAIT: Duration = Duration::from_secs(30);
/// Keep-alive comments on an idle stream (proxies close silent connections).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

struct Entry {
    tenant: String,
    /// What authorised the `GET /sse` that opened it: checked again at each post.
    credential: Credential,
    to_server: mpsc::Sender<ClientJsonRpcMessage>,
}

/// The open SSE sessions of a server.
pub(crate) struct SseSessions {
    engine: EngineHandle,
    live: LiveKeys,
    sessions: Mutex<HashMap<String, Entry>>,
    stop: CancellationToken,
}

/// `POST /messages?sessionId=…`.
#[derive(Debug, Deserialize)]
pub(crate) struct SessionQuery {
    #[serde(rename = "sessionId")]
    session_id: String,
}

/// Forgets a session when its stream is dropped (the client went away, or the server stops).
struct Forget {
    sessions: Arc<SseSessions>,
    id: String,
    _service: DropGuard,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.sessions
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

fn session_id() -> Option<String> {
    crate::keys::random_hex(16).ok()
}

impl SseSessions {
    pub(crate) fn new(
        engine: EngineHandle,
        live: LiveKeys,
        stop: CancellationToken,
    ) -> Arc<SseSessions> {
        Arc::new(SseSessions {
            engine,
            live,
            sessions: Mutex::new(HashMap::new()),
            stop,
        })
    }
}

/// `GET /sse`: a new session for the request's tenant, and its event stream.
pub(crate) async fn open(
    State(sessions): State<Arc<SseSessions>>,
    Extension(caller): Extension<Caller>,
    Extension(credential): Extension<Credential>,
    downloads: Option<Extension<snakebox_server::Downloads>>,
) -> Response {
    let Some(id) = session_id() else {
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server could not make a session id",
            "retry; check that /dev/urandom is readable by the server",
        );
    };
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(QUEUE);
    let (to_client, from_server) = mpsc::channel::<ServerJsonRpcMessage>(QUEUE);
    let service_token = sessions.stop.child_token();
    sessions
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            id.clone(),
            Entry {
                tenant: caller.id().to_owned(),
                credential,
                to_server,
            },
        );
    let mut server = SnakeboxServer::for_caller(sessions.engine.clone(), caller);
    if let Some(Extension(downloads)) = downloads {
        server = server.with_downloads(downloads);
    }
    let token = service_token.clone();
    tokio::spawn(async move {
        let transport = (
            PollSender::new(to_client),
            tokio_stream::wrappers::ReceiverStream::new(from_client),
        );
        tokio::select! {
            served = server.serve(transport) => {
                if let Ok(running) = served {
                    let cancel = running.cancellation_token();
                    tokio::select! {
                        _ = running.waiting() => {}
                        () = token.cancelled() => cancel.cancel(),
                    }
                }
            }
            () = token.cancelled() => {}
        }
    });
    let forget = Forget {
        sessions: Arc::clone(&sessions),
        id: id.clone(),
        _service: service_token.drop_guard(),
    };
    let endpoint = Event::default()
        .event("endpoint")
        .data(format!("/messages?sessionId={id}"));
    let messages = futures_util::stream::unfold(
        (from_server, forget),
        |(mut from_server, forget)| async move {
            let message = from_server.recv().await?;
            let event = match serde_json::to_string(&message) {
                Ok(json) => Event::default().event("message").data(json),
                Err(err) => Event::default().comment(format!("unserialisable message: {err}")),
            };
            Some((event, (from_server, forget)))
        },
    );
    let stream = futures_util::StreamExt::map(
        futures_util::StreamExt::chain(futures_util::stream::iter([endpoint]), messages),
        Ok::<Event, Infallible>,
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// `POST /messages?sessionId=…`: one message for the session's service.
///
/// The session id is the credential (128 random bits, handed out on an authenticated
/// `GET /sse` and bound to its tenant): clients of this transport post to the endpoint they
/// were given, without the key. The key that opened the session must still be live, read
/// from the store at this post. A post that does carry a key must be of the session's tenant.
pub(crate) async fn post(
    State(sessions): State<Arc<SseSessions>>,
    caller: Option<Extension<Caller>>,
    Query(query): Query<SessionQuery>,
    body: axum::body::Bytes,
) -> Response {
    let found = {
        let open = sessions
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.get(&query.session_id)
            .filter(|entry| {
                caller
                    .as_ref()
                    .is_none_or(|Extension(caller)| entry.tenant == caller.id())
            })
            .map(|entry| {
                (
                    entry.to_server.clone(),
                    entry.credential,
                    entry.tenant.clone(),
                )
            })
    };
    let Some((to_server, credential, tenant)) = found else {
        return refusal(
            StatusCode::NOT_FOUND,
            "no such SSE session",
            "open one with GET /sse and post to the endpoint its first event names",
        );
    };
    // Read off the runtime's threads: the key store may be a database (`--database`).
    let live = sessions.live.clone();
    let checked = tokio::task::spawn_blocking(move || live.check(credential))
        .await
        .unwrap_or(Err(crate::keys::KeyError::Interrupted));
    match checked {
        Ok(Some(still)) if still.id() == tenant => {}
        Ok(_) => {
            return *crate::edge::unauthorized(
                "the API key that opened this SSE session is no longer valid (revoked)",
            );
        }
        Err(err) => {
            tracing::error!(error = %err.describe(), "the API key store cannot be read");
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server cannot check API keys right now",
                &err.hint(),
            );
        }
    }
    let message: ClientJsonRpcMessage = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(err) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                &format!("the body is not a JSON-RPC message: {err}"),
                "post one JSON-RPC request, notification or response as JSON",
            );
        }
    };
    match tokio::time::timeout(POST_WAIT, to_server.send(message)).await {
        Ok(Ok(())) => StatusCode::ACCEPTED.into_response(),
        Ok(Err(_)) => refusal(
            StatusCode::NOT_FOUND,
            "no such SSE session",
            "the session's stream has closed; open a new one with GET /sse",
        ),
        Err(_) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the session is not taking messages",
            "wait for replies on the event stream before posting more",
        ),
    }
}
