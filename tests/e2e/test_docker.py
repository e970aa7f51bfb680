"""The docker backend end to end (issue 17): `--sandbox-backend docker` through the real binary,
the official MCP client and a real Docker engine (Debian's docker.io, started by
scripts/dockerd when none answers).

What is judged from outside: each hardening field of a live run's container, read with
`docker inspect` and from the host's /proc while the run sleeps; limits (memory → `memory_limit`,
pids → EAGAIN, output capped); timeouts and cancellation leave no container; numpy from the
read-only environment; a few attack-catalogue classes (host files, writes outside the allowed
directories, tampering with the environment, host loopback, mounts and user namespaces, the
engine's socket), each with a canary or listener on the host.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import call, connect, docker_engine, runsc_registered, server_pid

pytestmark = pytest.mark.anyio

MEMORY = 256 * 1024 * 1024
PIDS = 48
# Each run: a fresh container (cold: no warm pool, so the container a test finds is the run's),
# memory and pids small enough to hit from a test.
ARGS = (
    "--sandbox-backend", "docker",
    "--memory-limit", "256MiB",
    "--max-processes", str(PIDS),
    "--cpu-cores", "1.5",
    "--max-output-bytes", "65536",
    "--warm-pool", "0",
)


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def engine(snakebox_bin: Path) -> None:
    """A Docker engine that answers, and this host's run image in it."""
    docker_engine(snakebox_bin)
    status = subprocess.run([str(snakebox_bin), "image", "status"], capture_output=True, text=True)
    assert status.returncode == 0 and "snakebox-run:" in status.stdout, status


def our_containers() -> list[str]:
    out = docker("ps", "-a", "--filter", "name=snakebox-", "--format", "{{.Names}}")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def wait_no_containers(before: set[str], seconds: float = 20) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = [name for name in our_containers() if name not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


async def test_check_reports_the_docker_backend_and_its_image(engine, snakebox_bin, data_dir):
    out = subprocess.run(
        [str(snakebox_bin), "check", "--json", "--data-dir", str(data_dir), "--no-warm-cache", *ARGS],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["sandbox_backend"] == "docker" and report["isolation_active"], report
    details = "\n".join(report["sandbox_details"])
    assert "Engine API 1.41 pinned" in details and "snakebox-run:" in details, details
    limits = {limit["name"]: limit for limit in report["limits"]}
    for name in ("memory", "max_processes", "cpu_bandwidth", "network", "scratch_bytes"):
        assert limits[name]["enforced"], limits[name]
    assert "PidsLimit" in limits["max_processes"]["mechanism"]


async def test_the_image_tag_is_the_same_from_one_build_to_the_next(engine, snakebox_bin):
    """The tag names the archive's content only (no build time, owner or user name in it):
    a second build, by another process at another time, names the same image and finds it."""
    first = subprocess.run([str(snakebox_bin), "image", "status"], capture_output=True, text=True)
    time.sleep(1.1)  # a second later: an archive that carried the build time would differ
    again = subprocess.run([str(snakebox_bin), "image", "build"], capture_output=True, text=True)
    assert first.returncode == 0 and again.returncode == 0, (first, again)
    tag = first.stdout.split()[0]
    assert tag.startswith("snakebox-run:"), first.stdout
    assert again.stdout.startswith(f"{tag} is already in the engine"), again.stdout


async def test_a_missing_image_fails_closed_with_the_command_that_builds_it(engine, snakebox_bin, tmp_path):
    # Another engine socket: an empty engine is too slow to start here, so point at a socket
    # where no engine answers and check the hint; the image's own absence is `image status`.
    out = subprocess.run(
        [str(snakebox_bin), "check", "--data-dir", str(tmp_path), "--no-warm-cache", *ARGS],
        capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"},
    )
    assert out.returncode == 1, out
    assert "Failed to reach the Docker engine" in out.stdout and "scripts/dockerd" in out.stdout, out.stdout


async def test_numpy_from_the_read_only_environment(engine, snakebox_bin, data_dir):
    script = textwrap.dedent(
        """\
        import os, numpy
        print("numpy", numpy.__version__, int(numpy.arange(10).sum()))
        target = os.path.join(os.path.dirname(numpy.__file__), "planted.py")
        try:
            open(target, "w").write("x = 1")
            print("WROTE", target)
        except OSError as err:
            print("denied", err.errno, target)
        """
    )
    async with connect(snakebox_bin, data_dir, "auto", *ARGS) as client:
        data, _, is_error = await call(client, "execute_python", script=script, dependencies=["numpy>=1.26"])
    assert not is_error and data["status"] == "ok", data
    assert "numpy" in data["stdout"] and " 45" in data["stdout"], data["stdout"]
    assert "WROTE" not in data["stdout"], data["stdout"]
    planted = data["stdout"].split("denied 30 ", 1)[1].strip()  # EROFS
    assert not Path(planted).exists()


async def test_each_hardening_field_of_a_live_container(engine, snakebox_bin, data_dir):
    """A run sleeps while the test inspects its container from outside; the call is then
    cancelled, and the container must be gone."""
    before = set(our_containers())
    token = secrets.token_hex(8)
    script = f"import time\nprint('{token}', flush=True)\ntime.sleep(120)\n"
    found: dict[str, Any] = {}
    async with connect(snakebox_bin, data_dir, "auto", *ARGS) as client:
        async with anyio.create_task_group() as tasks:
            async def run() -> None:
                await client.call_tool("execute_python", {"script": script, "timeout_seconds": 120})

            tasks.start_soon(run)
            with anyio.fail_after(60):
                while not found:
                    # This server's run (other servers may share the engine; this one may be
                    # building the environment in install containers first).
                    for info in running_containers(before, server_pid(data_dir)).values():
                        if "/snakebox/runner.py" in info["Config"]["Cmd"]:
                            found.update(info)
                    await anyio.sleep(0.2)
            control = Path(next(m["Source"] for m in found["Mounts"] if m["Destination"] == "/.snakebox-control"))
            control_mode = {
                "dir": (control.stat().st_uid, control.stat().st_mode & 0o7777),
                "fifo": ((control / "control").stat().st_uid, (control / "control").stat().st_mode & 0o7777),
            }
            # The run's processes, from the host's /proc: the container's init (the runner's
            # reaper) and the runner.
            pid = found["State"]["Pid"]
            pid_1 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert any(part.endswith(b"runner.py") for part in pid_1) and not pid_1[0].endswith(b"docker-init"), pid_1
            statuses = [Path(f"/proc/{pid}/status").read_text()]
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                statuses.append(Path(f"/proc/{child}/status").read_text())
            tasks.cancel_scope.cancel()

    uid = assert_hardened(found)
    assert any("environments-v1" in m["Source"] and not m["RW"] for m in found["Mounts"]), found["Mounts"]
    # The control directory is root's and 0711 (the run may only write to its FIFO, 0622).
    assert control_mode["dir"] == (0, 0o711) and control_mode["fifo"] == (0, 0o622), control_mode
    for status in statuses:
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["CapEff"].strip() == "0000000000000000", fields["CapEff"]
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Seccomp"].strip() == "2", "our seccomp profile is on"
        assert int(fields["Uid"].split()[0]) == uid
    # Cancelled: nothing of it left, stopped or stored.
    assert not wait_no_containers(before), "a cancelled run left its container"


def assert_hardened(found: dict[str, Any]) -> int:
    """Each hardening field of a container, as `docker inspect` shows it; its uid."""
    host, config = found["HostConfig"], found["Config"]
    uid = int(config["User"].split(":")[0])
    assert uid >= 1000, config["User"]
    assert not config["OpenStdin"] and not config["AttachStdin"], "no stdin from the engine"
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert not any("unconfined" in opt for opt in host["SecurityOpt"])
    # Our seccomp profile (the native backend's rule table), not the engine's default: only
    # the native ABI, and the native deny list with its errnos.
    profiles = [json.loads(opt.split("=", 1)[1]) for opt in host["SecurityOpt"] if opt.startswith("seccomp=")]
    assert len(profiles) == 1, host["SecurityOpt"]
    profile = profiles[0]
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["architectures"] == [{"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[os.uname().machine]]
    refused = {(name, entry["errnoRet"]) for entry in profile["syscalls"] for name in entry["names"]}
    for name in ("keyctl", "bpf", "io_uring_setup", "mount", "ptrace", "open_by_handle_at", "socket", "clone"):
        assert (name, 1) in refused, name
    assert ("clone3", 38) in refused
    assert host["Privileged"] is False
    assert host["Memory"] == MEMORY and host["MemorySwap"] == MEMORY
    assert host["PidsLimit"] == PIDS
    assert host["NanoCpus"] == 1_500_000_000
    assert "size=" in host["Tmpfs"]["/tmp"] and host["ShmSize"] > 0
    assert host["LogConfig"]["Type"] == "none" and not found["LogPath"]
    # No docker-init: the runner's reaper is the container's pid 1, out of reach of the run's
    # signals; it reaps what the run leaves behind.
    assert not host["Init"], host["Init"]
    assert host["OomScoreAdj"] == 1000
    assert host["CgroupnsMode"] == "private"
    mounts = {m["Destination"]: m for m in found["Mounts"]}
    writable = sorted(d for d, m in mounts.items() if m["RW"])
    assert writable == ["/.snakebox-control", "/work"], writable
    assert "/var/run/docker.sock" not in {m["Source"] for m in found["Mounts"]}
    assert mounts["/usr"]["Source"] == "/usr" and not mounts["/usr"]["RW"]
    return uid


async def test_limits_memory_pids_output_and_timeout(engine, snakebox_bin, data_dir):
    before = set(our_containers())
    fork = textwrap.dedent(
        """\
        import os, errno, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except OSError as err:
            print("fork", errno.errorcode[err.errno], "after", n)
        """
    )
    network = ("--network", "on", "--network-allow-ip-literals")
    async with connect(snakebox_bin, data_dir, "auto", *ARGS, *network) as client:
        data, _, _ = await call(client, "execute_python", script="x = bytearray(1024**3)\nprint(len(x))")
        assert data["status"] == "memory_limit", data
        data, _, _ = await call(client, "execute_python", script=fork)
        assert data["status"] == "ok", data
        assert "fork EAGAIN after" in data["stdout"], data["stdout"]
        assert int(data["stdout"].split()[-1]) < PIDS
        data, _, _ = await call(
            client, "execute_python", timeout_seconds=4,
            script="import sys\nwhile True: sys.stdout.write('x' * 65536)\n",
        )
        assert data["status"] == "timeout", data
        assert data["stdout_truncated"] and len(data["stdout"]) <= 70_000, len(data["stdout"])
        # A run with network reaches it only through its proxy (the runner's bridge to the
        # proxy's socket), which applies the policy: a private address is refused.
        data, _, _ = await call(client, "execute_python", script=textwrap.dedent(
            """\
            import socket
            s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
            s.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\\r\\nHost: 10.0.0.1:443\\r\\n\\r\\n")
            print(s.recv(64))
            """
        ))
        assert data["status"] == "ok" and "403 Forbidden" in data["stdout"], data
        assert [(e["host"], e["allowed"]) for e in data["network_log"]] == [("10.0.0.1", False)], data["network_log"]
        # Still alive after all that.
        data, _, _ = await call(client, "execute_python", script="print('alive')")
        assert data["status"] == "ok" and data["stdout"].strip() == "alive", data
    assert not wait_no_containers(before), "runs left containers behind"


class Listener:
    """A TCP listener on the host's loopback that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connected = False
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.connected = True
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


# K-11: getpid through the i386 entry point, from a page of machine code (x86_64 only).
INT80 = textwrap.dedent(
    """\
    import ctypes, mmap
    buf = mmap.mmap(-1, 4096, prot=7)
    buf.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
    f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    print("getpid via int 0x80", f())
    """
)


async def test_attack_classes_judged_from_outside(engine, snakebox_bin, data_dir, tmp_path):
    """F-01 host files, F-04 writes outside, N-02 host loopback, K-02 user namespaces, K-04
    mounts, and the engine's socket: each probe reports, and the host is checked."""
    canary = Path("/root") / f".snakebox-canary-{secrets.token_hex(4)}"
    canary.write_text("SECRET-" + secrets.token_hex(8))
    outside = tmp_path / "outside"
    listener = Listener()
    script = textwrap.dedent(
        f"""\
        import ctypes, errno, os, socket
        def probe(name, fn):
            try:
                fn()
                print(name, "ALLOWED")
            except OSError as err:
                print(name, "denied", errno.errorcode.get(err.errno, err.errno))
        probe("F-01", lambda: open({str(canary)!r}).read())
        probe("F-02", lambda: open("/etc/shadow").read())
        probe("F-04-usr", lambda: open("/usr/planted", "w"))
        probe("F-04-root", lambda: open("/planted", "w"))
        probe("F-04-outside", lambda: open({str(outside)!r}, "w"))
        probe("N-02", lambda: socket.create_connection(("127.0.0.1", {listener.port}), timeout=2))
        probe("docker-sock", lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock"))
        libc = ctypes.CDLL(None, use_errno=True)
        def sys_ok(rc):
            if rc != 0:
                raise OSError(ctypes.get_errno(), "")
        probe("K-02", lambda: sys_ok(libc.unshare(0x10000000)))
        probe("K-04", lambda: sys_ok(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
        # The native backend's seccomp rules, which Docker's default profile lacks.
        probe("N-06", lambda: socket.socket(40, socket.SOCK_STREAM))
        libc.syscall.restype = ctypes.c_long
        probe("K-12", lambda: sys_ok(libc.syscall(ctypes.c_long(435), ctypes.c_long(0), ctypes.c_long(88))))
        import subprocess, sys
        if os.uname().machine == "x86_64":
            done = subprocess.run([sys.executable, "-c", {INT80!r}], capture_output=True, text=True)
            print("K-11", done.returncode, done.stdout.strip())
        open("/work/made-here", "w").write("ok")
        open("/tmp/scratch", "w").write("ok")  # /tmp is writable scratch (mode 1777)
        import resource
        print("core", resource.getrlimit(resource.RLIMIT_CORE))
        print("cgroups", sorted({{line.strip().split(":")[2] for line in open("/proc/self/cgroup")}}))
        print("DONE")
        """
    )
    try:
        async with connect(snakebox_bin, data_dir, "auto", *ARGS) as client:
            data, _, is_error = await call(client, "execute_python", script=script)
    finally:
        listener.close()
        canary_text = canary.read_text()
        canary.unlink()
    assert not is_error and data["status"] == "ok", (data["exception"], data["stderr"])
    out = data["stdout"]
    assert "DONE" in out, out
    assert "ALLOWED" not in out, out
    assert "core (0, 0)" in out, "core dumps are off, as a hard limit"
    assert "cgroups ['/']" in out, "the engine's cgroup paths are hidden (own cgroup namespace)"
    for name in ("F-01", "F-02", "F-04-usr", "F-04-root", "F-04-outside", "N-02", "docker-sock", "K-02", "K-04"):
        assert f"{name} denied" in out, (name, out)
    # Our profile's errnos and ABI: AF_VSOCK EPERM, clone3 ENOSYS (glibc falls back to clone),
    # an i386 `int 0x80` call kills its process with SIGSYS.
    assert "N-06 denied EPERM" in out and "K-12 denied ENOSYS" in out, out
    if os.uname().machine == "x86_64":
        assert any(line.split()[:2] == ["K-11", "-31"] for line in out.splitlines()), out
    assert canary_text not in out
    assert not outside.exists() and not Path("/usr/planted").exists()
    assert not listener.connected, "a run reached the host's loopback"
    # The working directory is writable (proof the probes ran in a working sandbox).
    assert "made-here" in [a["name"] for a in data["artifacts"]], data["artifacts"]


async def test_gvisor_runtime_subset(engine, snakebox_bin, data_dir):
    """`--docker-runtime runsc`: the documented subset (SECURITY.md) runs under gVisor, whose
    kernel is not the host's."""
    if not runsc_registered():
        reason = "runsc is not registered with the engine (scripts/dockerd registers Debian's runsc)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    before = set(our_containers())
    # ARGS[:4]: the backend and the memory limit; the warm pool keeps its default.
    args = (*ARGS[:4], "--max-processes", "20", "--docker-runtime", "runsc")
    probe = textwrap.dedent(
        """\
        import errno, os, socket
        print(open("/proc/version").read().strip())
        for name, fn in [
            ("write-usr", lambda: open("/usr/planted", "w")),
            ("docker-sock", lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock")),
            ("shadow", lambda: open("/etc/shadow")),
        ]:
            try:
                fn()
                print(name, "ALLOWED")
            except OSError as err:
                print(name, "denied", errno.errorcode.get(err.errno))
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    import time; time.sleep(30); os._exit(0)
                n += 1
        except OSError as err:
            print("fork", errno.errorcode[err.errno])
        21 * 2
        """
    )
    async with connect(snakebox_bin, data_dir, "auto", *args) as client:
        report, _, _ = await call(client, "check_environment")
        assert any("gVisor platform" in d for d in report["sandbox_details"]), report["sandbox_details"]
        data, _, is_error = await call(client, "execute_python", script=probe)
        assert not is_error and data["status"] == "ok", data
        assert data["result"]["json"] == 42, data["result"]  # the control channel works
        out = data["stdout"]
        assert out.splitlines()[0] != Path("/proc/version").read_text().strip(), "not gVisor's kernel"
        for name in ("write-usr", "docker-sock", "shadow"):
            assert f"{name} denied" in out, (name, out)
        assert "fork EAGAIN" in out, out
        data, _, _ = await call(client, "execute_python", script="x = bytearray(1024**3)\nprint(len(x))")
        assert data["status"] == "memory_limit", data
        # The warm pool (on here: the default of 2) and a session, under gVisor too.
        with anyio.fail_after(120):
            while (await call(client, "check_environment"))[0]["warm_pool"]["ready_default"] < 1:
                await anyio.sleep(0.2)
        served = (await call(client, "check_environment"))[0]["warm_pool"]["served"]
        data, _, _ = await call(client, "execute_python", script="print(open('/proc/version').read())")
        assert data["status"] == "ok" and data["stdout"].strip() == out.splitlines()[0], data
        assert (await call(client, "check_environment"))[0]["warm_pool"]["served"] == served + 1
        session, _, _ = await call(client, "create_session", name="gvisor")
        first, _, _ = await call(client, "execute_python", script="y = 20", session_id=session["session_id"])
        second, _, _ = await call(client, "execute_python", script="y + 1", session_id=session["session_id"])
        assert first["status"] == "ok" and second["result"]["json"] == 21, (first, second)
    assert not Path("/usr/planted").exists()
    assert not wait_no_containers(before), "gVisor runs left containers behind"


async def test_a_killed_servers_containers_are_removed_by_the_next_one(engine, snakebox_bin, data_dir):
    """A container outlives the server that asked for it (catalogue S: SIGKILL of the
    supervisor); the next server on the engine removes it before it takes calls."""
    before = set(our_containers())
    script = "import time\nprint('up', flush=True)\ntime.sleep(300)\n"
    proc = subprocess.Popen(
        [str(snakebox_bin), "run", "--data-dir", str(data_dir), "--no-warm-cache", *ARGS, "--timeout", "300", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(script.encode())
    proc.stdin.close()
    deadline = time.monotonic() + 60
    orphan: list[str] = []
    while not orphan and time.monotonic() < deadline:
        for name in set(our_containers()) - before:
            if json.loads(docker("inspect", name).stdout or "[{}]")[0].get("State", {}).get("Running"):
                orphan.append(name)
        time.sleep(0.2)
    assert orphan, "the run's container never ran"
    assert usage_cgroups(orphan[0]), "the run's usage cgroup exists while it runs"
    proc.kill()
    proc.wait()
    assert orphan[0] in our_containers(), "the engine keeps a killed client's container running"
    out = subprocess.run(
        [str(snakebox_bin), "check", "--data-dir", str(data_dir), "--no-warm-cache", *ARGS],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out
    assert orphan[0] not in our_containers(), "the next server left the orphan running"
    assert not usage_cgroups(orphan[0]), "the next server left the orphan's usage cgroup"


def usage_cgroups(container: str) -> list[Path]:
    """The parent cgroups a container's usage is read from (cgroup v1 or v2)."""
    root = Path("/sys/fs/cgroup")
    return [*root.glob(f"*/snakebox-docker/*/{container}"), *root.glob(f"snakebox-docker/*/{container}")]


def wait_gone(names: set[str], seconds: float = 20) -> set[str]:
    """Wait until none of these containers exists; those still there."""
    deadline = time.monotonic() + seconds
    while (left := names & set(our_containers())) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def running_containers(before: set[str], server: int) -> dict[str, dict[str, Any]]:
    """The containers of the server with pid `server` that run now and were not there before,
    by name, as inspected (other servers may use the same engine meanwhile)."""
    found = {}
    for name in set(our_containers()) - before:
        info = json.loads(docker("inspect", name).stdout or "[]")
        label = info[0]["Config"]["Labels"].get("snakebox.server", "") if info else ""
        if info and info[0]["State"]["Running"] and label.split(".")[1:2] == [str(server)]:
            found[name] = info[0]
    return found


async def test_pooled_containers_serve_one_run_each_and_leave_nothing(engine, snakebox_bin, data_dir):
    """The warm pool: containers started ahead, hardened like a cold run's (inspected while they
    wait), each serving one run and then removed; what a run used is measured either way; after
    the server exits none of its containers is left."""
    before = set(our_containers())
    pooled = tuple(a for a in ARGS if a not in ("--warm-pool", "0")) + ("--warm-pool", "1")
    script = "x = bytearray(64 << 20)\nprint(sum(range(10**6)))\n"

    def usage_ok(result: dict[str, Any]) -> None:
        usage = result["resource_usage"]
        assert usage is not None, result
        # 64 MiB touched; the limit is 256 MiB.
        assert 64 << 20 <= usage["peak_memory_bytes"] <= MEMORY, usage
        assert isinstance(usage["cpu_time_ms"], int) and usage["cpu_time_ms"] >= 0, usage

    async with connect(snakebox_bin, data_dir, "auto", *pooled) as client:
        # The first call makes the default environment known (no cache warming): it runs cold.
        first, _, _ = await call(client, "execute_python", script=script)
        assert first["status"] == "ok" and first["stdout"].strip() == str(sum(range(10**6))), first
        usage_ok(first)
        with anyio.fail_after(120):
            while (await call(client, "check_environment"))[0]["warm_pool"]["ready_default"] < 1:
                await anyio.sleep(0.2)
        pool = (await call(client, "check_environment"))[0]["warm_pool"]
        assert pool["cold_starts"] == 1 and pool["served"] == 0, pool
        waiting = running_containers(before, server_pid(data_dir))
        assert len(waiting) == 1, waiting
        [(name, container)] = waiting.items()
        # Hardened like a cold run's container, before it is used; its stdin is our FIFO.
        assert_hardened(container)
        assert any("environments-v1" in m["Source"] and not m["RW"] for m in container["Mounts"]), container["Mounts"]
        assert "0</.snakebox-control/request" in " ".join(container["Config"]["Cmd"]), container["Config"]["Cmd"]
        control = Path(next(m["Source"] for m in container["Mounts"] if m["Destination"] == "/.snakebox-control"))
        request = (control / "request").stat()
        assert (request.st_uid, request.st_mode & 0o7777) == (0, 0o644), request

        second, _, _ = await call(client, "execute_python", script=script)
        assert second["status"] == "ok", second
        usage_ok(second)
        pool = (await call(client, "check_environment"))[0]["warm_pool"]
        # Served by the container that was waiting before the call, which is gone after it.
        assert pool["served"] == 1 and pool["cold_starts"] == 1, pool
        assert not wait_gone({name}), "a pooled container outlived its one run"
        # The refill: another container, not the used one.
        with anyio.fail_after(120):
            while not (refill := running_containers(before, server_pid(data_dir))):
                await anyio.sleep(0.2)
        assert name not in refill
    # The server exited: its pooled container and its cgroups are gone.
    seen = {name, *refill}
    assert not wait_gone(seen), "the server left containers behind"
    cgroups = [*Path("/sys/fs/cgroup").glob("*/snakebox-docker/*/*"), *Path("/sys/fs/cgroup").glob("snakebox-docker/*/*")]
    assert not [p for p in cgroups if p.name in seen], cgroups


async def test_a_session_is_one_container_until_it_is_closed(engine, snakebox_bin, data_dir):
    """A session's interpreter is one long-lived, hardened container: state is kept across
    calls in it; a timeout kills it (the next call starts another); delete removes it, and the
    server's exit removes the rest."""
    before = set(our_containers())
    async with connect(snakebox_bin, data_dir, "auto", *ARGS) as client:
        data, text, is_error = await call(client, "create_session", name="docker")
        assert not is_error, text
        session = data["session_id"]

        async def run(script: str, **arguments: Any) -> dict[str, Any]:
            data, text, _ = await call(client, "execute_python", script=script, session_id=session, **arguments)
            return data

        first = await run("import os\nx = 41\nprint('pid', os.getpid())")
        assert first["status"] == "ok" and first["fresh_interpreter"] is True, first
        live = running_containers(before, server_pid(data_dir))
        assert len(live) == 1, {n: c["Config"]["Cmd"] for n, c in live.items()}
        [(name, container)] = live.items()
        assert_hardened(container)
        second = await run("x + 1")
        assert second["status"] == "ok" and second["result"]["json"] == 42, second
        assert second["fresh_interpreter"] is False, second
        assert set(running_containers(before, server_pid(data_dir))) == {name}, "the second call ran in the same container"
        # Files written in the workspace are the session's (the host directory bound in).
        third = await run("open('kept.txt', 'w').write('kept')\nprint(open('kept.txt').read())")
        assert third["stdout"] == "kept\n", third

        # A call that runs out of time kills the container; the next call gets a fresh one.
        slow = await run("import time\ntime.sleep(60)", timeout_seconds=2)
        assert slow["status"] == "timeout", slow
        assert not wait_gone({name}), "the timed-out session's container is gone"
        fresh = await run("print(open('kept.txt').read())")
        assert fresh["status"] == "ok" and fresh["fresh_interpreter"] is True and fresh["stdout"] == "kept\n", fresh
        [replacement] = running_containers(before, server_pid(data_dir))
        assert replacement != name

        await call(client, "delete_session", session_id=session)
        assert not wait_gone({replacement}), "a deleted session left its container"

        # Another session, left open: the server's exit removes it.
        data, _, _ = await call(client, "create_session", name="left-open")
        await call(client, "execute_python", script="y = 1", session_id=data["session_id"])
        left_open = set(running_containers(before, server_pid(data_dir)))
        assert len(left_open) == 1, "the second session's container runs"
    assert not wait_gone(left_open), "the server left a session's container behind"


async def test_an_idle_sessions_container_is_removed(engine, snakebox_bin, data_dir):
    """Idle expiry stops the interpreter: its container is killed and removed through the
    engine's API; the session lives on and its next call starts a new container."""
    before = set(our_containers())
    async with connect(snakebox_bin, data_dir, "auto", *ARGS, "--session-idle-stop", "2") as client:
        data, _, _ = await call(client, "create_session", name="idle")
        session = data["session_id"]
        first, _, _ = await call(client, "execute_python", script="x = 1", session_id=session)
        assert first["status"] == "ok", first
        live = set(running_containers(before, server_pid(data_dir)))
        assert len(live) == 1, live
        assert not wait_gone(live, 30), "the idle session's container is still there"
        again, _, _ = await call(client, "execute_python", script="print('back')", session_id=session)
        assert again["status"] == "ok" and again["fresh_interpreter"] is True, again
