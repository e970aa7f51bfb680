"""Harness for the adversarial suite (`test_attacks.py`): canaries planted outside the sandbox
before the server starts, a run marker scanned in host `/proc`, and one wrapper that runs an
attack snippet and checks both that it really ran and that nothing leaked.

Conventions (attack catalogue §2):

- Canaries: random secrets in the server's environment, files in a fake `$HOME`, a key in the
  harness's session keyring, TCP listeners on host `127.0.0.1` and `[::1]`, an abstract unix
  listener and a pathname unix listener in the server's `$XDG_RUNTIME_DIR`. Every listener
  records each connection it accepts; every run is checked for every canary value.
- Run marker: every attack script starts a background process that carries a unique token in
  its argv and environment. While the call is in flight a watcher thread finds it in host
  `/proc` (proof that the oracle can see sandbox processes, and the posture read from outside);
  after the call the token must be gone from every host `/proc/*/cmdline` and `environ`, and the
  run's cgroups must be empty.
- Proof of life: the script prints a start token first; results come back as
  `SBX-RESULT {json}` lines. An attack test asserts the token and the result it expects, so a
  sandbox that never started cannot pass.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import socket
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import call

# ---------------------------------------------------------------------------------------------
# The prelude every attack script starts with (runs inside the sandbox).
# ---------------------------------------------------------------------------------------------

PRELUDE = r'''
import ctypes, json, os, sys
START = {start!r}
MARKER = {marker!r}
print(START, flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sc(nr, *a):
    """Raw syscall with x86_64 numbers: (result, errno)."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return r, ctypes.get_errno()

def child(fn):
    """Run an escape attempt in a throwaway child; its exit code (negative = signal)."""
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            fn(); os._exit(0)
        except OSError as e:
            os._exit(e.errno or 100)
        except BaseException:
            os._exit(101)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def probe(nr, *a):
    """`sc` in a forked child, so a SIGSYS kill is observed too: (result, errno, exit)."""
    r_fd, w_fd = os.pipe()
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r_fd)
        r, e = sc(nr, *a)
        os.write(w_fd, json.dumps([r, e]).encode())
        os._exit(0)
    os.close(w_fd)
    data = b""
    while True:
        chunk = os.read(r_fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r_fd)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    r, e = json.loads(data) if data else (None, None)
    return r, e, code

def linger(seconds=0.6):
    """Stay alive long enough for the host watcher to read this process's posture."""
    import time
    time.sleep(seconds)

def report(**kw):
    print("SBX-RESULT " + json.dumps(kw, default=repr), flush=True)

def zombies():
    """How many processes this sandbox sees in the zombie state."""
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open("/proc/" + p + "/stat").read().rsplit(") ", 1)[1][0] == "Z": n += 1
            except OSError: pass
    return n

def spawn_marker(seconds=120):
    """A background process carrying the run marker in argv and environ (found from the host)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.closerange(3, 1 << 16)
            fd = os.open("/dev/null", os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            if fd > 2:
                os.close(fd)
            os.execve(sys.executable, [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", str(seconds), MARKER],
                      {{"SBX_RUN_MARKER": MARKER}})
        finally:
            os._exit(127)
    return pid
'''

RESULT_PREFIX = "SBX-RESULT "


def build_script(body: str, start: str, marker: str, *, spawn_marker: bool = True, params: Any = None) -> str:
    script = PRELUDE.format(start=start, marker=marker)
    script += f"P = json.loads({json.dumps(params)!r})\n"
    if spawn_marker:
        script += "MARKER_PID = spawn_marker()\n"
    return script + textwrap.dedent(body)


def parse_results(stdout: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            with contextlib.suppress(ValueError):
                results.update(json.loads(line[len(RESULT_PREFIX):]))
    return results


# ---------------------------------------------------------------------------------------------
# Host /proc: the marker scan and the posture read from outside.
# ---------------------------------------------------------------------------------------------


def _read(path: str, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def marker_pids(marker: str) -> list[int]:
    """Host pids whose cmdline or environ carries the marker (our own process excluded)."""
    token = marker.encode()
    # An empty marker is in every command line: never a match (callers kill what this finds).
    if len(token) < 8:
        raise ValueError(f"marker {marker!r} is too short to name a run's processes")
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        if token in _read(f"/proc/{entry}/cmdline") or token in _read(f"/proc/{entry}/environ"):
            found.append(int(entry))
    return found


def posture(pid: int) -> dict[str, Any]:
    """What the host sees of one process (gVisor's sandboxposture, catalogue P-08)."""
    status = {}
    for line in _read(f"/proc/{pid}/status").decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    ns = {}
    for name in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup"):
        with contextlib.suppress(OSError):
            ns[name] = os.readlink(f"/proc/{pid}/ns/{name}")
    fds = {}
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                fds[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    environ = _read(f"/proc/{pid}/environ")
    return {
        "pid": pid,
        "status": status,
        "ns": ns,
        "fds": fds,
        "cgroup": _read(f"/proc/{pid}/cgroup").decode(errors="replace"),
        "stat": _read(f"/proc/{pid}/stat").decode(errors="replace"),
        "limits": _read(f"/proc/{pid}/limits").decode(errors="replace"),
        "environ_keys": sorted({kv.split(b"=", 1)[0].decode(errors="replace") for kv in environ.split(b"\0") if kv}),
        "oom_score_adj": _read(f"/proc/{pid}/oom_score_adj").decode().strip(),
        "cmdline": _read(f"/proc/{pid}/cmdline").split(b"\0"),
        "tasks": _task_postures(pid),
    }


def _task_postures(pid: int) -> list[dict[str, str]]:
    out = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            fields = {}
            for line in _read(f"/proc/{pid}/task/{tid}/status").decode(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key in ("Seccomp", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "Uid"):
                    fields[key] = value.strip()
            out.append(fields)
    return out


def cgroup_dirs(cgroup_text: str) -> list[Path]:
    """Host directories of the cgroups listed in a host-side /proc/<pid>/cgroup."""
    dirs = []
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if path in ("", "/"):
            continue
        if controllers == "":
            base = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir() else Path("/sys/fs/cgroup")
        else:
            name = controllers.split(",")[0].replace("name=", "")
            base = Path("/sys/fs/cgroup") / name
            if not base.is_dir():
                base = Path("/sys/fs/cgroup") / controllers
        dirs.append(base / path.lstrip("/"))
    return dirs


def host_cgroup_dirs(pid: int) -> set[Path]:
    return set(cgroup_dirs(_read(f"/proc/{pid}/cgroup").decode(errors="replace")))


def is_namespace_init(snap: dict[str, Any]) -> bool:
    """Whether the process is pid 1 of its own PID namespace (the last `NSpid` field)."""
    ids = snap["status"].get("NSpid", "").split()
    return len(ids) > 1 and ids[-1] == "1"


class ProcWatch:
    """Polls host /proc while a run is in flight; records every process carrying the marker
    (and its parent, the script itself) with its posture, once."""

    def __init__(self, marker: str, interval: float = 0.05) -> None:
        self.marker = marker
        self.interval = interval
        self.seen: dict[int, dict[str, Any]] = {}
        self.parents: dict[int, dict[str, Any]] = {}
        # One level further up: bwrap's init (pid 1 inside) when the marker's parent is the script.
        self.grandparents: dict[int, dict[str, Any]] = {}
        self.first_seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.event = threading.Event()

    def __enter__(self) -> "ProcWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid in marker_pids(self.marker):
                if pid in self.seen:
                    continue
                snap = posture(pid)
                if not snap["status"]:
                    continue
                self.seen[pid] = snap
                if self.first_seen is None:
                    self.first_seen = time.monotonic()
                ppid = int(snap["status"].get("PPid", "0") or 0)
                if ppid and ppid not in self.parents:
                    parent = posture(ppid)
                    if parent["status"]:
                        self.parents[ppid] = parent
                        gpid = int(parent["status"].get("PPid", "0") or 0)
                        if gpid and gpid not in self.grandparents:
                            grand = posture(gpid)
                            if grand["status"]:
                                self.grandparents[gpid] = grand
                                self._above_reaper(grand)
                self.event.set()
            self._stop.wait(self.interval)

    def _above_reaper(self, snap: dict[str, Any]) -> None:
        """The runner's reaper (X-01: the runner's parent, in the sandbox) sits between the
        script and the sandbox's init, unless it is that init (pid 1 inside, as native runs
        make it): record the init above it too."""
        if not any(part.endswith(b"runner.py") for part in snap["cmdline"]) or is_namespace_init(snap):
            return
        up = int(snap["status"].get("PPid", "0") or 0)
        if up and up not in self.grandparents:
            init = posture(up)
            if init["status"]:
                self.grandparents[up] = init

    def wait_seen(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def cgroups(self) -> set[Path]:
        out: set[Path] = set()
        for snap in list(self.seen.values()):
            out.update(cgroup_dirs(snap["cgroup"]))
        return out


def wait_marker_gone(marker: str, grace: float) -> list[int]:
    """Poll until no host process carries the marker; return the stragglers after `grace`."""
    deadline = time.monotonic() + grace
    while True:
        left = marker_pids(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def cgroup_leftovers(dirs: set[Path], grace: float = 1.0) -> dict[str, str]:
    """cgroups of the run that still hold processes `grace` s from now (a removed directory
    counts as empty). The call may return while the run's processes are still exiting: each
    has SIGKILL pending by then, and none can be made (SECURITY.md, "the end of a run")."""
    deadline = time.monotonic() + grace
    while True:
        left = {}
        for d in dirs:
            procs = d / "cgroup.procs"
            try:
                text = procs.read_text().strip()
            except OSError:
                continue
            if text:
                left[str(d)] = text
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# Canaries planted outside before the server starts.
# ---------------------------------------------------------------------------------------------

HOME_FILES = [
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".netrc",
    ".docker/config.json",
    ".kube/config",
    ".git-credentials",
    ".config/gh/hosts.yml",
    ".anthropic/api_key",
]

KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_INVALIDATE = 21


class Listener:
    """A host listener that records every accepted connection."""

    def __init__(self, family: int, address: Any, label: str) -> None:
        self.label = label
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family != socket.AF_UNIX:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind(address)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.connections.append(f"{self.label} from {peer!r}")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@dataclass
class Canaries:
    root: Path
    home: Path
    runtime_dir: Path
    env: dict[str, str]
    file_values: dict[str, str]
    tcp_port: int
    abstract_name: str
    unix_path: Path
    key_payload: str
    key_id: int | None
    listeners: list[Listener] = field(default_factory=list)

    @property
    def values(self) -> list[str]:
        """Every secret value that must never be visible to the caller."""
        vals = [v for k, v in self.env.items() if k in SECRET_ENV_KEYS]
        vals += list(self.file_values.values())
        vals.append(self.key_payload)
        return vals

    def connections(self) -> list[str]:
        return [c for listener in self.listeners for c in listener.connections]

    def server_env(self) -> dict[str, str]:
        return dict(self.env)


SECRET_ENV_KEYS = ("ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "CANARY_SUPERVISOR_SECRET", "OPENAI_API_KEY")


def _free_dual_port() -> int:
    for _ in range(50):
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        try:
            v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            v6.bind(("::1", port))
            v6.close()
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on both 127.0.0.1 and ::1")


def _add_session_key(payload: str) -> int | None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    data = payload.encode()
    r = libc.syscall(
        ctypes.c_long(248), ctypes.c_char_p(b"user"), ctypes.c_char_p(b"sbx-canary-key"),
        ctypes.c_char_p(data), ctypes.c_size_t(len(data)), ctypes.c_long(KEY_SPEC_SESSION_KEYRING),
    )
    return int(r) if r > 0 else None


def _drop_session_key(key_id: int | None) -> None:
    if key_id is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(ctypes.c_long(250), ctypes.c_long(KEYCTL_INVALIDATE), ctypes.c_long(key_id))


def plant_canaries(root: Path) -> Canaries:
    tag = secrets.token_hex(8)
    home = root / "home"
    runtime = root / "run-user"
    runtime.mkdir(parents=True)
    file_values = {}
    for rel in HOME_FILES:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        value = f"file-canary-{tag}-{rel.replace('/', '_')}"
        path.write_text(value + "\n")
        path.chmod(0o600)
        file_values[rel] = value
    # A wheel in the fake home, for the dependency-specifier attacks (H-01): importing it would
    # print a canary from the host.
    env = {
        "HOME": str(home),
        "PYENV_ROOT": os.environ.get("PYENV_ROOT", str(Path("/root/.pyenv"))),
        "XDG_RUNTIME_DIR": str(runtime),
        "ANTHROPIC_API_KEY": f"sk-canary-{tag}",
        "AWS_SECRET_ACCESS_KEY": f"aws-canary-{tag}",
        "GITHUB_TOKEN": f"ghp_canary{tag}",
        "OPENAI_API_KEY": f"sk-openai-canary-{tag}",
        "CANARY_SUPERVISOR_SECRET": f"sup-canary-{tag}",
    }
    port = _free_dual_port()
    listeners = [
        Listener(socket.AF_INET, ("127.0.0.1", port), "tcp4"),
        Listener(socket.AF_INET6, ("::1", port), "tcp6"),
    ]
    abstract = f"sbx-canary-{tag}"
    listeners.append(Listener(socket.AF_UNIX, "\0" + abstract, "abstract"))
    unix_path = runtime / "sbx-canary.sock"
    listeners.append(Listener(socket.AF_UNIX, str(unix_path), "pathname"))
    env["SSH_AUTH_SOCK"] = str(unix_path)
    key_payload = f"key-canary-{tag}"
    key_id = _add_session_key(key_payload)
    return Canaries(
        root=root, home=home, runtime_dir=runtime, env=env, file_values=file_values, tcp_port=port,
        abstract_name=abstract, unix_path=unix_path, key_payload=key_payload, key_id=key_id, listeners=listeners,
    )


def remove_canaries(canaries: Canaries) -> None:
    for listener in canaries.listeners:
        listener.close()
    _drop_session_key(canaries.key_id)


# ---------------------------------------------------------------------------------------------
# One attack run.
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    data: dict[str, Any]
    text: str
    is_error: bool
    results: dict[str, Any]
    watch: ProcWatch
    wall: float
    marker: str
    start: str
    leftover_pids: list[int]
    leftover_cgroups: dict[str, str]

    @property
    def stdout(self) -> str:
        return self.data.get("stdout") or ""

    @property
    def stderr(self) -> str:
        return self.data.get("stderr") or ""

    def __getitem__(self, key: str) -> Any:
        assert key in self.results, f"script did not report {key!r}; stdout={self.stdout[-3000:]!r} stderr={self.stderr[-3000:]!r}"
        return self.results[key]

    def describe(self) -> str:
        return (
            f"status={self.data.get('status')} exit={self.data.get('exit_code')} error={self.data.get('error')}\n"
            f"stdout={self.stdout[-4000:]!r}\nstderr={self.stderr[-4000:]!r}"
        )


def new_tokens() -> tuple[str, str]:
    tag = secrets.token_hex(8)
    return f"SBX-START-{tag}", f"SBXMARK{tag}"


async def attack(
    client: Any,
    canaries: Canaries,
    body: str,
    *,
    timeout: int = 15,
    expect: str | tuple[str, ...] | None = "ok",
    marker: bool = True,
    marker_grace: float = 1.0,
    watch_started: Any = None,
    params: Any = None,
    **arguments: Any,
) -> Run:
    """Run one attack snippet and apply the oracles that hold for every run:

    - proof of life: the start token is in stdout and the status is `expect`;
    - NO-LEAK: no canary value in stdout, stderr or the text form; no listener connection;
    - teardown: no host process carries the run marker `marker_grace` s after the call
      returned, and the run's cgroups hold no process.
    """
    start, mark = new_tokens()
    script = build_script(body, start, mark, spawn_marker=marker, params=params)
    before = len(canaries.connections())
    t0 = time.monotonic()
    with ProcWatch(mark) as watch:
        if watch_started is not None:
            watch_started(watch)
        data, text, is_error = await call(client, "execute_python", script=script, timeout_seconds=timeout, **arguments)
    wall = time.monotonic() - t0
    left = wait_marker_gone(mark, marker_grace)
    cg_left = cgroup_leftovers(watch.cgroups())
    run = Run(data, text, is_error, parse_results(data.get("stdout") or ""), watch, wall, mark, start, left, cg_left)
    # Proof of life.
    if expect is not None:
        allowed = (expect,) if isinstance(expect, str) else expect
        assert data.get("status") in allowed, f"expected status {allowed}: {run.describe()}"
        assert start in run.stdout, f"the script never started (no start token): {run.describe()}"
    # NO-LEAK.
    assert_no_leak(canaries, data, text)
    after = canaries.connections()
    assert len(after) == before, f"a host canary listener was reached: {after[before:]}"
    # Teardown.
    assert not left, f"processes carrying the run marker survived the run: {left} {[posture(p)['cmdline'] for p in left]}"
    assert not cg_left, f"the run's cgroups still hold processes: {cg_left}"
    return run


def assert_no_leak(canaries: Canaries, data: dict[str, Any], text: str) -> None:
    blob = json.dumps(data) + "\n" + text
    leaked = [v for v in canaries.values if v in blob]
    assert not leaked, f"canary values leaked to the caller: {leaked}"


def server_ancestor(pid: int) -> int | None:
    """The `snakebox serve` process above a sandbox process, walking PPid up."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        cmd = _read(f"/proc/{pid}/cmdline").split(b"\0")
        if any(b"snakebox" in part for part in cmd[:1]) and b"serve" in cmd:
            return pid
        status = _read(f"/proc/{pid}/status").decode(errors="replace")
        m = re.search(r"^PPid:\s*(\d+)", status, re.M)
        if not m:
            return None
        pid = int(m.group(1))
    return None


def sysctl(name: str) -> str:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        return path.read_text().strip()
    except OSError as e:
        return f"absent ({e.strerror})"


def kernel_config(option: str) -> str | None:
    import gzip

    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            for line in f:
                if line.startswith(option + "="):
                    return line.strip().split("=", 1)[1]
                if line.startswith(f"# {option} is not set"):
                    return "n"
    except OSError:
        return None
    return "n"


def host_abi_probe() -> dict[str, Any]:
    """Whether x32 and ia32 system calls work on this host (outside any sandbox)."""
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(0x40000000 | 39))
    x32 = "present" if r > 0 else f"absent (errno {ctypes.get_errno()})"
    code = bytes.fromhex("b814000000cd80c3")  # mov eax, 20 (i386 getpid); int 0x80; ret
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        os._exit(0 if fn() == os.getpid() else 3)
    code_ = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ia32 = "present" if code_ == 0 else f"absent (child exit {code_})"
    return {"x32": x32, "ia32": ia32}
