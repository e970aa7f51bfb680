"""The web UI (issue 15) in a real browser: Debian's Chromium, headless, driven by
playwright-core (tests/clients/ui_flow.mjs, installed into target/clients by
scripts/install-clients; Chromium by scripts/install-deps).

A server with two tenants' keys; tenant A starts a long run (the browser sees its output
stream in live and cancels it from its page) and makes runs (one printing a marker and writing a PNG
made with pure Python, a binary file and an SVG; one raising) and a session with a file, over
MCP as raw JSON POSTs. The browser logs in with A's key, finds the run in the list and on its
page with its stdout, sees the PNG inline (and the SVG not), downloads artifacts and compares
their bytes, finds the session and its file and deletes it after confirmation; B's key sees
none of A's things. No console errors, no CSP violations. Screenshots of each page go to
docs/ui/ (the web UI chapter, docs/src/web-ui.md, shows them) when SNAKEBOX_UI_SCREENSHOTS=1.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, have_bwrap
from http_support import http_server, make_key

pytestmark = pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")

CLIENTS = REPO / "target" / "clients"
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = REPO / "docs" / "ui"

MATPLOTLIB = "matplotlib==3.10.3"


def make_png() -> bytes:
    """A 48x32 RGB PNG made without any library (the run writes the same bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    w, h = 48, 32
    rows = b"".join(b"\x00" + b"".join(bytes(((x * 5) % 256, (y * 8) % 256, 160)) for x in range(w)) for y in range(h))
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# What the first run writes: the PNG, a binary file, and an SVG with a script in it.
PNG_SCRIPT = inspect.getsource(make_png) + """
open("dot.png", "wb").write(make_png())
open("data.bin", "wb").write(bytes(range(256)) * 16)
open("page.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
"""


def call_tool(url: str, key: str, name: str, arguments: dict) -> dict:
    request = urllib.request.Request(
        f"{url}/mcp",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "Authorization": f"Bearer {key}", "MCP-Protocol-Version": "2025-06-18"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        body = json.loads(response.read().decode())
    return body["result"]["structuredContent"]


def test_the_ui_in_a_browser(snakebox_bin: Path, tmp_path: Path):
    if not (CLIENTS / "node_modules" / "playwright-core").exists():
        pytest.fail("playwright-core is not installed: run scripts/install-clients")
    if not CHROMIUM.exists():
        pytest.fail("Chromium is not installed: run scripts/install-deps (as root)")
    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    marker = uuid.uuid4().hex
    shots = tmp_path / "shots"
    downloads = tmp_path / "downloads"
    shots.mkdir()
    downloads.mkdir()
    with http_server(snakebox_bin, data) as (proc, url):
        run = call_tool(url, key_a, "execute_python",
                        {"script": f"print('hello from the UI test', {marker!r})\n" + PNG_SCRIPT})
        assert run["status"] == "ok", run
        figure_script = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9, 16])\nplt.title('squares')\nplt.show()\n"
        figure = call_tool(url, key_a, "execute_python",
                           {"script": figure_script, "dependencies": [MATPLOTLIB], "timeout_seconds": 300})
        assert figure["status"] == "ok", figure
        failed = call_tool(url, key_a, "execute_python",
                           {"script": "def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n"})
        assert failed["exception"]["type_name"] == "ZeroDivisionError", failed
        name = f"ui-{marker[:8]}"
        session = call_tool(url, key_a, "create_session", {"name": name})
        session_id = session["session_id"]
        call_tool(url, key_a, "write_file", {"session_id": session_id, "path": "notes.txt", "content": "notes of A"})
        call_tool(url, key_a, "execute_python", {"session_id": session_id, "script": "x = 41\nprint(x + 1)"})

        # A long run, to be cancelled from the UI while it runs.
        long_run: dict = {}

        def run_long() -> None:
            script = "import time\nprint('long run started', flush=True)\ntime.sleep(120)\n"
            long_run.update(call_tool(url, key_a, "execute_python", {"script": script, "timeout_seconds": 300}))

        waiter = threading.Thread(target=run_long, daemon=True)
        waiter.start()
        args = {
            "url": url, "keyA": key_a, "keyB": key_b, "runId": run["execution_id"], "figureRunId": figure["execution_id"],
            "errorRunId": failed["execution_id"], "sessionId": session_id, "sessionName": name,
            "marker": marker, "shots": str(shots), "downloads": str(downloads),
        }
        # playwright-core resolves from target/clients: run the script from there.
        work = CLIENTS / f"ui-flow-{uuid.uuid4().hex}.mjs"
        work.write_text((REPO / "tests" / "clients" / "ui_flow.mjs").read_text())
        try:
            done = subprocess.run(
                [str(CLIENTS / "node_modules" / ".bin" / "node"), str(work), json.dumps(args)],
                cwd=CLIENTS, capture_output=True, text=True, timeout=300,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
            )
        finally:
            work.unlink()
        waiter.join(timeout=60)
        assert proc.poll() is None, "the server died under the browser"
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in report, report["error"]
    checks = report["checks"]

    # Login: a page without a session goes to the login form; the cookie is strict.
    assert checks["unauthenticatedGoesToLogin"] == "/ui/login"
    assert "not valid" in checks["wrongKeyMessage"]
    assert checks["cookie"] == {"httpOnly": True, "sameSite": "Strict", "path": "/ui"}
    # The long run: found running, cancelled from its page, and its MCP call answered so.
    assert checks["runningFound"] and checks["runningStatus"] == "running"
    assert "long run started" in checks["liveStdout"]
    assert checks["cancelledStatus"] == "cancelled"
    assert "long run started" in checks["cancelledStdout"]
    assert long_run.get("status") == "cancelled", long_run
    assert checks["cancelledId"] == long_run["execution_id"]
    # The run: listed, newest first, with its stdout on its page.
    runs = checks["runsListed"]
    assert runs[0] == f"/ui/runs/{long_run['execution_id']}", runs
    assert f"/ui/runs/{run['execution_id']}" in runs
    assert runs.index(f"/ui/runs/{failed['execution_id']}") < runs.index(f"/ui/runs/{run['execution_id']}")
    assert f"hello from the UI test {marker}" in checks["stdout"]
    assert checks["status"] == "ok"
    # What the run used, as the host measured it (the memory cgroup's peak).
    assert checks["usage"] and "Peak memory" in checks["usage"] and "MiB" in checks["usage"], checks["usage"]
    # The PNG inline, decoded by the browser; the SVG never inline.
    assert checks["image"]["width"] == 48 and checks["image"]["height"] == 32, checks["image"]
    assert all("page.svg" not in src for src in checks["inlineImages"])
    # The matplotlib figure: inline, and a real picture of matplotlib's default size (640x480).
    assert [(i["src"].rsplit("/", 1)[-1], i["width"], i["height"]) for i in checks["figure"]] == [
        ("figure-1.png", 640, 480)], checks["figure"]
    # Downloads: exact bytes, under their names.
    assert bytes.fromhex(checks["download:data.bin"]["hex"]) == bytes(range(256)) * 16
    assert bytes.fromhex(checks["download:dot.png"]["hex"]) == make_png()
    svg = checks["download:page.svg"]
    assert svg["suggested"] == "page.svg" and b"<script>" in bytes.fromhex(svg["hex"])
    assert "ZeroDivisionError" in checks["traceback"] and "ratio" in checks["traceback"]
    # The session: listed, its file, deleted after confirmation.
    assert checks["sessionListed"] is True
    assert {"notes.txt", "upload.txt"} <= set(checks["sessionFiles"]), checks["sessionFiles"]
    assert checks["sessionCells"] == 1
    assert checks["sessionFile"] == "notes of A"
    assert checks["sessionGone"] is True
    # Environment and clients.
    assert checks["environmentReady"] in ("ready", "not ready") and checks["limits"] > 0
    assert checks["endpoint"] == f"{url}/mcp"
    assert checks["claude"].startswith(f"claude mcp add --scope user --transport http snakebox {url}/mcp")
    assert checks["afterLogout"] == "/ui/login"
    # Tenant B: none of A's things.
    assert checks["loginRedirect:b"] == "/ui/login"
    assert checks["bRunsPage"] == {"hasRun": False, "hasMarker": False}
    assert checks["bSessions"] is False
    assert set(checks["bStatuses"].values()) == {404}, checks["bStatuses"]
    # A clean console: no errors, no CSP violations, no script errors.
    assert report["csp"] == [], report["csp"]
    assert report["pageErrors"] == [], report["pageErrors"]
    assert report["console"] == [], report["console"]

    # The screenshots, for docs/src/web-ui.md: written into docs/ui/ only when asked
    # (SNAKEBOX_UI_SCREENSHOTS=1), so a test run leaves the checkout as it was.
    assert len(list(shots.glob("*.png"))) >= 10
    if os.environ.get("SNAKEBOX_UI_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        for shot in sorted(shots.glob("*.png")):
            shutil.copyfile(shot, SHOTS / shot.name)
