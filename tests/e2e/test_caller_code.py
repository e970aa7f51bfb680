"""Caller-chosen code outside the run (issue 10; catalogue §3b D-01, D-07).

A dependency is code the caller chose: its `.pth` lines and `sitecustomize` run wherever an
interpreter of its environment starts, including the fork server that forks that
environment's runs. These tests build such a package here (a wheel made with the standard
library, served from a simple index on 127.0.0.1) whose import-time code, in every process
that loads it, records its own posture and tries what a privileged helper would allow: read a
root-only host file (directly and through `open_by_handle_at`), mount a devtmpfs, become uid 0,
reach a listener on host loopback, write a host sysctl. It keeps what it found in module
memory, which a forked run inherits; the script prints it.

Judged from outside: the root-only canary never reaches any output, the loopback listener
records no connection, and the fork server's own record (proof that the `.pth` really ran in
it) shows a run's posture: no capability, seccomp, no-new-privs, not the host's user
namespace, not root. Every path that serves a run is tried: forked, pooled, cold, session.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import socket
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any, Iterator

import anyio
import pytest

from attacks_support import Listener
from backend_support import FORK_SERVER_ONLY
from conftest import call, connect, docker_backend, have_bwrap
from test_forkserver import compiled_now, fork_server_with

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the fork server and the canary need root"),
]

PACKAGE = "snakebox-probe-d01"
MODULE = "snakebox_probe_d01"

PROBE = r'''
import ctypes, errno, json, os, socket, sys

CANARY_PATH = {canary_path!r}
PORT = {port}
RECORDS = []
FOUND = []


def _status():
    keep = ("Uid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")
    out = {{}}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in keep:
                out[key] = value.strip()
    return out


def _try(fn):
    try:
        got = fn()
        return "ok" if got is None else got
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def _read_canary():
    with open(CANARY_PATH) as f:
        FOUND.append(f.read())


def _by_handle():
    libc = ctypes.CDLL(None, use_errno=True)

    class Handle(ctypes.Structure):
        _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("data", ctypes.c_ubyte * 8)]

    # The host file system's root directory (ext4 inode 2), through a mount of that file system.
    handle = Handle(8, 1, (ctypes.c_ubyte * 8)(2, 0, 0, 0, 0, 0, 0, 0))
    mount_fd = os.open("/usr", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY | os.O_DIRECTORY)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "open_by_handle_at")
        inner = os.open(CANARY_PATH.lstrip("/"), os.O_RDONLY, dir_fd=fd)
        FOUND.append(os.read(inner, 4096).decode(errors="replace"))
    finally:
        os.close(mount_fd)


def _mount_devtmpfs():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"devtmpfs", b"/tmp", b"devtmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")


def _loopback():
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("127.0.0.1", PORT))
    finally:
        s.close()


def _sysctl():
    with open("/proc/sys/kernel/core_pattern", "w") as f:
        f.write("|/bin/false")


def record(where):
    RECORDS.append({{
        "where": where,
        "argv0": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
        "pid": os.getpid(),
        "status": _status(),
        "userns": os.readlink("/proc/self/ns/user"),
        "canary": _try(_read_canary),
        "by_handle": _try(_by_handle),
        "devtmpfs": _try(_mount_devtmpfs),
        "setuid0": _try(lambda: os.setuid(0)),
        "loopback": _try(_loopback),
        "core_pattern": _try(_sysctl),
    }})


record("pth")
'''

SCRIPT = f"""
import json, sys
import {MODULE} as probe
probe.record("script")
print(json.dumps({{"records": probe.RECORDS, "found": probe.FOUND}}))
"""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, canary_path: str, port: int) -> Path:
    """A pure-Python wheel whose `.pth` and `sitecustomize` run the probe at interpreter start."""
    return pack_wheel(
        directory,
        PACKAGE,
        {
            f"{MODULE}/__init__.py": PROBE.format(canary_path=canary_path, port=port).encode(),
            f"{MODULE}.pth": f"import {MODULE}\n".encode(),
            "sitecustomize.py": f"import {MODULE}\n{MODULE}.record('sitecustomize')\n".encode(),
        },
    )


def pack_wheel(directory: Path, package: str, files: dict[str, bytes]) -> Path:
    """A pure-Python wheel of `package` 1.0 holding `files` (paths in site-packages)."""
    module = package.replace("-", "_")
    files = dict(files)
    files[f"{module}-1.0.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n".encode()
    files[f"{module}-1.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: snakebox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record_name = f"{module}-1.0.dist-info/RECORD"
    lines = [_record_line(name, data) for name, data in files.items()] + [f"{record_name},,"]
    files[record_name] = ("\n".join(lines) + "\n").encode()
    wheel = directory / f"{module}-1.0-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    wheel.write_bytes(buffer.getvalue())
    return wheel


class SimpleIndex:
    """A PEP 503 simple index of one wheel, on 127.0.0.1."""

    def __init__(self, wheel: Path, package: str = PACKAGE) -> None:
        data = wheel.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        page = f'<html><body><a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>'.encode()
        project = package.replace("_", "-")

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 - the http.server interface
                self.answer(with_body=False)

            def do_GET(self) -> None:  # noqa: N802
                self.answer(with_body=True)

            def answer(self, with_body: bool) -> None:
                path = self.path.split("#")[0].rstrip("/")
                if path == f"/simple/{project}":
                    body, kind = page, "text/html"
                elif path == f"/files/{wheel.name}":
                    body, kind = data, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def probe_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    secret = f"d01-canary-{uuid.uuid4().hex}"
    canary_dir = tmp_path_factory.mktemp("root-only")
    canary = canary_dir / "secret"
    canary.write_text(secret)
    os.chmod(canary, 0o600)
    os.chown(canary, 0, 0)
    listener = Listener(socket.AF_INET, ("127.0.0.1", 0), "host loopback")
    port = listener.sock.getsockname()[1]
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"), str(canary), port)
    index = SimpleIndex(wheel)
    try:
        yield {"secret": secret, "listener": listener, "env": {"UV_INDEX_URL": index.url}}
    finally:
        index.close()
        listener.close()


def check_records(found: dict[str, Any], secret: str, text: str) -> list[dict[str, Any]]:
    """Proof of life, then every record denied everything."""
    records = found["records"]
    wheres = [r["where"] for r in records]
    assert "pth" in wheres and "sitecustomize" in wheres and "script" in wheres, records
    assert secret not in text and not found["found"], found["found"]
    host_userns = os.readlink("/proc/self/ns/user")
    for r in records:
        assert r["canary"] in ("ENOENT", "EACCES"), r
        assert r["by_handle"] in ("EPERM", "ENOENT", "EACCES"), r
        assert r["devtmpfs"] == "EPERM", r
        assert r["setuid0"] in ("EPERM", "EINVAL"), r  # (EINVAL: uid 0 is not mapped)
        # (A time-out has no errno: "None".)
        assert r["loopback"] in ("ECONNREFUSED", "ENETUNREACH", "None"), r
        assert r["core_pattern"] in ("EROFS", "EACCES", "EPERM", "ENOENT"), r
        status = r["status"]
        assert status["CapEff"] == "0000000000000000", r
        assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1", r
        assert status["Uid"].split()[0] != "0", r
        if not docker_backend():
            # Docker runs have no user namespace of their own (the gap P-03 (docker) in
            # SECURITY.md): their uid is a leased host uid instead, asserted above.
            assert r["userns"] != host_userns, r
    return records


async def run_probe(client, probe_index, **arguments) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data, text, _ = await call(client, "execute_python", script=SCRIPT, dependencies=[f"{PACKAGE}==1.0"], timeout_seconds=120, **arguments)
    assert data["status"] == "ok", data
    found = json.loads(data["stdout"])
    records = check_records(found, probe_index["secret"], text + json.dumps(data))
    return data, records


@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_D01_a_dependencys_import_time_code_in_the_fork_server_holds_a_runs_power(snakebox_bin, data_dir, probe_index):
    async with connect(snakebox_bin, data_dir, "legacy", env=probe_index["env"]) as client:
        first, _ = await run_probe(client, probe_index)
        # The environment was just used: its own fork server starts. (The environment is
        # compiled after its first run and published anew in its place, with a fork server
        # of the copy taking over; a run may still come before the first fork server is
        # ready and start cold: the next is forked.)
        deadline = time.monotonic() + 120
        while True:
            while (await call(client, "check_environment"))[0]["warm_pool"]["fork_servers"] < 1:
                assert time.monotonic() < deadline, "no fork server started for the probe's environment"
                await anyio.sleep(0.2)
            before = (await call(client, "check_environment"))[0]["warm_pool"]["forked"]
            _, records = await run_probe(client, probe_index)
            after = (await call(client, "check_environment"))[0]["warm_pool"]["forked"]
            if after == before + 1:
                break
            assert time.monotonic() < deadline, "the probe's run was not forked"
    # The `.pth` and `sitecustomize` ran in the fork server itself (the run inherited what
    # they recorded there), and found a run's posture there.
    in_helper = [r for r in records if r["argv0"] == "forkserver.py"]
    assert {r["where"] for r in in_helper} == {"pth", "sitecustomize"}, records
    # The forked run itself is in another user namespace than the fork server.
    script = next(r for r in records if r["where"] == "script")
    assert script["userns"] != in_helper[0]["userns"], records
    assert probe_index["listener"].connections == []
    assert first["exit_code"] == 0


@pytest.mark.parametrize("path", ["pooled", "cold"])
async def test_D01_a_dependencys_import_time_code_holds_a_runs_power_on_every_path(snakebox_bin, data_dir, probe_index, path):
    args = ["--fork-server", "off"] + (["--warm-pool", "0"] if path == "cold" else [])
    async with connect(snakebox_bin, data_dir, "legacy", *args, env=probe_index["env"]) as client:
        for _ in range(2):
            _, records = await run_probe(client, probe_index)
            assert all(r["argv0"] != "forkserver.py" for r in records), records
    assert probe_index["listener"].connections == []


async def test_D01_a_dependencys_import_time_code_in_a_session_holds_a_runs_power(snakebox_bin, data_dir, probe_index):
    async with connect(snakebox_bin, data_dir, "legacy", env=probe_index["env"]) as client:
        created, _, _ = await call(client, "create_session", dependencies=[f"{PACKAGE}==1.0"])
        session = created["session_id"]
        try:
            data, text, _ = await call(client, "execute_python", session_id=session, script=SCRIPT, timeout_seconds=120)
            assert data["status"] == "ok", data
            check_records(json.loads(data["stdout"]), probe_index["secret"], text + json.dumps(data))
        finally:
            await call(client, "delete_session", session_id=session)
    assert probe_index["listener"].connections == []


@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_D07_a_forked_run_finds_no_trace_of_an_earlier_run_in_its_memory(snakebox_bin, data_dir):
    """A run's script, execution id and output never reach the fork server's memory, so a
    later forked run, scanning every readable page it inherited, finds none of them (and
    does find its own marker: proof that the scan sees what is there)."""
    earlier = f"earlier-{uuid.uuid4().hex}"
    later = f"later-{uuid.uuid4().hex}"
    # The scan may not hold what it looks for (it would find itself): for each value it gets
    # the value's first 8 characters in two halves, its length and its SHA-256, and checks
    # the bytes after each occurrence of the prefix.
    scan = """
import hashlib
found = set()
with open('/proc/self/maps') as maps:
    regions = [line.split() for line in maps]
with open('/proc/self/mem', 'rb', 0) as mem:
    for parts in regions:
        if 'r' not in parts[1] or (len(parts) > 5 and parts[5] in ('[vvar]', '[vsyscall]')):
            continue
        start, end = (int(x, 16) for x in parts[0].split('-'))
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        for key, (head, tail, length, digest) in NEEDLES.items():
            prefix = (head + tail).encode()
            at = chunk.find(prefix)
            while at >= 0:
                if hashlib.sha256(chunk[at:at + length]).hexdigest() == digest:
                    found.add(key)
                    break
                at = chunk.find(prefix, at + 1)
print(sorted(found))
"""

    def needle(value: str) -> tuple[str, str, int, str]:
        return (value[:4], value[4:8], len(value), hashlib.sha256(value.encode()).hexdigest())

    async with connect(snakebox_bin, data_dir, "legacy") as client:
        data, _, _ = await call(client, "execute_python", script="print('warm')")
        deadline = time.monotonic() + 30
        while (await call(client, "check_environment"))[0]["warm_pool"]["fork_servers"] < 1:
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
        first, _, _ = await call(client, "execute_python", script=f"x = {earlier!r}\nprint(x[::-1])")
        assert first["status"] == "ok", first
        needles = {key: needle(value) for key, value in {"earlier_script": earlier, "earlier_output": earlier[::-1], "earlier_id": first["execution_id"], "own": later}.items()}
        before = (await call(client, "check_environment"))[0]["warm_pool"]["forked"]
        script = f"# {later}\nNEEDLES = {needles!r}\n" + scan
        second, _, _ = await call(client, "execute_python", script=script, timeout_seconds=60)
        after = (await call(client, "check_environment"))[0]["warm_pool"]["forked"]
    assert second["status"] == "ok", second
    assert after == before + 1, "the scanning run was not forked"
    assert second["stdout"].strip() == "['own']", second["stdout"]


SPINNER = "snakebox-spinner-d03"


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_code_left_running_in_a_fork_server_gets_a_fraction_of_a_core(snakebox_bin, data_dir, tmp_path_factory):
    """A `.pth` line that starts a busy thread keeps running in the fork server between calls
    (runs are separate processes; the thread is not): it is held to the fork server's small CPU
    share, not a run's core."""
    module = SPINNER.replace("-", "_")
    marker = f"spin-{uuid.uuid4().hex[:8]}"
    init = f"""
import ctypes, sys, threading
def _spin():
    ctypes.CDLL(None).prctl(15, {marker!r}.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's comm
    while True:
        pass
if sys.argv and sys.argv[0].endswith("forkserver.py"):
    threading.Thread(target=_spin, daemon=True).start()
"""
    wheel = pack_wheel(tmp_path_factory.mktemp("spinner"), SPINNER, {f"{module}/__init__.py": init.encode(), f"{module}.pth": f"import {module}\n".encode()})
    index = SimpleIndex(wheel, SPINNER)
    try:
        async with connect(snakebox_bin, data_dir, "legacy", env={"UV_INDEX_URL": index.url}) as client:
            data, _, _ = await call(client, "execute_python", script="print('ok')", dependencies=[f"{SPINNER}==1.0"], timeout_seconds=120)
            assert data["status"] == "ok", data
            # The fork server that serves on: one started before the environment's compiled
            # copy took its place is stopped as soon as it is ready, and its thread with it.
            await compiled_now(client)
            await fork_server_with(client, module)
            deadline = time.monotonic() + 60
            pid = None
            while pid is None:
                assert time.monotonic() < deadline, "no fork server started for the spinner's environment"
                await anyio.sleep(0.2)
                pid = thread_named(marker)
            # (The marker is the spinning thread's name: it runs in the fork server.)
            assert any(arg.endswith(b"/forkserver.py") for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
            before, start = process_cpu_seconds(pid), time.monotonic()
            await anyio.sleep(3)
            used = (process_cpu_seconds(pid) - before) / (time.monotonic() - start)
            # A fork server with a thread of its environment's still forks runs (through a
            # single-threaded helper: a raw clone would copy locks the thread may hold), each
            # in its own pid namespace under a clone of the fork server as pid 1. (The first
            # fork server may be replaced once the environment's bytecode is compiled: runs
            # in between start cold.)
            forked = []
            deadline = time.monotonic() + 90
            while len(forked) < 3:
                assert time.monotonic() < deadline, f"no forked runs: {forked}"
                data, _, _ = await call(client, "execute_python", script=FORKED_PROBE, dependencies=[f"{SPINNER}==1.0"])
                assert data["status"] == "ok", data
                seen = json.loads(data["stdout"])
                if seen["init_is_the_fork_server"]:
                    forked.append(seen)
                else:
                    await anyio.sleep(0.2)
            assert all(seen == {"pid": 2, "init_is_the_fork_server": True, "threads": 1} for seen in forked), forked
            assert thread_named(marker) is not None, "the spinning thread is gone"
    finally:
        index.close()
    assert 0.05 < used < 0.4, f"the fork server used {used:.2f} of a core"


def thread_named(name: str) -> int | None:
    """The pid of a process with a thread named `name`, seen from the host."""
    for comm in Path("/proc").glob("[0-9]*/task/*/comm"):
        try:
            if comm.read_text().strip() == name:
                return int(comm.parts[2])
        except OSError:
            continue
    return None


# What a run sees of how it was started: a forked run's pid 1 is a clone of the fork server
# (its command line is the fork server's); a cold run's is bubblewrap's init.
FORKED_PROBE = """
import json, os
print(json.dumps({
    "pid": os.getpid(),
    "init_is_the_fork_server": b"forkserver.py" in open("/proc/1/cmdline", "rb").read(),
    "threads": len(os.listdir("/proc/self/task")),
}))
"""



@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_a_package_that_kills_the_fork_server_at_import_is_no_longer_preloaded(snakebox_bin, data_dir, tmp_path_factory):
    """Preloading imports a declared package in the fork server: one whose import ends the
    process there (it could as well hang or run out of memory) makes that start fail once; the
    next fork server of the environment preloads nothing, and its runs are forked as usual."""
    package = "snakebox-preload-crash"
    module = package.replace("-", "_")
    init = "import os, sys\nif sys.argv and sys.argv[0].endswith('forkserver.py'):\n    os._exit(3)\nVALUE = 'imported in the run'\n"
    wheel = pack_wheel(tmp_path_factory.mktemp("crash"), package, {f"{module}/__init__.py": init.encode()})
    index = SimpleIndex(wheel, package)
    script = f"import {module}\nprint({module}.VALUE)"
    try:
        async with connect(snakebox_bin, data_dir, "legacy", env={"UV_INDEX_URL": index.url}) as client:
            data, _, _ = await call(client, "execute_python", script=script, dependencies=[f"{package}==1.0"], timeout_seconds=120)
            assert data["status"] == "ok" and data["stdout"] == "imported in the run\n", data
            deadline = time.monotonic() + 90
            failed = False
            while True:
                report, _, _ = await call(client, "check_environment")
                pool = report["warm_pool"]
                failed = failed or "preloading" in (pool["fork_server_error"] or "")
                if pool["fork_servers"] >= 1:
                    break
                assert time.monotonic() < deadline, pool
                # Calls keep the environment in use (the pool retries a failed start as it works).
                data, _, _ = await call(client, "execute_python", script=script, dependencies=[f"{package}==1.0"])
                assert data["status"] == "ok", data
                await anyio.sleep(0.5)
            assert failed, "the preloading start was not seen failing"
            assert all(d["preloaded"] == [] for d in pool["fork_server_details"]), pool
            forked = pool["forked"]
            data, _, _ = await call(client, "execute_python", script=script, dependencies=[f"{package}==1.0"])
            assert data["status"] == "ok" and data["stdout"] == "imported in the run\n", data
            report, _, _ = await call(client, "check_environment")
            assert report["warm_pool"]["forked"] == forked + 1, report["warm_pool"]
    finally:
        index.close()
