//! What one frame is, per JSON-RPC 2.0 and MCP, and what it gets: handed to rmcp, answered
//! with an error here, or dropped (a notification or response rmcp could not take; those get
//! no reply).
//!
//! The rule this enforces: every request with an id gets exactly one reply with that id
//! (echoed exactly as written: the raw JSON text of the id), every line that is not JSON a
//! `-32700`. rmcp sees only what it can read: each message is parsed here with rmcp's own
//! types, so nothing reaches it that it would drop or answer without the id.
//!
//! Reading a frame is done in steps, each answering what the one before could not:
//! 1. not UTF-8, or not JSON (RFC 8259): `-32700`, with the id when the part before the error
//!    holds one (a client waiting on it is released), else `null`;
//! 2. JSON but not one JSON-RPC object (a scalar, a batch): `-32600`;
//! 3. the members, each kept as raw text (so depth and odd strings cannot fail this step):
//!    `jsonrpc`, `id`, `method`, `params`, `result`, `error`; the shape they make must be a
//!    request, a notification or a response, else `-32600` with the id when it is a string
//!    or a number;
//! 4. rmcp's own parse of the whole message: a request it refuses is answered here (`-32602`
//!    for its params, `-32600` when the text holds what rmcp cannot represent: nesting past
//!    serde_json's 128 levels, a lone UTF-16 surrogate such as `"\ud800"`); a notification
//!    or response it refuses is dropped, as rmcp itself would.

use std::borrow::Cow;

use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorData, RequestId};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;

/// What to do with one frame.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A blank line: nothing.
    Skip,
    /// A message rmcp reads; `id` is the raw id of a request.
    Forward {
        message: Box<ClientJsonRpcMessage>,
        id: Option<Box<RawValue>>,
    },
    /// Answer with this error.
    Reply(Reply),
    /// A batch: answer with these errors, as one array.
    Batch(Vec<Reply>),
    /// A notification or a response rmcp cannot take: no reply, only a log line.
    Drop(String),
}

/// An error reply: the id (raw, `null` when unknown) and the error.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) id: Option<Box<RawValue>>,
    pub(crate) error: ErrorData,
}

impl Reply {
    /// A reply to a line that is not JSON.
    pub(crate) fn parse_error(id: Option<Box<RawValue>>, message: String, hint: &str) -> Self {
        Self {
            id,
            error: ErrorData::parse_error(message, Some(json!({ "hint": hint }))),
        }
    }

    /// A reply to a message that is not a valid request.
    pub(crate) fn invalid(id: Option<Box<RawValue>>, message: String, hint: &str) -> Self {
        Self {
            id,
            error: ErrorData::invalid_request(message, Some(json!({ "hint": hint }))),
        }
    }

    /// The reply as JSON (`"id": null` when the id is unknown, as JSON-RPC 2.0 asks).
    pub(crate) fn to_value_text(&self) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            jsonrpc: &'static str,
            id: Option<&'a RawValue>,
            error: &'a ErrorData,
        }
        serde_json::to_string(&Out {
            jsonrpc: "2.0",
            id: self.id.as_deref(),
            error: &self.error,
        })
    }
}

/// Read one frame (a line without its `\n`).
pub(crate) fn classify(line: &[u8]) -> Verdict {
    // RFC 8259 §8.1 lets a parser ignore a byte order mark; rmcp does.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line
        .iter()
        .all(|byte| matches!(byte, b' ' | b'\t' | b'\r' | b'\n'))
    {
        return Verdict::Skip;
    }
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(err) => {
            // Bytes that are not UTF-8 break a string, not the structure around it: read the
            // id from the text with them replaced, unless they were in the id itself.
            let id = recover_id(&String::from_utf8_lossy(line))
                .filter(|id| !id.get().contains(char::REPLACEMENT_CHARACTER));
            return Verdict::Reply(Reply::parse_error(
                id,
                format!(
                    "Parse error: the message is not valid UTF-8 (byte {})",
                    err.valid_up_to()
                ),
                "JSON text must be UTF-8: encode strings as UTF-8, or escape characters as \\uXXXX",
            ));
        }
    };
    match text.trim_start().as_bytes().first() {
        Some(b'{') => classify_object(text),
        Some(b'[') => classify_batch(text),
        _ => match serde_json::from_str::<IgnoredAny>(text) {
            Err(err) => Verdict::Reply(not_json(None, &err)),
            Ok(_) => Verdict::Reply(Reply::invalid(
                None,
                "Invalid request: a JSON-RPC message is an object".to_owned(),
                "send one object per line, such as {\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\"}",
            )),
        },
    }
}

/// The reply to a line that is not JSON.
fn not_json(id: Option<Box<RawValue>>, err: &serde_json::Error) -> Reply {
    Reply::parse_error(
        id,
        format!("Parse error: the message is not valid JSON ({err})"),
        "send one JSON-RPC message per line, as JSON (RFC 8259), with no newline inside it",
    )
}

/// The members of a JSON-RPC object, each as its raw text.
#[derive(Debug, Default)]
struct Members<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
    /// The first member written twice.
    repeated: Option<String>,
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Members::default();
                while let Some(key) = map.next_key::<&'de RawValue>()? {
                    let key = key_name(key);
                    let slot = match key.as_deref().unwrap_or_default() {
                        "jsonrpc" => &mut members.jsonrpc,
                        "id" => &mut members.id,
                        "method" => &mut members.method,
                        "params" => &mut members.params,
                        "result" => &mut members.result,
                        "error" => &mut members.error,
                        // Other members are allowed and ignored, as rmcp does.
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    let value: &'de RawValue = map.next_value()?;
                    if slot.is_some() {
                        members
                            .repeated
                            .get_or_insert_with(|| key.unwrap_or_default().into_owned());
                    } else {
                        *slot = Some(value);
                    }
                }
                Ok(members)
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// A member's name from its raw text; `None` when it cannot be read (a lone surrogate).
fn key_name(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    match text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        Some(name) if !name.contains('\\') => Some(Cow::Borrowed(name)),
        _ => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
    }
}

/// The id of a JSON object that may be cut short or broken after it: read up to the error,
/// keeping the first `id` member that is a string or a number and is followed by `,` or `}`
/// (a number cut short, `12` of `123`, would be another request's id).
pub(crate) fn recover_id(text: &str) -> Option<Box<RawValue>> {
    struct IdVisitor<'s, 't> {
        text: &'t str,
        found: &'s mut Option<Box<RawValue>>,
    }
    impl<'de> Visitor<'de> for IdVisitor<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<&'de RawValue>()? {
                if key_name(key).as_deref() == Some("id") && self.found.is_none() {
                    let value: &'de RawValue = map.next_value()?;
                    let end = (value.get().as_ptr() as usize)
                        .saturating_sub(self.text.as_ptr() as usize)
                        + value.get().len();
                    let ended = self
                        .text
                        .get(end..)
                        .is_some_and(|rest| rest.trim_start().starts_with([',', '}']));
                    if is_string_or_number(value) && ended {
                        *self.found = Some(value.to_owned());
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    let mut found = None;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // The error is expected (that is why the id is recovered); what was read before it counts.
    let _ = deserializer.deserialize_map(IdVisitor {
        text,
        found: &mut found,
    });
    found
}

/// A string or a number: what a JSON-RPC id may be (MCP: a string or an integer).
fn is_string_or_number(raw: &RawValue) -> bool {
    matches!(
        raw.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9')
    )
}

/// The first character of a raw JSON value.
fn starts_with(raw: &RawValue, bytes: &[u8]) -> bool {
    raw.get()
        .as_bytes()
        .first()
        .is_some_and(|first| bytes.contains(first))
}

fn classify_object(text: &str) -> Verdict {
    let members = match serde_json::from_str::<Members<'_>>(text) {
        Ok(members) => members,
        Err(err) => return Verdict::Reply(not_json(recover_id(text), &err)),
    };
    let echo = members
        .id
        .filter(|raw| is_string_or_number(raw))
        .map(RawValue::to_owned);
    let invalid =
        |message: String, hint: &str| Verdict::Reply(Reply::invalid(echo.clone(), message, hint));
    if let Some(key) = &members.repeated {
        return invalid(
            format!("Invalid request: the member `{key}` is written twice"),
            "write each member of the message once",
        );
    }
    match members.jsonrpc {
        None => {
            return invalid(
                "Invalid request: `jsonrpc` is missing".to_owned(),
                "every message carries \"jsonrpc\": \"2.0\"",
            );
        }
        Some(raw) if serde_json::from_str::<String>(raw.get()).ok().as_deref() != Some("2.0") => {
            return invalid(
                format!(
                    "Invalid request: `jsonrpc` must be \"2.0\", not `{}`",
                    raw.get()
                ),
                "every message carries \"jsonrpc\": \"2.0\"",
            );
        }
        Some(_) => {}
    }
    if let Some(raw) = members.id {
        if !is_string_or_number(raw) {
            return invalid(
                format!(
                    "Invalid request: an id is a string or an integer, not `{}`",
                    raw.get()
                ),
                "use an id such as 1 or \"req-1\" (MCP does not allow null ids)",
            );
        }
        if let Err(err) = serde_json::from_str::<RequestId>(raw.get()) {
            return invalid(
                format!(
                    "Invalid request: the id `{}` cannot be used ({err})",
                    raw.get()
                ),
                "use a string id, or an integer from -9223372036854775808 to 9223372036854775807",
            );
        }
    }
    let is_response = members.result.is_some() || members.error.is_some();
    if let Some(method_raw) = members.method {
        if is_response {
            return invalid(
                "Invalid request: a request or notification carries no `result` or `error`"
                    .to_owned(),
                "a message with `method` is a request or a notification; `result` and `error` belong to responses",
            );
        }
        let Ok(method) = serde_json::from_str::<String>(method_raw.get()) else {
            return invalid(
                format!(
                    "Invalid request: `method` must be a string of valid Unicode, not `{}`",
                    method_raw.get()
                ),
                "name the method as a string, such as \"tools/call\"",
            );
        };
        if let Some(params) = members.params
            && !starts_with(params, b"{[n")
        {
            return invalid(
                format!(
                    "Invalid request: `params` must be an object, not `{}`",
                    params.get()
                ),
                "pass the parameters as an object, such as {\"name\": ..., \"arguments\": {...}}",
            );
        }
        // JSON-RPC allows positional params; MCP's methods take named ones only.
        if let Some(params) = members.params
            && starts_with(params, b"[")
            && is_typed_method(&method)
        {
            return match members.id {
                None => Verdict::Drop(format!(
                    "notification `{method}` dropped: its params are an array"
                )),
                Some(_) => Verdict::Reply(Reply {
                    id: echo,
                    error: ErrorData::invalid_params(
                        format!(
                            "Invalid params for `{method}`: MCP's params are an object of named members, not an array"
                        ),
                        Some(
                            json!({ "hint": "send `params` as an object (`{}` or leave it out when there are none), such as {\"name\": ..., \"arguments\": {...}} for tools/call" }),
                        ),
                    ),
                }),
            };
        }
        return match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            // rmcp reads a known method whose params do not fit as a custom one, and then
            // answers "method not found" (a request) or ignores it (a notification).
            Ok(message) if is_typed_method(&method) && is_custom(&message) => {
                if members.id.is_none() {
                    Verdict::Drop(format!(
                        "notification `{method}` dropped: its params do not fit"
                    ))
                } else {
                    Verdict::Reply(Reply {
                        id: echo,
                        error: ErrorData::invalid_params(
                            format!(
                                "Invalid params for `{method}`: they do not match the method's schema"
                            ),
                            Some(
                                json!({ "hint": "check the parameters against the MCP schema of the method (tools/list gives each tool's inputSchema)" }),
                            ),
                        ),
                    })
                }
            }
            Ok(message) => Verdict::Forward {
                message: Box::new(message),
                id: members.id.map(RawValue::to_owned),
            },
            Err(err) if members.id.is_none() => {
                Verdict::Drop(format!("notification `{method}` dropped: {err}"))
            }
            Err(err) if err.is_data() => Verdict::Reply(Reply {
                id: echo,
                error: ErrorData::invalid_params(
                    format!("Invalid params for `{method}`: {err}"),
                    Some(
                        json!({ "hint": "check the parameters against the method's schema (tools/list gives each tool's inputSchema)" }),
                    ),
                ),
            }),
            Err(err) => invalid(
                format!("Invalid request: the message cannot be read ({err})"),
                unreadable_hint(&err),
            ),
        };
    }
    if is_response {
        if members.result.is_some() && members.error.is_some() {
            return invalid(
                "Invalid response: it carries both `result` and `error`".to_owned(),
                "a response carries either `result` or `error`",
            );
        }
        if members.id.is_none() {
            return invalid(
                "Invalid response: the id is missing".to_owned(),
                "a response carries the id of the request it answers",
            );
        }
        return match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            Ok(message) => Verdict::Forward {
                message: Box::new(message),
                id: None,
            },
            Err(err) => invalid(
                format!("Invalid response: it cannot be read ({err})"),
                "an error is an object with an integer `code` and a string `message`",
            ),
        };
    }
    invalid(
        "Invalid request: the message has no `method` (nor `result` or `error`)".to_owned(),
        "a request carries \"method\", such as \"tools/call\"",
    )
}

/// The methods a client sends that rmcp reads into types of their own (MCP 2025-11-25 and
/// 2026-07-28); any other method is a custom one.
const TYPED_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
    "notifications/cancelled",
    "notifications/initialized",
    "notifications/progress",
    "notifications/roots/list_changed",
];

fn is_typed_method(method: &str) -> bool {
    TYPED_METHODS.contains(&method)
}

/// rmcp read the message as a custom request or notification.
fn is_custom(message: &ClientJsonRpcMessage) -> bool {
    match message {
        ClientJsonRpcMessage::Request(request) => {
            matches!(request.request, ClientRequest::CustomRequest(_))
        }
        ClientJsonRpcMessage::Notification(notification) => matches!(
            notification.notification,
            ClientNotification::CustomNotification(_)
        ),
        _ => false,
    }
}

/// The hint for valid JSON that serde_json (and so rmcp) cannot read.
fn unreadable_hint(err: &serde_json::Error) -> &'static str {
    let text = err.to_string();
    if text.contains("recursion limit") {
        "nest the parameters at most 127 levels deep"
    } else if text.contains("surrogate") || text.contains("hex escape") {
        "strings must be valid Unicode: a lone UTF-16 surrogate such as \\ud800 cannot be represented"
    } else {
        "check the message against the MCP schema"
    }
}

/// A JSON array: a JSON-RPC batch. MCP dropped batches in its 2025-06-18 revision and rmcp
/// does not take them; every request in one is answered with an error, with its id.
fn classify_batch(text: &str) -> Verdict {
    let items = match serde_json::from_str::<Vec<&RawValue>>(text) {
        Ok(items) => items,
        Err(err) => return Verdict::Reply(not_json(None, &err)),
    };
    let hint =
        "send each message on a line of its own (MCP has no batches since its 2025-06-18 revision)";
    if items.is_empty() {
        return Verdict::Reply(Reply::invalid(
            None,
            "Invalid request: an empty batch".to_owned(),
            hint,
        ));
    }
    let replies: Vec<Reply> = items
        .iter()
        .filter_map(|item| serde_json::from_str::<Members<'_>>(item.get()).ok())
        .filter_map(|members| members.id.filter(|raw| is_string_or_number(raw)))
        .map(|id| {
            Reply::invalid(
                Some(id.to_owned()),
                "Invalid request: batches are not supported".to_owned(),
                hint,
            )
        })
        .collect();
    if replies.is_empty() {
        return Verdict::Reply(Reply::invalid(
            None,
            "Invalid request: batches are not supported".to_owned(),
            hint,
        ));
    }
    Verdict::Batch(replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict in a word: `skip`, `drop`, `forward <id>`, `reply <code> <id>`, `batch <ids>`.
    fn summary(verdict: &Verdict) -> String {
        let id = |id: &Option<Box<RawValue>>| {
            id.as_ref()
                .map_or("null".to_owned(), |id| id.get().to_owned())
        };
        match verdict {
            Verdict::Skip => "skip".to_owned(),
            Verdict::Drop(_) => "drop".to_owned(),
            Verdict::Forward { id: raw, .. } => format!("forward {}", id(raw)),
            Verdict::Reply(reply) => format!("reply {} {}", reply.error.code.0, id(&reply.id)),
            Verdict::Batch(replies) => format!(
                "batch {}",
                replies
                    .iter()
                    .map(|reply| id(&reply.id))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    /// `name: frame => "summary",` — one test per frame.
    macro_rules! frames {
        ($($name:ident: $frame:expr => $expected:expr,)*) => {$(
            #[test]
            fn $name() {
                let frame: &[u8] = $frame;
                let verdict = classify(frame);
                assert_eq!(summary(&verdict), $expected, "{verdict:?}");
            }
        )*};
    }

    frames! {
        // Valid messages go to rmcp.
        request: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"# => "forward 1",
        request_with_a_string_id: br#"{"jsonrpc":"2.0","id":"a-1","method":"tools/list","params":{}}"# => "forward \"a-1\"",
        request_with_crlf_and_bom: b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}" => "forward 2",
        request_with_an_unknown_method: br#"{"jsonrpc":"2.0","id":3,"method":"nope/nope"}"# => "forward 3",
        request_with_an_extra_member: br#"{"jsonrpc":"2.0","id":4,"method":"ping","extra":[1]}"# => "forward 4",
        id_written_as_a_float_integer_keeps_its_text: br#"{"jsonrpc":"2.0","id":5.0,"method":"ping"}"# => "forward 5.0",
        negative_id: br#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"ping"}"# => "forward -9223372036854775808",
        notification: br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"# => "forward null",
        response_to_the_server: br#"{"jsonrpc":"2.0","id":7,"result":{}}"# => "forward null",
        error_response_to_the_server: br#"{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"no"}}"# => "forward null",
        blank_line: b"  \t" => "skip",
        empty_line: b"" => "skip",

        // Not JSON: -32700, with the id when the part before the error has one.
        not_json: b"hello" => "reply -32700 null",
        cut_short_before_the_id: br#"{"jsonrpc":"2.0","#=> "reply -32700 null",
        cut_short_after_the_id: br#"{"jsonrpc":"2.0","id":8,"method":"pi"# => "reply -32700 8",
        trailing_garbage: br#"{"jsonrpc":"2.0","id":9,"method":"ping"} x"# => "reply -32700 9",
        two_messages_on_one_line: br#"{"jsonrpc":"2.0","id":10,"method":"ping"}{"jsonrpc":"2.0","id":11,"method":"ping"}"# => "reply -32700 10",
        single_quotes: b"{'jsonrpc':'2.0','id':1}" => "reply -32700 null",
        invalid_utf8_in_a_string: b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}" => "reply -32700 12",
        invalid_utf8_before_the_id: b"{\"x\":\"\xc3\",\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"ping\"}" => "reply -32700 13",
        invalid_utf8_in_the_id: b"{\"jsonrpc\":\"2.0\",\"id\":\"a\xffb\",\"method\":\"ping\"}" => "reply -32700 null",
        invalid_utf8_cuts_the_id_short: b"{\"jsonrpc\":\"2.0\",\"id\":12\xff3,\"method\":\"ping\"}" => "reply -32700 null",
        cut_short_inside_the_id: br#"{"jsonrpc":"2.0","id":12"# => "reply -32700 null",
        cut_short_just_after_the_id: br#"{"jsonrpc":"2.0","id":"ab","# => "reply -32700 \"ab\"",
        form_feed_is_not_json_whitespace: b"\x0c" => "reply -32700 null",
        lone_surrogate_in_a_key: br#"{"\ud800":1,"jsonrpc":"2.0","id":32,"method":"ping"}"# => "reply -32600 32",
        escaped_member_names_count: br#"{"jsonrpc":"2.0","\u0069d":33,"method":"ping"}"# => "forward 33",
        broken_batch: b"[{\"id\":1}" => "reply -32700 null",
        nan: b"NaN" => "reply -32700 null",

        // JSON, but not a valid message: -32600, with the id when it is a string or a number.
        scalar: b"42" => "reply -32600 null",
        string: b"\"ping\"" => "reply -32600 null",
        null: b"null" => "reply -32600 null",
        empty_object: b"{}" => "reply -32600 null",
        no_jsonrpc: br#"{"id":14,"method":"ping"}"# => "reply -32600 14",
        wrong_jsonrpc: br#"{"jsonrpc":"1.0","id":15,"method":"ping"}"# => "reply -32600 15",
        jsonrpc_as_a_number: br#"{"jsonrpc":2.0,"id":16,"method":"ping"}"# => "reply -32600 16",
        method_as_a_number: br#"{"jsonrpc":"2.0","id":17,"method":17}"# => "reply -32600 17",
        method_as_null: br#"{"jsonrpc":"2.0","id":18,"method":null}"# => "reply -32600 18",
        params_as_a_string: br#"{"jsonrpc":"2.0","id":19,"method":"tools/call","params":"x"}"# => "reply -32600 19",
        request_with_a_result: br#"{"jsonrpc":"2.0","id":20,"method":"ping","result":{}}"# => "reply -32600 20",
        request_with_an_error: br#"{"jsonrpc":"2.0","id":21,"method":"ping","error":{"code":1,"message":"x"}}"# => "reply -32600 21",
        id_written_twice: br#"{"jsonrpc":"2.0","id":22,"id":23,"method":"ping"}"# => "reply -32600 22",
        id_past_64_bits: br#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"ping"}"# => "reply -32600 18446744073709551616",
        id_far_past_64_bits: br#"{"jsonrpc":"2.0","id":-123456789012345678901234567890,"method":"ping"}"# => "reply -32600 -123456789012345678901234567890",
        id_with_a_fraction: br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"# => "reply -32600 1.5",
        id_null: br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"# => "reply -32600 null",
        id_bool: br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"# => "reply -32600 null",
        id_object: br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"# => "reply -32600 null",
        id_with_a_lone_surrogate: br#"{"jsonrpc":"2.0","id":"\ud800","method":"ping"}"# => "reply -32600 \"\\ud800\"",
        response_with_both: br#"{"jsonrpc":"2.0","id":24,"result":{},"error":{"code":1,"message":"x"}}"# => "reply -32600 24",
        response_without_an_id: br#"{"jsonrpc":"2.0","result":{}}"# => "reply -32600 null",
        response_with_a_bad_error: br#"{"jsonrpc":"2.0","id":25,"error":"bad"}"# => "reply -32600 25",
        invalid_notification: br#"{"jsonrpc":"2.0","method":5}"# => "reply -32600 null",

        // Valid JSON rmcp cannot read: answered here (requests) or dropped (notifications).
        lone_surrogate_in_params: br#"{"jsonrpc":"2.0","id":26,"method":"tools/call","params":{"name":"execute_python","arguments":{"script":"\ud800"}}}"# => "reply -32600 26",
        params_as_an_array: br#"{"jsonrpc":"2.0","id":34,"method":"tools/list","params":[]}"# => "reply -32602 34",
        params_as_an_array_of_a_notification: br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[]}"# => "drop",
        params_of_the_wrong_type: br#"{"jsonrpc":"2.0","id":27,"method":"initialize","params":{"protocolVersion":5}}"# => "reply -32602 27",
        tool_call_without_a_name: br#"{"jsonrpc":"2.0","id":29,"method":"tools/call","params":{"arguments":{}}}"# => "reply -32602 29",
        tool_call_with_a_numeric_name: br#"{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":5}}"# => "reply -32602 30",
        tool_call: br#"{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"execute_python","arguments":{"script":"1"}}}"# => "forward 31",
        custom_notification: br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":{"a":1}}"# => "forward null",
        notification_rmcp_cannot_read: br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":true}}"# => "drop",

        // Batches: every request in one is answered, with its id.
        batch: br#"[{"jsonrpc":"2.0","id":28,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"b","method":"ping"}]"# => "batch 28,\"b\"",
        batch_of_notifications: br#"[{"jsonrpc":"2.0","method":"notifications/initialized"}]"# => "reply -32600 null",
        empty_batch: b"[]" => "reply -32600 null",
    }

    /// serde_json stops at 128 levels; the request must still be answered with its id.
    #[test]
    fn deep_nesting_is_answered_with_the_id() {
        for depth in [126, 127, 128, 129, 1000, 100_000] {
            let frame = format!(
                r#"{{"jsonrpc":"2.0","id":{depth},"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}{}}}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            );
            let verdict = classify(frame.as_bytes());
            let summary = summary(&verdict);
            assert!(
                summary == format!("forward {depth}")
                    || summary.starts_with("reply ") && summary.ends_with(&format!(" {depth}")),
                "depth {depth}: {summary}"
            );
            if depth >= 127 {
                assert_eq!(summary, format!("reply -32600 {depth}"), "depth {depth}");
            }
        }
    }

    #[test]
    fn replies_carry_the_id_as_written_and_null_when_unknown() {
        let Verdict::Reply(reply) = classify(br#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#)
        else {
            panic!("not a reply");
        };
        let text = reply.to_value_text().unwrap();
        assert!(
            text.starts_with(r#"{"jsonrpc":"2.0","id":1e400,"error":{"code":-32600,"#),
            "{text}"
        );
        assert!(text.contains("hint"), "{text}");
        let Verdict::Reply(reply) = classify(b"x") else {
            panic!("not a reply");
        };
        let text = reply.to_value_text().unwrap();
        assert!(
            text.starts_with(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"#),
            "{text}"
        );
    }
}
