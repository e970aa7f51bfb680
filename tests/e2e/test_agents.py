"""Fronts and engine agents (issue 35, T1 with real processes): one front (`snakebox serve --http
--agents ...`) and three `snakebox agent` processes on loopback, each with its own data directory,
driven by the official MCP Python SDK over HTTP with two tenants.

- one-shot runs spread over the agents (each agent's own audit log, read with `snakebox audit`,
  shows its share);
- a session's cells land on the agent that made it (its state persists), and sessions spread;
- a tenant cannot see or use another tenant's session;
- a front restarted finds every live session again (from the agents), and two fronts (the second
  configured by the config file's `[front]`) serve one session in turn;
- `kill -9` of one agent: its session's next call answers `session_lost` with a hint, while a
  session on another agent and one-shot runs carry on;
- an agent refuses calls without a valid grant token (none, malformed, expired, for another
  agent, signed by another key, for another session, replayed, or sent straight to it by an MCP
  client) with 401, and runs nothing.

What is simulated: the hosts. Every process runs on this one, the agents on loopback ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import jwt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from backend_support import backend_flags
from conftest import call, connect as connect_stdio, have_bwrap
from http_support import free_port, http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

MODE = "auto"


def keypair(binary: Path, out: Path) -> tuple[Path, Path]:
    """`snakebox keys front-keypair --out DIR`: (front.key, front.pub)."""
    subprocess.run([str(binary), "keys", "front-keypair", "--out", str(out)], check=True,
                   capture_output=True, timeout=60)
    return out / "front.key", out / "front.pub"


@contextlib.contextmanager
def agent_process(binary: Path, data: Path, public_key: Path, pool: bool = False, host: str = "127.0.0.1",
                  port: int | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """`snakebox agent` on HOST:PORT (a free loopback port by default): the process and its URL,
    once it is ready. Without its warm pool unless `pool` (bench/agents.py)."""
    port = port or free_port()
    url = f"http://{host}:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [str(binary), "agent", "--listen", f"{host}:{port}", "--front-public-key", str(public_key),
             "--data-dir", str(data), "--no-warm-cache", *(() if pool else ("--warm-pool", "0")), *backend_flags()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAKEBOX_LOG": "warn"},
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"the agent exited at start: {log.read().decode(errors='replace')}")
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"{url}/readyz", timeout=2) as ready:
                        if ready.status == 200:
                            break
                assert time.monotonic() < deadline, "the agent did not become ready"
                time.sleep(0.1)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextlib.asynccontextmanager
async def connect(url: str, key: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=MODE,
                            read_timeout_seconds=300) as client:
        yield client


def runs_on(binary: Path, data: Path, tenant: str) -> int:
    """How many one-shot runs of `tenant` an agent's own audit log holds (`snakebox audit`)."""
    done = subprocess.run([str(binary), "audit", "--data-dir", str(data), "--tenant", tenant, "--json",
                           "--limit", "1000"], capture_output=True, text=True, timeout=60, check=True)
    return sum(1 for line in done.stdout.splitlines()
               if line.strip() and json.loads(line).get("kind") == "execute")


def sessions_on(url: str, private_key: Path, name: str, tenant: str) -> list[str]:
    """The session ids an agent holds for `tenant`, asked as a front would."""
    status, body = agent_post(url, "/v1/list_sessions", sign(private_key, name, tenant), None)
    assert status == 200, body
    return [s["session_id"] for s in body["Ok"]["sessions"]]


def sign(private_key: Path, agent: str, tenant: str, session: str | None = None, *,
         issued: float | None = None, lifetime: int = 30) -> str:
    """A grant token as a front signs it (EdDSA, the claims of snakebox_wire::token::Grant)."""
    now = int(issued if issued is not None else time.time())
    claims: dict[str, Any] = {"aud": "snakebox-agent", "agent": agent, "tenant": tenant, "iat": now,
                              "exp": now + lifetime, "jti": secrets.token_hex(16)}
    if session is not None:
        claims["session"] = session
    return jwt.encode(claims, private_key.read_bytes(), algorithm="EdDSA")


def agent_post(url: str, route: str, token: str | None, body: Any) -> tuple[int, Any]:
    """A raw POST to an agent: its status and JSON body (the last line of a streamed one)."""
    request = urllib.request.Request(
        f"{url}{route}", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return status, json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return status, text


def get_json(url: str) -> tuple[int, Any]:
    """A GET without a token: its status and JSON body."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def execute_body(script: str, session_id: str | None = None) -> dict[str, Any]:
    """An ExecuteRequest as JSON, every field given."""
    return {"script": script, "dependencies": [], "session_id": session_id, "timeout_seconds": None,
            "python_version": None, "files": [], "network": None, "allowed_domains": [],
            "allowed_imports": None, "profile": None, "memory_limit_bytes": None}


async def test_a_front_spreads_runs_keeps_sessions_and_loses_only_a_killed_agents_sessions(snakebox_bin: Path, tmp_path: Path):
    private, public = keypair(snakebox_bin, tmp_path / "keys")
    front_data = tmp_path / "front"
    key_a = make_key(snakebox_bin, front_data, "team-a")
    key_b = make_key(snakebox_bin, front_data, "team-b")
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(agent_process(snakebox_bin, tmp_path / f"agent{i}", public)) for i in range(3)]
        urls = [url for _, url in agents]
        names = [url.removeprefix("http://") for url in urls]
        front_args = ("--agents", ",".join(urls), "--front-key", str(private), "--warm-pool", "0")
        with http_server(snakebox_bin, front_data, *front_args) as (front, url):
            # The front is ready when its agents are (it runs nothing itself).
            assert get_json(f"{url}/readyz") == (200, {"ready": True, "problems": []})
            async with connect(url, key_a) as a:
                # One-shot runs spread over the agents.
                for i in range(6):
                    run, text, is_error = await call(a, "execute_python", script=f"print({i} * 7)")
                    assert not is_error and run["stdout"] == f"{i * 7}\n", text
                shares = [runs_on(snakebox_bin, tmp_path / f"agent{i}", "team-a") for i in range(3)]
                assert shares == [2, 2, 2], shares

                # Three sessions: spread, each cell on its own agent, state kept.
                sids = []
                for i in range(3):
                    session, text, is_error = await call(a, "create_session", name=f"s{i}")
                    assert not is_error, text
                    sid = session["session_id"]
                    sids.append(sid)
                    for _ in range(3):
                        await call(a, "execute_python", script=f"x = globals().get('x', {i * 100}) + 1", session_id=sid)
                for i, sid in enumerate(sids):
                    cell, text, _ = await call(a, "execute_python", script="print(x)", session_id=sid)
                    assert cell["stdout"] == f"{i * 100 + 3}\n", text
                holders = {sid: [n for n, (u, name) in enumerate(zip(urls, names))
                                 if sid in sessions_on(u, private, name, "team-a")] for sid in sids}
                assert sorted(h for held in holders.values() for h in held) == [0, 1, 2], holders
                listed, _, _ = await call(a, "list_sessions")
                assert sorted(s["session_id"] for s in listed["sessions"]) == sorted(sids), listed

            # Another tenant sees none of it.
            async with connect(url, key_b) as b:
                listed, _, _ = await call(b, "list_sessions")
                assert listed["sessions"] == [], listed
                stolen, text, is_error = await call(b, "execute_python", script="print(x)", session_id=sids[0])
                assert is_error and stolen["error"]["kind"] == "not_found", text
                mine, text, is_error = await call(b, "create_session")
                assert not is_error, text

        # A front restarted (a new process, no state of its own) finds every session; a second
        # front (its own data directory and keys, its agents from the config file's [front])
        # serves the same session in turn with it.
        second_data = tmp_path / "front2"
        key_a2 = make_key(snakebox_bin, second_data, "team-a")
        config = tmp_path / "front2.toml"
        config.write_text(f"[front]\nagents = {json.dumps(urls)}\nfront_key = {json.dumps(str(private))}\n")
        with http_server(snakebox_bin, front_data, *front_args) as (front, url), \
                http_server(snakebox_bin, second_data, "--config", str(config), "--warm-pool", "0") as (_, url2):
            async with connect(url, key_a) as a, connect(url2, key_a2) as a2:
                for i, sid in enumerate(sids):
                    cell, text, _ = await call(a, "execute_python", script="print(x)", session_id=sid)
                    assert cell["stdout"] == f"{i * 100 + 3}\n", text
                for turn in range(4):
                    client = (a, a2)[turn % 2]
                    cell, text, _ = await call(client, "execute_python", script="x += 1\nprint(x)", session_id=sids[1])
                    assert cell["stdout"] == f"{100 + 4 + turn}\n", (turn, text)

                # kill -9 of the agent holding the first session.
                victim = holders[sids[0]][0]
                agents[victim][0].kill()
                agents[victim][0].wait()
                # Still ready (two agents are), and it says which agent does not answer.
                status, ready = get_json(f"{url}/readyz")
                deadline = time.monotonic() + 20
                while not ready["problems"] and time.monotonic() < deadline:
                    time.sleep(0.5)
                    status, ready = get_json(f"{url}/readyz")
                assert status == 200 and ready["ready"], ready
                assert len(ready["problems"]) == 1 and names[victim] in ready["problems"][0], ready
                lost, text, is_error = await call(a, "execute_python", script="print(x)", session_id=sids[0])
                assert is_error, text
                assert lost["error"]["kind"] == "session_lost" and names[victim] in text, text
                assert "hint:" in text and "new session" in text, text
                # The other sessions carry on, and one-shot runs too (on the agents left).
                for i, sid in enumerate(sids[1:], start=1):
                    cell, text, is_error = await call(a, "execute_python", script="print(x)", session_id=sid)
                    assert not is_error and cell["stdout"] == f"{i * 100 + 3 + (4 if i == 1 else 0)}\n", text
                for i in range(4):
                    run, text, is_error = await call(a, "execute_python", script=f"print('after', {i})")
                    assert not is_error and run["stdout"] == f"after {i}\n", text
                # A new session goes to an agent that is alive.
                fresh, text, is_error = await call(a, "create_session")
                assert not is_error, text
                cell, text, is_error = await call(a, "execute_python", script="print('fresh')",
                                                  session_id=fresh["session_id"])
                assert not is_error and cell["stdout"] == "fresh\n", text


async def test_an_agent_refuses_calls_without_a_valid_token_and_runs_nothing(snakebox_bin: Path, tmp_path: Path):
    private, public = keypair(snakebox_bin, tmp_path / "keys")
    other_private, _ = keypair(snakebox_bin, tmp_path / "other-keys")
    data = tmp_path / "agent"
    with agent_process(snakebox_bin, data, public) as (_, url):
        name = url.removeprefix("http://")
        body = execute_body("open('/tmp/x', 'w')\nprint('ran')")
        cases = {
            "no token": None,
            "not a token": "sbx_" + "0" * 64,
            "expired": sign(private, name, "team-a", issued=time.time() - 600, lifetime=60),
            "valid too long": sign(private, name, "team-a", lifetime=3600),
            "for another agent": sign(private, "127.0.0.1:1", "team-a"),
            "signed by another key": sign(other_private, name, "team-a"),
            "unsigned (alg none)": jwt.encode({"aud": "snakebox-agent", "agent": name, "tenant": "team-a",
                                               "iat": int(time.time()), "exp": int(time.time()) + 30,
                                               "jti": secrets.token_hex(16)}, None, algorithm="none"),
            "for a session, sent for a one-shot run": sign(private, name, "team-a", session="s-1"),
        }
        for what, token in cases.items():
            status, answer = agent_post(url, "/v1/execute", token, body)
            assert status == 401, (what, status, answer)
            assert answer["error"] == "unauthorized" and answer["hint"], (what, answer)
        # Replayed: accepted once, refused the second time.
        token = sign(private, name, "team-a")
        status, answer = agent_post(url, "/v1/list_sessions", token, None)
        assert status == 200, answer
        status, answer = agent_post(url, "/v1/list_sessions", token, None)
        assert status == 401 and "used before" in answer["message"], answer
        # An MCP client sent straight to the agent: refused, not served.
        status, answer = agent_post(url, "/mcp", None, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert status == 404 and "front" in answer["hint"], answer
        # The probes and /metrics need no token (they carry no tenant's data).
        assert get_json(f"{url}/healthz") == (200, {"status": "ok", "agent": name})
        assert get_json(f"{url}/readyz")[0] == 200
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as metrics:
            assert metrics.status == 200 and "snakebox_sessions" in metrics.read().decode()
        # Nothing ran; proof of life: a good token runs.
        assert runs_on(snakebox_bin, data, "team-a") == 0
        status, answer = agent_post(url, "/v1/execute", sign(private, name, "team-a"), body)
        assert status == 200 and answer["result"]["stdout"] == "ran\n", answer
        assert runs_on(snakebox_bin, data, "team-a") == 1


async def test_a_stdio_front_runs_on_its_agent_as_the_local_tenant(snakebox_bin: Path, tmp_path: Path):
    """`snakebox serve --agents` on stdio (one user): its calls run on the agent, as `local`."""
    private, public = keypair(snakebox_bin, tmp_path / "keys")
    data = tmp_path / "agent"
    with agent_process(snakebox_bin, data, public) as (_, url):
        async with connect_stdio(snakebox_bin, tmp_path / "front", "auto", "--agents", url,
                                 "--front-key", str(private), "--warm-pool", "0") as client:
            run, text, is_error = await call(client, "execute_python", script="import os\nprint(os.getpid() > 0)")
            assert not is_error and run["stdout"] == "True\n", text
            session, text, is_error = await call(client, "create_session")
            assert not is_error, text
            cell, text, _ = await call(client, "execute_python", script="y = 5", session_id=session["session_id"])
            cell, text, _ = await call(client, "execute_python", script="print(y * 2)", session_id=session["session_id"])
            assert cell["stdout"] == "10\n", text
        assert runs_on(snakebox_bin, data, "local") == 1
        assert not (tmp_path / "front" / "audit" / "tenants" / "local.jsonl").exists()
