#!/usr/bin/env python3
"""snakebox benchmark harness: snakebox and its baselines, measured in one run, as one table.

What it measures (see bench/README.md for how to run it and BENCHMARKS.md for results):

- baselines: a bare `python3 -c "print('hi')"` (the real interpreter binary, never a pyenv
  shim), `uv run --script`, and bubblewrap + `uv run --script` exactly the way
  `mcp-python-exec-sandbox` runs each call;
- snakebox over MCP stdio with the official Python SDK (`mcp.Client`), a warm server with the
  native sandbox fully on (default flags, its own fresh --data-dir): `print('hi')`, a script
  importing a cached dependency (numpy) against a bare `import numpy` in a ready venv, the
  first run of a dependency set that is in uv's cache but not installed against
  `uv pip install` + the bare run, throughput with 8 concurrent clients, and the server's
  memory (idle, and growth after a run printing 200 MiB), and (issue 19) a cell `x = x + 1`
  in a live session and `import pandas` + `describe()` of 1e5 rows in a cached environment
  against a bare venv with bytecode compiled.

Latency rows are measured round-robin (one sample of each row per round), so drift in the
machine's load affects baselines and snakebox alike, back to back (a pause between samples
lets the server's threads and processes go idle: waking them costs a session cell ≈ 0.8 ms on
these virtual machines, measured). A forked run's processes finish exiting after its reply, so
with `--compare` the older build's sample comes before the newer one's in each round. Ratios
are medians over medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

REPO = Path(__file__).resolve().parents[1]

HI = "print('hi')"
HI_SCRIPT = "# /// script\n# dependencies = []\n# ///\nprint('hi')\n"
PANDAS_SCRIPT = (
    "import numpy, pandas\n"
    "frame = pandas.DataFrame(numpy.random.default_rng(0).random((100_000, 4)), columns=list('abcd'))\n"
    "print(frame.describe().shape)\n"
)
PANDAS_OUT = "(8, 4)\n"
PRINT_200_MIB = (
    "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.buffer.write(chunk)\n"
)

# Index, certificate and proxy settings passed to uv, the baselines' and snakebox's alike (the same
# allow-list as snakebox-env's `env_vars.rs`).
PASS_THROUGH = (
    "UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_FIND_LINKS",
    "UV_INDEX_STRATEGY", "UV_KEYRING_PROVIDER", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT",
    "UV_CONCURRENT_DOWNLOADS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
    "all_proxy", "no_proxy",
)  # fmt: skip


def passed_through() -> dict[str, str]:
    return {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}


# Targets from issue 5.
TARGET_PRINT_MS = 10.0
TARGET_PRINT_RATIO = 0.25
TARGET_NUMPY_RATIO = 1.15
TARGET_FIRST_RUN_RATIO = 1.2
TARGET_RUNS_PER_S = 150.0
TARGET_IDLE_MIB = 20.0
# Issue 19.
TARGET_SESSION_CELL_MS = 1.5
TARGET_PANDAS_RATIO = 0.1
# A normal user's warm print('hi') against root's, same run (issue 33).
TARGET_USER_PRINT_RATIO = 1.5
TARGET_GROWTH_MIB = 5.0


# ---------------------------------------------------------------------------------------------
# Small helpers


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[index]


@dataclass
class Row:
    name: str
    samples: list[float] = field(default_factory=list)  # milliseconds
    unit: str = "ms"
    value: float | None = None  # for non-latency rows (runs/s, MiB)
    baseline: str | None = None  # name of the row this one is compared with
    target: str = ""
    met: bool | None = None
    note: str = ""
    cpu: list[float] = field(default_factory=list)  # CPU ms per sample, where measured

    @property
    def median(self) -> float | None:
        if self.value is not None:
            return self.value
        return statistics.median(self.samples) if self.samples else None

    @property
    def p95(self) -> float | None:
        return percentile(self.samples, 0.95) if self.samples else None


def real_python(version: str | None) -> tuple[str, str]:
    """The real interpreter binary (pyenv shims resolved) and its version `X.Y.Z`."""
    candidates: list[str] = []
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        found = []
        for entry in pyenv.iterdir():
            parts = entry.name.split(".")
            if len(parts) == 3 and parts[0] == "3" and all(p.isdigit() for p in parts):
                if version is None or entry.name == version or entry.name.startswith(version + "."):
                    binary = entry / "bin" / f"python{parts[0]}.{parts[1]}"
                    if binary.exists():
                        found.append((tuple(int(p) for p in parts), str(binary)))
        candidates += [b for _, b in sorted(found, reverse=True)]
    if version:
        which = shutil.which(f"python{version}")
        if which:
            candidates.append(which)
    candidates.append(shutil.which("python3") or "/usr/bin/python3")
    for candidate in candidates:
        out = subprocess.run(
            [candidate, "-c", "import sys, platform; print(sys.executable); print(platform.python_version())"],
            capture_output=True,
            text=True,
        )
        if out.returncode == 0:
            exe, ver = out.stdout.split()
            return os.path.realpath(exe), ver
    raise SystemExit(f"no Python {version or '3'} found")


def real_uv(explicit: str | None) -> str:
    """The real uv binary (a pyenv shim is a shell script: resolve it with `pyenv which`)."""
    if explicit:
        return explicit
    found = shutil.which("uv")
    if found and "/shims/" in found:
        out = subprocess.run(["pyenv", "which", "uv"], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip()
    for candidate in [found, str(Path.home() / ".local/bin/uv"), str(Path.home() / ".cargo/bin/uv")]:
        if candidate and Path(candidate).exists():
            return os.path.realpath(candidate)
    raise SystemExit("uv not found: pass --uv")


def clean_env() -> dict[str, str]:
    """The environment of the bare baselines: nothing inherited that changes Python's behaviour
    (a PYTHONDONTWRITEBYTECODE in the caller's shell would make every bare import recompile)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8"}


def timed_run(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None, expect: str | None = None) -> float:
    env = env if env is not None else clean_env()
    start = time.perf_counter()
    out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=cwd)
    elapsed = (time.perf_counter() - start) * 1000
    if out.returncode != 0 or (expect is not None and out.stdout.decode() != expect):
        raise RuntimeError(
            f"baseline command failed ({out.returncode}): {argv}\nstdout: {out.stdout[-2000:]!r}\nstderr: {out.stderr[-2000:]!r}"
        )
    return elapsed


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for pid {pid}")


class CpuAcct:
    """CPU time of a process tree, from a cgroup v1 `cpuacct` group of our own.

    rusage cannot do it: bwrap's outer process exits without reaping its pid 1, so the
    sandboxed interpreter's CPU time is never added to anyone's children's time. A cgroup
    counts every process in it, wherever it is reparented. (snakebox moves runs into memory,
    pids and cpu cgroups only, so they stay in this one; the fork servers, started before the
    group is, are added with their servers.) `None` when there is no writable v1
    cpuacct hierarchy: the CPU columns are then left out."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, name: str):
        self.dir = self.ROOT / f"snakebox-bench-{os.getpid()}-{name}"
        self.dir.mkdir()

    @classmethod
    def create(cls, name: str) -> "CpuAcct | None":
        try:
            return cls(name) if (cls.ROOT / "cpuacct.usage").exists() else None
        except OSError:
            return None

    def usage_ms(self) -> float:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e6

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def add_trees(self, pids: list[int]) -> None:
        """`pids` with every process below them now (a server's bwrap and fork servers):
        processes they start later, such as forked runs, are then in this group too."""
        for pid in with_descendants(pids):
            with contextlib.suppress(OSError):  # gone meanwhile
                self.add(pid)

    def join(self) -> None:
        """For `preexec_fn`: move the (single-threaded, forked) child in."""
        with open(self.dir / "tasks", "w") as tasks:
            tasks.write("0")

    def remove(self) -> None:
        for pid in (self.dir / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (self.ROOT / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.dir.rmdir()


CPU_GROUPS: list[CpuAcct] = []


def cpu_group(name: str) -> CpuAcct | None:
    group = CpuAcct.create(name)
    if group is not None:
        CPU_GROUPS.append(group)
    return group


def with_descendants(pids: list[int]) -> list[int]:
    """`pids` and every process below them (a server's bwrap, fork servers, sandboxes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def machine_busy_ms() -> float:
    """CPU time spent by the whole machine (all processes and kernel threads), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) * 1000 / os.sysconf("SC_CLK_TCK")


def machine_note(busy_ms: float, runs: int, seconds: float) -> str:
    """The whole machine's CPU per run and how busy it was, for a throughput row's note."""
    busy_share = busy_ms / (seconds * 1000) / (os.cpu_count() or 1) * 100
    return f"whole machine {busy_ms / runs:.1f} ms per run, {busy_share:.0f}% busy"


def server_pids(data_dir: Path) -> list[int]:
    """Pids of `snakebox serve` processes using `data_dir` (our children)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and str(data_dir).encode() in cmdline:
            pids.append(int(entry))
    return pids


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# ---------------------------------------------------------------------------------------------
# MCP clients: the official SDK, and a raw JSON-RPC client (to separate the SDK's own cost)


class RawClient:
    """Line-delimited JSON-RPC over the server's stdio, legacy `initialize` handshake. Several
    requests may be in flight; responses are matched by id."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv = argv
        self.env = env
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def __aenter__(self) -> "RawClient":
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            limit=64 << 20,
        )
        self.reader = asyncio.create_task(self._read())
        await self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "snakebox-bench", "version": "0"}},
        )
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.reader.cancel()

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                for fut in self.pending.values():
                    if not fut.done():
                        fut.set_exception(RuntimeError("server closed stdout"))
                return
            message = json.loads(line)
            fut = self.pending.pop(message.get("id"), None) if "id" in message else None
            if fut is not None and not fut.done():
                fut.set_result(message)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        message = await fut
        if "error" in message:
            raise RuntimeError(f"{method} failed: {message['error']}")
        return message["result"]

    async def execute(self, script: str, dependencies: list[str] | None = None) -> dict[str, Any]:
        result = await self.request(
            "tools/call",
            {"name": "execute_python", "arguments": {"script": script, "dependencies": dependencies or []}},
        )
        return result["structuredContent"]


class Snakebox:
    """A `snakebox serve` process driven by the official SDK."""

    def __init__(self, binary: Path, data_dir: Path, python_version: str, mode: str, extra: list[str] | None = None):
        self.binary = binary
        self.data_dir = data_dir
        self.python_version = python_version
        self.mode = mode
        self.extra = extra or []
        self.server_pid = 0
        self.stack = contextlib.AsyncExitStack()

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--python-version",
            self.python_version,
            *self.extra,
        ]

    def env(self) -> dict[str, str]:
        # What the SDK's stdio client passes too (it adds HOME, USER, ... to `env`): snakebox finds
        # pyenv interpreters through HOME.
        return {
            "SNAKEBOX_LOG": os.environ.get("SNAKEBOX_LOG", "warn"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(Path.home()),
            **passed_through(),
        }

    async def __aenter__(self) -> "Snakebox":
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        argv = self.argv()
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=self.env())
        self.client = await self.stack.enter_async_context(Client(params, mode=self.mode, read_timeout_seconds=600))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stack.aclose()

    async def execute(self, script: str, dependencies: list[str] | None = None, expect: str | None = None) -> dict[str, Any]:
        result = await self.client.call_tool("execute_python", {"script": script, "dependencies": dependencies or []})
        structured = result.structured_content or {}
        if structured.get("status") != "ok" or (expect is not None and structured.get("stdout") != expect):
            text = "".join(getattr(b, "text", "") for b in result.content)
            raise RuntimeError(f"snakebox run failed: {text[-3000:]}")
        return structured

    async def background_done(self) -> None:
        """Wait until the server's background work on new environments ended (their
        compilation after the first run; a build without it reports none), so that it does not
        slow the next samples."""
        while True:
            result = await self.client.call_tool("check_environment", {})
            compilation = ((result.structured_content or {}).get("cache") or {}).get("compilation") or {}
            if not compilation.get("pending"):
                return
            await asyncio.sleep(0.1)

    def pid(self) -> int:
        pids = server_pids(self.data_dir)
        if len(pids) != 1:
            raise RuntimeError(f"expected one server for {self.data_dir}, found {pids}")
        return pids[0]


class UserSnakebox(Snakebox):
    """The same binary served by the normal user `user` (`runuser`), as most people run their
    agent: it and uv are copied where the user can read them (a checkout under /root is not),
    and the data directory is the user's own."""

    def __init__(self, binary: Path, work: Path, user: str, python_version: str, mode: str, uv: str):
        import pwd

        entry = pwd.getpwnam(user)
        home = work / f"user-{user}"
        home.mkdir(mode=0o755)
        for tool, source in (("snakebox", binary), ("uv", Path(uv))):
            shutil.copy2(source, home / tool)
            (home / tool).chmod(0o755)
        data = home / "data"
        data.mkdir(mode=0o700)
        os.chown(data, entry.pw_uid, entry.pw_gid)
        # The same minor version: the user cannot run root's pyenv builds, so its server picks
        # the system's interpreter of that version.
        minor = ".".join(python_version.split(".")[:2])
        super().__init__(home / "snakebox", data, minor, mode, ["--uv-path", str(home / "uv")])
        self.user = user
        self.home = home

    def argv(self) -> list[str]:
        return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", self.user, "--", *super().argv()]

    def env(self) -> dict[str, str]:
        # The system's interpreters only: the user cannot enter root's pyenv.
        return {**super().env(), "HOME": str(self.home), "PATH": "/usr/local/bin:/usr/bin:/bin"}


# The pause before each call of the spaced `print('hi')` rows.
SPACED_PAUSE = 0.1


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


# ---------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Setup:
    work: Path
    binary: Path
    python: str
    python_version: str
    uv: str
    bwrap: str
    mode: str
    rounds: int
    install_rounds: int
    throughput_seconds: float
    skip: set[str]

    def uv_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(Path.home()),
            "LANG": "C.UTF-8",
            "UV_CACHE_DIR": str(self.work / "uv-cache"),
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
            **passed_through(),
        }


def peer_bwrap_argv(setup: Setup, cmd: list[str], script_path: Path) -> list[str]:
    """mcp-python-exec-sandbox's `BubblewrapSandbox.wrap` (sandbox_linux.py), flag for flag,
    plus the two read-only binds without which its command cannot start on this machine (uv
    and the interpreter live under /root, which it does not mount: see PEERS.md)."""
    cache_dir = str(setup.work / "uv-cache")
    script_dir = str(script_path.parent)
    argv = [
        setup.bwrap,
        "--unshare-all",
        "--share-net",
        "--die-with-parent",
        "--ro-bind", "/usr", "/usr",
        "--ro-bind", "/lib", "/lib",
        "--ro-bind", "/bin", "/bin",
        "--ro-bind", "/sbin", "/sbin",
        "--symlink", "/usr/lib64", "/lib64",
        "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
        "--ro-bind", "/etc/ssl", "/etc/ssl",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--bind", cache_dir, cache_dir,
        "--bind", script_dir, script_dir,
    ]  # fmt: skip
    if Path("/lib64").is_dir() and not Path("/lib64").is_symlink():
        argv += ["--ro-bind", "/lib64", "/lib64"]
    # Added so that the peer's command can run here at all (not part of its wrap()).
    uv_dir = str(Path(setup.uv).parent)
    prefix = str(Path(setup.python).parents[1])
    argv += ["--ro-bind", uv_dir, uv_dir]
    if not uv_dir.startswith(prefix + "/"):
        argv += ["--ro-bind", prefix, prefix]
    return argv + cmd


async def bench_print(
    setup: Setup,
    sb: Snakebox,
    rows: dict[str, Row],
    other: Snakebox | None = None,
    backends: dict[str, Snakebox] | None = None,
) -> None:
    """Warm print('hi'): baselines and snakebox, round-robin. `backends`: servers of the same
    binary with other sandbox backends (`--backend`), by row key, sampled in the same rounds."""
    backends = backends or {}
    hi = setup.work / "scripts" / "hi.py"
    hi.parent.mkdir(parents=True, exist_ok=True)
    hi.write_text(HI_SCRIPT)
    uv_cmd = [setup.uv, "run", "--script", "--python", setup.python, str(hi)]
    env = setup.uv_env()
    bare = [setup.python, "-c", HI]
    bare_is = [setup.python, "-I", "-S", "-c", HI]
    bwrap_uv = peer_bwrap_argv(setup, uv_cmd, hi)

    raw = RawClient(sb.argv(), sb.env()) if "raw" not in setup.skip else None
    async with contextlib.AsyncExitStack() as stack:
        if raw is not None:
            await stack.enter_async_context(raw)
        # Warm every path: uv's script environment, the server's default environment, caches.
        for _ in range(3):
            timed_run(bare, expect="hi\n")
            timed_run(uv_cmd, env=env, cwd=str(hi.parent), expect="hi\n")
            timed_run(bwrap_uv, env=env, cwd=str(hi.parent), expect="hi\n")
            await sb.execute(HI, expect="hi\n")
            if raw is not None:
                await raw.execute(HI)
            if other is not None:
                await other.execute(HI, expect="hi\n")
            for server in backends.values():
                await server.execute(HI, expect="hi\n")
        cases: list[tuple[str, Callable[[], Awaitable[float]]]] = []

        async def run_sync(argv: list[str], **kw: Any) -> float:
            return timed_run(argv, **kw)

        cases.append(("bare", lambda: run_sync(bare, expect="hi\n")))
        cases.append(("bare_is", lambda: run_sync(bare_is, expect="hi\n")))
        cases.append(("uv_run", lambda: run_sync(uv_cmd, env=env, cwd=str(hi.parent), expect="hi\n")))
        cases.append(("bwrap_uv", lambda: run_sync(bwrap_uv, env=env, cwd=str(hi.parent), expect="hi\n")))
        if setup.mode == "legacy":  # `ping` is gone from the 2026-07-28 revision
            cases.append(("mcp_ping", lambda: timed(sb.client.send_ping)))
        # The `--compare` build first: a forked run's reply does not wait for its processes'
        # exits (since f597cf0), which then overlap the next sample; each build's row follows
        # one that leaves nothing behind (the older build's waited for its exits).
        if other is not None:
            cases.append(("snakebox_print_other", lambda: timed(lambda: other.execute(HI, expect="hi\n"))))
        cases.append(("snakebox_print", lambda: timed(lambda: sb.execute(HI, expect="hi\n"))))

        async def spaced(server: Snakebox) -> float:
            # An agent's calls come seconds apart: the server is idle, and nothing of the call
            # before is still going on.
            await asyncio.sleep(SPACED_PAUSE)
            return await timed(lambda: server.execute(HI, expect="hi\n"))

        if other is not None:
            cases.append(("snakebox_print_spaced_other", lambda: spaced(other)))
        cases.append(("snakebox_print_spaced", lambda: spaced(sb)))
        for key, server in backends.items():
            # No CPU column: a container's work is done by the engine's daemons, not the server.
            cases.append((key, lambda server=server: timed(lambda: server.execute(HI, expect="hi\n"))))
        if raw is not None:

            async def raw_call() -> None:
                result = await raw.execute(HI)
                if result.get("stdout") != "hi\n":
                    raise RuntimeError(f"raw call failed: {result}")

            cases.append(("snakebox_print_raw", lambda: timed(raw_call)))
        if "cli" not in setup.skip:
            cli = [str(setup.binary), "run", "--data-dir", str(sb.data_dir), "--python-version", setup.python_version, str(hi)]
            timed_run(cli, expect="hi\n")
            cases.append(("snakebox_cli", lambda: run_sync(cli, expect="hi\n")))
        groups: dict[str, CpuAcct] = {}
        for name, server in (("snakebox_print", sb), ("snakebox_print_other", other)):
            group = cpu_group(name) if server is not None else None
            if group is not None and server is not None:
                group.add_trees([server.server_pid])
                groups[name] = group
        for i in range(setup.rounds):
            for name, case in cases:
                group = groups.get(name)
                before = group.usage_ms() if group is not None else 0.0
                rows[name].samples.append(await case())
                if group is not None:
                    rows[name].cpu.append(group.usage_ms() - before)
            if (i + 1) % 10 == 0:
                log(f"print round {i + 1}/{setup.rounds}")
        # CPU per run of the subprocess rows, in a separate untimed pass: joining a cgroup needs
        # a preexec_fn, which would slow the timed spawns down.
        subprocess_rows = {"bare": (bare, None, None), "bare_is": (bare_is, None, None), "uv_run": (uv_cmd, env, str(hi.parent)), "bwrap_uv": (bwrap_uv, env, str(hi.parent))}
        for name, (argv, run_env, cwd) in subprocess_rows.items():
            group = cpu_group(name)
            if group is None:
                break
            for _ in range(10):
                before = group.usage_ms()
                subprocess.run(argv, env=run_env or clean_env(), cwd=cwd, capture_output=True, check=True, preexec_fn=group.join)
                rows[name].cpu.append(group.usage_ms() - before)


async def bench_session(setup: Setup, sb: Snakebox, rows: dict[str, Row], other: Snakebox | None = None) -> None:
    """A cell in a live session, `x = x + 1`, round-robin with an MCP `ping` (the floor of any
    call through the same client), the same through a raw JSON-RPC client of the same server (its
    own session; the SDK's own cost left out) and, with `--compare`, the same cell on the other
    build."""

    async def open_session(server: Snakebox) -> Callable[[], Awaitable[Any]]:
        created = await server.client.call_tool("create_session", {})
        session = (created.structured_content or {}).get("session_id")
        if not session:
            raise RuntimeError(f"create_session failed: {created.content}")
        expected = [0]

        async def cell() -> None:
            result = await server.client.call_tool("execute_python", {"script": "x = x + 1", "session_id": session})
            structured = result.structured_content or {}
            expected[0] += 1
            if structured.get("status") != "ok":
                raise RuntimeError(f"session cell failed: {structured}")

        async def check() -> None:
            result = await server.client.call_tool("execute_python", {"script": "x", "session_id": session})
            value = ((result.structured_content or {}).get("result") or {}).get("json")
            if value != expected[0]:
                raise RuntimeError(f"the session lost cells: x is {value}, expected {expected[0]}")

        checks.append(check)

        first = await server.client.call_tool("execute_python", {"script": "x = 0", "session_id": session})
        if (first.structured_content or {}).get("status") != "ok":
            raise RuntimeError(f"session cell failed: {first.content}")
        return cell

    async def open_raw_session(raw: RawClient) -> Callable[[], Awaitable[Any]]:
        created = await raw.request("tools/call", {"name": "create_session", "arguments": {}})
        session = created["structuredContent"]["session_id"]
        expected = [0]

        async def call(script: str) -> dict[str, Any]:
            result = await raw.request(
                "tools/call", {"name": "execute_python", "arguments": {"script": script, "session_id": session}}
            )
            structured = result["structuredContent"]
            if structured.get("status") != "ok":
                raise RuntimeError(f"session cell failed: {structured}")
            return structured

        async def cell() -> None:
            await call("x = x + 1")
            expected[0] += 1

        async def check() -> None:
            value = ((await call("x")).get("result") or {}).get("json")
            if value != expected[0]:
                raise RuntimeError(f"the session lost cells: x is {value}, expected {expected[0]}")

        checks.append(check)
        await call("x = 0")
        return cell

    checks: list[Callable[[], Awaitable[None]]] = []
    cell = await open_session(sb)
    other_cell = await open_session(other) if other is not None else None
    async with contextlib.AsyncExitStack() as stack:
        raw_cell = None
        if "raw" not in setup.skip:
            raw = await stack.enter_async_context(RawClient(sb.argv(), sb.env()))
            raw_cell = await open_raw_session(raw)

            async def raw_ping() -> None:
                await raw.request("ping", {})

        cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if setup.mode == "legacy":
            cases.append(("session_ping", sb.client.send_ping))
        cases.append(("snakebox_session_cell", cell))
        if other_cell is not None:
            cases.append(("snakebox_session_cell_other", other_cell))
        if raw_cell is not None:
            cases += [("session_ping_raw", raw_ping), ("snakebox_session_cell_raw", raw_cell)]
        for _ in range(5):
            for _, case in cases:
                await case()
        for i in range(setup.rounds):
            for name, case in cases:
                rows[name].samples.append(await timed(case))
            if (i + 1) % 10 == 0:
                log(f"session round {i + 1}/{setup.rounds}")
        for check in checks:
            await check()


async def fork_server_preloading(server: Snakebox, module: str, seconds: float = 180) -> dict[str, Any] | None:
    """Wait until one of `server`'s fork servers has preloaded `module`: its entry in
    `check_environment`'s `fork_server_details`, or `None` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        report = await server.client.call_tool("check_environment", {})
        pool = (report.structured_content or {}).get("warm_pool", {})
        for detail in pool.get("fork_server_details", []):
            if module in detail.get("preloaded", []):
                return detail
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.5)


async def bench_pandas(setup: Setup, sb: Snakebox, rows: dict[str, Row], other: Snakebox | None = None) -> None:
    """`import pandas` + `describe()` of 1e5 rows: a bare venv with bytecode compiled against
    snakebox's cached environment, once its fork server has preloaded pandas (waited for through
    `check_environment`), round-robin; with `--compare`, the same on the other build."""
    env = setup.uv_env()
    venv = setup.work / "venv-pandas"
    subprocess.run([setup.uv, "venv", "-q", "--python", setup.python, str(venv)], env=env, check=True)
    subprocess.run(
        [setup.uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(venv / "bin" / "python"), "pandas"],
        env=env,
        check=True,
    )
    vpy = str(venv / "bin" / "python")
    freeze = subprocess.run([setup.uv, "pip", "freeze", "--python", vpy], env=env, capture_output=True, text=True, check=True)
    pins = {line.split("==")[0].lower(): line for line in freeze.stdout.split() if "==" in line}
    dependencies = [pins["pandas"], pins["numpy"]]
    log(f"pandas: {dependencies}; building snakebox's environment")
    servers = [sb] + ([other] if other is not None else [])
    for server in servers:
        await server.execute(PANDAS_SCRIPT, dependencies, expect=PANDAS_OUT)
    # The steady state of a cached environment: its byte-compiled copy published in its place
    # (after the first run, in the background), and a fork server of that copy. A fork server
    # of the directory it replaced goes at the next run, which starts cold.
    for server in servers:
        await server.background_done()
        await server.execute(PANDAS_SCRIPT, dependencies, expect=PANDAS_OUT)
    for server in servers:
        preloaded = await fork_server_preloading(server, "pandas")
        if server is not sb:
            continue
        if preloaded is None:
            rows["snakebox_pandas"].note = "no fork server preloaded pandas within 180 s"
            log(rows["snakebox_pandas"].note)
        else:
            rows["snakebox_pandas"].note = "fork server preloaded " + ", ".join(preloaded["preloaded"])
            memory = preloaded.get("peak_memory_bytes")
            if memory:
                rows["snakebox_pandas"].note += f"; its peak memory {memory / (1 << 20):.0f} MiB"
    bare = [vpy, "-c", PANDAS_SCRIPT]
    for _ in range(3):
        timed_run(bare, expect=PANDAS_OUT)
        for server in servers:
            await server.execute(PANDAS_SCRIPT, dependencies, expect=PANDAS_OUT)
    for i in range(setup.rounds):
        rows["bare_pandas"].samples.append(timed_run(bare, expect=PANDAS_OUT))
        # The `--compare` build first, as in the print rows.
        if other is not None:
            rows["snakebox_pandas_other"].samples.append(
                await timed(lambda: other.execute(PANDAS_SCRIPT, dependencies, expect=PANDAS_OUT))
            )
        rows["snakebox_pandas"].samples.append(await timed(lambda: sb.execute(PANDAS_SCRIPT, dependencies, expect=PANDAS_OUT)))
        if (i + 1) % 10 == 0:
            log(f"pandas round {i + 1}/{setup.rounds}")


async def bench_numpy(setup: Setup, sb: Snakebox, rows: dict[str, Row]) -> str:
    """A cached dependency: bare `import numpy` in a ready venv vs snakebox. Returns the pin."""
    env = setup.uv_env()
    venv = setup.work / "venv-numpy"
    subprocess.run([setup.uv, "venv", "-q", "--python", setup.python, str(venv)], env=env, check=True)
    # A ready venv: byte-compiled, as snakebox's environments are.
    subprocess.run(
        [setup.uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(venv / "bin" / "python"), "numpy"],
        env=env,
        check=True,
    )
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    pin = f"numpy=={version}"
    log(f"numpy: {pin}; building snakebox's environment")
    await sb.execute("import numpy", [pin])
    bare = [str(venv / "bin" / "python"), "-c", "import numpy"]
    for _ in range(3):
        timed_run(bare)
        await sb.execute("import numpy", [pin])
    for _ in range(setup.rounds):
        rows["bare_numpy"].samples.append(timed_run(bare))
        rows["snakebox_numpy"].samples.append(await timed(lambda: sb.execute("import numpy", [pin])))
    return version


async def bench_first_run(
    setup: Setup, sb: Snakebox, rows: dict[str, Row], numpy_version: str, other: Snakebox | None = None
) -> None:
    """A requirement set in uv's cache (numpy, downloaded above) but never installed: every round
    uses a new set (an always-true marker makes the key distinct, the pin stays exact). With
    `other` (the `--compare` build, its own data directory, numpy put in its cache first), the
    same set is timed on it in the same round, the two servers taking turns going first."""
    env = setup.uv_env()
    tag = os.getpid()
    if other is not None:
        await other.execute("import numpy", [f"numpy=={numpy_version}"])
    for i in range(setup.install_rounds):
        spec = f"numpy=={numpy_version}; platform_machine != 'bench{tag}x{i}'"
        for row, extra in (("uv_pip_install_bare", []), ("uv_pip_install_compile_bare", ["--compile-bytecode"])):
            # The venv is made before the clock starts: the baseline is the install + the run.
            venv = setup.work / f"venv-first-{i}"
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([setup.uv, "venv", "-q", "--python", setup.python, str(venv)], env=env, check=True)
            vpy = str(venv / "bin" / "python")
            start = time.perf_counter()
            subprocess.run([setup.uv, "pip", "install", "-q", *extra, "--python", vpy, spec], env=env, check=True, capture_output=True)
            timed_run([vpy, "-c", "import numpy"])
            rows[row].samples.append((time.perf_counter() - start) * 1000)
        result: dict[str, Any] = {}

        async def first() -> None:
            result.update(await sb.execute("import numpy", [spec]))

        async def first_other() -> None:
            assert other is not None
            result_other.update(await other.execute("import numpy", [spec]))

        result_other: dict[str, Any] = {}
        # Not timed: what a server does after answering (compiling the new environment) must
        # not slow the next sample, of either build (the other one's sample follows at once)
        # or of the next round's baselines.
        if other is not None and i % 2 == 1:
            rows["snakebox_first_run_other"].samples.append(await timed(first_other))
            await other.background_done()
        rows["snakebox_first_run"].samples.append(await timed(first))
        await sb.background_done()
        if other is not None and i % 2 == 0:
            rows["snakebox_first_run_other"].samples.append(await timed(first_other))
            await other.background_done()
        if result.get("environment_reused") or result_other.get("environment_reused"):
            raise RuntimeError("the first-run case reused an environment: the set was not new")
        shutil.rmtree(venv, ignore_errors=True)
        log(f"first run {i + 1}/{setup.install_rounds}")


async def throughput(setup: Setup, rows: dict[str, Row], binary: Path | None = None, suffix: str = "") -> None:
    """print('hi') runs per second: 8 clients, each with its own stdio server (how stdio MCP is
    deployed), and 8 requests in flight on one server. Every run is a fresh sandbox. `binary`
    and `suffix`: another build's rows (`--compare`), measured right after."""
    clients = 8
    binary = binary or setup.binary
    data = setup.work / f"data-throughput{suffix}"
    data.mkdir(mode=0o755)

    async def drive(calls: list[Callable[[], Awaitable[Any]]]) -> tuple[int, float]:
        done = 0
        deadline = time.perf_counter() + setup.throughput_seconds

        async def worker(call: Callable[[], Awaitable[Any]]) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await call()
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in calls))
        return done, time.perf_counter() - start

    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(Snakebox(binary, data, setup.python_version, setup.mode)) for _ in range(clients)]
        for sb in servers:
            for _ in range(2):
                await sb.execute(HI, expect="hi\n")
        group = cpu_group(f"throughput8{suffix}")
        if group is not None:
            group.add_trees(server_pids(data))
        cpu_before = group.usage_ms() if group is not None else 0.0
        client_before = os.times()
        busy_before = machine_busy_ms()
        done, elapsed = await drive([lambda sb=sb: sb.execute(HI, expect="hi\n") for sb in servers])
        busy = machine_busy_ms() - busy_before
        client_after = os.times()
        client = (client_after.user + client_after.system - client_before.user - client_before.system) * 1000
        row = rows[f"throughput_8_servers{suffix}"]
        row.value = done / elapsed
        row.note = f"{done} runs in {elapsed:.1f} s; CPU per run:"
        if group is not None:
            row.note += f" servers + sandboxes {(group.usage_ms() - cpu_before) / done:.1f} ms,"
        row.note += f" SDK clients {client / done:.1f} ms; {machine_note(busy, done, elapsed)}"
    log(f"throughput{suffix}, 8 servers: {done / elapsed:.1f} runs/s")

    async with Snakebox(binary, data, setup.python_version, setup.mode) as sb:
        for _ in range(2):
            await sb.execute(HI, expect="hi\n")
        group = cpu_group(f"throughput1{suffix}")
        if group is not None:
            group.add_trees([sb.pid()])
        cpu_before = group.usage_ms() if group is not None else 0.0
        busy_before = machine_busy_ms()
        done, elapsed = await drive([lambda: sb.execute(HI, expect="hi\n") for _ in range(clients)])
        busy = machine_busy_ms() - busy_before
        row = rows[f"throughput_1_server{suffix}"]
        row.value = done / elapsed
        row.note = f"{done} runs in {elapsed:.1f} s"
        if group is not None:
            row.note += f"; CPU per run: server + sandboxes {(group.usage_ms() - cpu_before) / done:.1f} ms"
        row.note += f"; {machine_note(busy, done, elapsed)}"
    log(f"throughput{suffix}, 1 server x 8 in flight: {done / elapsed:.1f} runs/s")


def judge(rows: dict[str, Row]) -> None:
    def ratio(name: str) -> float | None:
        row, base = rows[name], rows.get(rows[name].baseline or "")
        if row.median is None or base is None or base.median is None:
            return None
        return row.median / base.median

    p = rows["snakebox_print"]
    if p.median is not None:
        r = ratio("snakebox_print")
        p.met = p.median <= TARGET_PRINT_MS and r is not None and r <= TARGET_PRINT_RATIO
    for name, limit in (
        ("snakebox_numpy", TARGET_NUMPY_RATIO),
        ("snakebox_first_run", TARGET_FIRST_RUN_RATIO),
        ("snakebox_print_user", TARGET_USER_PRINT_RATIO),
    ):
        r = ratio(name)
        if r is not None:
            rows[name].met = r <= limit
    t = rows["throughput_8_servers"]
    if t.value is not None:
        t.met = t.value >= TARGET_RUNS_PER_S
    r = ratio("snakebox_pandas")
    if r is not None:
        rows["snakebox_pandas"].met = r <= TARGET_PANDAS_RATIO
    cell = rows["snakebox_session_cell"]
    if cell.median is not None:
        cell.met = cell.median <= TARGET_SESSION_CELL_MS
    for name, limit in (("idle_rss", TARGET_IDLE_MIB), ("rss_growth", TARGET_GROWTH_MIB)):
        if rows[name].value is not None:
            rows[name].met = rows[name].value <= limit


def render(rows: dict[str, Row], setup: Setup, info: dict[str, str]) -> str:
    def fmt(x: float | None) -> str:
        if x is None:
            return "—"
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"

    lines = [
        "| measure | n | median | p95 | baseline | ratio | target | met |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    for row in rows.values():
        if row.median is None:
            continue
        base = rows.get(row.baseline or "")
        ratio = row.median / base.median if base is not None and base.median else None
        unit = "" if row.unit == "ms" else f" {row.unit}"
        n = str(len(row.samples)) if row.samples else "—"
        met = {True: "**met**", False: "missed", None: ""}[row.met]
        note = row.note
        if row.cpu:
            cpu = f"CPU {statistics.mean(row.cpu):.1f} ms/run"
            note = f"{note}; {cpu}" if note else cpu
        name = row.name + (f" ({note})" if note else "")
        lines.append(
            f"| {name} | {n} | {fmt(row.median)}{unit} | {fmt(row.p95)} | {base.name.replace('**', '') if base else ''} | "
            f"{fmt(ratio) + '×' if ratio is not None else ''} | {row.target} | {met} |"
        )
    header = [
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']}, Linux {info['kernel']}; "
        f"load at start {info['load']}, at end {info['load_end']}",
        f"python: {setup.python} ({setup.python_version}); uv: {setup.uv} ({info['uv_version']}); "
        f"bwrap: {info['bwrap_version']}; snakebox: {info['snakebox_version']}; MCP client mode: {setup.mode}",
        f"latency rows: {setup.rounds} rounds (round-robin), first-run rows: {setup.install_rounds}; times in ms",
        "",
    ]
    return "\n".join(header + lines)


def make_rows() -> dict[str, Row]:
    r = {
        "bare": Row("bare `python3 -c \"print('hi')\"`"),
        "bare_is": Row("bare `python3 -I -S -c \"print('hi')\"`", baseline="bare"),
        "uv_run": Row("`uv run --script` hi.py", baseline="bare"),
        "bwrap_uv": Row("bwrap + `uv run --script` (mcp-python-exec-sandbox)", baseline="bare"),
        "mcp_ping": Row("MCP `ping` round trip (SDK client, floor)", baseline="bare"),
        "snakebox_print": Row(
            "**snakebox `print('hi')` via MCP (SDK client)**",
            baseline="bare",
            target=f"≤ {TARGET_PRINT_MS:g} ms and ≤ {TARGET_PRINT_RATIO}×",
        ),
        "snakebox_print_other": Row("snakebox `print('hi')` via MCP (SDK client), `--compare` build", baseline="snakebox_print"),
        "snakebox_print_raw": Row("snakebox `print('hi')` via raw JSON-RPC client", baseline="bare"),
        "snakebox_print_user": Row(
            "snakebox `print('hi')` via MCP (SDK client), the server run by a normal user (`--as-user`)",
            baseline="snakebox_print",
            target=f"≤ {TARGET_USER_PRINT_RATIO}× root's",
        ),
        "snakebox_print_spaced": Row(
            f"snakebox `print('hi')` via MCP (SDK client), each call {SPACED_PAUSE * 1000:g} ms after the one before", baseline="bare"
        ),
        "snakebox_print_spaced_other": Row(
            "snakebox `print('hi')`, calls apart, `--compare` build", baseline="snakebox_print_spaced"
        ),
        "snakebox_cli": Row("`snakebox run hi.py` (CLI, one process per run)", baseline="bare"),
        "session_ping": Row("MCP `ping` round trip (SDK client, floor)"),
        "snakebox_session_cell": Row(
            "**snakebox session cell `x = x + 1` via MCP (SDK client)**",
            baseline="session_ping",
            target=f"≤ {TARGET_SESSION_CELL_MS:g} ms",
        ),
        "session_ping_raw": Row("MCP `ping` round trip (raw JSON-RPC client, floor)"),
        "snakebox_session_cell_raw": Row(
            "snakebox session cell `x = x + 1` via raw JSON-RPC client", baseline="session_ping_raw"
        ),
        "snakebox_session_cell_other": Row(
            "snakebox session cell `x = x + 1`, `--compare` build", baseline="snakebox_session_cell"
        ),
        "bare_pandas": Row("bare venv (bytecode compiled): `import pandas` + `describe()` of 1e5 rows"),
        "snakebox_pandas": Row(
            "**snakebox `import pandas` + `describe()` of 1e5 rows (cached env)**",
            baseline="bare_pandas",
            target=f"≤ {TARGET_PANDAS_RATIO}×",
        ),
        "snakebox_pandas_other": Row("snakebox pandas row, `--compare` build", baseline="bare_pandas"),
        "bare_numpy": Row("bare venv `python -c \"import numpy\"`"),
        "snakebox_numpy": Row(
            "**snakebox `import numpy` (cached env)**", baseline="bare_numpy", target=f"≤ {TARGET_NUMPY_RATIO}×"
        ),
        "uv_pip_install_bare": Row("`uv pip install` (from uv cache) + bare run"),
        "uv_pip_install_compile_bare": Row(
            "`uv pip install --compile-bytecode` + bare run", baseline="uv_pip_install_bare"
        ),
        "snakebox_first_run": Row(
            "**snakebox first run of a new set in uv's cache**",
            baseline="uv_pip_install_bare",
            target=f"≤ {TARGET_FIRST_RUN_RATIO}×",
        ),
        "snakebox_first_run_other": Row(
            "snakebox first run of a new set in uv's cache, `--compare` build", baseline="snakebox_first_run"
        ),
        "throughput_8_servers": Row(
            "**throughput, 8 clients (8 stdio servers)**", unit="runs/s", target=f"≥ {TARGET_RUNS_PER_S:g} runs/s"
        ),
        "throughput_1_server": Row("throughput, 1 server, 8 calls in flight", unit="runs/s"),
        "throughput_8_servers_other": Row("throughput, 8 clients (8 stdio servers), `--compare` build", unit="runs/s"),
        "throughput_1_server_other": Row("throughput, 1 server, 8 calls in flight, `--compare` build", unit="runs/s"),
        "idle_rss": Row("**server idle RSS (after warm-up)**", unit="MiB", target=f"≤ {TARGET_IDLE_MIB:g} MiB"),
        "idle_rss_other": Row("server idle RSS (after warm-up), `--compare` build, same moment", unit="MiB", baseline="idle_rss"),
        "rss_growth": Row("**server RSS growth after printing 200 MiB**", unit="MiB", target=f"≤ {TARGET_GROWTH_MIB:g} MiB"),
        "hwm_growth": Row("server peak RSS (VmHWM) growth, same run", unit="MiB"),
    }
    # Keep stable keys for JSON output; titles are the display names.
    return r


async def main_async(args: argparse.Namespace) -> int:
    python, python_version = real_python(args.python_version)
    uv = real_uv(args.uv)
    bwrap = args.bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
    source = Path(args.snakebox or REPO / "target" / "release" / "snakebox")
    if not source.exists():
        raise SystemExit(f"{source} not found: run `cargo build --release -p snakebox`")
    work = Path(tempfile.mkdtemp(prefix="snakebox-bench-", dir=args.work_root))
    work.chmod(0o755)
    # A private copy: a rebuild of target/release during the run must not swap the binary.
    binary = work / "snakebox"
    shutil.copy2(source, binary)
    setup = Setup(
        work=work,
        binary=binary,
        python=python,
        python_version=python_version,
        uv=uv,
        bwrap=bwrap,
        mode=args.mode,
        rounds=args.rounds,
        install_rounds=args.install_rounds,
        throughput_seconds=args.throughput_seconds,
        skip=set(args.skip or []),
    )
    info = machine()
    info["uv_version"] = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    info["bwrap_version"] = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    info["snakebox_version"] = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    log(f"work dir {work}; python {python} ({python_version}); uv {uv}")
    rows = make_rows()
    data = work / "data"
    data.mkdir(mode=0o755)
    (work / "uv-cache").mkdir()
    try:
        async with contextlib.AsyncExitStack() as servers:
            sb = await servers.enter_async_context(Snakebox(binary, data, python_version, args.mode))
            other = None
            if args.compare:
                # The `--compare` build serves beside it from the start: its idle RSS is
                # measured at the same moment, and its print and session rows in the same rounds.
                other_binary = work / "snakebox-compare"
                shutil.copy2(args.compare, other_binary)
                other_data = work / "data-compare"
                other_data.mkdir(mode=0o755)
                other = await servers.enter_async_context(Snakebox(other_binary, other_data, python_version, args.mode))
            log("warming the server")
            for _ in range(5):
                await sb.execute(HI, expect="hi\n")
                if other is not None:
                    await other.execute(HI, expect="hi\n")
            await asyncio.sleep(1)
            pid = sb.server_pid = sb.pid()
            rows["idle_rss"].value = rss_kib(pid) / 1024
            log(f"server pid {pid}, idle RSS {rows['idle_rss'].value:.1f} MiB")
            if other is not None:
                other_pid = other.server_pid = other.pid()
                rows["idle_rss_other"].value = rss_kib(other_pid) / 1024
                log(f"--compare server pid {other_pid}, idle RSS {rows['idle_rss_other'].value:.1f} MiB")
            if "print" not in setup.skip:
                async with contextlib.AsyncExitStack() as stack:
                    backends = {}
                    for spec in args.backend or []:
                        name, _, extra = spec.partition("=")
                        key = f"snakebox_print_backend_{name}"
                        rows[key] = Row(
                            f"snakebox `print('hi')` via MCP (SDK client), {name} (`{extra}`)", baseline="snakebox_print"
                        )
                        backend_data = work / f"data-{name}"
                        backend_data.mkdir(mode=0o755)
                        backends[key] = await stack.enter_async_context(
                            Snakebox(binary, backend_data, python_version, args.mode, extra.split())
                        )
                    if args.as_user:
                        # A normal user's server: the system interpreter (the user cannot read
                        # root's pyenv), so root's row is sampled with the same version.
                        backends["snakebox_print_user"] = await stack.enter_async_context(
                            UserSnakebox(binary, work, args.as_user, python_version, args.mode, uv)
                        )
                    await bench_print(setup, sb, rows, other, backends)
            if "session" not in setup.skip:
                await bench_session(setup, sb, rows, other)
            if "pandas" not in setup.skip:
                await bench_pandas(setup, sb, rows, other)
            if "numpy" not in setup.skip:
                version = await bench_numpy(setup, sb, rows)
                if "first" not in setup.skip:
                    async with contextlib.AsyncExitStack() as stack:
                        other = None
                        if args.compare:
                            other_binary = work / "snakebox-compare-first"
                            shutil.copy2(args.compare, other_binary)
                            other_data = work / "data-compare-first"
                            other_data.mkdir(mode=0o755)
                            other = await stack.enter_async_context(
                                Snakebox(other_binary, other_data, python_version, args.mode)
                            )
                        await bench_first_run(setup, sb, rows, version, other)
            if "memory" not in setup.skip:
                await asyncio.sleep(1)
                before, hwm_before = rss_kib(pid), rss_kib(pid, "VmHWM")
                result = await sb.client.call_tool("execute_python", {"script": PRINT_200_MIB})
                structured = result.structured_content or {}
                if structured.get("status") != "ok" or not structured.get("stdout_truncated"):
                    raise RuntimeError(f"the 200 MiB run did not end as expected: {structured.get('status')}")
                await asyncio.sleep(1)
                after, hwm_after = rss_kib(pid), rss_kib(pid, "VmHWM")
                rows["rss_growth"].value = (after - before) / 1024
                rows["rss_growth"].note = f"{before / 1024:.1f} → {after / 1024:.1f} MiB"
                rows["hwm_growth"].value = (hwm_after - hwm_before) / 1024
                rows["hwm_growth"].note = f"{hwm_before / 1024:.1f} → {hwm_after / 1024:.1f} MiB"
        if "throughput" not in setup.skip:
            await throughput(setup, rows)
            if args.compare:
                other_binary = work / "snakebox-compare-throughput"
                shutil.copy2(args.compare, other_binary)
                await throughput(setup, rows, other_binary, "_other")
    finally:
        for group in CPU_GROUPS:
            group.remove()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    info["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    judge(rows)
    table = render(rows, setup, info)
    print(table)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "machine": info,
                    "command": " ".join(sys.argv),
                    "rows": {
                        k: {
                            "title": r.name,
                            "median": r.median,
                            "p95": r.p95,
                            "samples": r.samples,
                            "cpu_ms": r.cpu,
                            "unit": r.unit,
                            "baseline": r.baseline,
                            "met": r.met,
                            "note": r.note,
                        }
                        for k, r in rows.items()
                    },
                },
                indent=1,
            )
        )
    return 0


def main() -> int:
    # `ping` is deprecated in the 2026-07-28 revision; the harness uses it under mode='legacy' only.
    warnings.filterwarnings("ignore", message="ping is removed")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", help="snakebox binary (default: target/release/snakebox; copied before use)")
    parser.add_argument(
        "--compare",
        help="a second snakebox binary: its print('hi') and first-run rows are sampled in the same rounds, its throughput rows right after (before/after)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        metavar="NAME=ARGS",
        help="another sandbox backend's print('hi') row, sampled in the same rounds: a server of the same binary "
        "started with ARGS (e.g. `docker=--sandbox-backend docker`; repeatable)",
    )
    parser.add_argument(
        "--as-user",
        metavar="USER",
        help="also a print('hi') row of the same binary served by the normal user USER (an existing account; "
        "e.g. `useradd -m snakebox-bench`), sampled in the same rounds; its server runs the system's interpreter "
        "of the same minor version (a user cannot run root's pyenv builds)",
    )
    parser.add_argument("--python-version", help="e.g. 3.12 (default: the newest CPython 3 found, as snakebox picks)")
    parser.add_argument("--uv", help="uv binary (default: found on PATH, pyenv shims resolved)")
    parser.add_argument("--bwrap", help="bwrap binary (default: found on PATH)")
    parser.add_argument("--mode", default="legacy", choices=["legacy", "auto"], help="MCP client protocol mode")
    parser.add_argument("-n", "--rounds", type=int, default=40, help="samples per latency row")
    parser.add_argument("--install-rounds", type=int, default=5, help="samples of the first-run rows")
    parser.add_argument("--throughput-seconds", type=float, default=10.0)
    parser.add_argument(
        "--skip",
        action="append",
        choices=["print", "raw", "cli", "session", "pandas", "numpy", "first", "memory", "throughput"],
        help="leave a group out (repeatable)",
    )
    parser.add_argument("--work-root", help="where the temporary work directory goes (default: $TMPDIR)")
    parser.add_argument("--json", help="also write samples and results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
