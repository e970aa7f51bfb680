"""The stdio framing, frame by frame (issue 12, items 4 and 8).

A malformed-frame corpus of several hundred lines, generated here, goes to the real binary
over its stdin, and every reply is checked: every frame with an id gets exactly one reply with
exactly that id, every line that is not JSON exactly one -32700, frames that are answered
without an id (an id that is not a string or a number, a line cut before its id) exactly one
reply with id null, notifications and responses none, and nothing else appears on stdout. A
ping after each frame marks where its replies end, so a reply with id null is traced to the
frame that caused it. Then: a request reusing the id of one still in flight, a line over the
frame limit, a real tools/call as proof of life, and the server's memory after a 64 MiB line.

The corpus needs a raw client (no SDK sends a broken frame); the official SDK's own message
model checks that each reply is a JSON-RPC message.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from conftest import backend_flags, process_rss_kib

# The limit the corpus server runs with (through the environment, so the flag's absence in an
# older binary does not stop it from starting).
FRAME_LIMIT = 2 * 1024 * 1024
REPLY_TIMEOUT = 60.0


def load(data: bytes | str) -> Any:
    """JSON with floats kept as their text, so `1.0` and `1` are different ids."""
    return json.loads(data, parse_float=lambda text: ("float", text), parse_constant=lambda text: ("const", text))


def id_key(value: Any) -> Any:
    """A hashable id that tells `1` from `"1"` (and from `True`)."""
    return (type(value).__name__, json.dumps(value) if not isinstance(value, tuple) else value[1])


class RawServer:
    """`snakebox serve` over pipes: frames in, lines out (read by a thread, kept in order)."""

    def __init__(self, binary: Path, data_dir: Path, env: dict[str, str] | None = None) -> None:
        full_env = {"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        full_env.update(env or {})
        self.stderr_path = data_dir / f"stderr-{time.monotonic_ns()}.log"
        self.stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [str(binary), "serve", "--data-dir", str(data_dir), "--no-warm-cache", *backend_flags()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=full_env,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.next_sync = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, frame: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(frame + b"\n")
        self.process.stdin.flush()

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(json.dumps(message).encode())

    def line(self, timeout: float = REPLY_TIMEOUT) -> bytes:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no reply within {timeout} s; stderr:\n{self.stderr_text()}") from None
        if line is None:
            raise AssertionError(f"the server closed its stdout (exit {self.process.poll()}); stderr:\n{self.stderr_text()}")
        return line

    def until(self, wanted: Any, timeout: float = REPLY_TIMEOUT) -> tuple[list[Any], Any]:
        """Read replies until the one with id `wanted`; return those before it, and it."""
        before = []
        deadline = time.monotonic() + timeout
        while True:
            message = parse_reply(self.line(max(0.1, deadline - time.monotonic())))
            if isinstance(message, dict) and id_key(message.get("id")) == id_key(wanted):
                return before, message
            before.append(message)

    def call(self, method: str, params: dict[str, Any] | list[Any] | None, id: Any) -> tuple[list[Any], Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        self.send_json(message)
        return self.until(id)

    def initialize(self) -> None:
        before, reply = self.call(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "frames", "version": "1"}},
            "init",
        )
        assert not before and "result" in reply, reply
        self.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def stderr_text(self) -> str:
        self.stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


# Replies the official SDK cannot read as a JSON-RPC message (kept, so that a test can list
# them beside the frames that got them).
UNREADABLE: list[str] = []


def parse_reply(line: bytes) -> Any:
    """One line of stdout: UTF-8 JSON, a JSON-RPC message (or a batch of them)."""
    assert line.endswith(b"\n"), f"a reply not ended by a newline: {line[:200]!r}"
    text = line.decode("utf-8")
    message = load(text)
    for item in message if isinstance(message, list) else [message]:
        assert isinstance(item, dict) and item.get("jsonrpc") == "2.0", f"not JSON-RPC: {text[:300]}"
        if not isinstance(item.get("id"), tuple):
            # The official SDK's model of a message (it has no float ids; MCP ids are
            # strings or integers).
            try:
                types.jsonrpc_message_adapter.validate_python(item, by_name=False)
            except ValueError as err:
                UNREADABLE.append(f"{text[:200]} ({str(err).splitlines()[0]})")
    return message


# ---------------------------------------------------------------------------------------------
# The corpus.
# ---------------------------------------------------------------------------------------------


@dataclass
class Expect:
    """What one frame must get back."""

    frame: bytes
    what: str
    ids: list[Any] = field(default_factory=list)  # each gets exactly one reply with that id
    nulls: int = 0  # replies with id null
    code: int | None = None  # the code of every reply, when it matters
    own: Any = None  # a line that is not JSON: its -32700 may carry this id instead of null
    parse_error: bool = False
    mentions: str | None = None  # text the reply's message must hold


class Corpus:
    def __init__(self) -> None:
        self.frames: list[Expect] = []
        self.counter = 0

    def id(self) -> int:
        self.counter += 1
        return 1000 + self.counter

    def add(self, frame: bytes, what: str, **expect: Any) -> None:
        assert b"\n" not in frame, what
        self.frames.append(Expect(frame=frame, what=what, **expect))

    def reply(self, frame: bytes, what: str, id: Any, code: int | None = None, **more: Any) -> None:
        self.add(frame, what, ids=[id], code=code, **more)

    def null(self, frame: bytes, what: str, code: int) -> None:
        self.add(frame, what, nulls=1, code=code)

    def not_json(self, frame: bytes, what: str, own: Any = None) -> None:
        self.add(frame, what, parse_error=True, own=own, code=-32700)

    def silent(self, frame: bytes, what: str) -> None:
        self.add(frame, what)


def request(id: Any, method: Any = "ping", params: Any = None, **members: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    message.update(members)
    return message


def dumps(message: Any) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode()


def nested(depth: int, leaf: str = "[]") -> str:
    return "[" * depth + "]" * depth if leaf == "[]" else '{"a":' * depth + "1" + "}" * depth


def build_corpus() -> Corpus:
    c = Corpus()

    # Valid requests, some unusual: rmcp answers each, with its id.
    for method in ["ping", "tools/list", "resources/list", "prompts/list", "nope/nope", "", "x" * 300]:
        i = c.id()
        c.reply(dumps(request(i, method)), f"request {method[:20]!r}", i)
    i = c.id()
    c.reply(dumps(request(i)) + b"\r", "a CRLF line", i)
    i = c.id()
    c.reply(b"\xef\xbb\xbf" + dumps(request(i)), "a byte order mark", i)
    i = c.id()
    c.reply(b"   " + dumps(request(i)) + b"\t ", "surrounding whitespace", i)

    # Lines that are not JSON, cut at every point of two requests: -32700 (its id only when
    # the id was whole before the cut).
    for template in [
        lambda i: request(i, "tools/call", {"name": "execute_python", "arguments": {"script": "print(1)"}}),
        lambda i: {"id": i, "jsonrpc": "2.0", "method": "ping", "params": {"a": [1, 2.5, None, True, {"b": "c"}]}},
    ]:
        text = dumps(template(0))
        for cut in range(1, len(text)):
            i = c.id()
            frame = dumps(template(i))[:cut]
            if frame.strip():
                c.not_json(frame, f"cut at {cut}", own=i)
    garbage = [
        b"x", b"{", b"}", b"[", b"]", b"{]", b"[}", b"{'jsonrpc': '2.0'}", b'{"a":1,}', b"[1,]", b"{a:1}",
        b"NaN", b"Infinity", b"-Infinity", b"01", b"1.", b".5", b"+1", b"--1", b"1e", b"tru", b"nul",
        b'"abc', b'"\\x"', b'"\\u12"', b'"\\ud80"', b'{"a" 1}', b'{"a":}', b"{,}", b'{"a":1 "b":2}', b"\x00",
        b"\x01{}", b'{"a":"\x01"}', b'{"a":"tab\there"}', b"\x0c", b"\x0b{}", b"{}{}", b"{} {}", b"1 2", b"[] x",
        b"/* c */ {}", b"// c", b"<xml/>", b"jsonrpc=2.0&id=1", b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xf0\x9f\x98",
        b"\xc0\xaf", b"\xfe\xff", '{"id":1}'.encode("utf-16"), '{"id":1}'.encode("utf-32"), b"\x1b[31m{}",
        b'{"jsonrpc":"2.0",,"method":"ping"}', b"{\"a\":1}}", b"[[]",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"", b'{"a":tru}', b'{"a":-}', b'{"a":1.e5}',
        b'{"a":0x10}', b'{"a":"\\u00zz"}', b'{"a":"\\q"}', b"'single'", b"`backtick`", b"\\", b'"', b"{{}}",
    ]
    for frame in garbage:
        c.not_json(frame, f"garbage {frame[:20]!r}")
    for cut in [b"{\"id\":1234567", b'{"jsonrpc":"2.0","id":"abc']:
        c.not_json(cut, f"cut inside the id {cut!r}")
    i = c.id()
    c.not_json(f'{{"jsonrpc":"2.0","id":{i},"method":"ping"'.encode(), "no closing brace", own=i)

    # Bytes that are not UTF-8 inside a request: -32700, with the id.
    bad_bytes = [b"\xff", b"\xfe", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xe2\x82\x28", b"\xf0\x28\x8c\xbc",
                 b"\xf0\x90\x28\xbc", b"\xf8\xa1\xa1\xa1\xa1", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]
    for bad in bad_bytes:
        i = c.id()
        c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"execute_python","arguments":{{"script":"'.encode() + bad + b'"}}}',
                f"not UTF-8 in a string after the id: {bad!r}", i, code=-32700)
        i = c.id()
        c.reply(b'{"params":{"s":"' + bad + f'"}},"jsonrpc":"2.0","id":{i},"method":"ping"}}'.encode(),
                f"not UTF-8 in a string before the id: {bad!r}", i, code=-32700)
    i = c.id()
    c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"pi'.encode() + b"\xffng\"}", "not UTF-8 in the method", i, code=-32700)

    # Lone surrogates (valid JSON text that no Rust string can hold): an error with the id.
    for escape in ["\\ud800", "\\udfff", "\\udc00\\ud800", "a\\ud83d", "\\ud83d b", "\\ud800\\u0041"]:
        i = c.id()
        c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"execute_python","arguments":{{"script":"{escape}"}}}}}}'.encode(),
                f"lone surrogate {escape} in the script", i)
        i = c.id()
        c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"{escape}"}}'.encode(), f"lone surrogate {escape} in the method", i)
    for n, escape in enumerate(["\\ud800", "\\udfff", "x\\ud800y"]):
        raw_id = f'"{escape}-{n}"'
        c.reply(f'{{"jsonrpc":"2.0","id":{raw_id},"method":"ping"}}'.encode(), f"lone surrogate in the id {raw_id}", load(raw_id))
    i = c.id()
    c.reply(f'{{"\\ud800":1,"jsonrpc":"2.0","id":{i},"method":"ping"}}'.encode(), "lone surrogate in a member name", i)
    i = c.id()
    c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"ping","params":{{"ok":"\\ud83d\\ude00"}}}}'.encode(), "a surrogate pair is fine", i)

    # Deep nesting: serde_json stops at 128 levels; every request still gets its reply.
    for depth in [100, 125, 126, 127, 128, 129, 130, 200, 1000, 10_000, 100_000]:
        for leaf in ["[]", "{}"]:
            i = c.id()
            c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"execute_python","arguments":{{"script":"1","x":{nested(depth, leaf)}}}}}}}'.encode(),
                    f"arguments nested {depth} deep ({leaf})", i)
        i = c.id()
        c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"ping","params":{{"meta":{nested(depth)}}}}}'.encode(), f"ping params nested {depth} deep", i)
    i = c.id()
    c.reply(f'{{"jsonrpc":"2.0","method":"ping","params":{{"x":{nested(500)}}},"id":{i}}}'.encode(), "nesting before the id", i)

    # Wrong types for every member.
    for value in [None, 2, 2.0, "1.0", "", "2.0 ", True, [], {}, ["2.0"]]:
        i = c.id()
        c.reply(dumps({"jsonrpc": value, "id": i, "method": "ping"}), f"jsonrpc = {value!r}", i, code=-32600)
    i = c.id()
    c.reply(dumps({"id": i, "method": "ping"}), "no jsonrpc", i, code=-32600)
    for value in [5, None, True, [], {}, ["ping"], 1.5]:
        i = c.id()
        c.reply(dumps(request(i, value)), f"method = {value!r}", i, code=-32600)
    for value in [5, "x", True, 1.5, ""]:
        i = c.id()
        c.reply(dumps(request(i, "tools/call", value)), f"params = {value!r}", i, code=-32600)
    for params in [{"name": 5}, {"arguments": {}}, {"name": None}, {"name": "execute_python", "arguments": 5},
                   {"name": "execute_python", "arguments": "x"}, {"name": ["execute_python"]}]:
        i = c.id()
        c.reply(dumps(request(i, "tools/call", params)), f"tools/call params {params}", i)
    for params in [{"name": "execute_python", "arguments": {"script": 5}}, {"name": "execute_python", "arguments": {"script": "1", "timeout_seconds": "x"}},
                   {"name": "execute_python", "arguments": {}}, {"name": "no_such_tool", "arguments": {}}]:
        i = c.id()
        c.reply(dumps(request(i, "tools/call", params)), f"tool arguments {params['arguments']}", i)
    for method, params in [("initialize", {"protocolVersion": 5}), ("logging/setLevel", {"level": 5}), ("resources/read", {"uri": 5}),
                           ("completion/complete", {"ref": 5}), ("tools/list", {"cursor": 5}), ("ping", [1, 2]), ("tools/list", [])]:
        i = c.id()
        c.reply(dumps(request(i, method, params)), f"{method} params {params}", i)

    # Ids: strings and integers of any size come back exactly; others get id null.
    for raw_id in ["9223372036854775807", "-9223372036854775808", "9223372036854775808", "18446744073709551616",
                   "-9223372036854775809", "123456789012345678901234567890", "-123456789012345678901234567890",
                   "1" + "0" * 400, "700001.5", "700002.0", "7e5", "1e400", "-0", '""', '"' + "i" * 5000 + '"',
                   '"ünïcödé"', '"\\u0041\\u0042"', '"\\u0000"', '"\\ud83d\\ude00"', '"with \\"quotes\\""', '"1001"']:
        frame = f'{{"jsonrpc":"2.0","id":{raw_id},"method":"ping"}}'.encode()
        c.reply(frame, f"id {raw_id[:30]}", load(raw_id))
    for raw_id in ["null", "true", "false", "[]", "[1]", "{}", '{"id":1}']:
        c.null(f'{{"jsonrpc":"2.0","id":{raw_id},"method":"ping"}}'.encode(), f"id {raw_id}", -32600)

    # Extra members.
    for extra in [{"result": {}}, {"error": {"code": 1, "message": "x"}}, {"result": None}, {"result": {}, "error": {}}]:
        i = c.id()
        c.reply(dumps(request(i, "ping", None, **extra)), f"a request with {list(extra)}", i, code=-32600)
    for extra in [{"foo": 1}, {"params2": {}}, {"ID": 5}, {"_meta": {}}]:
        i = c.id()
        c.reply(dumps(request(i, "ping", None, **extra)), f"a request with the extra {list(extra)}", i)
    i = c.id()
    c.reply(f'{{"jsonrpc":"2.0","id":{i},"id":{i + 500000},"method":"ping"}}'.encode(), "the id written twice", i, code=-32600)
    i = c.id()
    c.reply(f'{{"jsonrpc":"2.0","id":{i},"method":"ping","method":"tools/list"}}'.encode(), "the method written twice", i, code=-32600)

    # Notifications: never a reply, valid or not rmcp's to read; invalid messages without an
    # id get -32600 with id null.
    for notification in [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999999, "reason": "x"}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": True}},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"a": 1}},
        {"jsonrpc": "2.0", "method": "ping"},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": 5}},
        {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"x": "\ud800"}},
    ]:
        c.silent(json.dumps(notification).encode(), f"notification {notification['method']}")
    for invalid in [{"jsonrpc": "2.0", "method": 5}, {"jsonrpc": "1.0", "method": "ping"}, {"method": "ping"}, {}, {"jsonrpc": "2.0"},
                    {"jsonrpc": "2.0", "method": "ping", "params": 5}, {"jsonrpc": "2.0", "method": "ping", "result": 1}]:
        c.null(dumps(invalid), f"invalid message without an id {invalid}", -32600)
    for scalar in [b"1", b'"ping"', b"null", b"true", b"-1.5e3"]:
        c.null(scalar, f"scalar {scalar!r}", -32600)

    # Responses from the client: no reply when valid (nothing here asked), -32600 when not.
    for response in [{"jsonrpc": "2.0", "id": "resp-1", "result": {}}, {"jsonrpc": "2.0", "id": 77777777, "error": {"code": -1, "message": "x"}}]:
        c.silent(dumps(response), f"response {response}")
    i = c.id()
    c.reply(dumps({"jsonrpc": "2.0", "id": i, "result": {}, "error": {"code": 1, "message": "x"}}), "response with result and error", i, code=-32600)
    i = c.id()
    c.reply(dumps({"jsonrpc": "2.0", "id": i, "error": "bad"}), "response with a bad error", i, code=-32600)
    c.null(dumps({"jsonrpc": "2.0", "result": {}}), "response without an id", -32600)

    # Batches (dropped by MCP in 2025-06-18): every request in one is answered with its id.
    for size in [1, 2, 5]:
        ids = [c.id() for _ in range(size)]
        batch = [request(i) for i in ids] + [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
        c.add(dumps(batch), f"batch of {size}", ids=ids, code=-32600)
    c.null(b"[]", "empty batch", -32600)
    c.null(dumps([{"jsonrpc": "2.0", "method": "notifications/initialized"}]), "batch of notifications", -32600)
    c.null(b"[1,2,3]", "batch of numbers", -32600)

    # Over the frame limit: an error naming the limit, with the id when it comes first.
    i = c.id()
    pad = "x" * (FRAME_LIMIT + 1000)
    c.reply(dumps(request(i, "ping", {"pad": pad})), "over the limit, id first", i, code=-32600, mentions=str(FRAME_LIMIT))
    c.add(dumps({"jsonrpc": "2.0", "method": "ping", "params": {"pad": pad}, "id": c.id()}), "over the limit, id last",
          nulls=1, code=-32600, mentions=str(FRAME_LIMIT))
    i = c.id()
    c.reply(dumps(request(i, "ping", {"pad": "x" * (FRAME_LIMIT - 200)})), "just under the limit", i)
    return c


def message_text(message: dict[str, Any]) -> str:
    return json.dumps(message.get("error", {}))


def test_every_frame_gets_exactly_its_replies(snakebox_bin: Path, data_dir: Path) -> None:
    corpus = build_corpus()
    assert len(corpus.frames) >= 400, len(corpus.frames)
    UNREADABLE.clear()
    server = RawServer(snakebox_bin, data_dir, env={"SNAKEBOX_MAX_FRAME_BYTES": str(FRAME_LIMIT)})
    try:
        server.initialize()
        # Replies traced to frames: those with id null by position (before the frame's sync
        # ping's reply), the others by id.
        nulls: list[list[Any]] = []
        by_id: dict[Any, list[Any]] = {}
        for n, expect in enumerate(corpus.frames):
            server.send(expect.frame)
            before, _ = server.call("ping", None, f"sync-{n}")
            here = []
            for message in before:
                for item in message if isinstance(message, list) else [message]:
                    if item.get("id") is None:
                        here.append(item)
                    else:
                        by_id.setdefault(id_key(item["id"]), []).append(item)
            nulls.append(here)
        # The last replies of forwarded requests (tool calls take a while), then a marker
        # after which anything more would be an extra reply.
        wanted = {id_key(i) for expect in corpus.frames for i in expect.ids}
        deadline = time.monotonic() + 120
        while not wanted <= set(by_id) and time.monotonic() < deadline:
            try:
                line = server.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break  # the frames still unanswered are listed below
            assert line is not None, f"the server closed its stdout; stderr:\n{server.stderr_text()}"
            message = parse_reply(line)
            for item in message if isinstance(message, list) else [message]:
                assert item.get("id") is not None, f"a reply with id null after the corpus: {item}"
                by_id.setdefault(id_key(item["id"]), []).append(item)
        before, _ = server.call("ping", None, "sync-end")
        for message in before:
            for item in message if isinstance(message, list) else [message]:
                assert item.get("id") is not None, f"a reply with id null after the corpus: {item}"
                by_id.setdefault(id_key(item["id"]), []).append(item)

        failures = []
        expected_ids: set[Any] = set()
        for n, expect in enumerate(corpus.frames):
            own = by_id.get(id_key(expect.own), []) if expect.own is not None else []
            got = nulls[n] + own + [reply for i in expect.ids for reply in by_id.get(id_key(i), [])]
            expected_ids.update(id_key(i) for i in expect.ids)
            if expect.own is not None:
                expected_ids.add(id_key(expect.own))
            problem = None
            if expect.parse_error:
                if len(nulls[n]) + len(own) != 1:
                    problem = f"{len(nulls[n])} replies with id null and {len(own)} with its id; wanted one -32700"
            else:
                if len(nulls[n]) != expect.nulls:
                    problem = f"{len(nulls[n])} replies with id null, wanted {expect.nulls}"
                for i in expect.ids:
                    count = len(by_id.get(id_key(i), []))
                    if count != 1:
                        problem = f"{count} replies with id {str(i)[:40]}, wanted exactly 1"
            if problem is None and expect.code is not None:
                codes = [reply.get("error", {}).get("code") for reply in got]
                if any(code != expect.code for code in codes):
                    problem = f"codes {codes}, wanted {expect.code}"
            if problem is None and expect.mentions is not None:
                if not all(expect.mentions in message_text(reply) for reply in got):
                    problem = f"the error does not mention {expect.mentions}: {[message_text(r)[:200] for r in got]}"
            if problem is not None:
                failures.append(f"frame {n} ({expect.what}; {expect.frame[:80]!r}): {problem}")
        strays = [key for key in by_id if key not in expected_ids]
        if strays:
            failures.append(f"replies with ids no frame had: {strays[:10]}")
        if UNREADABLE:
            failures.append(f"{len(UNREADABLE)} replies the SDK cannot read, such as: {UNREADABLE[:3]}")
        assert not failures, f"{len(failures)} of {len(corpus.frames)} frames answered wrongly:\n" + "\n".join(failures)

        # Proof of life: a real tool call after the corpus.
        _, reply = server.call("tools/call", {"name": "execute_python", "arguments": {"script": "print(6 * 7)"}}, "alive")
        assert reply["result"]["structuredContent"]["status"] == "ok", reply
        assert "42" in reply["result"]["structuredContent"]["stdout"], reply
    finally:
        server.close()


def test_a_request_reusing_an_id_in_flight_is_refused_and_the_first_still_answered(snakebox_bin: Path, data_dir: Path) -> None:
    server = RawServer(snakebox_bin, data_dir)
    try:
        server.initialize()
        slow = {"name": "execute_python", "arguments": {"script": "import time; time.sleep(2); print('first')"}}
        server.send_json(request("same", "tools/call", slow))
        server.send_json(request("same", "tools/call", {"name": "execute_python", "arguments": {"script": "print('second')"}}))
        server.send_json(request(7, "tools/call", slow))
        server.send_json(request(7.0, "ping"))  # the same id to rmcp: 7.0 is read as 7
        replies: dict[Any, list[Any]] = {}
        while len(replies.get(id_key("same"), [])) < 2 or len(replies.get(id_key(7), [])) < 1 or len(replies.get(id_key(("float", "7.0")), [])) < 1:
            message = parse_reply(server.line())
            replies.setdefault(id_key(message["id"]), []).append(message)
        same = replies[id_key("same")]
        refused = [m for m in same if "error" in m]
        answered = [m for m in same if "result" in m]
        assert len(refused) == 1 and "in flight" in refused[0]["error"]["message"], same
        assert len(answered) == 1, same
        content = answered[0]["result"]["structuredContent"]
        assert content["status"] == "ok" and content["stdout"] == "first\n", content
        assert "in flight" in replies[id_key(("float", "7.0"))][0]["error"]["message"]
        assert replies[id_key(7)][0]["result"]["structuredContent"]["stdout"] == "first\n"
        # Once answered, an id may be used again; and nothing more arrives for the old ones.
        before, reply = server.call("ping", None, "same")
        assert "result" in reply and not before, (before, reply)
    finally:
        server.close()


def test_memory_returns_after_a_line_over_the_limit(snakebox_bin: Path, data_dir: Path) -> None:
    """Issue 12, item 8: one 64 MiB line left the server at ~80 MB for good."""
    server = RawServer(snakebox_bin, data_dir)
    try:
        server.initialize()
        for n in range(3):
            server.call("ping", None, f"warm-{n}")
        baseline = process_rss_kib(server.process.pid)
        huge = b'{"jsonrpc":"2.0","id":"huge","method":"ping","params":{"pad":"' + b"x" * (64 << 20) + b'"}}'
        server.send(huge)
        del huge
        before, reply = server.until("huge")
        assert not before, before
        assert reply.get("error", {}).get("code") == -32600, str(reply)[:300]
        assert "larger than the limit" in reply["error"]["message"], reply
        assert "max-frame-bytes" in json.dumps(reply["error"].get("data")), reply
        _, alive = server.call("ping", None, "after")
        assert "result" in alive
        after = process_rss_kib(server.process.pid)
        # Generous: the frame limit is 16 MiB, the line 64 MiB; what is left must be far below either.
        assert after - baseline < 12 * 1024, f"VmRSS {baseline} KiB before, {after} KiB after a 64 MiB line"
    finally:
        server.close()


def test_messages_before_initialize_do_not_end_the_connection(snakebox_bin: Path, data_dir: Path) -> None:
    """rmcp ends the connection when the first message is a notification or a response; the
    framing holds those back until the session has begun."""
    server = RawServer(snakebox_bin, data_dir)
    try:
        server.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        server.send_json({"jsonrpc": "2.0", "id": "stray", "result": {}})
        server.send(b"not json")
        before, pong = server.call("ping", None, "early")
        assert "result" in pong, pong
        assert [m["error"]["code"] for m in before] == [-32700], before
        server.initialize()
        _, tools = server.call("tools/list", None, "list")
        assert "execute_python" in {tool["name"] for tool in tools["result"]["tools"]}, tools
    finally:
        server.close()


def test_an_unknown_method_tool_or_positional_params_get_a_hint(snakebox_bin: Path, data_dir: Path) -> None:
    """What a hand-written client gets wrong first: each answer names the mistake and what to
    send instead (rmcp's own answers were `nosuch`, `tool not found`, `unrecognized JSON-RPC
    message`, with no hint)."""
    server = RawServer(snakebox_bin, data_dir)
    try:
        server.initialize()
        _, method = server.call("nosuch", None, "m")
        assert method["error"]["code"] == -32601 and method["error"]["message"] == "unknown method `nosuch`", method
        assert "tools/call" in method["error"]["data"]["hint"], method
        _, tool = server.call("tools/call", {"name": "nosuch_tool", "arguments": {}}, "t")
        assert tool["error"]["code"] == -32602 and tool["error"]["message"] == "unknown tool `nosuch_tool`", tool
        assert "`execute_python`" in tool["error"]["data"]["hint"], tool
        _, positional = server.call("tools/list", [], "p")
        assert positional["error"]["code"] == -32602, positional
        assert "not an array" in positional["error"]["message"], positional
        assert "as an object" in positional["error"]["data"]["hint"], positional
        _, ping = server.call("ping", None, "alive")
        assert "result" in ping, ping
    finally:
        server.close()
