"""Issue 32, properties 4 and 5, judged from outside: the real binary over HTTP, two tenants'
keys made by `snakebox keys add`, raw HTTP (httpx, http.client) so that what the server really
answers is what is checked.

- A `Host` is one plain authority or the request is refused (400, with a hint), and the
  links and client configurations the server hands out are written from the parsed host or
  `--public-url`, never from the header's text.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.parse
from pathlib import Path

import httpx2 as httpx
import pytest

from conftest import have_bwrap
from http_support import http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

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


