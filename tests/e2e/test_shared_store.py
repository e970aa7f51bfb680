"""Several fronts, one deployment (issue 35): two `snakebox serve --http` processes with data
directories of their own share one PostgreSQL (`--database`), a real cluster the test makes
(pg_support.py). Judged from outside, through each front and the database itself:

- a key made by `snakebox keys add --database …` works on both fronts; revoked through
  `snakebox keys revoke --database …`, it is refused by both on their next request;
- a run made through one front is in the runs table seen through the other (its web UI);
- the audit lines of both fronts land in the database (`snakebox audit --database …` and psql),
  and nothing of keys, runs or audit is kept in either data directory;
- the database's password is never printed or logged; a bad URL or an unreachable database
  stops `serve` at start with a hint; `snakebox check` names the store;
- while the database is down a front refuses keyed requests (503, fail closed) and serves
  them again once it is back, without a restart.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import sqlite3
import subprocess
import urllib.parse
import uuid
from pathlib import Path
from typing import AsyncIterator

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import backend_flags, call, have_bwrap
from http_support import free_port, http_server
from pg_support import pg_bin, pg_cluster, pg_start, pg_stop, psql

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(pg_bin() is None, reason="PostgreSQL is not installed (Debian: apt-get install postgresql)"),
]


def snakebox(binary: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)


@contextlib.asynccontextmanager
async def connect(url: str, key: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy", read_timeout_seconds=300) as client:
        yield client


def status_of(url: str, key: str) -> int:
    """The status of a tools/list POST with `key`."""
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    conn.request("POST", "/mcp", body=body, headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {key}"})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def ui_page(url: str, key: str, path: str) -> tuple[int, str]:
    """Log in to the web UI with `key` and GET `path` with the session's cookie."""
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("POST", "/ui/login", body=urllib.parse.urlencode({"key": key}), headers={
        "Content-Type": "application/x-www-form-urlencoded", "Origin": url})
    login = conn.getresponse()
    login.read()
    cookie = login.getheader("Set-Cookie")
    assert cookie, f"no session cookie: {login.status}"
    conn.request("GET", path, headers={"Cookie": cookie.split(";")[0]})
    page = conn.getresponse()
    text = page.read().decode()
    conn.close()
    return page.status, text


def password_of(url: str) -> str:
    return urllib.parse.urlparse(url).password or ""


async def test_two_fronts_share_keys_runs_and_the_audit_log(snakebox_bin: Path, tmp_path: Path):
    data_a, data_b = tmp_path / "front-a", tmp_path / "front-b"
    marker = uuid.uuid4().hex
    with pg_cluster() as database:
        secret = password_of(database)
        made = snakebox(snakebox_bin, "keys", "add", "--tenant", "team-a", "--database", database, "--data-dir", str(data_a))
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        assert key.startswith("sbx_"), made.stdout
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        with http_server(snakebox_bin, data_a, "--database", database, log_path=logs[0]) as (_, url_a), \
                http_server(snakebox_bin, data_b, "--database", database, log_path=logs[1]) as (_, url_b):
            # The key made once works on both fronts.
            assert status_of(url_a, key) == 200
            assert status_of(url_b, key) == 200
            # A run through front A...
            async with connect(url_a, key) as a:
                ran, _, _ = await call(a, "execute_python", script=f"print('{marker}')")
            assert ran["status"] == "ok", ran
            run_id = ran["execution_id"]
            # ...is in the runs table seen through front B (its web UI), with its script.
            status, listing = ui_page(url_b, key, "/ui/runs")
            assert status == 200 and f"/ui/runs/{run_id}" in listing, listing[:2000]
            status, page = ui_page(url_b, key, f"/ui/runs/{run_id}")
            assert status == 200 and marker in page, page[:2000]
            # A call through front B: an audit line of B's.
            async with connect(url_b, key) as b:
                sessions, _, _ = await call(b, "list_sessions")
            assert "error" not in sessions, sessions
            # Revoked through the CLI of another data directory: refused by both fronts.
            listed = snakebox(snakebox_bin, "keys", "list", "--json", "--database", database, "--data-dir", str(tmp_path / "elsewhere"))
            assert listed.returncode == 0, listed.stderr
            [info] = json.loads(listed.stdout)
            assert info["tenant"] == "team-a" and info["revoked_at"] is None, info
            revoked = snakebox(snakebox_bin, "keys", "revoke", info["id"], "--database", database, "--data-dir", str(data_b))
            assert revoked.returncode == 0, revoked.stderr
            assert status_of(url_b, key) == 401
            assert status_of(url_a, key) == 401
        # Both fronts' audit lines are in the database: A's run, B's call.
        audit = snakebox(snakebox_bin, "audit", "--json", "--database", database, "--data-dir", str(tmp_path / "elsewhere"))
        assert audit.returncode == 0, audit.stderr
        calls = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
        ran_line = [c for c in calls if c.get("execution_id") == run_id]
        assert ran_line and ran_line[0]["status"] == "ok" and ran_line[0]["tenant"] == "team-a", calls
        assert any(c.get("tool") == "list_sessions" for c in calls), calls
        rows = psql(database, "SELECT tenant, count(*) FROM snakebox_audit GROUP BY tenant")
        assert rows and rows[0][0] == "team-a" and int(rows[0][1]) >= 3, rows
        [[owner, run_status, host]] = psql(database, f"SELECT owner, status, server_host FROM snakebox_runs WHERE execution_id = '{run_id}'")
        assert (owner, run_status) == ("team-a", "ok") and host, (owner, run_status, host)
        [[hashed]] = psql(database, "SELECT count(*) FROM snakebox_keys WHERE position(decode(substr($$" + key + "$$, 5), 'escape') in hash) > 0")
        assert hashed == "0", "the key is stored in clear"
        # Nothing of keys, runs or audit in either data directory (sessions' store only).
        for data in (data_a, data_b):
            assert not (data / "audit").exists(), list(data.iterdir())
            store = data / "store-v1.db"
            if store.exists():
                conn = sqlite3.connect(store)
                try:
                    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
                    assert conn.execute("SELECT count(*) FROM keys").fetchone()[0] == 0
                finally:
                    conn.close()
        # The password was never printed or logged.
        for text in [made.stdout, made.stderr, listed.stdout, listed.stderr, revoked.stdout,
                     revoked.stderr, audit.stderr, *(log.read_text() for log in logs)]:
            assert secret not in text


def test_a_bad_or_unreachable_database_stops_serve_with_a_hint(snakebox_bin: Path, tmp_path: Path):
    closed = free_port()
    unreachable = f"postgres://snakebox:pw-never-shown@127.0.0.1:{closed}/snakebox"
    for url, says in [
        (unreachable, "Failed to connect to the database `postgres://snakebox:***@127.0.0.1:"),
        ("mysql://u:pw-never-shown@db/x", "does not start with `postgres://`"),
    ]:
        done = subprocess.run(
            [str(snakebox_bin), "serve", "--http", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"),
             "--no-warm-cache", "--database", url, *backend_flags(())],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )
        assert done.returncode != 0, done
        assert says in done.stderr and "hint:" in done.stderr, done.stderr
        assert "pw-never-shown" not in done.stderr + done.stdout
        # Refused before it took anything of the host: no mount of its data directory is left.
        assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
        keys = snakebox(snakebox_bin, "keys", "list", "--database", url, "--data-dir", str(tmp_path / "data"))
        assert keys.returncode != 0 and says in keys.stderr and "hint:" in keys.stderr, keys.stderr
        assert "pw-never-shown" not in keys.stderr + keys.stdout


def test_check_names_the_store_without_its_password(snakebox_bin: Path, tmp_path: Path):
    with pg_cluster() as database:
        done = snakebox(snakebox_bin, "check", "--database", database, "--data-dir", str(tmp_path / "data"), *backend_flags(()))
        assert "store:     postgresql postgres://snakebox:***@127.0.0.1:" in done.stdout, done.stdout
        assert password_of(database) not in done.stdout + done.stderr
    local = snakebox(snakebox_bin, "check", "--data-dir", str(tmp_path / "data"), *backend_flags(()))
    assert f"store:     sqlite {tmp_path / 'data' / 'store-v1.db'}" in local.stdout, local.stdout


async def test_a_key_revoked_through_the_database_ends_its_stream_on_another_front(snakebox_bin: Path, tmp_path: Path):
    # Helpers of the one-host revocation test: streams read in the background.
    from test_http_edge import MCP_HEADERS, REVOCATION_BOUND_S, bearer, long_call, progress_lines, streams
    import time

    marker = uuid.uuid4().hex
    with pg_cluster() as database:
        def add(tenant: str) -> str:
            made = snakebox(snakebox_bin, "keys", "add", "--tenant", tenant, "--database", database, "--data-dir", str(tmp_path / "ops"))
            assert made.returncode == 0, made.stderr
            return made.stdout.strip().splitlines()[-1]

        key_a, key_b = add("team-a"), add("team-b")
        with http_server(snakebox_bin, tmp_path / "front-a", "--database", database) as (_, url_a), \
                http_server(snakebox_bin, tmp_path / "front-b", "--database", database) as (_, url_b):
            async with streams() as open_stream:
                run_a = await open_stream("a run", "POST", f"{url_a}/mcp", headers={**MCP_HEADERS, **bearer(key_a)},
                                          json=long_call(f"import time\nprint('{marker}', flush=True)\ntime.sleep(60)", 41))
                run_b = await open_stream("b run", "POST", f"{url_b}/mcp", headers={**MCP_HEADERS, **bearer(key_b)},
                                          json=long_call(f"import time\nprint('{marker}', flush=True)\ntime.sleep(3)\nprint('b done')", 42))
                for run in (run_a, run_b):
                    assert run.status == 200
                    assert await run.wait_for(lambda: marker in progress_lines(run), 120), run.text()
                    assert run.ended_at is None
                # Revoked by the operator against the database, not through front A.
                listed = json.loads(snakebox(snakebox_bin, "keys", "list", "--json", "--database", database,
                                             "--data-dir", str(tmp_path / "ops")).stdout)
                (entry,) = [k for k in listed if k["tenant"] == "team-a"]
                revoked = snakebox(snakebox_bin, "keys", "revoke", entry["id"], "--database", database, "--data-dir", str(tmp_path / "ops"))
                assert revoked.returncode == 0, revoked.stderr
                revoked_at = time.monotonic()
                # Front A's open stream of that key ends within the one-host bound; both fronts
                # refuse the key's next request; team-b's call on front B goes on to its end.
                await run_a.wait_for(lambda: run_a.ended_at is not None, 30)
                assert run_a.ended_at is not None, run_a.text()
                took = run_a.ended_at - revoked_at
                assert took <= REVOCATION_BOUND_S, took
                assert not any(m.get("id") == 41 and "result" in m for m in run_a.messages()), run_a.text()
                assert status_of(url_a, key_a) == 401 and status_of(url_b, key_a) == 401
                result = (await run_b.reply(42))["result"]["structuredContent"]
                assert result["status"] == "ok" and "b done" in result["stdout"], result
                assert status_of(url_b, key_b) == 200


def test_a_front_refuses_keyed_requests_while_the_database_is_down_and_serves_once_it_is_back(snakebox_bin: Path, tmp_path: Path):
    with pg_cluster() as database:
        made = snakebox(snakebox_bin, "keys", "add", "--tenant", "team-a", "--database", database, "--data-dir", str(tmp_path / "ops"))
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        log = tmp_path / "front.log"
        with http_server(snakebox_bin, tmp_path / "front", "--database", database, log_path=log) as (proc, url):
            assert status_of(url, key) == 200
            pg_stop(database)
            assert status_of(url, key) == 503
            assert proc.poll() is None, "the front died with its database"
            pg_start(database)
            assert status_of(url, key) == 200
        text = log.read_text()
        assert "the API key store cannot be read" in text, text
        assert password_of(database) not in text
