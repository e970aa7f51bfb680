"""The HTTP face (issue 14) with a real client: the official MCP Python SDK's streamable HTTP
transport against `snakebox serve --http`, in both protocol eras, with API keys made by
`snakebox keys add`.

- a tenant runs a script (with progress notifications streamed back), works in a session and
  reads its artifact;
- another tenant's key sees none of it: its session, artifact and run are "not found";
- a request without a key, or with a revoked one, gets 401 (the SDK raises);
- SIGTERM stops the server cleanly (exit 0) with nothing of it left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import AsyncIterator

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import MODES, call, have_bwrap
from http_support import http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


def raw_post(url: str, key: str | None) -> tuple[int, dict[str, str], str]:
    """A tools/list POST without the SDK: what the server really answers."""
    request = urllib.request.Request(
        f"{url}/mcp",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 **({"Authorization": f"Bearer {key}"} if key else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read().decode()


@contextlib.asynccontextmanager
async def connect(url: str, key: str | None, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = create_mcp_http_client(headers=headers)
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode, read_timeout_seconds=300) as client:
        yield client


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.docker_ci
async def test_tenants_work_over_http_and_never_see_each_other(snakebox_bin: Path, tmp_path: Path, mode: str):
    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    marker = uuid.uuid4().hex
    with http_server(snakebox_bin, data) as (proc, url):
        async with connect(url, key_a, mode) as a:
            # A run whose printed lines stream back as progress notifications.
            progress: list[str] = []

            async def on_progress(_progress: float, _total: float | None, message: str | None) -> None:
                if message:
                    progress.append(message)

            result = await a.call_tool(
                "execute_python",
                {"script": f"import time\nfor i in range(3):\n    print('{marker}', i, flush=True)\n    time.sleep(0.3)\nopen('out.txt', 'w').write('made by a')"},
                progress_callback=on_progress,
            )
            run = result.structured_content
            assert run["status"] == "ok" and marker in run["stdout"], run
            assert any(marker in line for line in progress), progress
            uri = run["artifacts"][0]["uri"]
            content = await a.read_resource(uri)
            assert content.contents[0].text == "made by a"
            session, text, is_error = await call(a, "create_session", name="http")
            assert not is_error, text
            sid = session["session_id"]
            cell, text, _ = await call(a, "execute_python", script="x = 41\nx + 1", session_id=sid)
            assert cell["result"]["json"] == 42, text
            report, _, _ = await call(a, "check_environment")
            assert [s["session_id"] for s in report["sessions"]["sessions"]] == [sid], report["sessions"]

        async with connect(url, key_b, mode) as b:
            listed, _, _ = await call(b, "list_sessions")
            assert listed["sessions"] == [], listed
            # check_environment lists the caller's own sessions only (it listed every tenant's).
            report, _, _ = await call(b, "check_environment")
            assert report["sessions"]["sessions"] == [], report["sessions"]
            for tool in ("delete_session", "list_packages"):
                data_b, text, is_error = await call(b, tool, session_id=sid)
                assert is_error and data_b["error"]["kind"] == "not_found", (tool, text)
            cell_b, text, is_error = await call(b, "execute_python", script="1", session_id=sid)
            assert is_error and cell_b["error"]["kind"] == "not_found", text
            with pytest.raises(Exception) as refused:
                await b.read_resource(uri)
            assert "No artifact" in str(refused.value)
            resources = await b.list_resources()
            assert resources.resources == []

        # A's session is untouched by all that.
        async with connect(url, key_a, mode) as a:
            cell, text, _ = await call(a, "execute_python", script="x", session_id=sid)
            assert cell["result"]["json"] == 41, text
            await call(a, "delete_session", session_id=sid)
        assert proc.poll() is None


async def test_requests_without_a_live_key_are_refused(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    key = make_key(snakebox_bin, data, "team-a")
    with http_server(snakebox_bin, data) as (proc, url):
        for wrong in (None, "sbx_" + "0" * 64):
            # The SDK's client fails (it reports a generic error response)...
            with pytest.raises(Exception):
                async with connect(url, wrong, "legacy") as client:
                    await client.list_tools()
            # ...and what the server answered is a 401 with the Bearer challenge and a hint.
            status, headers, body = raw_post(url, wrong)
            assert status == 401, (status, body)
            assert headers.get("www-authenticate") == 'Bearer realm="snakebox"', headers
            assert "snakebox keys add" in json.loads(body)["hint"]
        async with connect(url, key, "legacy") as client:
            tools = await client.list_tools()
            assert any(t.name == "execute_python" for t in tools.tools)
        # Revoked: refused from the next request on, without a restart.
        key_id = subprocess.run(
            [str(snakebox_bin), "keys", "list", "--json", "--data-dir", str(data)],
            capture_output=True, text=True, check=True,
        ).stdout
        (entry,) = json.loads(key_id)
        assert entry["masked"].startswith("sbx_") and key not in key_id
        subprocess.run([str(snakebox_bin), "keys", "revoke", entry["id"], "--data-dir", str(data)], check=True, capture_output=True)
        with pytest.raises(Exception):
            async with connect(url, key, "legacy") as client:
                await client.list_tools()
        assert raw_post(url, key)[0] == 401
        assert proc.poll() is None


def plain_get(url: str, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """A GET without the SDK (a browser or curl downloading a link, a Prometheus scrape)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def runs_ok(metrics: str) -> float:
    """`snakebox_runs_total{kind="execute",status="ok"}` in Prometheus text (0 when absent)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("snakebox_runs_total{") and 'kind="execute"' in line and 'status="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("mode", MODES)
async def test_signed_download_links_and_metrics(snakebox_bin: Path, tmp_path: Path, mode: str):
    data = tmp_path / "data"
    key = make_key(snakebox_bin, data, "team-a")
    payload = os.urandom(200_000)
    with http_server(snakebox_bin, data) as (proc, url):
        status, headers, before = plain_get(f"{url}/metrics", key)
        assert status == 200 and headers["content-type"].startswith("text/plain"), (status, before)
        assert plain_get(f"{url}/metrics")[0] == 401  # a key exists: the scrape needs one
        before = before.decode()
        assert "# TYPE snakebox_sessions gauge" in before, before
        async with connect(url, key, mode) as client:
            run, text, _ = await call(
                client, "execute_python",
                script=f"import base64\nopen('report out.bin', 'wb').write(base64.b64decode({__import__('base64').b64encode(payload).decode()!r}))",
            )
        assert run["status"] == "ok", text
        (artifact,) = run["artifacts"]
        link = artifact["download_url"]
        assert link.startswith(f"{url}/files/{run['execution_id']}/report%20out.bin?"), link
        assert key not in link and f"download: {link}" in text
        # A plain GET, no key: the exact bytes, as an attachment that is never rendered.
        status, headers, body = plain_get(link)
        assert status == 200 and body == payload, status
        assert headers["content-length"] == str(len(payload))
        assert headers["content-disposition"].startswith('attachment; filename="report_out.bin"'), headers
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["content-security-policy"] == "sandbox; default-src 'none'"
        # One changed character of the signature: 403.
        tampered = link[:-1] + ("0" if link[-1] != "0" else "1")
        assert plain_get(tampered)[0] == 403
        status, _, after = plain_get(f"{url}/metrics", key)
        assert status == 200
        after = after.decode()
        assert runs_ok(after) == runs_ok(before) + 1, after
        assert "snakebox_http_requests_total{" in after and "team-a" not in after
        # A raster image is shown in the browser (python-mcp-sandbox's links are, issue 36); an
        # SVG, a document that can hold script, is still an attachment; both unsniffed, sandboxed.
        async with connect(url, key, mode) as client:
            pictures, text, _ = await call(
                client, "execute_python",
                script="import base64\nopen('plot.png', 'wb').write(base64.b64decode("
                "'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='))\n"
                "open('chart.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>')",
            )
        links = {a["name"]: a["download_url"] for a in pictures["artifacts"]}
        assert set(links) == {"plot.png", "chart.svg"}, text
        for name, kind, mime in (("plot.png", "inline;", "image/png"), ("chart.svg", "attachment;", "image/svg+xml")):
            status, headers, _ = plain_get(links[name])
            assert status == 200 and headers["content-disposition"].startswith(kind), (name, headers)
            assert headers["content-type"] == mime and headers["x-content-type-options"] == "nosniff", headers
            assert headers["content-security-policy"] == "sandbox; default-src 'none'", headers
        assert proc.poll() is None


async def test_sigterm_stops_the_http_server_cleanly(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    with http_server(snakebox_bin, data) as (proc, url):
        async with connect(url, None, "legacy") as client:
            ok, _, _ = await call(client, "execute_python", script="print('before the stop')")
            assert ok["status"] == "ok", ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        pid = proc.pid
    assert not (data / "runs" / str(pid)).exists()
    # Nothing of it keeps running (the sessions' disk watchdog notices the exit within a
    # second or two and ends too).
    deadline = time.monotonic() + 20
    while True:
        leftovers = subprocess.run(["pgrep", "-f", str(data)], capture_output=True, text=True).stdout.split()
        described = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
                     for pid in leftovers if Path(f"/proc/{pid}").exists()}
        if not described or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert described == {}, described


async def test_legacy_sse_with_a_key_in_the_url_and_sessions_bound_to_their_tenant(snakebox_bin: Path, tmp_path: Path):
    """Seed 002's users connect through `supergateway --sse http://HOST/sse?api_key=KEY`: the
    SDK's SSE client, given the same URL, runs a tool; its session id is useless to another
    tenant, and without a key the stream is refused."""
    from mcp.client.sse import sse_client

    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    sessions: list[str] = []
    with http_server(snakebox_bin, data) as (proc, url):
        transport = sse_client(f"{url}/sse?api_key={key_a}", on_session_created=sessions.append)
        async with Client(transport, mode="legacy", read_timeout_seconds=120) as client:
            run, text, is_error = await call(client, "execute_python", script="print(6 * 7)\nopen('sse.txt', 'w').write('over sse')")
            assert not is_error and run["stdout"] == "42\n", text
            # Results over legacy SSE carry download links too.
            status, _, body = plain_get(run["artifacts"][0]["download_url"])
            assert (status, body) == (200, b"over sse"), (status, body)
            created, text, _ = await call(client, "create_session", name="over-sse")
            sid = created["session_id"]
            assert sessions, "no SSE session id was announced"
            # Another tenant's key cannot post into A's SSE session...
            message = {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}
            status, _, body = raw_request(f"{url}/messages?sessionId={sessions[0]}", message, key_b)
            assert status == 404 and "no such SSE session" in body, (status, body)
            # ...nor can a made-up session id be posted to.
            status, _, _ = raw_request(f"{url}/messages?sessionId={'0' * 32}", message, None)
            assert status == 404
            # A's session (made over SSE) is A's over streamable HTTP too, and not B's.
        async with connect(url, key_b, "legacy") as b:
            refused, _, is_error = await call(b, "list_packages", session_id=sid)
            assert is_error and refused["error"]["kind"] == "not_found", refused
        async with connect(url, key_a, "legacy") as a:
            listed, _, _ = await call(a, "list_sessions")
            assert [s["session_id"] for s in listed["sessions"]] == [sid], listed
        # Without a key, no stream.
        status, headers, _ = raw_request(f"{url}/sse", None, None, method="GET")
        assert status == 401 and "bearer" in headers.get("www-authenticate", "").lower()
        assert proc.poll() is None


def raw_request(url: str, message: dict | None, key: str | None, method: str = "POST") -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(message).encode() if message is not None else None,
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read(200).decode()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read().decode()


async def test_quotas_per_tenant_refuse_with_a_hint_and_never_starve_another(snakebox_bin: Path, tmp_path: Path):
    """`[tenants]` quotas, judged from what each tenant's client gets: past its runs per
    minute a tenant is refused (`quota`, with when to retry) while another is served; past its
    sessions, `create_session` is refused; and with one slot per tenant, another tenant's call
    runs while the busy tenant's calls wait on its own queue. A client that goes away takes its
    calls with it: the runs are stopped, not left to their timeout."""
    import anyio

    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    args = ("--max-concurrent-runs", "2", "--tenant-max-concurrent-runs", "1",
            "--tenant-runs-per-minute", "5", "--tenant-max-sessions", "1")
    with http_server(snakebox_bin, data, *args) as (proc, url):
        async with connect(url, key_a, "legacy") as a, connect(url, key_b, "legacy") as b:
            # Per minute: A's fifth call in the minute is its last.
            for i in range(5):
                ok, text, _ = await call(a, "execute_python", script=f"print({i})")
                assert ok["status"] == "ok", text
            refused, text, is_error = await call(a, "execute_python", script="print(5)")
            assert is_error and refused["error"]["kind"] == "quota", text
            assert "retry after" in refused["error"]["message"] and "runs_per_minute" in refused["error"]["hint"]
            still, text, _ = await call(b, "execute_python", script="print('b is served')")
            assert still["status"] == "ok", text
            # Sessions: one per tenant.
            first, text, is_error = await call(b, "create_session")
            assert not is_error, text
            second, text, is_error = await call(b, "create_session")
            assert is_error and second["error"]["kind"] == "quota", text
            assert "max_sessions" in second["error"]["hint"]

    # Fairness, with fresh allowances: C fills its one slot and queues two more; D's call is not
    # behind them. Then C's client goes away mid-run.
    key_c = make_key(snakebox_bin, data, "team-c")
    key_d = make_key(snakebox_bin, data, "team-d")
    marker = uuid.uuid4().hex
    with http_server(snakebox_bin, data, *args) as (proc, url):
        done_c: list[str] = []
        d_finished_with: list[int] = []
        async with connect(url, key_c, "legacy") as c, connect(url, key_d, "legacy") as d:

            async def slow_c(i: int) -> None:
                script = (
                    "import subprocess, sys, time\n"
                    f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                    f"time.sleep(120)\nprint({i})"
                )
                data_c, _, _ = await call(c, "execute_python", script=script, timeout_seconds=200)
                done_c.append(data_c["status"])

            async with anyio.create_task_group() as group:
                for i in range(3):
                    group.start_soon(slow_c, i)
                # Proof of life: C's first run is running (its child is seen from the host).
                with anyio.fail_after(120):
                    while not marker_alive(marker):
                        await anyio.sleep(0.2)
                quick, text, _ = await call(d, "execute_python", script="print('d ran')")
                assert quick["status"] == "ok" and quick["stdout"] == "d ran\n", text
                d_finished_with.append(len(done_c))
                group.cancel_scope.cancel()
        assert d_finished_with == [0], "D waited behind C's runs"
        # C's client is gone: its runs are stopped (no process of theirs is left) well before
        # their two minutes, and the server keeps serving.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and marker_alive(marker):
            time.sleep(0.5)
        assert not marker_alive(marker), "the runs of a client that went away kept running"
        async with connect(url, key_d, "legacy") as d:
            alive, _, _ = await call(d, "execute_python", script="print('still serving')")
            assert alive["status"] == "ok"
        assert proc.poll() is None


def marker_alive(marker: str) -> bool:
    """Whether a process whose command line holds `marker` runs (a script's, seen from the host)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return True
    return False


def write_file(size: int) -> str:
    return f"open('out.bin', 'wb').write(b'x' * {size})\n"


def artifact_of(url: str, key: str, size: int) -> dict:
    """A run of `key`'s tenant that writes one file of `size` bytes; its result."""
    from test_audit import tool

    result = tool(url, key, "execute_python", {"script": write_file(size)})["result"]["structuredContent"]
    assert result["status"] == "ok", result
    return result


def read_resource(url: str, key: str, uri: str) -> dict:
    from test_audit import rpc

    return rpc(url, key, "resources/read", {"uri": uri})


def test_one_tenants_artifacts_never_remove_anothers(snakebox_bin: Path, tmp_path: Path):
    """Issue 32, property 2 (artifacts): the store's total (`--artifact-max-size`) is made room
    in only by the tenant that writes; a tenant's own budget (`--tenant-artifacts-max-size`)
    removes only its own oldest; a link or `resources/read` of a removed artifact says why."""
    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    with http_server(snakebox_bin, data, "--artifact-max-size", "2MiB") as (_proc, url):
        kept = artifact_of(url, key_b, 300_000)
        floods = [artifact_of(url, key_a, 600_000) for _ in range(5)]
        # team-b's file, older than all of team-a's, is still readable both ways.
        (b_file,) = kept["artifacts"]
        read = read_resource(url, key_b, b_file["uri"])
        assert "result" in read and read["result"]["contents"][0]["uri"] == b_file["uri"], str(read)[:300]
        status, _, body = plain_get(b_file["download_url"])
        assert status == 200 and len(body) == 300_000
        # team-a's oldest made room for its newest; reading one says why, and whose bound.
        (a_first,) = floods[0]["artifacts"]
        gone = read_resource(url, key_a, a_first["uri"])
        assert "error" in gone, gone
        assert "was removed" in gone["error"]["message"] and "artifact store was full" in gone["error"]["message"], gone
        status, _, body = plain_get(a_first["download_url"])
        assert status == 404 and b"was removed" in body, (status, body)
        # To team-b, team-a's removed artifact is as unknown as one that never existed.
        unknown = read_resource(url, key_b, a_first["uri"])["error"]["message"]
        assert unknown.startswith("No artifact") and "store was full" not in unknown, unknown
        (a_last,) = floods[-1]["artifacts"]
        assert "result" in read_resource(url, key_a, a_last["uri"])
    with http_server(snakebox_bin, data, "--tenant-artifacts-max-size", "1MiB") as (_proc, url):
        first, second = artifact_of(url, key_a, 600_000), artifact_of(url, key_a, 600_000)
        gone = read_resource(url, key_a, first["artifacts"][0]["uri"])
        assert "own tenant's budget" in gone["error"]["message"], gone
        assert "artifacts_max_size" in json.dumps(gone["error"].get("data")), gone
        assert "result" in read_resource(url, key_a, second["artifacts"][0]["uri"])
        assert "result" in read_resource(url, key_b, b_file["uri"])
        from test_audit import stores

        told = stores(url, key_a)["artifacts"]
        assert told["max_bytes"] == 1 << 20 and told["removed"] >= 1 and told["used_bytes"] <= 1 << 20, told


def data_state(data: Path) -> dict[str, tuple[int, int]]:
    """Every file of the data directory with its size and modification time, but two the
    kernel or SQLite write without a request: a shared-memory index (`-shm`, which a reader
    maps and marks) and the sessions' disk image (mounted with lazy inode-table init, which the
    kernel finishes in the background after the mount)."""
    return {str(path.relative_to(data)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(data.rglob("*"))
            if path.is_file() and not path.name.endswith("-shm") and path.suffix != ".img"}


def test_no_get_changes_server_state(snakebox_bin: Path, tmp_path: Path):
    """Issue 32, property 6: a GET changes nothing, on any route: no UI session is made (the
    keyless local tenant's login is a POST from the page), no file of the data directory is
    written; the same login as a POST works (proof that there was something to make)."""
    data = tmp_path / "data"
    with http_server(snakebox_bin, data) as (_proc, url):
        from test_audit import tool

        run = tool(url, None, "execute_python", {"script": write_file(10)})["result"]["structuredContent"]
        assert run["status"] == "ok", run
        time.sleep(1)
        before = data_state(data)
        paths = ["/ui/login", "/ui/", "/ui", "/ui/runs", f"/ui/runs/{run['execution_id']}", "/ui/sessions",
                 "/ui/environment", "/ui/clients", "/ui/static/ui.css", "/healthz", "/readyz", "/metrics", "/mcp",
                 run["artifacts"][0]["download_url"].removeprefix(url), "/files/x/y", "/nowhere"]
        for path in paths:
            status, headers, body = plain_get(f"{url}{path}")
            assert "set-cookie" not in headers, (path, status, headers)
        status, _, page = plain_get(f"{url}/ui/login")
        assert status == 200 and b'id="login-local"' in page, page[:500]
        time.sleep(1)
        assert data_state(data) == before
        # The page's button: a POST from the server's own origin logs in.
        request = urllib.request.Request(f"{url}/ui/login", data=b"", method="POST",
                                         headers={"Origin": url, "Content-Type": "application/x-www-form-urlencoded"})
        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(request, timeout=30)
            raise AssertionError("the login did not redirect")
        except urllib.error.HTTPError as err:
            assert err.code == 303 and "snakebox_ui=" in err.headers.get("set-cookie", ""), (err.code, dict(err.headers))


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
