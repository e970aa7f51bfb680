"""Shared fixtures for the end-to-end suite: the real `snakebox` binary, spoken to over stdio
by the official MCP Python SDK (`mcp.Client`), in both protocol eras.

The backend every server of the suite runs on is chosen by `SNAKEBOX_E2E_BACKEND` (native,
docker or runsc: backend_support.py); every helper that starts the binary adds its
`backend_flags()`, and a test that asserts what only the native sandbox has is marked
`native_only(reason)` and skipped under docker with that reason (`pytest_runtest_setup`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from backend_support import E2E_BACKEND, backend_flags, docker_backend, reported_backend

__all__ = ["E2E_BACKEND", "backend_flags", "docker_backend", "reported_backend"]

REPO = Path(__file__).resolve().parents[2]

# Both protocol eras: the legacy `initialize` handshake and the 2026-07-28 revision.
MODES = ["legacy", "auto"]


def _binary() -> Path:
    explicit = os.environ.get("SNAKEBOX_BIN")
    if explicit:
        return Path(explicit)
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "snakebox"
        if candidate.exists():
            return candidate
    raise RuntimeError("snakebox binary not found: run `cargo build` or set SNAKEBOX_BIN")


@pytest.fixture(scope="session")
def snakebox_bin() -> Path:
    return _binary()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data directory for the session, so environments built once are reused (as in
    production); tests that need their own pass a different one."""
    path = tmp_path_factory.mktemp("snakebox-data")
    path.chmod(0o755)
    return path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def server_params(binary: Path, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    full_env = {"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    full_env.update(env or {})
    return StdioServerParameters(
        command=str(binary),
        args=["serve", "--data-dir", str(data_dir), "--no-warm-cache", *args, *backend_flags(args)],
        env=full_env,
    )


@contextlib.asynccontextmanager
async def connect(binary: Path, data_dir: Path, mode: str, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[Client]:
    async with Client(server_params(binary, data_dir, *args, env=env), mode=mode, read_timeout_seconds=300) as client:
        yield client


@pytest.fixture
async def client(snakebox_bin: Path, data_dir: Path, mode: str) -> AsyncIterator[Client]:
    async with connect(snakebox_bin, data_dir, mode) as c:
        yield c


async def call(client: Client, tool: str, **arguments: Any) -> tuple[dict[str, Any], str, bool]:
    """Call a tool; return (structuredContent, text, isError).

    A tool that could not do what was asked answers `isError` with no structuredContent (it
    would not match the tool's outputSchema) and says why in its text; for those, the first
    item is `{"error": {"kind", "message", "hint"}}` read back from that text, so tests judge
    exactly what a model is shown."""
    result = await client.call_tool(tool, arguments)
    text = "".join(block.text for block in result.content if getattr(block, "type", "") == "text")
    if result.structured_content is None and result.is_error:
        return {"error": error_from_text(text)}, text, True
    assert result.structured_content is not None, f"{tool} returned no structuredContent: {text}"
    return result.structured_content, text, bool(result.is_error)


def error_from_text(text: str) -> dict[str, Any]:
    """`error (KIND): MESSAGE` and `hint: HINT` lines of an error result, as a dict."""
    match = re.match(r"error \((\w+)\): (.*?)(?:\nhint: (.*))?\n?$", text, re.S)
    assert match, f"not an error text: {text!r}"
    kind, message, hint = match.groups()
    return {"kind": kind, "message": message, "hint": hint}


def have_bwrap() -> bool:
    return shutil.which("bwrap") is not None


def find_python(version: str) -> str | None:
    """A real interpreter binary of this version, if the machine has one."""
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        for entry in sorted(pyenv.iterdir()):
            if entry.name.startswith(version):
                candidate = entry / "bin" / "python3"
                if candidate.exists():
                    return str(candidate)
    found = shutil.which(f"python{version}")
    return found


def process_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def session_dirs(data_dir: Path, session: str) -> list[Path]:
    """Where a session's directory is on the host: in its tenant's share of the sessions' disk,
    `sessions-v1/shares/<slot>/<id>` (before shares, `sessions-v1/<id>`); none once deleted."""
    root = data_dir / "sessions-v1"
    return [p for p in [root / session, *root.glob(f"shares/*/{session}")] if p.is_dir()]


def session_dir(data_dir: Path, session: str) -> Path:
    """The one directory of a session on the host (see `session_dirs`)."""
    found = session_dirs(data_dir, session)
    assert len(found) == 1, f"the directory of session {session}: {found}"
    return found[0]


def server_pid(data_dir: Path) -> int:
    """The pid of the `snakebox serve` process using this data dir."""
    out = subprocess.run(["pgrep", "-f", f"serve --data-dir {data_dir}"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    assert pids, "server process not found"
    return pids[0]


_ENGINE: dict[str, str] = {}


def docker_engine(binary: Path) -> None:
    """A Docker engine that answers (scripts/dockerd starts one) and this host's run image in it
    (`snakebox image build`), once per session: skipped with the reason where no engine can
    run, a failure in CI."""
    if not _ENGINE:
        started = subprocess.run([str(REPO / "scripts" / "dockerd")], capture_output=True, text=True)
        if started.returncode != 0:
            _ENGINE["reason"] = f"no Docker engine can run here: {started.stderr.strip()}"
        else:
            built = subprocess.run([str(binary), "image", "build"], capture_output=True, text=True)
            assert built.returncode == 0, built.stderr
            _ENGINE["ready"] = "yes"
    if "reason" in _ENGINE:
        if os.environ.get("CI"):
            pytest.fail(_ENGINE["reason"])
        pytest.skip(_ENGINE["reason"])


def runsc_registered() -> bool:
    """Whether gVisor's runsc is a runtime of the engine (scripts/dockerd registers it)."""
    out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    return out.returncode == 0 and "runsc" in json.loads(out.stdout or "{}")


@pytest.fixture(scope="session", autouse=True)
def backend_ready() -> None:
    """Under SNAKEBOX_E2E_BACKEND=docker|runsc: the engine, the image and (runsc) the runtime,
    before the first server starts."""
    if not docker_backend():
        return
    docker_engine(_binary())
    if E2E_BACKEND == "runsc" and not runsc_registered():
        pytest.fail("SNAKEBOX_E2E_BACKEND=runsc: runsc is not registered with the engine (scripts/dockerd registers Debian's runsc)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `native_only(reason)` is skipped, with its reason, on the docker backend;
    one marked `not_runsc(reason)` under gVisor (SNAKEBOX_E2E_BACKEND=runsc)."""
    if docker_backend():
        why = item.get_closest_marker("native_only")
        if why is not None:
            pytest.skip(f"native backend only: {why.args[0]}")
    if E2E_BACKEND == "runsc":
        why = item.get_closest_marker("not_runsc")
        if why is not None:
            pytest.skip(f"not under gVisor: {why.args[0]}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "native_only(reason): skipped under the docker backend (SNAKEBOX_E2E_BACKEND, or an attack case's docker launch mode), with the reason")
    config.addinivalue_line("markers", "docker_ci: in the docker subset CI runs (an attack case's docker launch mode; elsewhere scripts/test's SNAKEBOX_E2E_BACKEND=docker pass)")
    config.addinivalue_line("markers", "not_runsc(reason): skipped under SNAKEBOX_E2E_BACKEND=runsc (gVisor), with the reason")
    config.addinivalue_line("markers", "docker_gap(reason): an attack case the docker backend fails for a documented reason (strict xfail under docker)")
    config.addinivalue_line("markers", "runsc_subset: an attack case also run under gVisor (test_attacks.py)")
