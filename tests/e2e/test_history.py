"""The runs table (issue 11): every call that runs code is recorded in `<data>/store-v1.db`
with its owner, kind, script, status and duration, so the web UI and the audit log can read
what ran. Judged from outside: the database file the real server wrote, read with sqlite3.

- a server stopped cleanly (stdin closed) has written every call it answered;
- a server killed with SIGKILL mid-run leaves the row `running`, and the next server to open
  the data directory marks it `interrupted`;
- each tenant's rows are kept within its own budget: a tenant past it loses its own oldest
  runs, never another tenant's (issue 32).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import backend_flags, call, connect, have_bwrap
from http_support import http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


def rows(data_dir: Path) -> dict[str, dict]:
    db = data_dir / "store-v1.db"
    assert db.exists(), f"no runs table at {db}"
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return {row["execution_id"]: dict(row) for row in conn.execute("SELECT * FROM runs")}
    finally:
        conn.close()


async def test_every_call_that_runs_code_is_recorded(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    marker = uuid.uuid4().hex
    async with connect(snakebox_bin, data, "legacy") as client:
        ok, _, _ = await call(client, "execute_python", script=f"print('{marker}')")
        assert ok["status"] == "ok", ok
        failed, _, _ = await call(client, "execute_python", script="raise SystemExit(3)")
        assert failed["status"] == "error" and failed["exit_code"] == 3, failed
        bad, _, _ = await call(client, "execute_python", script="print(1)", timeout_seconds=0)
        assert bad["status"] == "invalid_request", bad
        session, _, _ = await call(client, "create_session")
        sid = session["session_id"]
        cell, _, _ = await call(client, "execute_python", script="x = 41\nx + 1", session_id=sid)
        assert cell["status"] == "ok", cell
        command, _, _ = await call(client, "run_command", session_id=sid, command="echo hi")
        assert command["status"] == "ok", command
    # The client closed stdin: the server stopped cleanly and wrote what it had queued.
    recorded = rows(data)
    expected = {
        ok["execution_id"]: ("execute", "ok", 0),
        failed["execution_id"]: ("execute", "error", 3),
        bad["execution_id"]: ("execute", "invalid_request", None),
        cell["execution_id"]: ("session_cell", "ok", 0),
        command["execution_id"]: ("command", "ok", 0),
    }
    for execution_id, (kind, status, exit_code) in expected.items():
        row = recorded.get(execution_id)
        assert row is not None, (execution_id, recorded)
        assert (row["kind"], row["status"], row["exit_code"]) == (kind, status, exit_code), row
        assert row["owner"] == "local", row
        assert row["started_at_ms"] > 0 and row["duration_ms"] is not None, row
    assert marker in recorded[ok["execution_id"]]["script"]
    assert recorded[cell["execution_id"]]["session_id"] == sid
    assert recorded[command["execution_id"]]["script"] == "echo hi"
    assert recorded[ok["execution_id"]]["python_version"] == ok["python_version"]
    assert json.loads(recorded[ok["execution_id"]]["dependencies"]) == []


def _send(proc: subprocess.Popen, message: dict) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


async def test_a_run_cut_by_sigkill_is_marked_interrupted_by_the_next_server(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [str(snakebox_bin), "serve", "--data-dir", str(data), "--no-warm-cache", *backend_flags()],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAKEBOX_LOG": "warn"},
    )
    try:
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_python",
            "arguments": {"script": f"# {marker}\nimport time\nprint('up', flush=True)\ntime.sleep(120)", "timeout_seconds": 200}}})
        # The call is admitted and recorded as running (the writer commits within moments).
        deadline = time.monotonic() + 120
        running = []
        while time.monotonic() < deadline and not running:
            if (data / "store-v1.db").exists():
                try:
                    running = [r for r in rows(data).values() if marker in r["script"] and r["status"] == "running"]
                except sqlite3.OperationalError:
                    running = []
            time.sleep(0.2)
        assert running, "the call was never recorded as running"
        assert proc.poll() is None, "the server died by itself"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # Still `running` on disk: nobody could mark it.
    (row,) = [r for r in rows(data).values() if marker in r["script"]]
    assert row["status"] == "running", row
    # The next server marks it interrupted when it opens the store, and keeps serving.
    async with connect(snakebox_bin, data, "legacy") as client:
        alive, _, _ = await call(client, "execute_python", script="print('next')")
        assert alive["status"] == "ok", alive
    row = rows(data)[row["execution_id"]]
    assert row["status"] == "interrupted", row


def test_a_tenant_over_its_runs_budget_loses_its_own_oldest_runs_only(snakebox_bin: Path, tmp_path: Path):
    """Issue 32, property 2 (the runs table): with `--tenant-history-max-runs 5`, team-a's
    twelve calls keep its newest five rows; team-b's three rows, older than all of them, stay;
    `check_environment` tells each tenant its own budget, use and removals."""
    from test_audit import stores, tool

    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    call_ = {"script": "print(1)", "timeout_seconds": 0}  # refused at once, recorded all the same
    with http_server(snakebox_bin, data, "--tenant-history-max-runs", "5") as (_proc, url):
        b_ids = [tool(url, key_b, "execute_python", call_)["result"]["structuredContent"]["execution_id"] for _ in range(3)]
        a_ids = [tool(url, key_a, "execute_python", call_)["result"]["structuredContent"]["execution_id"] for _ in range(12)]
        time.sleep(1)
        told_a, told_b = stores(url, key_a), stores(url, key_b)
    recorded = rows(data)
    owned = {t: [r["execution_id"] for r in sorted(recorded.values(), key=lambda r: r["started_at_ms"]) if r["owner"] == t]
             for t in ("team-a", "team-b")}
    assert owned["team-b"] == b_ids, owned
    assert owned["team-a"] == a_ids[-5:], owned
    assert told_a["runs"]["max_items"] == 5 and told_a["runs"]["used_items"] == 5, told_a
    assert told_a["runs"]["removed"] == 7, told_a
    assert told_b["runs"]["used_items"] == 3 and told_b["runs"]["removed"] == 0, told_b
