"""What a server holds on the host, judged from outside, and a stdio transport over a server
process the test owns (so it can signal it).

Shared by the lifecycle tests (`test_lifecycle.py`: clean stops), the fault suite
(`test_faults.py`: SIGKILL at each stage) and the soak (`soak_support.py`). Everything is read
from host `/proc`, `/proc/self/mountinfo`, the cgroup hierarchies and the data directory: never
from the server's own reports.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
from mcp import Client, types
from mcp.shared.message import SessionMessage

from attacks_support import marker_pids
from conftest import server_params

@contextlib.contextmanager
def normal_user(name: str) -> Iterator[pwd.struct_passwd]:
    """A fresh unprivileged user with a home of its own under /tmp, removed afterwards with
    every process it left (the tests that run snakebox as a user would: `test_nonroot.py`,
    `test_readme.py`)."""
    subprocess.run(["userdel", "-r", name], capture_output=True)
    home = Path(f"/tmp/{name}-{secrets.token_hex(4)}")
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        time.sleep(0.5)
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def real_uv() -> Path:
    """The uv binary itself (not a pyenv shim, which a normal user cannot run)."""
    candidates = [os.environ.get("SNAKEBOX_UV_PATH")]
    if shutil.which("pyenv"):
        candidates.append(subprocess.run(["pyenv", "which", "uv"], capture_output=True, text=True).stdout.strip())
    candidates.append(shutil.which("uv"))
    for candidate in filter(None, candidates):
        path = Path(candidate).resolve()
        if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
            return path
    raise LookupError("no uv binary found: install uv (scripts/install-deps)")


# How long the processes of a server that stopped or was killed may take to end (sandboxes
# die with it; the sessions' disk watchdog notices within a second).
GONE_WITHIN = 30.0


@dataclass
class Owned:
    """The server process behind an `owned_stdio` transport."""

    process: Any = None
    stdin_closed: bool = False
    stderr: list[bytes] = field(default_factory=list)

    async def close_stdin(self) -> None:
        self.stdin_closed = True
        await self.process.stdin.aclose()


@contextlib.asynccontextmanager
async def owned_stdio(argv: list[str], env: dict[str, str], owned: Owned) -> AsyncIterator[Any]:
    """An MCP stdio transport for `mcp.Client` over a process we spawn and keep."""
    process = await anyio.open_process(argv, env=env)
    owned.process = process
    to_client, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    to_server, from_client = anyio.create_memory_object_stream[SessionMessage](16)

    async def read_stdout() -> None:
        buffer = b""
        async with to_client:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for chunk in process.stdout:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                            await to_client.send(SessionMessage(message))

    async def read_stderr() -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in process.stderr:
                owned.stderr.append(chunk)

    async def write_stdin() -> None:
        async with from_client:
            async for message in from_client:
                if owned.stdin_closed:
                    continue
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    await process.stdin.send(data.encode())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(read_stderr)
        tasks.start_soon(write_stdin)
        try:
            yield from_server, to_server
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()
            tasks.cancel_scope.cancel()


def mounts_under(data_dir: Path) -> list[str]:
    """Mount points at or below the data directory, from our own mountinfo (the host's view)."""
    root = str(data_dir.resolve())
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                points.append(point)
    return points


def cgroups_of(pid: int, sits_like: int | None = None) -> list[str]:
    """The server's run cgroups: `snakebox-<pid>-*` at each hierarchy's root and below the
    cgroup the server itself sits in (cgroup v1 nests delegated memory cgroups), and the docker
    backend's parent of its containers' cgroups. For a server
    that is gone, `sits_like` names a living process started the same way (the same cgroups)."""
    parents = set(glob.glob("/sys/fs/cgroup/*")) | {"/sys/fs/cgroup"}
    with contextlib.suppress(OSError), open(f"/proc/{sits_like or pid}/cgroup") as own:
        for line in own:
            _, controllers, path = line.strip().split(":", 2)
            for controller in (controllers.removeprefix("name=").split(",") if controllers else ["unified"]):
                parents.add(f"/sys/fs/cgroup/{controller}{path}".rstrip("/"))
    found: set[str] = set()
    for parent in parents:
        found.update(glob.glob(f"{parent}/snakebox-{pid}-*"))
    # The docker backend's: `snakebox-docker/<pid namespace>.<pid>.<start time>` at each
    # hierarchy's root, the parent of its containers' cgroups (docker/usage.rs).
    found.update(glob.glob(f"/sys/fs/cgroup/snakebox-docker/*.{pid}.*"))
    found.update(glob.glob(f"/sys/fs/cgroup/*/snakebox-docker/*.{pid}.*"))
    return sorted(found)


def run_dirs_of(data_dir: Path, pid: int) -> list[str]:
    own = data_dir / "runs" / str(pid)
    if not own.exists():
        return []
    return [str(own), *(str(p) for p in own.iterdir())]


def holdings(data_dir: Path, pid: int, markers: list[str]) -> dict[str, list]:
    return {
        "mounts": mounts_under(data_dir),
        "cgroups": cgroups_of(pid),
        "run_dirs": run_dirs_of(data_dir, pid),
        "sandbox_processes": [p for marker in markers for p in marker_pids(marker)],
    }


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# The server's processes, by pid ancestry.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One host process, identified by pid and start time (a pid may be reused)."""

    pid: int
    start: int
    cmdline: str

    def alive(self) -> bool:
        """Still running (a zombie is dead: it only waits to be reaped)."""
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, start time, parent pid) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19]), int(fields[1])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(pid: int) -> list[Proc]:
    """Every living process below `pid` (threads are not processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                children.setdefault(stat[2], []).append(int(entry))
    found: list[Proc] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        stat = _stat(child)
        if stat is None:
            continue
        found.append(Proc(child, stat[1], _cmdline(child)))
        stack.extend(children.get(child, []))
    return found


def mentioning(text: str) -> list[Proc]:
    """Living processes whose command line names `text` (a data directory: every sandbox,
    fork server, uv and watchdog of a server names it), the caller excluded."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        line = _cmdline(int(entry))
        stat = _stat(int(entry))
        if text in line and stat is not None and stat[0] != "Z":
            found.append(Proc(int(entry), stat[1], line))
    return found


def cgroup_members(paths: list[str]) -> dict[str, str]:
    """Processes still in these cgroups (a removed cgroup has none)."""
    left = {}
    for path in paths:
        with contextlib.suppress(OSError):
            text = Path(path, "cgroup.procs").read_text().strip()
            if text:
                left[path] = text
    return left


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------------------------------------
# A server the test owns, stopped or killed from outside.
# ---------------------------------------------------------------------------------------------


@dataclass
class Server:
    client: Client
    owned: Owned
    data_dir: Path
    stopped_cleanly: bool = False
    pending: list[Any] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.owned.process.pid

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, arguments)
        assert result.structured_content is not None, result.content
        return result.structured_content


@contextlib.asynccontextmanager
async def serve(snakebox_bin: Path, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[Server]:
    """A server on `data_dir`, spoken to by the official client over a stdio transport this
    module owns. Left normally, it is stopped cleanly (stdin closed) and must exit with 0
    leaving nothing behind: no process naming its data directory, no mount, cgroup or run
    directory of it."""
    params = server_params(snakebox_bin, data_dir, *args, env=env)
    owned = Owned()
    async with Client(owned_stdio([params.command, *params.args], params.env or {}, owned), mode="legacy", read_timeout_seconds=300) as client:
        server = Server(client, owned, data_dir)
        await client.list_tools()  # the SDK checks results against the tools' schemas
        yield server
        if owned.process.returncode is None:
            await owned.close_stdin()
            with anyio.fail_after(30):
                await owned.process.wait()
            server.stopped_cleanly = True
    if server.stopped_cleanly:
        stderr = b"".join(owned.stderr).decode(errors="replace")
        assert owned.process.returncode == 0, stderr
        await wait_for(lambda: not mentioning(str(data_dir)), GONE_WITHIN, "the stopped server's processes to end")
        after = holdings(data_dir, server.pid, [])
        assert after == {"mounts": [], "cgroups": [], "run_dirs": [], "sandbox_processes": []}, (after, stderr)
