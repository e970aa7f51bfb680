"""One store and a tenant's own settings (issue 34, item 5), judged over HTTP against the real
binary with two tenants' keys.

- `[tenants.NAME]` sets one tenant's bounds apart from the `[tenants]` defaults: that tenant is
  held to its own (sessions, runs per minute), another keeps the defaults, and each is told
  its own bounds in `check_environment` and nothing of the other's.
- A data directory of a version before the one store (its runs in `store-v1.db`, its
  sessions in `sessions-v1/sessions.db` (or, older, inside the one image `sessions-v1.img`
  all sessions shared), its keys in `keys-v1.db`), made by that version's binary (`SNAKEBOX_OLD_BIN`, default `/tmp/snakebox-old`; skipped without it), is taken up
  by this one: the old keys still authenticate, the old runs are listed, the old session is
  there with its files, and the old files are kept aside as `<name>.imported`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from conftest import call, have_bwrap
from http_support import http_server, make_key
from test_http import connect
from test_tenants import ui_get, ui_login

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

OLD_BIN = Path(os.environ.get("SNAKEBOX_OLD_BIN", "/tmp/snakebox-old"))


async def test_a_tenant_table_holds_for_that_tenant_only(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    config = tmp_path / "snakebox.toml"
    config.write_text(
        "[tenants]\n"
        "max_sessions = 2\n"
        "runs_per_minute = 30\n"
        "[tenants.team-a]\n"
        "max_sessions = 1\n"
        "runs_per_minute = 2\n"
        "default_profile = \"basic\"\n"
    )
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    with http_server(snakebox_bin, data, "--config", str(config)) as (proc, url):
        async with connect(url, key_a, "legacy") as a, connect(url, key_b, "legacy") as b:
            report_a, _, _ = await call(a, "check_environment")
            report_b, _, _ = await call(b, "check_environment")
            # Each is told its own tenant, and nothing of the other's.
            assert report_a["tenant"]["name"] == "team-a", report_a["tenant"]
            assert (report_a["tenant"]["max_sessions"], report_a["tenant"]["runs_per_minute"]) == (1, 2)
            assert report_a["default_profile"] == report_a["tenant"]["default_profile"] == "basic"
            assert report_b["tenant"]["name"] == "team-b", report_b["tenant"]
            assert (report_b["tenant"]["max_sessions"], report_b["tenant"]["runs_per_minute"]) == (2, 30)
            assert report_b["default_profile"] == "standard"
            assert "team-a" not in json.dumps(report_b) and "team-b" not in json.dumps(report_a)

            # Sessions: A's one, B's two.
            first, text, is_error = await call(a, "create_session")
            assert not is_error, text
            second, text, is_error = await call(a, "create_session")
            assert is_error and second["error"]["kind"] == "quota", text
            assert "max_sessions" in second["error"]["hint"] and "[tenants.NAME]" in second["error"]["hint"]
            for _ in range(2):
                made, text, is_error = await call(b, "create_session")
                assert not is_error, text
            third, text, is_error = await call(b, "create_session")
            assert is_error and third["error"]["kind"] == "quota", text

            # Runs per minute: A's third call in the minute is refused (`basic`, its default,
            # is what its runs were held to); B's are not.
            for i in range(2):
                ok, text, _ = await call(a, "execute_python", script=f"print({i})")
                assert ok["status"] == "ok" and ok["profile"] == "basic", text
            refused, text, is_error = await call(a, "execute_python", script="print(2)")
            assert is_error and refused["error"]["kind"] == "quota", text
            for i in range(3):
                ok, text, _ = await call(b, "execute_python", script=f"print({i})")
                assert ok["status"] == "ok" and ok["profile"] == "standard", text
        assert proc.poll() is None


async def test_an_upgraded_data_dir_keeps_its_keys_runs_and_sessions(snakebox_bin: Path, tmp_path: Path):
    if not OLD_BIN.is_file():
        pytest.skip(f"no binary of the version before the one store at {OLD_BIN} (SNAKEBOX_OLD_BIN)")
    data = tmp_path / "data"
    key_a = make_key(OLD_BIN, data, "team-a")
    key_b = make_key(OLD_BIN, data, "team-b")
    assert (data / "keys-v1.db").is_file()
    with http_server(OLD_BIN, data) as (_proc, url):
        async with connect(url, key_a, "legacy") as a:
            run, text, _ = await call(a, "execute_python", script="print('before the upgrade')")
            assert run["status"] == "ok", text
            session, text, is_error = await call(a, "create_session", name="kept")
            assert not is_error, text
            sid = session["session_id"]
            cell, text, _ = await call(a, "execute_python", session_id=sid,
                                       script="open('note.txt', 'w').write('written before')\n")
            assert cell["status"] == "ok", text
    # The old version's files are there, each its own (its sessions' file in the one image
    # all sessions shared then, when it was root: `sessions-v1.img`).
    assert (data / "sessions-v1" / "sessions.db").is_file() or (data / "sessions-v1.img").is_file()
    old_runs = sqlite3.connect(data / "store-v1.db")
    try:
        tables = {row[0] for row in old_runs.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        old_runs.close()
    assert "runs" in tables and "keys" not in tables and "sessions" not in tables, tables
    # A key revoked by the old version stays revoked.
    revoked = make_key(OLD_BIN, data, "team-c")
    import subprocess

    listed = subprocess.run([str(OLD_BIN), "keys", "list", "--data-dir", str(data)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    key_id = next(line.split()[0] for line in listed.splitlines() if "team-c" in line)
    subprocess.run([str(OLD_BIN), "keys", "revoke", key_id, "--data-dir", str(data)],
                   capture_output=True, text=True, timeout=60, check=True)

    with http_server(snakebox_bin, data) as (proc, url):
        async with connect(url, key_a, "legacy") as a, connect(url, key_b, "legacy") as b:
            # The old keys authenticate their tenants; the session is A's, with its file.
            sessions, text, _ = await call(a, "list_sessions")
            assert [s["session_id"] for s in sessions["sessions"]] == [sid], text
            again, text, _ = await call(a, "execute_python", session_id=sid,
                                        script="print(open('note.txt').read())")
            assert again["status"] == "ok" and again["stdout"] == "written before\n", text
            theirs, text, _ = await call(b, "list_sessions")
            assert theirs["sessions"] == [], text
        # The old run is listed on A's runs page.
        cookie = ui_login(url, key_a)
        status, page = ui_get(f"{url}/ui/runs", cookie)
        assert status == 200 and run["execution_id"] in page, page[:500]
        # The revoked key is refused.
        from test_http import plain_get

        status, _, _ = plain_get(f"{url}/metrics", revoked)
        assert status == 401, status
        assert proc.poll() is None
    # One file now: the old ones are kept aside, renamed, and nothing reads them.
    assert not (data / "keys-v1.db").exists() and (data / "keys-v1.db.imported").is_file()
    assert not (data / "sessions-v1" / "sessions.db").exists()
    assert (data / "sessions-v1" / "sessions.db.imported").is_file()
    store = sqlite3.connect(data / "store-v1.db")
    try:
        tables = {row[0] for row in store.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"runs", "sessions", "shares", "keys", "migrations"} <= tables, tables
    finally:
        store.close()
    assert (data / "store-v1.db").stat().st_mode & 0o077 == 0
    # A second start of the new version finds everything where it is.
    with http_server(snakebox_bin, data) as (_proc, url):
        async with connect(url, key_a, "legacy") as a:
            sessions, text, _ = await call(a, "list_sessions")
            assert [s["session_id"] for s in sessions["sessions"]] == [sid], text
