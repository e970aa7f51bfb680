"""Issue 32, properties 4 and 5, judged from outside: the real binary over HTTP, two tenants'
keys made by `snakebox keys add`, raw HTTP (httpx, http.client) so that what the server really
answers is what is checked.

- A `Host` is one plain authority or the request is refused (400, with a hint), and the
  links and client configurations the server hands out are written from the parsed host or
  `--public-url`, never from the header's text.
- The documented body limit (64 MiB, `--max-body-bytes`) is the real one on every transport
  (`/mcp`, `POST /sse`, the legacy `/messages`), on both sides of it, and the documented
  file limit (10 MiB per session file) fits through every transport, the web UI's upload
  included.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import AsyncIterator, Callable

import anyio
import httpx2 as httpx
import pytest

from conftest import have_bwrap
from http_support import http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

MIB = 1 << 20
MCP_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def rpc(method: str, params: dict | None = None, id: int | None = 1) -> dict:
    message: dict = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        message["id"] = id
    if params is not None:
        message["params"] = params
    return message


INITIALIZE = rpc("initialize", {"protocolVersion": "2024-11-05", "capabilities": {},
                                "clientInfo": {"name": "snakebox-e2e", "version": "1"}}, id=0)


class Stream:
    """An event stream read in the background: its events, its comments, when it ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.status = 0
        self.events: list[tuple[str, str]] = []
        self.comments: list[str] = []
        self.ended_at: float | None = None
        self.error: str | None = None

    async def follow(self, response: httpx.Response) -> None:
        event, data = "message", []
        try:
            async for line in response.aiter_lines():
                if line == "":
                    if data:
                        self.events.append((event, "\n".join(data)))
                    event, data = "message", []
                elif line.startswith(":"):
                    self.comments.append(line)
                elif line.startswith("event:"):
                    event = line[len("event:"):].strip()
                elif line.startswith("data:"):
                    data.append(line[len("data:"):].lstrip())
        except Exception as err:  # a cut connection ends the stream too
            self.error = repr(err)
        self.ended_at = time.monotonic()

    def messages(self) -> list[dict]:
        """The JSON-RPC messages the stream carried (`message` events)."""
        found = []
        for event, data in self.events:
            if event == "message":
                with contextlib.suppress(ValueError):
                    found.append(json.loads(data))
        return found

    def text(self) -> str:
        return json.dumps(self.events)

    async def wait_for(self, what: Callable[[], bool], timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            while not what():
                await anyio.sleep(0.02)
        return what()

    async def reply(self, id: int, timeout: float = 120) -> dict:
        """The JSON-RPC response with this id."""
        found = await self.wait_for(lambda: any(m.get("id") == id for m in self.messages()), timeout)
        assert found, f"{self.name}: no reply {id}: {self.text()} {self.error}"
        return next(m for m in self.messages() if m.get("id") == id)


@contextlib.asynccontextmanager
async def streams() -> AsyncIterator[Callable]:
    """`open(name, method, url, **kwargs)` starts a request whose response is read in the
    background as a [`Stream`]; all are closed when the block ends."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client, anyio.create_task_group() as group:

        async def open_stream(name: str, method: str, url: str, **kwargs) -> Stream:
            stream = Stream(name)
            ready = anyio.Event()

            async def run() -> None:
                try:
                    async with client.stream(method, url, **kwargs) as response:
                        stream.status = response.status_code
                        ready.set()
                        await stream.follow(response)
                except Exception as err:
                    stream.error = repr(err)
                    stream.ended_at = time.monotonic()
                finally:
                    ready.set()

            group.start_soon(run)
            await ready.wait()
            return stream

        yield open_stream
        group.cancel_scope.cancel()


async def open_legacy_session(open_stream: Callable, http: httpx.AsyncClient, url: str, key: str, name: str) -> tuple[Stream, str]:
    """`GET /sse?api_key=…`, then the MCP handshake posted (without the key) to the endpoint
    the stream announced; the stream and that endpoint."""
    stream = await open_stream(name, "GET", f"{url}/sse?api_key={key}")
    assert stream.status == 200, (name, stream.status)
    assert await stream.wait_for(lambda: any(e == "endpoint" for e, _ in stream.events), 30), stream.text()
    endpoint = url + next(data for event, data in stream.events if event == "endpoint")
    posted = await http.post(endpoint, json=INITIALIZE)
    assert posted.status_code == 202, posted.text
    await stream.reply(0)
    posted = await http.post(endpoint, json=rpc("notifications/initialized", id=None))
    assert posted.status_code == 202, posted.text
    return stream, endpoint


def raw(url: str, method: str, path: str, host: str | None, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly this `Host` (http.client sends it as given)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    try:
        all_headers = dict(headers or {})
        if host is not None:
            all_headers["Host"] = host
        connection.request(method, path, body=body, headers=all_headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def reply_of(body: bytes) -> dict:
    """A JSON-RPC reply: a JSON body, or the last `data:` line of an event stream."""
    text = body.decode()
    with contextlib.suppress(ValueError):
        return json.loads(text)
    datas = [line[5:].strip() for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return json.loads(datas[-1])


def run_with_host(url: str, key: str, host: str | None) -> tuple[int, dict | bytes]:
    """execute_python writing one artifact, sent with this `Host`; the status and the result
    (or the refusal)."""
    call = rpc("tools/call", {"name": "execute_python", "arguments": {"script": "open('out.txt', 'w').write('x')"}})
    status, _, body = raw(url, "POST", "/mcp", host, json.dumps(call).encode(), {**MCP_HEADERS, **bearer(key)})
    if status != 200:
        return status, body
    return status, reply_of(body)["result"]["structuredContent"]


async def ui_login(http: httpx.AsyncClient, url: str, key: str) -> str:
    """The UI's session cookie for `key` (`name=value`)."""
    response = await http.post(f"{url}/ui/login", data={"key": key}, headers={"Origin": url}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return response.headers["set-cookie"].split(";")[0]


async def test_a_host_is_one_plain_authority_and_links_are_written_from_the_parsed_host(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    key = make_key(snakebox_bin, data, "team-a")
    with http_server(snakebox_bin, data) as (proc, url):
        port = urllib.parse.urlsplit(url).port
        # Anything but `host[:port]` is refused with 400 and a hint, and nothing is run.
        for host in (f"[::1]@evil.example", f"[::1]:{port}/x", f"[::1]:{port}#x", f"localhost:{port}@evil.example",
                     f"localhost:{port}/x", f"localhost:{port}#", f"localhost:{port}?x",
                     f"127.0.0.1:{port} evil.example", f"localhost::{port}", f"localhost:{port}:{port}",
                     "127.0.0.1:99999", "localhost:", "localhost:0", "[::1", "127.1", ""):
            status, refusal = run_with_host(url, key, host)
            assert status != 200, f"Host {host!r} was served; its link: {refusal['artifacts'][0]['download_url']}"
            assert status == 400, (host, status, refusal)
            refusal = json.loads(refusal)
            assert "not a valid authority" in refusal["error"] or "no Host" in refusal["error"], (host, refusal)
            assert "host[:port]" in refusal["hint"] or "name[:port]" in refusal["hint"], refusal
            assert "evil" not in refusal["error"], refusal
        # A well-formed host that is not served: 403.
        status, refusal = run_with_host(url, key, "evil.example")
        assert status == 403 and "--allowed-host" in json.loads(refusal)["hint"], refusal
        # Allowed hosts, however they are written: links in the parsed, canonical form.
        for host, base in ((f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
                           (f"LocalHost:{port}", f"http://localhost:{port}"),
                           (f"[0:0:0:0:0:0:0:1]:{port}", f"http://[::1]:{port}"),
                           ("localhost", "http://localhost")):
            status, result = run_with_host(url, key, host)
            assert status == 200 and result["status"] == "ok", (host, result)
            link = result["artifacts"][0]["download_url"]
            assert link.startswith(f"{base}/files/{result['execution_id']}/out.txt?"), (host, link)
        # The UI's client configurations are written from the parsed host too.
        async with httpx.AsyncClient(timeout=60) as http:
            cookie = await ui_login(http, url, key)
        status, _, page = raw(url, "GET", "/ui/clients", f"LOCALHOST:{port}", headers={"Cookie": cookie})
        assert status == 200 and f"http://localhost:{port}/mcp" in page.decode(), status
        assert f"LOCALHOST:{port}" not in page.decode()
        status, _, page = raw(url, "GET", "/ui/clients", f"localhost:{port}@evil.example", headers={"Cookie": cookie})
        assert status == 400 and b"evil" not in page, page
        assert proc.poll() is None

    # With --public-url, links start with it whatever Host the client sent.
    with http_server(snakebox_bin, data, "--public-url", "https://Snakebox.example.com/base/") as (proc, url):
        port = urllib.parse.urlsplit(url).port
        for host in (f"127.0.0.1:{port}", "snakebox.example.com"):
            status, result = run_with_host(url, key, host)
            assert status == 200, (host, result)
            link = result["artifacts"][0]["download_url"]
            assert link.startswith(f"https://snakebox.example.com/base/files/{result['execution_id']}/"), link
        assert proc.poll() is None


def padded(size: int, message: dict) -> bytes:
    """`message` (an object with `params`), padded with spaces inside to exactly `size` bytes."""
    text = json.dumps(message)
    assert text.endswith("}")
    pad = size - len(text)
    assert pad >= 0
    return (text[:-1] + " " * pad + "}").encode()


def ping(size: int, id: int = 7) -> bytes:
    return padded(size, {"jsonrpc": "2.0", "id": id, "method": "ping"})


async def test_the_documented_body_limit_is_the_real_one_on_every_transport(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    key = make_key(snakebox_bin, data, "team-a")
    limit = 64 * MIB  # README, "Over HTTP, with API keys": a 64 MiB body limit (413)
    with http_server(snakebox_bin, data) as (proc, url):
        host = urllib.parse.urlsplit(url).netloc
        headers = {**MCP_HEADERS, **bearer(key)}
        # Streamable HTTP, at /mcp and at POST /sse: the limit is accepted, one byte more is 413.
        for path in ("/mcp", "/sse"):
            status, _, body = raw(url, "POST", path, host, ping(limit), headers)
            assert status == 200, (path, status, body[:300])
            assert reply_of(body) == {"jsonrpc": "2.0", "id": 7, "result": {}}, body[:300]
            status, reply_headers, body = raw(url, "POST", path, host, ping(limit + 1), headers)
            assert status == 413, (path, status, body[:300])
            refusal = json.loads(body)
            assert "64 MiB" in refusal["error"] and str(limit) in refusal["error"], refusal
            assert "--max-body-bytes" in refusal["hint"], refusal

        async with httpx.AsyncClient(timeout=120) as http, streams() as open_stream:
            # Legacy SSE: a post at the limit is taken (and answered on the stream), one byte
            # more is 413.
            sse, endpoint = await open_legacy_session(open_stream, http, url, key, "sse")
            posted = await http.post(endpoint, content=ping(limit, id=8), headers={"Content-Type": "application/json"})
            assert posted.status_code == 202, posted.text[:300]
            assert (await sse.reply(8))["result"] == {}
            posted = await http.post(endpoint, content=ping(limit + 1, id=9), headers={"Content-Type": "application/json"})
            assert posted.status_code == 413 and "--max-body-bytes" in posted.json()["hint"], posted.text[:300]

            # The documented file limit (10 MiB per session file) fits through every transport;
            # one byte more is the tool's refusal, not the transport's.
            created = reply_of(raw(url, "POST", "/mcp", host, json.dumps(rpc("tools/call", {"name": "create_session", "arguments": {}})).encode(), headers)[2])
            session_id = created["result"]["structuredContent"]["session_id"]
            for size in (10 * MIB, 10 * MIB + 1):
                content = base64.b64encode(b"\x01" * size).decode()
                call = rpc("tools/call", {"name": "write_file", "arguments": {"session_id": session_id, "path": "big.bin",
                                                                             "content": content, "encoding": "base64"}}, id=40)
                status, _, body = raw(url, "POST", "/mcp", host, json.dumps(call).encode(), headers)
                assert status == 200, (size, status, body[:300])
                over_mcp = reply_of(body)["result"]
                posted = await http.post(endpoint, json=call)
                assert posted.status_code == 202, (size, posted.status_code, posted.text[:300])
                over_sse = (await sse.reply(40))["result"]
                sse.events.clear()
                for result in (over_mcp, over_sse):
                    if size == 10 * MIB:
                        assert not result.get("isError"), result
                    else:
                        assert result.get("isError") and str(10 * MIB) in json.dumps(result), json.dumps(result)[:300]

            # The web UI's upload, the one upload route: the same file limit, both sides.
            cookie = await ui_login(http, url, key)
            page = (await http.get(f"{url}/ui/sessions/{session_id}", headers={"Cookie": cookie})).text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
            for size in (10 * MIB, 10 * MIB + 1):
                uploaded = await http.post(f"{url}/ui/sessions/{session_id}/upload", headers={"Cookie": cookie, "Origin": url},
                                           data={"csrf": csrf}, files={"file": ("up.bin", b"\x02" * size)}, follow_redirects=False)
                if size == 10 * MIB:
                    assert uploaded.status_code == 303, uploaded.text[:300]
                else:
                    assert uploaded.status_code == 400 and str(10 * MIB) in uploaded.text, (uploaded.status_code, uploaded.text[:300])
        assert proc.poll() is None
