"""The attack catalogue (`attack-catalogue.md`) as an end-to-end suite: each case runs its
snippet inside a real sandbox through the real binary over MCP, and the harness checks from
outside (canaries, host listeners, a run marker in host /proc, host files).

Every test asserts both that the run really happened (the script's start token and results are
in stdout, the status is the expected one) and that the attack was denied. Escape attempts run
in a forked child inside the script. Session cases (F-07 persistent workspace, J-01/J-02/J-04/J-05,
U-03, I-01 across `create_session` interpreters) run against live sessions; cases that need a
kernel feature this host lacks are skipped with the reason. A case where the sandbox really lets the
attack through is marked `xfail(strict=True, reason="GAP: ...")` and listed in SECURITY.md, so it
turns red when the gap is closed.

Every case runs in four launch modes (the `launch` fixture): native forked and pooled runs, the
docker backend (`docker`: the subset marked `docker_ci` in CI, all with
SNAKEBOX_DOCKER_ATTACKS=all) and gVisor (`runsc`: the cases marked `runsc_subset`). Under docker,
a case marked `native_only` is skipped with its reason, and one marked `docker_gap` is a strict
xfail listed in SECURITY.md (the docker backend).

Run with `scripts/test -k attacks`; `pytest -s` shows the kernel posture and the K-01 table.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest

from attacks_support import (
    Canaries,
    ProcWatch,
    assert_no_leak,
    attack,
    host_abi_probe,
    is_namespace_init,
    kernel_config,
    marker_pids,
    plant_canaries,
    posture,
    remove_canaries,
    server_ancestor,
    sysctl,
    wait_marker_gone,
)
from conftest import E2E_BACKEND, call, connect, docker_backend, docker_engine, process_rss_kib, runsc_registered, session_dir

pytestmark = pytest.mark.anyio

# Attacks do not depend on the protocol era; one mode keeps the suite fast.
MODE = "auto"
SIGSYS = 31
DENIED = {errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EROFS, errno.ENOENT}


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> Any:
    planted = plant_canaries(tmp_path_factory.mktemp("canaries"))
    yield planted
    remove_canaries(planted)
    assert not planted.connections(), f"host canary listeners were reached: {planted.connections()}"


# How one-shot runs of the default environment start: every attack runs each way.
# "forked": from the fork server (the default; the server is ready before the attack);
# "pooled": in a pre-started bubblewrap sandbox, or cold (`--fork-server off`);
# "docker": a container of a Docker engine (`--sandbox-backend docker`, issue 17), judged from
# outside as for native. A case that asserts what only the native sandbox has, or needs what the
# docker backend does not offer yet, is marked `native_only(reason)` and skipped there with the
# reason. CI runs the docker cases marked `docker_ci` (a subset that keeps CI short, one or more
# per class); SNAKEBOX_DOCKER_ATTACKS=all runs every docker case, =off none.
# "runsc": the same under gVisor (`--docker-runtime runsc`), for the cases marked `runsc_subset`
# only (gVisor's kernel answers the calls, so the kernel-facing cases judge gVisor, not ours).
LAUNCH = {"mode": "forked"}
# A pass of the whole suite on docker (SNAKEBOX_E2E_BACKEND) runs every docker case by default.
DOCKER_ATTACKS = os.environ.get("SNAKEBOX_DOCKER_ATTACKS", "all" if docker_backend() else "ci")
LAUNCH_ARGS = {
    "docker": ("--sandbox-backend", "docker"),
    "runsc": ("--sandbox-backend", "docker", "--docker-runtime", "runsc"),
}
native_only = pytest.mark.native_only
docker_ci = pytest.mark.docker_ci
runsc_subset = pytest.mark.runsc_subset
# A case the docker backend fails for a documented reason (SECURITY.md, the docker backend):
# strict xfail under docker and runsc, so it turns red when the gap is closed.
docker_gap = pytest.mark.docker_gap
# Ids inside a docker run: a leased uid, the same inside and on the host (no user namespace);
# native runs are 65534 inside their user namespace.
LEASED = range(200_000, 200_000 + 4096)


def docker_mode() -> bool:
    return LAUNCH["mode"] in LAUNCH_ARGS


def sandbox_uid_inside(uid: int) -> bool:
    """The uid a run sees for itself: 65534 (native), or its leased uid (docker)."""
    return uid in LEASED if docker_mode() else uid == 65534


@pytest.fixture(autouse=True, params=["forked", "pooled", "docker", "runsc"])
def launch(request):
    if docker_backend() and request.param != E2E_BACKEND:
        # A pass of the whole suite on one docker backend runs the catalogue in that mode only.
        pytest.skip(f"SNAKEBOX_E2E_BACKEND={E2E_BACKEND} runs the {E2E_BACKEND} launch mode only")
    if request.param in LAUNCH_ARGS:
        why = request.node.get_closest_marker("native_only")
        if why is not None:
            pytest.skip(f"native backend only: {why.args[0]}")
        if DOCKER_ATTACKS == "off":
            pytest.skip("SNAKEBOX_DOCKER_ATTACKS=off")
        if request.param == "runsc" and request.node.get_closest_marker("runsc_subset") is None:
            pytest.skip("not in the gVisor subset (marked runsc_subset)")
        if DOCKER_ATTACKS != "all" and request.node.get_closest_marker("docker_ci") is None and request.param == "docker":
            pytest.skip("not in the docker subset CI runs (SNAKEBOX_DOCKER_ATTACKS=all runs it)")
        docker_engine(request.getfixturevalue("snakebox_bin"))
        if request.param == "runsc" and not runsc_registered():
            reason = "runsc is not registered with the engine (scripts/dockerd registers Debian's runsc)"
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
        gap = request.node.get_closest_marker("docker_gap")
        if gap is not None:
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=f"GAP (docker): {gap.args[0]}"))
    LAUNCH["mode"] = request.param
    yield request.param


async def wait_for_fork_server(client: Any) -> None:
    """Name the default environment (cache warming is off here) and wait until its fork
    server runs, so that the attack's runs are forked."""
    data, _, _ = await call(client, "execute_python", script="print('warm')", timeout_seconds=60)
    assert data["status"] == "ok", data
    deadline = time.monotonic() + 30
    while True:
        report, _, _ = await call(client, "check_environment")
        pool = report["warm_pool"]
        if pool["fork_servers"] >= 1:
            return
        assert pool["fork_server_error"] is None, pool
        assert time.monotonic() < deadline, pool
        await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def server(snakebox_bin: Path, data_dir: Path, canaries: Canaries, *args: str) -> AsyncIterator[Any]:
    """One server with the canaries in its environment (HOME is the fake home)."""
    forked = LAUNCH["mode"] == "forked"
    if LAUNCH["mode"] in LAUNCH_ARGS:
        args = (*args, *LAUNCH_ARGS[LAUNCH["mode"]])
    elif not forked:
        args = (*args, "--fork-server", "off")
    async with connect(snakebox_bin, data_dir, MODE, *args, env=canaries.server_env()) as client:
        # The fork server serves runs without network while the pool is on.
        pairs = list(zip(args, args[1:]))
        if forked and ("--network", "on") not in pairs and ("--warm-pool", "0") not in pairs:
            await wait_for_fork_server(client)
        yield client


async def alive(client: Any) -> None:
    """Proof that the server survived an attack and still serves."""
    data, _, is_error = await call(client, "execute_python", script="print('alive')", timeout_seconds=30)
    assert not is_error and data["status"] == "ok" and data["stdout"] == "alive\n", data


def unprivileged_host_ids(status_ids: str) -> bool:
    """A `Uid:`/`Gid:` line of /proc/<pid>/status belongs to a sandbox: real, effective, saved and
    filesystem ids all the same unprivileged id, either the shared sandbox id (65534: sessions,
    non-leased runs) or a per-run id leased from 200000 up (one-shot runs, R-21)."""
    ids = {int(x) for x in status_ids.split()}
    return len(ids) == 1 and (ids == {65534} or all(200_000 <= i < 200_000 + 4096 for i in ids))


def find_server(data_dir: Path) -> int:
    """The pid of the one `snakebox serve` process using this data dir."""
    found = []
    for p in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            if p.isdigit() and b"serve" in cmd and str(data_dir).encode() in cmd and b"snakebox" in cmd[0]:
                found.append(int(p))
    assert len(found) == 1, f"expected one server for {data_dir}: {found}"
    return found[0]


def within(run: Any, timeout: int, grace: float = 1.0) -> None:
    """KILLED(T+1s): the sandbox's own duration and the harness's wall clock."""
    assert run.data["duration_ms"] <= (timeout + grace) * 1000, f"killed after {run.data['duration_ms']} ms (T={timeout} s)"


# =============================================================================================
# Kernel posture (catalogue §2): always recorded.
# =============================================================================================


async def test_kernel_posture_is_recorded(snakebox_bin, data_dir, canaries):
    names = [
        "kernel.unprivileged_bpf_disabled",
        "vm.unprivileged_userfaultfd",
        "kernel.perf_event_paranoid",
        "kernel.io_uring_disabled",
        "dev.tty.legacy_tiocsti",
        "kernel.yama.ptrace_scope",
        "kernel.kptr_restrict",
        "kernel.dmesg_restrict",
        "user.max_user_namespaces",
        "fs.protected_symlinks",
        "fs.protected_hardlinks",
        "kernel.core_pattern",
    ]
    posture_ = {name: sysctl(name) for name in names}
    posture_["kernel"] = os.uname().release
    posture_["abi"] = host_abi_probe()
    posture_["CONFIG_X86_X32_ABI"] = kernel_config("CONFIG_X86_X32_ABI")
    posture_["CONFIG_IA32_EMULATION"] = kernel_config("CONFIG_IA32_EMULATION")
    posture_["cgroup"] = Path("/proc/self/cgroup").read_text().strip().splitlines()
    posture_["bwrap"] = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    async with server(snakebox_bin, data_dir, canaries) as client:
        report, _, _ = await call(client, "check_environment")
    posture_["isolation_active"] = report["isolation_active"]
    posture_["limits"] = [(l["name"], l.get("value"), l["enforced"], l["mechanism"]) for l in report["limits"]]
    print("\n== kernel posture (attack catalogue §2)")
    print(json.dumps(posture_, indent=2))
    assert posture_["kernel"]
    assert report["isolation_active"] is True, "the attack suite needs the native sandbox"


# =============================================================================================
# 3.1 Resource abuse and process lifetime (R)
# =============================================================================================


async def run_with_probe(coro_fn: Any, probe: Any, seen_timeout: float = 20) -> tuple[Any, Any]:
    """Run an attack while `probe(watch)` runs on the host once the run's marker is visible."""
    box: dict[str, Any] = {}
    got_watch = anyio.Event()

    def started(watch: ProcWatch) -> None:
        box["watch"] = watch
        got_watch.set()

    async def go() -> None:
        box["run"] = await coro_fn(started)

    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        await got_watch.wait()
        seen = await anyio.to_thread.run_sync(box["watch"].wait_seen, seen_timeout)
        assert seen, "the run's marker never appeared in host /proc"
        box["probe"] = await probe(box["watch"])
    return box["run"], box["probe"]


@docker_ci
async def test_R01_fork_bomb_hits_pids_limit_and_host_can_still_spawn(snakebox_bin, data_dir, canaries):
    body = """
    import errno
    root = os.getpid()
    seen = False
    while True:
        try:
            os.fork()
        except OSError as e:
            if os.getpid() == root and not seen:
                seen = True
                report(fork_error=e.errno)
    """

    async def host_spawn(_watch: ProcWatch) -> float:
        await anyio.sleep(1.0)
        t0 = time.monotonic()
        await anyio.to_thread.run_sync(lambda: subprocess.run(["true"], check=True))
        return time.monotonic() - t0

    async with server(snakebox_bin, data_dir, canaries, "--max-processes", "64") as client:
        run, spawn_s = await run_with_probe(lambda started: attack(client, canaries, body, timeout=4, expect="timeout", watch_started=started), host_spawn)
        await alive(client)
    assert run["fork_error"] == errno.EAGAIN
    assert spawn_s < 1.0, f"the host needed {spawn_s:.2f} s to spawn `true` during the bomb"
    within(run, 4)


async def test_R02_thread_bomb_stops_at_pids_limit(snakebox_bin, data_dir, canaries):
    body = """
    import threading, time
    n = 0
    while True:
        try:
            threading.Thread(target=time.sleep, args=(1e9,), daemon=True).start(); n += 1
        except RuntimeError:
            report(threads=n); break
    time.sleep(1e9)
    """
    async with server(snakebox_bin, data_dir, canaries, "--max-processes", "64") as client:
        run = await attack(client, canaries, body, timeout=4, expect="timeout")
        await alive(client)
    assert 0 < run["threads"] < 64
    within(run, 4)


@docker_ci
@runsc_subset
async def test_R03_memory_bomb_is_killed_at_the_memory_limit(snakebox_bin, data_dir, canaries):
    body = """
    chunks = []
    while True:
        chunks.append(b"\\x01" * (64 << 20))
        report(mib=64 * len(chunks))
    """
    async with server(snakebox_bin, data_dir, canaries, "--memory-limit", "256MiB") as client:
        run = await attack(client, canaries, body, timeout=20, expect=("memory_limit", "error"))
        await alive(client)
    if run.data["status"] == "error":
        assert "MemoryError" in run.stderr, run.describe()
    assert run["mib"] <= 256, f"allocated {run['mib']} MiB under a 256 MiB limit"


async def test_R04_tmpfs_fill_is_capped_by_size(snakebox_bin, data_dir, canaries):
    body = """
    for path in ("/dev/shm/fill", "/tmp/fill"):
        n = 0
        try:
            with open(path, "wb") as f:
                while n < (512 << 20):
                    f.write(b"\\xff" * (1 << 20)); f.flush(); n += 1 << 20
            report(**{path: ["no error", n]})
        except OSError as e:
            report(**{path: [e.errno, n]})
        os.unlink(path)
    """
    async with server(snakebox_bin, data_dir, canaries, "--scratch-limit", "64MiB", "--memory-limit", "512MiB") as client:
        run = await attack(client, canaries, body, timeout=30)
    for path in ("/dev/shm/fill", "/tmp/fill"):
        err, written = run[path]
        assert err == errno.ENOSPC, f"{path}: {err}"
        assert written <= 64 << 20


async def test_R07_one_big_file_is_capped(snakebox_bin, data_dir, canaries):
    body = """
    for d in (os.getcwd(), "/tmp"):
        n = 0
        try:
            with open(os.path.join(d, "big"), "wb") as f:
                while n < (1 << 30):
                    f.write(b"\\0" * (1 << 20)); f.flush(); n += 1 << 20
            report(**{d: ["no error", n]})
        except OSError as e:
            report(**{d: [e.errno, n]})
        os.unlink(os.path.join(d, "big"))
    """
    async with server(snakebox_bin, data_dir, canaries, "--scratch-limit", "64MiB") as client:
        run = await attack(client, canaries, body, timeout=60)
    err, written = run["/work"]
    assert err in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT), err
    assert written <= 256 << 20  # RLIMIT_FSIZE default (file_size_bytes) or the scratch cap
    err, written = run["/tmp"]
    assert err in (errno.EFBIG, errno.ENOSPC), err
    assert written <= 64 << 20


async def test_R08_many_files_in_the_workdir_are_capped_by_the_scratch_limit(snakebox_bin, data_dir, canaries):
    body = """
    os.makedirs("d", exist_ok=True)
    n = 0
    try:
        for i in range(96):
            with open(f"d/{i}", "wb") as f:
                f.write(b"\\0" * (1 << 20))
            n += 1
        report(files=["no error", n])
    except OSError as e:
        report(files=[e.errno, n])
    """
    async with server(snakebox_bin, data_dir, canaries, "--scratch-limit", "32MiB") as client:
        run = await attack(client, canaries, body, timeout=60)
    err, n = run["files"]
    assert err in (errno.ENOSPC, errno.EDQUOT), f"wrote {n} MiB into /work under a 32 MiB scratch limit"
    assert n <= 33


async def test_R08_deep_tree_and_many_inodes_are_cleaned_up(snakebox_bin, data_dir, canaries):
    body = """
    import time
    t0 = time.monotonic()
    n = 0
    os.makedirs("d", exist_ok=True)
    try:
        for i in range(20000):
            open(f"d/{i}", "w").close(); n += 1
    except OSError as e:
        report(inode_errno=e.errno)
    p = "deep"
    depth = 0
    for _ in range(3000):
        p = os.path.join(p, "x")
        try: os.makedirs(p); depth += 1
        except OSError as e: report(deep_errno=e.errno); break
    report(files=n, depth=depth, seconds=time.monotonic() - t0)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        t0 = time.monotonic()
        run = await attack(client, canaries, body, timeout=60)
        elapsed = time.monotonic() - t0
        await alive(client)
    assert run["files"] > 0 and run["depth"] > 0
    # Cleanup of the workspace finishes (the call returned) in bounded time.
    assert elapsed < 60
    # Wherever under `runs/` the server keeps it, nothing named after this run is left.
    runs = data_dir / "runs"
    assert runs.is_dir(), f"{runs} does not exist: the oracle would be blind"
    execution_id = run.data["execution_id"]
    deadline = time.monotonic() + 10
    while list(runs.rglob(execution_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(runs.rglob(execution_id)), f"the run's scratch directory under {runs} was not removed"


async def test_R09_sparse_and_hardlink_bombs_do_not_hang_the_server(snakebox_bin, data_dir, canaries):
    body = """
    try:
        with open("sparse.bin", "wb") as f: f.truncate(1 << 50)
        report(sparse="created")
    except OSError as e:
        report(sparse=e.errno)
    with open("real.bin", "wb") as f: f.write(os.urandom(8 << 20))
    n = 0
    for i in range(2000):
        try: os.link("real.bin", f"hl{i}"); n += 1
        except OSError as e: report(link_errno=e.errno); break
    report(links=n)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=30)
        await alive(client)
    assert run["sparse"] in ("created", errno.EFBIG)
    # Whatever the server returns about the workspace stays small (it never copies 16 GB of links).
    assert len(json.dumps(run.data)) < 1 << 20
    assert run.wall < 30


async def test_R10_cpu_and_io_storm_is_killed_and_host_stays_responsive(snakebox_bin, data_dir, canaries):
    body = """
    def spin():
        while True: pass
    for _ in range(8):
        if os.fork() == 0:
            spin()
    with open("f", "wb") as f:
        while True:
            # Rewind each time: an I/O storm, not a disk fill (R-07/R-08 cover those limits).
            f.write(b"x" * 4096); os.fsync(f.fileno()); f.seek(0)
    """

    async def latency(_watch: ProcWatch) -> float:
        worst = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            await anyio.to_thread.run_sync(time.sleep, 0.01)
            worst = max(worst, time.monotonic() - t0 - 0.01)
        return worst

    async with server(snakebox_bin, data_dir, canaries) as client:
        run, worst = await run_with_probe(lambda started: attack(client, canaries, body, timeout=3, expect="timeout", watch_started=started), latency)
    within(run, 3)
    assert worst < 0.5, f"host 10 ms sleep overshot by {worst:.3f} s"


async def test_R10_cpu_bandwidth_is_throttled_by_a_cgroup(snakebox_bin, data_dir, canaries):
    body = """
    import time
    time.sleep(1.5)
    """

    async def quotas(watch: ProcWatch) -> list[str]:
        found = []
        for snap in list(watch.seen.values()):
            for line in snap["cgroup"].splitlines():
                _, ctrl, path = line.split(":", 2)
                if path in ("", "/"):
                    continue
                if "cpu" in ctrl.split(","):
                    q = Path("/sys/fs/cgroup/cpu") / path.lstrip("/") / "cpu.cfs_quota_us"
                    with contextlib.suppress(OSError):
                        if int(q.read_text()) > 0:
                            found.append(str(q))
                if ctrl == "":
                    q = Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "cpu.max"
                    with contextlib.suppress(OSError):
                        if q.read_text().split()[0] != "max":
                            found.append(str(q))
        return found

    async with server(snakebox_bin, data_dir, canaries) as client:
        _, found = await run_with_probe(lambda started: attack(client, canaries, body, timeout=10, watch_started=started), quotas)
    assert found, "the run's processes are in no cgroup with a CPU quota"


async def test_R11_busy_loop_ignoring_signals_is_killed(snakebox_bin, data_dir, canaries):
    body = """
    import signal
    for s in range(1, signal.NSIG):
        try: signal.signal(s, signal.SIG_IGN)
        except (OSError, ValueError, RuntimeError): pass
    report(ignoring=True)
    while True: pass
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=2, expect="timeout")
    assert run["ignoring"] is True and run.data["timed_out"] is True
    within(run, 2)


@docker_ci
@runsc_subset
async def test_R12_sleep_forever_is_killed_at_wall_clock(snakebox_bin, data_dir, canaries):
    body = """
    import time
    report(sleeping=True)
    time.sleep(10**9)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=2, expect="timeout")
    assert run["sleeping"] is True
    within(run, 2)


async def test_R13_ignoring_sigxcpu_still_dies_at_the_cpu_limit(snakebox_bin, data_dir, canaries):
    body = """
    import signal
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    report(ignoring=True)
    while True: pass
    """
    async with server(snakebox_bin, data_dir, canaries, "--cpu-limit", "2") as client:
        run = await attack(client, canaries, body, timeout=20, expect=("cpu_limit", "error"))
    assert run["ignoring"] is True
    assert run.data["duration_ms"] < 8000, run.data["duration_ms"]


async def test_R14_double_fork_daemon_dies_with_the_run(snakebox_bin, data_dir, canaries):
    body = """
    import time
    DAEMON = "\\n".join([
        "import os, signal, time",
        "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(s, signal.SIG_IGN)",
        "os.closerange(0, 1024)",
        "while True:",
        "    with open('/work/heartbeat', 'a') as f: f.write('x')",
        "    time.sleep(0.2)",
    ])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-c", DAEMON, MARKER], {"SBX_RUN_MARKER": MARKER})
        os._exit(0)
    for _ in range(50):
        if os.path.exists("/work/heartbeat"): break
        time.sleep(0.1)
    time.sleep(0.5)
    report(daemon_started=os.path.exists("/work/heartbeat"))
    print("main exits now")
    """
    cwd_fds: list[int] = []

    async def grab_cwd(watch: ProcWatch) -> None:
        for pid in list(watch.seen):
            with contextlib.suppress(OSError):
                cwd_fds.append(os.open(f"/proc/{pid}/cwd", os.O_RDONLY | os.O_DIRECTORY))

    async with server(snakebox_bin, data_dir, canaries) as client:
        run, _ = await run_with_probe(lambda started: attack(client, canaries, body, timeout=10, marker=False, watch_started=started), grab_cwd)
    assert run["daemon_started"] is True
    assert run.watch.seen, "the daemon was never seen from the host"
    # The heartbeat stops growing (checked through the daemon's own cwd, held open from the host).
    for fd in cwd_fds:
        try:
            size = lambda: os.stat("heartbeat", dir_fd=fd).st_size  # noqa: E731
            first = size()
            time.sleep(1.0)
            assert size() == first, "heartbeat still growing after the run returned"
        except FileNotFoundError:
            pass  # the workspace is already gone
        finally:
            os.close(fd)


async def test_R17_zombies_are_bounded_and_reaped(snakebox_bin, data_dir, canaries):
    body = """
    import time
    n = 0
    for _ in range(2000):
        try:
            if os.fork() == 0: os._exit(0)
            n += 1
        except OSError as e:
            report(fork_error=e.errno); break
    time.sleep(0.5)
    report(forked=n, zombies=zombies())
    """
    async with server(snakebox_bin, data_dir, canaries, "--max-processes", "64") as client:
        run = await attack(client, canaries, body, timeout=10)
        await alive(client)
    assert run["fork_error"] == errno.EAGAIN
    assert run["forked"] < 64 and run["zombies"] < 64


@docker_ci
async def test_R17_orphans_are_reaped_by_the_sandboxs_init(snakebox_bin, data_dir, canaries):
    # Orphans go to the sandbox's init (the runner's reaper in a pooled, cold or docker run):
    # it must reap them, or their zombies fill the run's process limit and fork fails. After
    # every 20 orphans the script waits (at most 3 s) until it sees no zombie.
    body = """
    import time
    made = 0
    for _ in range(300):
        try:
            child = os.fork()
        except OSError as e:
            report(fork_error=e.errno, made=made); break
        if child == 0:
            try:
                if os.fork() == 0: os._exit(0)   # the grandchild: an orphan once its parent ends
            except OSError:
                os._exit(1)
            os._exit(0)
        if os.waitpid(child, 0)[1] != 0:
            report(fork_error="in the child", made=made); break
        made += 1
        if made % 20 == 0:
            # Unreaped: zombies still there at the deadline. (A grandchild may exit only after
            # a look found none: its zombie is new, and the init's to reap by the next look.)
            deadline = time.monotonic() + 3
            left = zombies()
            while left and time.monotonic() < deadline:
                time.sleep(0.01)
                left = zombies()
            if left:
                report(unreaped=left, made=made); break
    report(made=made)
    """
    async with server(snakebox_bin, data_dir, canaries, "--max-processes", "64") as client:
        run = await attack(client, canaries, body, timeout=30)
        await alive(client)
    assert "fork_error" not in run.results and "unreaped" not in run.results, run.results
    assert run["made"] == 300


@docker_ci
@runsc_subset
async def test_R18_kill_minus_one_only_hits_the_sandbox(snakebox_bin, data_dir, canaries):
    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    # A host process under the sandbox's host uid (65534), which kill(-1) would reach without a
    # PID namespace.
    victim = subprocess.Popen(["sleep", "60"], preexec_fn=as_nobody)
    # kill(-1) reaches every process of the sandbox but its init and the caller: the runner's
    # reaper must be out of reach (the init), or its end ends the run under the script (which
    # then never reports `still_running`) and no report says how the run ended.
    body = """
    import signal, time
    os.kill(-1, signal.SIGKILL)
    report(after_kill_all=True)
    time.sleep(0.5)
    report(still_running=True)
    os.killpg(0, signal.SIGKILL)
    report(survived_killpg=True)
    """
    try:
        async with server(snakebox_bin, data_dir, canaries) as client:
            run = await attack(client, canaries, body, timeout=10, expect="error")
            await alive(client)
        assert run["after_kill_all"] is True and run["still_running"] is True, run.results
        assert "survived_killpg" not in run.results
        assert run.data.get("signal") == 9, run.data
        assert victim.poll() is None, "kill(-1) inside the sandbox killed a host process"
    finally:
        victim.kill()
        victim.wait()


@docker_ci
async def test_R19_stdout_flood_is_capped_and_server_memory_bounded(snakebox_bin, data_dir, canaries):
    body = """
    chunk = "A" * (1 << 20)
    while True: sys.stdout.write(chunk)
    """
    async with server(snakebox_bin, data_dir, canaries, "--max-output-bytes", "65536") as client:
        await alive(client)
        pid = find_server(data_dir)
        before = process_rss_kib(pid)
        run = await attack(client, canaries, body, timeout=3, expect=("timeout", "output_limit"))
        after = process_rss_kib(pid)
        await alive(client)
    assert run.data["stdout_truncated"] is True
    assert len(run.stdout.encode()) + len(run.stderr.encode()) <= 65536 + 1024
    assert after - before < 32 * 1024, f"server RSS grew by {after - before} KiB"
    within(run, 3)


async def test_R20_stderr_flood_without_newlines_does_not_deadlock(snakebox_bin, data_dir, canaries):
    body = """
    while True: os.write(2, b"E" * 65536)
    """
    async with server(snakebox_bin, data_dir, canaries, "--max-output-bytes", "65536") as client:
        run = await attack(client, canaries, body, timeout=3, expect=("timeout", "output_limit"))
        await alive(client)
    assert run.data["stderr_truncated"] is True
    assert len(run.stderr.encode()) <= 65536 + 1024
    within(run, 3)


async def test_R21_per_uid_counters_do_not_starve_the_host(snakebox_bin, data_dir, canaries):
    body = """
    import time
    n = 0
    while n < 100000 and libc.inotify_init() >= 0: n += 1
    fds = []
    try:
        while len(fds) < 100000:
            r, w = os.pipe(); fds += [r, w]
    except OSError as e:
        report(pipe_errno=e.errno)
    report(inotify=n, pipes=len(fds) // 2)
    spawn_marker(10)
    time.sleep(2)
    """

    async def host_can(_watch: ProcWatch) -> bool:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init()
        r, w = os.pipe()
        os.close(r)
        os.close(w)
        if fd >= 0:
            os.close(fd)
        return fd >= 0

    async with server(snakebox_bin, data_dir, canaries) as client:
        run, host_ok = await run_with_probe(lambda started: attack(client, canaries, body, timeout=15, marker=False, watch_started=started), host_can)
    assert run["inotify"] >= 0 and run["pipe_errno"] == errno.EMFILE
    assert host_ok, "the host could not create an inotify instance while the sandbox held its maximum"


async def test_R21_per_uid_counters_do_not_starve_a_concurrent_run(snakebox_bin, data_dir, canaries):
    holder = """
    import time
    n = 0
    while n < 100000 and libc.inotify_init() >= 0: n += 1
    report(inotify=n, errno=ctypes.get_errno())
    spawn_marker(15)
    time.sleep(5)
    """
    other = """
    fd = libc.inotify_init()
    report(inotify=[fd, ctypes.get_errno()])
    """
    async with server(snakebox_bin, data_dir, canaries) as client:

        async def concurrent(_watch: ProcWatch) -> Any:
            got = await attack(client, canaries, other)
            assert marker_pids(_watch.marker), "the holder was no longer running: not concurrent"
            return got

        held, second = await run_with_probe(lambda started: attack(client, canaries, holder, timeout=20, marker=False, watch_started=started), concurrent)
    assert held["inotify"] > 0
    fd, err = second["inotify"]
    assert fd >= 0, f"a concurrent run could not create an inotify instance (errno {err}) while another held {held['inotify']}"


async def test_R22_stack_overflow_is_reported_without_core_dump(snakebox_bin, data_dir, canaries):
    body = """
    import resource
    report(core=resource.getrlimit(resource.RLIMIT_CORE))
    sys.setrecursionlimit(10**9)
    def f(n): return f(n + 1)
    f(0)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        # Python 3.11 recurses on the C stack (3.12+ does not), so this really overflows it.
        run = await attack(client, canaries, body, timeout=20, expect=("error", "memory_limit"), python_version="3.11")
        await alive(client)
    assert run["core"] == [0, 0]
    assert run.data["exit_code"] != 0


# =============================================================================================
# 3.2 Filesystem isolation (F)
# =============================================================================================


@docker_ci
@runsc_subset
async def test_F01_host_home_secrets_are_absent(snakebox_bin, data_dir, canaries):
    body = """
    import glob
    cands = ["~/.ssh/*", "~/.aws/*", "~/.config/gcloud/**", "~/.netrc", "~/.git-credentials", "~/.docker/config.json",
             "~/.kube/config", "~/.npmrc", "~/.pypirc", "~/.config/gh/*", "~/.bash_history", "~/.anthropic/**",
             "/home/*/.ssh/*", "/root/.ssh/*", "/home/*/.aws/*", "/root/.aws/*", "/root/.netrc"]
    found = []
    for pat in cands:
        for p in glob.glob(os.path.expanduser(pat), recursive=True):
            try: print(p, open(p, "rb").read(4096)); found.append(p)
            except OSError as e: print(p, e.errno)
    fake = P["home"]
    for rel in P["files"]:
        try: print(open(os.path.join(fake, rel)).read()); found.append(rel)
        except OSError as e: print(rel, e.errno)
    report(found=found, fake_home_exists=os.path.exists(fake), home=os.environ.get("HOME"))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"home": str(canaries.home), "files": list(canaries.file_values)})
    assert run["found"] == []
    assert run["fake_home_exists"] is False
    assert run["home"] != str(canaries.home)


@docker_ci
async def test_F02_system_secrets_and_host_users(snakebox_bin, data_dir, canaries):
    body = """
    out = {}
    for p in ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/passwd", "/etc/group", "/var/log/auth.log",
              "/var/lib/docker", "/etc/ssh/ssh_host_ed25519_key", "/etc/machine-id"]:
        try: out[p] = open(p, "rb").read(4096).decode(errors="replace")
        except OSError as e: out[p] = e.errno
    report(files=out)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    files = run["files"]
    for p in ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/var/log/auth.log", "/etc/ssh/ssh_host_ed25519_key", "/var/lib/docker"]:
        assert files[p] in (errno.ENOENT, errno.EACCES, errno.EISDIR), f"{p}: {files[p]!r}"
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines() if line and not line.startswith("#")}
    inside_users = {line.split(":")[0] for line in files["/etc/passwd"].splitlines() if line}
    if docker_mode():
        # The run image's own names: the sandbox, the installer and one per leased uid
        # (`run<uid>`), so that a run's lookup of its own uid works; none is the host's.
        inside_users -= {f"run{uid}" for uid in LEASED}
        assert inside_users <= {"root", "sandbox", "installer"}, inside_users
    else:
        assert inside_users <= {"root", "nobody", "sandbox"}, inside_users
    assert not (inside_users & host_users - {"root", "nobody"})
    host_mid = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else None
    assert files["/etc/machine-id"] == errno.ENOENT or (host_mid and host_mid not in files["/etc/machine-id"])


# Every directory a run can create a file in, found by trying (not from a list of known
# scratch places): the whole tree but /proc and /sys, symlinks not followed.
WRITABLE_DIRS = """
    def writable_dirs(tag):
        found = []
        for root, dirs, _ in os.walk("/", topdown=True):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys") and not os.path.islink(os.path.join(root, d))]
            probe = os.path.join(root, ".probe-" + tag)
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except OSError:
                continue
            os.unlink(probe)
            found.append(root)
        return found
"""


async def test_F03_concurrent_and_left_behind_sibling_files_are_invisible(snakebox_bin, data_dir, canaries):
    """Issue 32, item 7, as a class: whatever place a run can write to (found by trying every
    directory it sees), a file it leaves there is invisible to a concurrent run and to a later
    one, on every launch path. A forked run's /dev was the fork server's, shared by its runs."""
    sibling_secret = "sibling-canary-" + os.urandom(8).hex()
    writer = WRITABLE_DIRS + """
    import time
    written = []
    for d in writable_dirs("w"):
        try:
            with open(os.path.join(d, "sibling-canary"), "w") as f: f.write(P["secret"])
            written.append(d)
        except OSError as e: print(d, e.errno)
    report(written=written, cwd=os.getcwd())
    time.sleep(6)
    """
    reader = WRITABLE_DIRS + """
    import glob, itertools, stat
    places = writable_dirs("r")
    hits = []
    for d in places:
        for name in os.listdir(d):
            p = os.path.join(d, name)
            try:
                if not stat.S_ISREG(os.lstat(p).st_mode): continue   # FIFOs and pipes would block
                if P["secret"].encode() in open(p, "rb").read(256): hits.append(p)
            except OSError: pass
    for pat in ["../*/**", "/run/user/**", "/proc/*/cwd/**"]:
        for p in itertools.islice(glob.iglob(pat, recursive=True), 2000):
            try:
                if not stat.S_ISREG(os.stat(p).st_mode): continue
                if P["secret"].encode() in open(p, "rb").read(256): hits.append(p)
            except OSError: pass
    report(hits=hits, places=places, parent=sorted(os.listdir("..")), mountinfo=open("/proc/self/mountinfo").read())
    """
    canaries.file_values["sibling"] = sibling_secret  # part of NO-LEAK for every later run too
    try:
        async with server(snakebox_bin, data_dir, canaries) as client:

            async def concurrent_read(_watch: ProcWatch) -> Any:
                # The writer is running (its marker is on the host) and its files exist.
                # (The writer walks the whole tree first: wait for its files.)
                ids: list[str] = []
                deadline = time.monotonic() + 30
                while not docker_mode() and not ids:
                    ids = [d.parent.name for d in (data_dir / "runs").glob("*/*/work") if (d / "sibling-canary").exists()]
                    assert ids or time.monotonic() < deadline, "the sibling's canary file is not on the host: the oracle would be blind"
                    await anyio.sleep(0.1)
                got = await attack(client, canaries, reader, params={"secret": sibling_secret})
                # I-04: the reader's mount table names no other run.
                assert not any(i in got["mountinfo"] for i in ids), "a sibling run's id is visible in mountinfo"
                assert marker_pids(_watch.marker), "the writer was no longer running: the read was not concurrent"
                return got

            writer_run, during = await run_with_probe(
                lambda started: attack(client, canaries, writer, timeout=30, params={"secret": sibling_secret}, watch_started=started),
                concurrent_read,
            )
            after = await attack(client, canaries, reader, params={"secret": sibling_secret})
    finally:
        del canaries.file_values["sibling"]
    # The oracle sees: the writer found and wrote the scratch places every run has.
    written = writer_run["written"]
    for scratch in ("/tmp", "/dev/shm", writer_run["cwd"]):
        assert scratch in written, f"the writer did not write {scratch}: {written}"
    assert set(during["places"]) >= {"/tmp", "/dev/shm"}, during["places"]
    # The reader really ran while the writer was alive.
    assert writer_run.watch.first_seen
    assert during["hits"] == [] and after["hits"] == [], (during["hits"], after["hits"], written)
    # The workspace's parent lists no sibling runs (no execution ids, no `runs` directory).
    for listing in (during["parent"], after["parent"]):
        assert "runs" not in listing and not any(re.fullmatch(r"[0-9a-f]{16,}", n) for n in listing), listing


@docker_ci
@runsc_subset
async def test_F04_writes_outside_the_allowed_dirs(snakebox_bin, data_dir, canaries):
    body = """
    res = {}
    for d in ["/", "/usr", "/usr/lib", "/etc", "/var", "/opt", "/home", "/root", "/tmp", "/dev/shm", "/snakebox", "/proc", "/sys", P["home"], os.path.expanduser("~"), "/work"]:
        try:
            with open(os.path.join(d, "sbx-write-probe"), "w") as f: f.write("x")
            res[d] = "WROTE"
        except OSError as e:
            res[d] = e.errno
    report(res=res)
    """
    host_dirs = ["/", "/usr", "/usr/lib", "/etc", "/var", "/opt", "/home", "/root", "/tmp", "/dev/shm", str(canaries.home)]
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"home": str(canaries.home)})
    res = run["res"]
    for d, r in res.items():
        if d in ("/tmp", "/dev/shm", "/work"):
            assert r == "WROTE", f"{d} should be writable scratch: {r}"
        else:
            assert r in (errno.EROFS, errno.EACCES, errno.ENOENT, errno.EPERM), f"wrote into {d}"
    for d in host_dirs:
        assert not Path(d, "sbx-write-probe").exists(), f"a write reached host {d}"


async def test_F06_hardlinks_to_protected_files(snakebox_bin, data_dir, canaries):
    body = """
    res = {}
    for t in ["/etc/passwd", "/etc/shadow", "/usr/bin/python3", sys.executable, "/snakebox/script.py"]:
        try: os.link(t, "hl"); res[t] = "LINKED"; os.unlink("hl")
        except OSError as e: res[t] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for t, r in run["res"].items():
        assert r in (errno.EXDEV, errno.EPERM, errno.EROFS, errno.ENOENT, errno.EACCES), f"hardlink to {t}: {r}"


async def test_F07_symlinks_planted_in_the_workdir_do_not_steer_host_cleanup(snakebox_bin, data_dir, canaries, tmp_path):
    protected = tmp_path / "protected"
    protected.mkdir()
    (protected / "keep").write_text("precious")
    protected.chmod(0o777)
    body = """
    import shutil
    made = []
    for p in [".cache", ".sandbox", "out", "tmp", ".venv", "input", "work", "artifacts", "script.py"]:
        shutil.rmtree(p, ignore_errors=True)
        for target in ["../" * 12 + "etc", P["protected"], P["protected"] + "/keep"]:
            try:
                os.symlink(target, p); made.append(p); break
            except OSError:
                pass
    os.symlink("loop", "loop")
    os.makedirs("mid", exist_ok=True)
    os.symlink(P["protected"], "mid/link")
    report(made=made)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"protected": str(protected)})
        second = await attack(client, canaries, "report(ok=sorted(os.listdir('.')))\n")
    assert run["made"]
    assert second["ok"] == [], "the next run's workdir is not fresh"
    assert sorted(os.listdir(protected)) == ["keep"] and (protected / "keep").read_text() == "precious"


async def new_session(client: Any, **arguments: Any) -> str:
    data, text, is_error = await call(client, "create_session", **arguments)
    assert not is_error and data["session_id"].startswith("s-"), text
    return data["session_id"]


def tree_state(root: Path) -> dict[str, Any]:
    """Every entry under `root` with its type, owner, mode and content (links not followed)."""
    state: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            content = p.read_bytes() if p.is_file() and not p.is_symlink() else None
            state[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, content)
    return state


def kill_server(data_dir: Path) -> None:
    pid = find_server(data_dir)
    os.kill(pid, 9)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.05)


async def test_F07_session_workspace_symlink_ambush(snakebox_bin, canaries, tmp_path):
    """F-07, persistent workspace: links planted by session code in /work never steer the file
    tools, input files, a server restart, `reset_session` or `delete_session` outside it."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    protected = tmp_path / "protected"
    protected.mkdir()
    secret = f"f07-protected-{os.urandom(6).hex()}"
    (protected / "keep").write_text(secret)
    (protected / "sub").mkdir()
    (protected / "sub" / "deep").write_text(secret + "-deep")
    for p in (protected, protected / "sub"):
        p.chmod(0o777)
    (protected / "keep").chmod(0o666)
    before = tree_state(protected)
    etc_before = sorted(os.listdir("/etc"))
    passwd = Path("/etc/passwd").read_bytes()
    hidden = [secret, "root:x:0:0", Path("/etc/hostname").read_text().strip() or "unlikely"]

    def clean(data: Any, text: str) -> None:
        blob = json.dumps(data) + text
        leaked = [h for h in hidden + canaries.values if h in blob]
        assert not leaked, f"host content reached the caller: {leaked}"

    plant = """
    made = {}
    import shutil
    def link(target, name):
        try:
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name)
            elif os.path.lexists(name):
                os.unlink(name)
            os.symlink(target, name); made[name] = target
        except OSError as e:
            made[name] = e.errno
    os.makedirs("real", exist_ok=True)
    for name, target in {
        "etc": "/etc", "root": "/root", "passwd": "/etc/passwd", "prot": P["protected"],
        "protkeep": P["protected"] + "/keep", "data": P["data"], "other": P["other"],
        "up": "../" * 12, "upetc": "../" * 12 + "etc", "upprot": "../" * 12 + P["protected"].lstrip("/"),
        "loop": "loop", "loopa": "loopb", "loopb": "loopa", "real/link": P["protected"],
        "real/up": "../../../../../../../../etc", ".venv": P["protected"], ".cache": P["protected"],
        "tmp": P["protected"], "out": P["protected"], "input": P["protected"],
    }.items():
        link(target, name)
    link(P["protected"], "subdir_link")
    report(made=made, listing=sorted(os.listdir(".")))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        a = await new_session(client, name="ambusher")
        b = await new_session(client, name="bystander")
        data, text, _ = await call(client, "write_file", session_id=b, path="b-secret.txt", content=secret + "-b")
        other = session_dir(data_dir, b) / "work"
        assert (other / "b-secret.txt").read_text() == secret + "-b", "proof that B's workspace is where we think"
        hidden.append(secret + "-b")
        params = {"protected": str(protected), "data": str(data_dir), "other": str(other)}
        run = await attack(client, canaries, plant, marker=False, session_id=a, params=params)
        assert run["made"]["prot"] == str(protected) and "subdir_link" in run["listing"], "the links were not planted"
        clean(run.data, run.text)
        for artifact in run.data.get("artifacts", []):
            contents = (await client.read_resource(artifact["uri"])).contents
            clean([getattr(c, "text", None) or getattr(c, "blob", None) for c in contents], "")
        work = session_dir(data_dir, a) / "work"
        assert os.readlink(work / "prot") == str(protected), "proof from outside: the link is in A's host workspace"

        names = ["etc", "root", "passwd", "prot", "protkeep", "data", "other", "up", "upetc", "upprot", "loop",
                 "loopa", "real/link", "real/up", "subdir_link", ".venv", ".cache", "tmp", "out", "input"]
        inside = ["", "/keep", "/passwd", "/hostname", "/sub/deep", "/b-secret.txt", "/etc/passwd", "/sessions-v1"]
        ambushes = 0
        # 1. read_file / list_files on every link and through it.
        for name in names:
            for suffix in inside:
                data, text, is_error = await call(client, "read_file", session_id=a, path=name + suffix)
                clean(data, text)
                assert is_error, f"read_file followed {name + suffix}: {text[:200]}"
                ambushes += 1
            data, text, is_error = await call(client, "list_files", session_id=a, path=name)
            clean(data, text)
            assert is_error or not data.get("entries"), f"list_files listed through {name}: {text[:300]}"
        data, text, is_error = await call(client, "list_files", session_id=a, depth=10)
        assert not is_error, text
        clean(data, text)
        listed = {e["path"]: e for e in data["entries"]}
        assert "prot" in listed and not any(p.startswith(("prot/", "subdir_link/", "etc/", "other/")) for p in listed), listed
        # 2. write_file on the links and through them.
        for name in names:
            for suffix in ["", "/pwned", "/keep", "/sub/deep"]:
                data, text, is_error = await call(client, "write_file", session_id=a, path=name + suffix, content="PWNED")
                clean(data, text)
        # 3. Input files of a session call aimed at the links.
        for name in ["prot/evil", "protkeep", "subdir_link/keep", "real/link/x", "etc/sbx-pwned", "other/b-secret.txt", "upprot/keep"]:
            data, text, _ = await call(client, "execute_python", session_id=a, script="print('inputs')",
                                       files=[{"path": name, "content": "PWNED"}])
            clean(data, text)
        assert tree_state(protected) == before, "the protected host directory changed (file tools)"
        assert (other / "b-secret.txt").read_text() == secret + "-b"
        assert sorted(os.listdir("/etc")) == etc_before and Path("/etc/passwd").read_bytes() == passwd
        # Re-plant whatever the tools replaced, then restart the server (kill -9).
        run = await attack(client, canaries, plant, marker=False, session_id=a, params=params)
        kill_server(data_dir)
    async with server(snakebox_bin, data_dir, canaries) as client:
        data, text, is_error = await call(client, "list_sessions")
        assert a in {s["session_id"] for s in data["sessions"]}, text
        data, text, _ = await call(client, "list_files", session_id=a, depth=10)
        clean(data, text)
        run = await attack(client, canaries, "report(listing=sorted(os.listdir('.')), fresh=True)\n", marker=False, session_id=a)
        assert run.data["fresh_interpreter"] is True and "prot" in run["listing"]
        clean(run.data, run.text)
        for name in ["protkeep", "prot/keep", "subdir_link/sub/deep"]:
            data, text, is_error = await call(client, "read_file", session_id=a, path=name)
            clean(data, text)
            assert is_error, name
        assert tree_state(protected) == before, "the protected host directory changed (restart)"
        # reset_session and delete_session remove the workspace without following its links.
        data, text, is_error = await call(client, "reset_session", session_id=a)
        assert not is_error, text
        assert tree_state(protected) == before, "reset_session followed a link"
        assert not (work / "prot").exists() and not os.path.islink(work / "prot")
        run = await attack(client, canaries, plant, marker=False, session_id=a, params=params)
        data, text, is_error = await call(client, "delete_session", session_id=a)
        assert not is_error, text
        assert not os.path.lexists(work)
        assert tree_state(protected) == before, "delete_session followed a link"
        assert (other / "b-secret.txt").read_text() == secret + "-b"
        assert sorted(os.listdir("/etc")) == etc_before and Path("/etc/passwd").read_bytes() == passwd
        await call(client, "delete_session", session_id=b)
        await alive(client)
    assert ambushes > 100


@docker_ci
async def test_F09_interpreter_and_site_packages_are_read_only(snakebox_bin, data_dir, canaries):
    body = """
    import site
    res = {}
    for p in [sys.executable, "/proc/self/exe", os.path.realpath(sys.executable), sys.prefix, sys.base_prefix] + site.getsitepackages():
        t = p if not os.path.isdir(p) else os.path.join(p, "zz_evil.pth")
        try:
            open(t, "ab").close(); res[t] = "WRITABLE"
        except OSError as e:
            res[t] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for t, r in run["res"].items():
        assert r in (errno.EROFS, errno.ETXTBSY, errno.EACCES, errno.EPERM), f"{t} is writable"
        if t.endswith("zz_evil.pth"):
            assert not Path(t).exists(), f"{t} appeared on the host"


async def test_F10_proc_root_traversal_sees_only_the_sandbox(snakebox_bin, data_dir, canaries):
    body = """
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    roots = {}
    for pid in pids:
        for link in ("root", "cwd"):
            try: roots[f"{pid}/{link}"] = [os.readlink(f"/proc/{pid}/{link}"), sorted(os.listdir(f"/proc/{pid}/{link}"))[:8]]
            except OSError as e: roots[f"{pid}/{link}"] = e.errno
    report(pids=pids, roots=roots)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert 1 < len(run["pids"]) < 10, run["pids"]
    host_root = sorted(os.listdir("/"))[:8]
    for key, value in run["roots"].items():
        if key.endswith("/root") and isinstance(value, list):
            assert value[0] == "/", f"{key} -> {value}"
            assert value[1] != host_root, f"{key} lists the host's root"


async def test_F11_device_nodes_and_mknod(snakebox_bin, data_dir, canaries):
    body = """
    import glob
    devs = sorted(os.listdir("/dev"))
    opened = []
    for p in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/kvm", "/dev/fuse",
              "/dev/net/tun", "/dev/vhost-net", "/dev/vsock", "/dev/userfaultfd", "/dev/vhost-vsock"] + glob.glob("/dev/nvidia*") + glob.glob("/dev/dri/*"):
        try: os.close(os.open(p, os.O_RDONLY)); opened.append(p)
        except OSError as e: pass
    try: os.mknod("fake", 0o600 | 0o20000, os.makedev(1, 3)); mk = "MKNOD OK"
    except OSError as e: mk = e.errno
    try: os.mkfifo("fifo"); fifo = "ok"
    except OSError as e: fifo = e.errno
    report(devs=devs, opened=opened, mknod=mk, fifo=fifo)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    allowed = {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin", "stdout", "stderr", "core", "mqueue"}
    assert set(run["devs"]) <= allowed, set(run["devs"]) - allowed
    assert run["opened"] == []
    assert run["mknod"] == errno.EPERM
    assert run["fifo"] == "ok"  # a FIFO is harmless and allowed (sandbox-runtime's expectation)


async def test_F12_proc_sys_sysrq_and_core_pattern_are_read_only(snakebox_bin, data_dir, canaries):
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    body = """
    res = {}
    for p, v in [("/proc/sys/kernel/core_pattern", "|/tmp/x"), ("/proc/sysrq-trigger", "h"),
                 ("/proc/sys/vm/drop_caches", "3"), ("/proc/sys/kernel/modprobe", "/tmp/x"),
                 ("/proc/sys/kernel/hostname", "pwned")]:
        try:
            with open(p, "w") as f: f.write(v)
            res[p] = "WROTE"
        except OSError as e: res[p] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for p, r in run["res"].items():
        assert r in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT), f"wrote {p}"
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


@docker_ci
async def test_F13_sys_and_cgroupfs_are_not_writable(snakebox_bin, data_dir, canaries):
    body = """
    cg = open("/proc/self/cgroup").read()
    res = {}
    for p, v in [("/sys/fs/cgroup/memory.max", "max"), ("/sys/fs/cgroup/pids.max", "max"), ("/sys/fs/cgroup/cpu.max", "max"),
                 ("/sys/fs/cgroup/cgroup.procs", str(os.getpid())), ("/sys/kernel/debug/x", "1"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "-1"), ("/sys/fs/cgroup/pids/pids.max", "max")]:
        try:
            with open(p, "w") as f: f.write(v)
            res[p] = "WROTE"
        except OSError as e: res[p] = e.errno
    report(cgroup=cg, res=res, sys_exists=os.path.exists("/sys"), sys_list=sorted(os.listdir("/sys")) if os.path.isdir("/sys") else None)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for p, r in run["res"].items():
        assert r in (errno.EROFS, errno.EACCES, errno.ENOENT, errno.EPERM), f"wrote {p}"
    # No host cgroup path is shown (cgroup namespace): every path is "/".
    for line in run["cgroup"].splitlines():
        assert line.split(":", 2)[2] == "/", f"host cgroup path visible: {line}"


async def test_F15_memfd_exec_is_recorded(snakebox_bin, data_dir, canaries):
    body = """
    fd = os.memfd_create("p")
    os.write(fd, open("/usr/bin/true", "rb").read())
    code = child(lambda: os.execv(f"/proc/self/fd/{fd}", ["p"]))
    report(memfd_exec_exit=code)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    # Informational (P2): native code runs anyway (K-16); the policy does not promise "no new binaries".
    print("F-15 memfd exec exit code:", run["memfd_exec_exit"])


# =============================================================================================
# 3.3 Information leaks (I)
# =============================================================================================

ENV_ALLOWLIST = {
    "PATH", "VIRTUAL_ENV", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING", "MPLBACKEND", "PWD", "SBX_RUN_MARKER",
}


@docker_ci
async def test_I01_I02_I03_environment_and_pid1_leak_nothing(snakebox_bin, data_dir, canaries):
    body = """
    import re
    print(dict(os.environ))
    envs = {}
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for what in ("environ", "cmdline"):
            try: envs[f"{pid}/{what}"] = open(f"/proc/{pid}/{what}", "rb").read().decode(errors="replace")
            except OSError as e: envs[f"{pid}/{what}"] = e.errno
    print(envs)
    report(keys=sorted(os.environ), procs=envs)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert set(run["keys"]) <= ENV_ALLOWLIST, set(run["keys"]) - ENV_ALLOWLIST
    assert "1/environ" in run["procs"] and "1/cmdline" in run["procs"]
    # The canaries are checked by attack() on the whole output (I-01 NO-LEAK, I-02 /proc/1/environ,
    # I-03 /proc/1/cmdline); bwrap's argv holds no options either (they travel on --args FD).
    assert "--setenv" not in str(run["procs"]["1/cmdline"])
    assert str(canaries.home) not in run.stdout


async def test_I04_mountinfo_shows_no_host_secrets_or_user_paths(snakebox_bin, data_dir, canaries):
    body = """
    report(mountinfo=open("/proc/self/mountinfo").read())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    info = run["mountinfo"]
    print("I-04 mountinfo inside:\n" + info)
    assert str(canaries.home) not in info and str(canaries.root) not in info


@docker_ci
async def test_I05_host_processes_are_invisible(snakebox_bin, data_dir, canaries):
    body = """
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    comms = []
    for p in pids:
        try: comms.append(open(f"/proc/{p}/comm").read().strip())
        except OSError: pass
    report(n=len(pids), comms=comms)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    host_n = len([p for p in os.listdir("/proc") if p.isdigit()])
    assert run["n"] < 10 < host_n, (run["n"], host_n)
    init = "docker-init" if docker_mode() else "bwrap"
    assert all(c == init or c.startswith("python") for c in run["comms"]), run["comms"]


async def test_I06_host_global_kernel_info_is_recorded(snakebox_bin, data_dir, canaries):
    body = """
    res = {}
    for p in ["/proc/kallsyms", "/proc/sched_debug", "/proc/timer_list", "/proc/kcore", "/proc/modules",
              "/proc/sys/kernel/random/boot_id", "/proc/stat", "/proc/meminfo", "/proc/cpuinfo", "/proc/version",
              "/sys/class/dmi/id/product_uuid", "/sys/class/net", "/proc/keys"]:
        try: res[p] = open(p, "rb").read(300).decode(errors="replace")
        except OSError as e: res[p] = e.errno
    res["syslog"] = sc(103, 3, 0, 0)
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    print("I-06 host-global info:", json.dumps({k: (v[:80] if isinstance(v, str) else v) for k, v in res.items()}, indent=1))
    assert res["syslog"] == [-1, errno.EPERM]
    assert not isinstance(res["/proc/kcore"], str) or res["/proc/kcore"] == ""
    assert not isinstance(res["/sys/class/dmi/id/product_uuid"], str)


async def test_I06_kallsyms_addresses_are_hidden(snakebox_bin, data_dir, canaries):
    body = """
    try:
        lines = open("/proc/kallsyms").read(4096).splitlines()[:20]
        report(addrs=[l.split()[0] for l in lines])
    except OSError as e:
        report(addrs=e.errno)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    addrs = run["addrs"]
    assert isinstance(addrs, int) or all(set(a) == {"0"} for a in addrs), f"kernel addresses visible: {addrs[:3]}"


async def test_I07_identity_is_neutral(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    report(host=socket.gethostname(), uid=os.getuid(), gid=os.getgid(), groups=os.getgroups(),
           uid_map=open("/proc/self/uid_map").read(), gid_map=open("/proc/self/gid_map").read())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    print("I-07 uid_map:", run["uid_map"].strip(), "gid_map:", run["gid_map"].strip())
    assert run["host"] == "sandbox" and run["host"] != socket.gethostname()
    assert sandbox_uid_inside(run["uid"]) and run["gid"] == run["uid"], run


@docker_ci
async def test_I08_no_inherited_file_descriptors(snakebox_bin, data_dir, canaries):
    body = """
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try: fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError as e: fds[fd] = e.errno
    report(fds=fds, stdin=os.readlink("/proc/self/fd/0"))
    linger()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    fds = {int(k): v for k, v in run["fds"].items()}
    # 0-2, the one listdir itself opened, and the runner's private result pipe (moved to 200,
    # close-on-exec; the engine trusts nothing in it for status, see the forged-record test).
    # (Docker: the result channel is the run's control FIFO, bound at /.snakebox-control.)
    channel = "/.snakebox-control/control" if docker_mode() else "pipe:"
    extra = {fd: t for fd, t in fds.items() if fd > 2 and not (fd == 200 and str(t).startswith(channel))}
    assert len(extra) == 1, run["fds"]
    assert run["stdin"] == "/dev/null"
    # From outside: the script process holds stdio (+ the runner's pipe) and nothing else of the server's.
    assert run.watch.parents, "the script process was not seen from the host"
    for parent in run.watch.parents.values():
        extra = {fd: target for fd, target in parent["fds"].items() if fd > 2 and not (fd == 200 and target.startswith(channel))}
        assert not extra, f"sandboxed process holds extra fds: {extra}"


async def test_I08_forged_result_record_cannot_change_status_or_paths(snakebox_bin, data_dir, canaries):
    body = """
    import base64, stat
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(200).st_mode)
    except OSError:
        is_pipe = False
    report(control=is_pipe)
    if is_pipe:
        png = base64.b64encode(b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0" * 64).decode()
        rec = {"status": "ok", "exit_code": 0, "timed_out": False, "value": {"repr": "'FORGED'", "type_name": "str"},
               "images": [{"source": "../../../../../etc/sbx-forged", "data": png}, {"source": "/etc/sbx-forged2", "data": png}],
               "notes": ["forged note"]}
        os.write(200, b"\\n" + json.dumps(rec).encode() + b"\\n")
    sys.stdout.flush()
    os._exit(3)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, expect="error")
    if not run["control"]:
        pytest.skip("this build gives the script no result pipe")
    assert run.data["exit_code"] == 3 and run.data["timed_out"] is False
    for artifact in run.data.get("artifacts") or []:
        name = json.dumps(artifact)
        assert ".." not in name and "sbx-forged" not in name.replace("\\", ""), artifact
    assert not Path("/etc/sbx-forged").exists() and not Path("/etc/sbx-forged2").exists()
    print("I-08 forged record -> status", run.data["status"], "value", run.data.get("value"), "artifacts", run.data.get("artifacts"))


async def test_I09_orchestrator_and_cloud_credentials_are_absent(snakebox_bin, data_dir, canaries):
    body = """
    import glob
    found = []
    for pat in ["/var/run/secrets/**", "/run/secrets/**", "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "/etc/kubernetes/**", "/root/.config/gcloud/**", "/etc/google/auth/**", "/var/lib/cloud/**", "/etc/boto.cfg",
                "/process_api", "/etc/environment"]:
        for p in glob.glob(pat, recursive=True):
            found.append(p)
    report(found=found)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["found"] == []


# =============================================================================================
# 3.4 Network (N)
# =============================================================================================


def host_primary_ip() -> str | None:
    """The host's own non-loopback address, by a UDP route lookup (sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
        except OSError:
            return None


@docker_ci
async def test_N01_only_loopback_and_no_routes(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    probes = {}
    for fam, addr in [(socket.AF_INET, ("192.0.2.1", 9)), (socket.AF_INET, ("169.254.169.254", 80)),
                      (socket.AF_INET, ("10.0.0.1", 9)), (socket.AF_INET, (P["host_ip"] or "192.0.2.2", 9)),
                      (socket.AF_INET6, ("2001:db8::1", 9)), (socket.AF_INET6, ("fd00:ec2::254", 80))]:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        try: s.connect(addr); probes[str(addr)] = "ROUTE EXISTS"
        except OSError as e: probes[str(addr)] = e.errno
        s.close()
    report(ifs=socket.if_nameindex(), route=open("/proc/net/route").read().splitlines(), probes=probes)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"host_ip": host_primary_ip()})
    assert [name for _, name in run["ifs"]] == ["lo"]
    assert len(run["route"]) == 1
    for addr, r in run["probes"].items():
        assert r == errno.ENETUNREACH, f"route to {addr}: {r}"


@docker_ci
@runsc_subset
async def test_N02_host_loopback_canary_is_unreachable(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    res = {}
    for fam, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
        s = socket.socket(fam); s.settimeout(2)
        res[host] = s.connect_ex((host, P["port"]))
        s.close()
    # The host's own non-loopback address: route probe first, no TCP if a route exists.
    hip = P["host_ip"]
    if hip:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try: u.connect((hip, 9)); res["host_ip_route"] = "ROUTE EXISTS"
        except OSError as e: res["host_ip_route"] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"port": canaries.tcp_port, "host_ip": host_primary_ip()})
    assert run["res"]["127.0.0.1"] == errno.ECONNREFUSED
    assert run["res"]["::1"] in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH)
    if "host_ip_route" in run["res"]:
        # gVisor's network stack, with no interface but loopback, says "no route to host".
        no_route = {errno.ENETUNREACH, errno.EHOSTUNREACH} if LAUNCH["mode"] == "runsc" else {errno.ENETUNREACH}
        assert run["res"]["host_ip_route"] in no_route, run["res"]
    assert canaries.connections() == []


async def test_N03_cloud_metadata_has_no_route_and_no_dns(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    res = {}
    for fam, addr in [(socket.AF_INET, ("169.254.169.254", 80)), (socket.AF_INET6, ("fd00:ec2::254", 80))]:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        try: s.connect(addr); res[addr[0]] = "ROUTE EXISTS"
        except OSError as e: res[addr[0]] = e.errno
    try: res["dns"] = socket.getaddrinfo("metadata.google.internal", 80)
    except OSError as e: res["dns"] = "no resolution"
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["res"]["169.254.169.254"] == errno.ENETUNREACH
    assert run["res"]["fd00:ec2::254"] == errno.ENETUNREACH
    assert run["res"]["dns"] == "no resolution"


async def test_N05_raw_and_packet_sockets(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    res = {}
    for name, args in [("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0)), ("raw_icmp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                       ("raw6", (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)), ("dgram_icmp", (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))]:
        try: socket.socket(*args).close(); res[name] = "OPENED"
        except OSError as e: res[name] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    for name in ("packet", "raw_icmp", "raw6"):
        assert res[name] in (errno.EPERM, errno.EACCES, errno.EAFNOSUPPORT), f"{name}: {res[name]}"
    print("N-05 ICMP datagram socket:", res["dgram_icmp"])


@docker_ci
async def test_N06_vsock_is_blocked(snakebox_bin, data_dir, canaries):
    # Only socket() is attempted: nothing is ever sent to the hypervisor.
    body = """
    import socket
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close(); r = "OPENED"
    except OSError as e: r = e.errno
    report(vsock=r, raw=sc(41, 40, 1, 0))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["vsock"] == errno.EPERM
    assert run["raw"] == [-1, errno.EPERM]


async def test_N08_listeners_inside_are_not_reachable_from_the_host(snakebox_bin, data_dir, canaries):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = """
    import socket, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", P["port"])); s.listen()
    report(listening=True)
    spawn_marker(10)
    s.settimeout(2.5)
    try: c, peer = s.accept(); report(accepted=str(peer))
    except OSError: report(accepted=None)
    """

    async def knock(_watch: ProcWatch) -> int:
        await anyio.sleep(0.3)
        with socket.socket() as c:
            c.settimeout(1)
            return c.connect_ex(("127.0.0.1", port))

    async with server(snakebox_bin, data_dir, canaries) as client:
        run, knocked = await run_with_probe(lambda started: attack(client, canaries, body, timeout=15, marker=False, params={"port": port}, watch_started=started), knock)
    assert run["listening"] is True and run["accepted"] is None
    assert knocked == errno.ECONNREFUSED


# N-09 (egress allowlist bypasses) runs against test hosts of its own: see
# `test_N09_allowlist_bypasses_are_refused` in test_network.py.


# =============================================================================================
# 3.5 IPC, terminals and local sockets (U)
# =============================================================================================


@docker_ci
@runsc_subset
async def test_U02_host_unix_sockets_abstract_and_pathname(snakebox_bin, data_dir, canaries):
    body = """
    import socket, stat
    hits = []
    for root in ["/run", "/var/run", "/tmp", "/var/tmp", "/dev", "/home", "/root", "/mnt", "/srv", os.path.expanduser("~"), "/work"]:
        for d, dirs, files in os.walk(root, onerror=lambda e: None):
            for n in files + dirs:
                p = os.path.join(d, n)
                try:
                    if stat.S_ISSOCK(os.lstat(p).st_mode): hits.append(p)
                except OSError: pass
    res = {}
    for name, addr in [("abstract", "\\0" + P["abstract"]), ("pathname", P["path"])]:
        s = socket.socket(socket.AF_UNIX); s.settimeout(1)
        res[name] = s.connect_ex(addr); s.close()
    report(sockets=hits, res=res, ssh_auth_sock=os.environ.get("SSH_AUTH_SOCK"))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"abstract": canaries.abstract_name, "path": str(canaries.unix_path)})
    assert run["sockets"] == []
    assert run["res"]["abstract"] == errno.ECONNREFUSED
    assert run["res"]["pathname"] == errno.ENOENT
    assert run["ssh_auth_sock"] is None
    assert canaries.connections() == []


async def test_U03_sysv_ipc_is_private_to_each_run(snakebox_bin, data_dir, canaries):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5BC0DE00 + (os.getpid() & 0xFF)
    assert libc.shmget(key, 0, 0) == -1, "the test key already exists on the host"
    creator = """
    import time
    shm = libc.shmget(P["key"], 4096, 0o1000 | 0o666)
    msg = libc.msgget(P["key"], 0o1000 | 0o666)
    report(shm=shm, msg=msg)
    spawn_marker(15)
    time.sleep(5)
    """
    looker = """
    shm = libc.shmget(P["key"], 0, 0)
    e1 = ctypes.get_errno()
    msg = libc.msgget(P["key"], 0)
    e2 = ctypes.get_errno()
    report(shm=[shm, e1], msg=[msg, e2], mqueue=os.listdir("/dev/mqueue") if os.path.isdir("/dev/mqueue") else "no mqueue fs")
    """
    async with server(snakebox_bin, data_dir, canaries) as client:

        async def look(_watch: ProcWatch) -> Any:
            host = (libc.shmget(key, 0, 0), libc.msgget(key, 0))
            got = await attack(client, canaries, looker, params={"key": key})
            assert marker_pids(_watch.marker), "the creator was no longer running: the look was not concurrent"
            return host, got

        a, (host, b) = await run_with_probe(lambda started: attack(client, canaries, creator, timeout=15, marker=False, params={"key": key}, watch_started=started), look)
    assert a["shm"] >= 0 and a["msg"] >= 0, "the creator could not create its IPC objects"
    assert host == (-1, -1), "the sandbox's SysV objects are visible on the host"
    assert b["shm"] == [-1, errno.ENOENT] and b["msg"] == [-1, errno.ENOENT]
    assert libc.shmget(key, 0, 0) == -1


@docker_ci
async def test_U05_helpers_in_the_sandbox_cannot_be_taken_over(snakebox_bin, data_dir, canaries):
    body = """
    res = {"ptrace_pid1": sc(101, 16, 1, 0, 0), "pidfd_getfd": sc(438, -1, 0, 0)}
    procs = {}
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())]:
        try: procs[pid] = [open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"), os.listdir(f"/proc/{pid}/fd")]
        except OSError as e: procs[pid] = e.errno
    report(res=res, procs=procs)
    linger()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["res"]["ptrace_pid1"] == [-1, errno.EPERM]
    assert run["res"]["pidfd_getfd"] == [-1, errno.EPERM]
    print("U-05 processes visible:", run["procs"])
    # From outside: the helper in the sandbox (pid 1 inside: the runner's reaper in a pooled,
    # cold or docker run, the init a forked run starts with) holds nothing worth stealing: no
    # capabilities, the same seccomp program, no-new-privs, the sandbox's uid.
    inits = [g for g in run.watch.grandparents.values() if is_namespace_init(g)]
    assert inits, "the sandbox's init was not seen from the host"
    if LAUNCH["mode"] in ("pooled", "docker"):
        # The reaper (the runner's parent, which reports how it ended, X-01) is the init, not
        # bubblewrap's or docker's: the run's kill(-1) cannot reach it (R-18).
        runner = [g for g in inits if not g["cmdline"][0].endswith(b"bwrap") and any(part.endswith(b"runner.py") for part in g["cmdline"])]
        assert runner and len(runner) == len(inits), [g["cmdline"] for g in inits]
    # Any other runner's reaper seen (below an init) is a helper too.
    reapers = [g for g in run.watch.grandparents.values() if any(part.endswith(b"runner.py") for part in g["cmdline"])]
    for init in inits + reapers:
        st = init["status"]
        assert all(int(st[c], 16) == 0 for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), st
        assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1" and unprivileged_host_ids(st["Uid"]), st


async def test_U01_terminal_injection_has_no_terminal_to_reach(snakebox_bin, data_dir, canaries):
    body = """
    import fcntl, termios
    res = {}
    try: os.open("/dev/tty", os.O_RDWR); res["dev_tty"] = "OPENED"
    except OSError as e: res["dev_tty"] = e.errno
    ch = ctypes.c_char(b"x")
    for fd in range(0, 3):
        res[f"tiocsti_{fd}"] = sc(16, fd, 0x5412, ctypes.addressof(ch))
    res["isatty"] = [os.isatty(i) for i in range(3)]
    res["sid"] = os.getsid(0)
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    assert res["dev_tty"] == errno.ENXIO
    for fd in range(3):
        assert res[f"tiocsti_{fd}"] == [-1, errno.EPERM], res
    assert res["isatty"] == [False, False, False]
    # A new session led inside the sandbox (bwrap's init, pid 1, or the script itself).
    assert res["sid"] in (1, 2), res["sid"]


PTY_WRAPPER = """
import fcntl, os, sys, termios
try:
    os.setsid()
except OSError:
    pass                                # already a session leader (the client starts a new session)
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.ioctl(fd, termios.TIOCSCTTY, 0)   # the harness's pty becomes the server's controlling terminal
os.dup2(fd, 2)                          # and the server's stderr is that terminal, as under an agent's shell
os.execv(sys.argv[2], sys.argv[2:])
"""


async def test_U01_server_on_a_pty_terminal_injection_is_contained(snakebox_bin, data_dir, canaries):
    import pty
    import threading

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from conftest import server_params

    master, slave = pty.openpty()
    slave_name = os.ttyname(slave)
    seen = bytearray()
    stop = threading.Event()

    def drain() -> None:
        import select

        while not stop.is_set():
            r, _, _ = select.select([master], [], [], 0.1)
            if r:
                try:
                    seen.extend(os.read(master, 4096))
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    body = """
    res = {}
    try: os.open("/dev/tty", os.O_RDWR); res["dev_tty"] = "OPENED"
    except OSError as e: res["dev_tty"] = e.errno
    payload = b"echo sbxpwn-" + P["tag"].encode() + b"\\n"
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        got = []
        for byte in payload:
            ch = ctypes.c_char(bytes([byte]))
            got.append(tuple(sc(16, fd, 0x5412, ctypes.addressof(ch))))
        res[f"fd{fd}"] = sorted(set(got))
    res["pts"] = sorted(os.listdir("/dev/pts"))
    report(res=res)
    linger()
    """
    tag = os.urandom(4).hex()
    params = server_params(snakebox_bin, data_dir, env=canaries.server_env())
    wrapped = StdioServerParameters(command=sys.executable, args=["-c", PTY_WRAPPER, slave_name, params.command, *params.args], env=params.env)
    try:
        async with Client(wrapped, mode=MODE, read_timeout_seconds=300) as client:
            run = await attack(client, canaries, body, params={"tag": tag})
            srv = find_server(data_dir)
            fields = Path(f"/proc/{srv}/stat").read_text().rsplit(") ", 1)[1].split()
            assert int(fields[4]) != 0, "the server has no controlling terminal: the case would prove nothing"
        time.sleep(0.3)
    finally:
        stop.set()
        reader.join(2)
        os.close(slave)
        os.close(master)
    res = run["res"]
    assert res["dev_tty"] == errno.ENXIO
    for key, value in res.items():
        if key.startswith("fd"):
            assert value == [[-1, errno.EPERM]], f"TIOCSTI on {key}: {value}"
    assert f"sbxpwn-{tag}".encode() not in bytes(seen), "text was injected into the server's terminal"


# =============================================================================================
# 3.6 Kernel attack surface and seccomp (K)
# =============================================================================================

DENY = "deny"  # EPERM or ENOSYS, or SIGSYS
ENOSYS_ONLY = "enosys"
EPERM_ONLY = "eperm"
INFO = "info"

K01_PROBES: list[tuple[str, int, list[int], str]] = [
    ("setns", 308, [-1, 0], DENY),
    ("mount", 165, [1, 1, 1, 0, 0], DENY),
    ("umount2", 166, [1, 0], DENY),
    ("pivot_root", 155, [1, 1], DENY),
    ("chroot", 161, [1], DENY),
    ("open_tree", 428, [-1, 1, 0], ENOSYS_ONLY),
    ("move_mount", 429, [-1, 1, -1, 1, 0], ENOSYS_ONLY),
    ("fsopen", 430, [1, 0], ENOSYS_ONLY),
    ("fsconfig", 431, [-1, 0, 0, 0, 0], ENOSYS_ONLY),
    ("fsmount", 432, [-1, 0, 0], ENOSYS_ONLY),
    ("fspick", 433, [-1, 1, 0], ENOSYS_ONLY),
    ("mount_setattr", 442, [-1, 1, 0, 1, 0], ENOSYS_ONLY),
    ("add_key", 248, [1, 1, 1, 0, -3], DENY),
    ("request_key", 249, [1, 1, 1, 0], DENY),
    ("keyctl_get_session", 250, [0, -3, 0], DENY),
    ("perf_event_open", 298, [1, 0, -1, -1, 0], DENY),
    ("userfaultfd_0", 323, [0], DENY),
    ("userfaultfd_user_mode_only", 323, [1], DENY),
    ("io_uring_setup", 425, [1, 1], DENY),
    ("io_uring_enter", 426, [-1, 0, 0, 0, 0, 0], DENY),
    ("io_uring_register", 427, [-1, 0, 0, 0], DENY),
    ("bpf", 321, [5, 1, 128], DENY),
    ("ptrace_attach_pid1", 101, [16, 1, 0, 0], EPERM_ONLY),
    ("process_vm_readv", 310, [1, 1, 1, 1, 1, 0], DENY),
    ("process_vm_writev", 311, [1, 1, 1, 1, 1, 0], DENY),
    ("pidfd_getfd", 438, [-1, 0, 0], DENY),
    ("kcmp", 312, [1, 1, 0, 0, 0], DENY),
    ("open_by_handle_at", 304, [-1, 1, 0], DENY),
    ("name_to_handle_at", 303, [-1, 1, 1, 1, 0], DENY),
    ("clone3", 435, [1, 88], ENOSYS_ONLY),
    ("unshare_newuser", 272, [0x10000000], DENY),
    ("unshare_newns", 272, [0x00020000], DENY),
    ("clone_newuser", 56, [0x10000000 | 17, 0, 0, 0, 0], DENY),
    ("ioctl_TIOCSTI", 16, [-1, 0x5412, 1], EPERM_ONLY),
    ("ioctl_TIOCSTI_high_bits", 16, [-1, (0x123 << 32) | 0x5412, 1], EPERM_ONLY),
    ("ioctl_TIOCLINUX", 16, [-1, 0x541C, 1], EPERM_ONLY),
    ("socket_AF_VSOCK", 41, [40, 1, 0], EPERM_ONLY),
    ("syslog", 103, [3, 1, 16], EPERM_ONLY),
    ("personality_addr_no_randomize", 135, [0x0040000], EPERM_ONLY),
    ("init_module", 175, [1, 0, 1], DENY),
    ("finit_module", 313, [-1, 1, 0], DENY),
    ("delete_module", 176, [1, 0], DENY),
    ("kexec_load", 246, [0, 0, 1, 0], DENY),
    ("kexec_file_load", 320, [-1, -1, 0, 1, 0], DENY),
    ("reboot", 169, [0, 0, 0, 0], DENY),
    ("swapon", 167, [1, 0], DENY),
    ("swapoff", 168, [1], DENY),
    ("acct", 163, [1], DENY),
    ("settimeofday", 164, [1, 1], DENY),
    ("clock_settime", 227, [0, 1], DENY),
    ("quotactl", 179, [0, 1, 0, 1], DENY),
    ("quotactl_fd", 443, [-1, 0, 0, 1], DENY),
    ("fanotify_init", 300, [0, 0], DENY),
    ("modify_ldt", 154, [0, 1, 0], DENY),
    ("iopl", 172, [3], DENY),
    ("ioperm", 173, [0, 1, 1], DENY),
    ("uselib", 134, [1], DENY),
    ("vhangup", 153, [], DENY),
    ("lookup_dcookie", 212, [0, 1, 0], DENY),
    ("statmount", 457, [1, 1, 0, 0], DENY),
    ("listmount", 458, [1, 1, 0, 0], DENY),
    ("lsm_set_self_attr", 460, [0, 1, 1, 0], DENY),
    ("setxattrat", 463, [-1, 1, 0, 1, 1, 0], DENY),
    ("getxattrat", 464, [-1, 1, 0, 1, 1, 0], DENY),
    ("listxattrat", 465, [-1, 1, 0, 1, 0], DENY),
    ("removexattrat", 466, [-1, 1, 0, 1], DENY),
    ("future_470", 470, [-1, 1, 1, 1], ENOSYS_ONLY),
    ("future_480", 480, [-1, 1, 1, 1], ENOSYS_ONLY),
    ("future_511", 511, [-1, 1, 1, 1], ENOSYS_ONLY),
    ("mseal", 462, [1, 1, 0], INFO),
    ("file_getattr", 468, [-1, 1, 0, 0, 0], INFO),
    ("file_setattr", 469, [-1, 1, 0, 0, 0], INFO),
]

# K-01 rows where the sandbox lets the call reach the kernel although the catalogue's policy says
# it must be filtered. Filled from the observed table; each is a GAP listed in SECURITY.md.
K01_GAPS: dict[str, str] = {}
# The same under the docker backend: rules of the native program that do not reach a docker run
# (docker/seccomp.rs; SECURITY.md, the docker backend).
_NAME_UNKNOWN = "runc drops a profile entry whose name the engine's libseccomp (2.5.4 on Debian 12) does not know"
K01_DOCKER_GAPS: dict[str, str] = {
    **{name: _NAME_UNKNOWN for name in (
        "statmount", "listmount", "lsm_set_self_attr", "setxattrat", "getxattrat", "listxattrat", "removexattrat",
    )},
}


def _k01_run(snakebox_bin: Path, data_dir: Path, canaries: Canaries) -> dict[str, Any]:
    body = """
    table = {}
    for name, nr, args, _ in P["probes"]:
        table[name] = probe(nr, *args)
    report(table=table)
    """

    async def go() -> dict[str, Any]:
        async with server(snakebox_bin, data_dir, canaries) as client:
            run = await attack(client, canaries, body, params={"probes": K01_PROBES}, timeout=60)
        return run["table"]

    box: dict[str, Any] = {}

    def thread() -> None:
        try:
            box["table"] = anyio.run(go)
        except BaseException as e:  # re-raised in the fixture
            box["error"] = e

    import threading

    t = threading.Thread(target=thread)
    t.start()
    t.join(180)
    if "error" in box:
        raise box["error"]
    return box["table"]


_K01_TABLES: dict[str, dict[str, Any]] = {}


@pytest.fixture
def k01_table(launch, snakebox_bin, data_dir, canaries) -> dict[str, Any]:
    """The probe table, made once per launch mode (one run probes every row)."""
    if launch in _K01_TABLES:
        return _K01_TABLES[launch]
    table = _K01_TABLES[launch] = _k01_run(snakebox_bin, data_dir, canaries)
    print(f"\n== K-01 syscall probe table ({launch}; result, errno, child exit; -31 = SIGSYS)")
    for name, nr, _, want in K01_PROBES:
        r, e, code = table[name]
        verdict = "SIGSYS" if code == -SIGSYS else (errno.errorcode.get(e, str(e)) if r == -1 else f"returned {r}")
        print(f"  {name:32s} nr={nr:<4d} want={want:7s} got={verdict}")
    return table


def _k01_params() -> list[Any]:
    out = []
    for name, nr, args, want in K01_PROBES:
        marks = [pytest.mark.xfail(strict=True, reason=K01_GAPS[name])] if name in K01_GAPS else []
        if name in K01_DOCKER_GAPS:
            marks.append(docker_gap(K01_DOCKER_GAPS[name]))
        out.append(pytest.param(name, nr, want, id=name, marks=marks))
    return out


@pytest.mark.parametrize(("name", "nr", "want"), _k01_params())
@docker_ci
def test_K01_syscall_probe(k01_table, name, nr, want):
    r, e, code = k01_table[name]
    if want == INFO:
        return
    assert code is not None
    if code == -SIGSYS:
        assert want in (DENY, EPERM_ONLY), f"{name}: killed by SIGSYS, want {want}"
        return
    assert code == 0, f"{name}: probe child died with {code}"
    reached = f"{name} (nr {nr}) reached the kernel: result {r}, errno {errno.errorcode.get(e, e)}"
    assert r == -1, reached
    if want == ENOSYS_ONLY:
        assert e == errno.ENOSYS, reached
    elif want == EPERM_ONLY:
        assert e == errno.EPERM, reached
    else:
        assert e in (errno.EPERM, errno.ENOSYS), reached


@docker_ci
async def test_K02_nested_user_namespace_is_blocked(snakebox_bin, data_dir, canaries):
    body = """
    import shutil, subprocess
    def f():
        if hasattr(os, "unshare"): os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
        else:
            r, e = sc(272, 0x10000000 | 0x40000000)
            if r < 0: raise OSError(e, "unshare")
    res = {"unshare": child(f)}
    def g():
        r, e = sc(272, 0x10000000)
        if r < 0: raise OSError(e, "unshare")
    res["unshare_user_only"] = child(g)
    if shutil.which("unshare"):
        p = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
        res["unshare_cmd"] = [p.returncode, p.stderr.strip()]
    report(res=res, max_userns=open("/proc/sys/user/max_user_namespaces").read().strip())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    for key in ("unshare", "unshare_user_only"):
        assert res[key] in (errno.EPERM, errno.ENOSPC, errno.EINVAL, -SIGSYS), f"{key}: nested userns allowed ({res[key]})"
    if "unshare_cmd" in res:
        assert res["unshare_cmd"][0] != 0


async def test_K03_cgroup_v1_release_agent_chain_fails(snakebox_bin, data_dir, canaries):
    agents = {p: p.read_text() for p in Path("/sys/fs/cgroup").glob("*/release_agent")}
    body = """
    import ctypes
    lc = ctypes.CDLL(None, use_errno=True)
    res = {}
    def step1():
        r, e = sc(272, 0x10000000 | 0x00020000 | 0x02000000)   # unshare(USER|NS|CGROUP)
        if r < 0: raise OSError(e, "unshare")
    res["unshare"] = child(step1)
    os.makedirs("/tmp/cg", exist_ok=True)
    for fstype, opts in [(b"cgroup", b"rdma"), (b"cgroup", b"memory"), (b"cgroup2", None)]:
        r = lc.mount(b"cgroup", b"/tmp/cg", fstype, 0, opts)
        res[f"mount_{fstype.decode()}_{opts}"] = [r, ctypes.get_errno()]
    try:
        with open("/sys/fs/cgroup/release_agent", "w") as f: f.write("/tmp/x")
        res["release_agent"] = "WROTE"
    except OSError as e:
        res["release_agent"] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    assert res["unshare"] in (errno.EPERM, errno.ENOSPC, errno.EINVAL, -SIGSYS)
    for key, value in res.items():
        if key.startswith("mount_"):
            assert value == [-1, errno.EPERM], f"{key}: {value}"
    assert res["release_agent"] != "WROTE"
    assert {p: p.read_text() for p in agents} == agents


@docker_ci
async def test_K04_mount_family_and_remount_rw(snakebox_bin, data_dir, canaries):
    body = """
    import shutil, subprocess
    lc = ctypes.CDLL(None, use_errno=True)
    MS_REMOUNT, MS_BIND = 32, 4096
    res = {}
    res["remount_root_rw"] = [lc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno()]
    res["remount_usr_rw"] = [lc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno()]
    res["tmpfs"] = [lc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno()]
    res["umount_proc"] = [lc.umount2(b"/proc", 2), ctypes.get_errno()]
    if shutil.which("mount"):
        p = subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True, text=True); res["mount_cmd"] = p.returncode
    if shutil.which("unshare"):
        p = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, text=True); res["unshare_cmd"] = p.returncode
    try:
        open("/usr/sbx-probe", "w"); res["usr_write"] = "WROTE"
    except OSError as e: res["usr_write"] = e.errno
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    for key in ("remount_root_rw", "remount_usr_rw", "tmpfs", "umount_proc"):
        assert res[key] == [-1, errno.EPERM], f"{key}: {res[key]}"
    for key in ("mount_cmd", "unshare_cmd"):
        if key in res:
            assert res[key] != 0, key
    assert res["usr_write"] in (errno.EROFS, errno.EACCES)


@docker_ci
async def test_K05_keyring_is_blocked_and_the_host_key_does_not_leak(snakebox_bin, data_dir, canaries):
    if canaries.key_id is None:
        pytest.skip("could not plant a canary key in the harness's session keyring")
    body = """
    res = {"get_session": sc(250, 0, -3, 0), "get_user": sc(250, 0, -4, 0),
           "add_key": sc(248, 1, 1, 1, 0, -3), "request_key": sc(249, 1, 1, 1, 0)}
    buf = ctypes.create_string_buffer(4096)
    res["read_canary"] = sc(250, 11, P["key_id"], ctypes.addressof(buf), 4096)   # KEYCTL_READ of the host's key id
    res["read_buf"] = buf.value.decode(errors="replace")
    res["proc_keys"] = open("/proc/keys").read() if os.path.exists("/proc/keys") else "no /proc/keys"
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, params={"key_id": canaries.key_id})
    res = run["res"]
    for key in ("get_session", "get_user", "add_key", "request_key", "read_canary"):
        assert res[key] == [-1, errno.EPERM], f"{key}: {res[key]}"
    assert canaries.key_payload not in res["read_buf"]


async def test_K06_perf_event_open_real_counter_is_blocked(snakebox_bin, data_dir, canaries):
    body = """
    # struct perf_event_attr: type=PERF_TYPE_SOFTWARE (1), size=128, config=PERF_COUNT_SW_CPU_CLOCK (0), exclude_kernel.
    attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(attr, 0).value = 1
    ctypes.c_uint32.from_buffer(attr, 4).value = 128
    ctypes.c_uint64.from_buffer(attr, 8).value = 0
    ctypes.c_uint64.from_buffer(attr, 40).value = (1 << 5) | (1 << 6)   # exclude_kernel | exclude_hv
    report(perf=sc(298, ctypes.addressof(attr), 0, -1, -1, 0), paranoid=open("/proc/sys/kernel/perf_event_paranoid").read().strip())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["perf"] == [-1, errno.EPERM]


async def test_K07_userfaultfd_both_modes_are_blocked(snakebox_bin, data_dir, canaries):
    body = """
    report(uffd0=probe(323, 0), uffd_user_only=probe(323, 1), dev=os.path.exists("/dev/userfaultfd"))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for key in ("uffd0", "uffd_user_only"):
        r, e, code = run[key]
        assert code == -SIGSYS or (r == -1 and e in (errno.EPERM, errno.ENOSYS)), f"{key}: {run[key]}"
    assert run["dev"] is False


async def test_K09_bpf_is_blocked(snakebox_bin, data_dir, canaries):
    body = """
    # BPF_PROG_LOAD with a bad pointer and a real BPF_MAP_CREATE attempt.
    attr = ctypes.create_string_buffer(72)
    ctypes.c_uint32.from_buffer(attr, 0).value = 2     # BPF_MAP_TYPE_ARRAY
    ctypes.c_uint32.from_buffer(attr, 4).value = 4
    ctypes.c_uint32.from_buffer(attr, 8).value = 4
    ctypes.c_uint32.from_buffer(attr, 12).value = 1
    report(prog_load=sc(321, 5, 1, 128), map_create=sc(321, 0, ctypes.addressof(attr), 72))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["prog_load"] == [-1, errno.EPERM]
    assert run["map_create"] == [-1, errno.EPERM]


@docker_ci
async def test_K11_x32_and_i386_abis_are_refused(snakebox_bin, data_dir, canaries):
    host = host_abi_probe()
    body = """
    import mmap
    def x32():
        r, e = sc(0x40000000 | 272, 0x10000000)          # unshare(CLONE_NEWUSER) with __X32_SYSCALL_BIT
        if r < 0: raise OSError(e, "x32 unshare")
    def x32_getpid():
        r, e = sc(0x40000000 | 39)
        if r < 0: raise OSError(e, "x32 getpid")
    def i386():
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(bytes.fromhex("b814000000cd80c3"))     # mov eax, 20 (i386 getpid); int 0x80; ret
        fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        os._exit(0 if fn() == os.getpid() else 3)
    report(x32_unshare=child(x32), x32_getpid=child(x32_getpid), i386=child(i386))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for key in ("x32_unshare", "x32_getpid"):
        assert run[key] in (errno.ENOSYS, errno.EPERM, -SIGSYS), f"{key}: {run[key]}"
    if host["ia32"] == "present":
        assert run["i386"] == -SIGSYS, f"int 0x80 getpid inside: {run['i386']} (host: {host['ia32']})"
    else:
        assert run["i386"] != 0


@docker_ci
async def test_K12_clone3_is_enosys_and_glibc_falls_back(snakebox_bin, data_dir, canaries):
    body = """
    import subprocess, threading
    r = sc(435, 1, 88)
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    p = subprocess.run([sys.executable, "-c", "print('spawned')"], capture_output=True, text=True)
    report(clone3=r, spawn=p.stdout.strip())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["clone3"] == [-1, errno.ENOSYS]
    assert run["spawn"] == "spawned"


@docker_ci
async def test_K14_ptrace_and_cross_process_memory(snakebox_bin, data_dir, canaries):
    body = """
    res = {"ptrace_attach_1": sc(101, 16, 1, 0, 0), "process_vm_readv": sc(310, 1, 1, 1, 1, 1, 0)}
    kid = os.fork()
    if kid == 0:
        import time; time.sleep(5); os._exit(0)
    res["ptrace_attach_child"] = sc(101, 16, kid, 0, 0)
    try: open("/proc/1/mem", "rb").read(1); res["mem1"] = "READ"
    except OSError as e: res["mem1"] = e.errno
    try:
        with open(f"/proc/{kid}/mem", "rb") as f: f.read(1); res["mem_child"] = "READ"
    except OSError as e: res["mem_child"] = e.errno
    os.kill(kid, 9); os.waitpid(kid, 0)
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    for key in ("ptrace_attach_1", "process_vm_readv", "ptrace_attach_child"):
        assert res[key] == [-1, errno.EPERM], f"{key}: {res[key]}"
    assert res["mem1"] in (errno.EACCES, errno.EPERM, errno.EIO)
    print("K-14 /proc/<child>/mem read:", res["mem_child"])


async def test_K15_seccomp_nnp_and_no_caps_on_every_thread(snakebox_bin, data_dir, canaries):
    body = """
    import threading, glob, time, subprocess
    ts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(8)]; [t.start() for t in ts]
    tasks = {}
    for st in glob.glob("/proc/self/task/*/status"):
        d = dict(l.split(":\\t", 1) for l in open(st).read().splitlines() if ":\\t" in l)
        tasks[st] = [d["Seccomp"].strip(), d["NoNewPrivs"].strip(), d["CapEff"].strip()]
    code = "d=dict(l.split(':\\\\t',1) for l in open('/proc/self/status').read().splitlines() if ':\\\\t' in l); print(d['Seccomp'].strip(), d['NoNewPrivs'].strip(), d['CapEff'].strip())"
    after_exec = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    [t.join() for t in ts]
    report(tasks=tasks, after_exec=after_exec)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert len(run["tasks"]) >= 9
    for task, (secc, nnp, cap) in run["tasks"].items():
        assert (secc, nnp, int(cap, 16)) == ("2", "1", 0), f"{task}: {secc} {nnp} {cap}"
    assert run["after_exec"][:2] == ["2", "1"] and int(run["after_exec"][2], 16) == 0


async def test_K16_native_code_runs_so_the_k_tests_exercise_the_kernel(snakebox_bin, data_dir, canaries):
    body = """
    import mmap
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes.fromhex("b82a000000c3"))     # mov eax, 42; ret
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    report(native=fn(), getpid=sc(39)[0] == os.getpid())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["native"] == 42 and run["getpid"] is True


# =============================================================================================
# 3.7 Privilege and posture (P)
# =============================================================================================


async def test_P01_no_new_privileges_and_setuid_is_inert(snakebox_bin, data_dir, canaries):
    body = """
    import shutil, subprocess
    status = [l.strip() for l in open("/proc/self/status") if l.startswith(("NoNewPrivs", "Uid", "Gid"))]
    shutil.copy(sys.executable, "pysuid"); os.chmod("pysuid", 0o4755)
    env = dict(os.environ, PYTHONHOME=sys.base_prefix)
    p = subprocess.run(["./pysuid", "-c", "import os; print(os.geteuid())"], capture_output=True, text=True, env=env)
    euid = p.stdout.strip() or p.stderr[-300:]
    cmds = {}
    for cmd in (["sudo", "-n", "id", "-u"], ["su", "-c", "id -u"], ["pkexec", "id", "-u"], ["newgrp"], ["passwd", "-S"]):
        if shutil.which(cmd[0]):
            p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=5)
            cmds[cmd[0]] = [p.returncode, p.stdout.strip()]
    report(status=status, euid=euid, cmds=cmds)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert any(line.startswith("NoNewPrivs") and line.split()[-1] == "1" for line in run["status"]), run["status"]
    assert sandbox_uid_inside(int(run["euid"])), run["euid"]
    for name, (code, out) in run["cmds"].items():
        assert out != "0", f"{name} printed uid 0"


@pytest.mark.xfail(strict=True, reason="GAP: the read-only /usr is the host's, with its setuid/setgid binaries (inert: NNP + nosuid) — see SECURITY.md")
async def test_P01_no_setuid_files_are_visible(snakebox_bin, data_dir, canaries):
    body = """
    suid = []
    for d, _, fs in os.walk("/", onerror=lambda e: None):
        if d.startswith(("/proc", "/sys", "/dev")): continue
        for f in fs:
            try:
                if os.lstat(os.path.join(d, f)).st_mode & 0o6000: suid.append(os.path.join(d, f))
            except OSError: pass
    report(suid=suid)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=60)
    print("P-01 setuid/setgid files visible:", run["suid"])
    assert run["suid"] == []


async def test_P02_capabilities_are_empty_also_after_exec(snakebox_bin, data_dir, canaries):
    body = """
    import subprocess
    def caps(text):
        return {l.split(":")[0]: l.split(":")[1].strip() for l in text.splitlines() if l.startswith("Cap")}
    me = caps(open("/proc/self/status").read())
    kid = caps(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)
    report(me=me, kid=kid)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    for who in ("me", "kid"):
        caps = run[who]
        assert set(caps) >= {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}, caps
        assert all(int(v, 16) == 0 for v in caps.values()), f"{who}: {caps}"


@docker_gap("no user namespace: a run's uid is a leased host uid, the same inside and outside (see SECURITY.md)")
@docker_ci
async def test_P03_every_namespace_is_new(snakebox_bin, data_dir, canaries):
    body = """
    report(ns={n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup")})
    linger()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    mine = {n: os.readlink(f"/proc/self/ns/{n}") for n in run["ns"]}
    for n, value in run["ns"].items():
        assert value != mine[n], f"{n} namespace shared with the host"
    # From outside: the sandboxed process's namespaces (read on the host) differ too.
    assert run.watch.parents, "the script process was not seen from the host"
    for parent in run.watch.parents.values():
        for n, value in parent["ns"].items():
            assert value != mine[n], f"{n} namespace shared (host view)"


@docker_ci
async def test_P04_rlimits_are_hard(snakebox_bin, data_dir, canaries):
    body = """
    import resource
    res = {}
    for n in ["RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE", "RLIMIT_STACK"]:
        r = getattr(resource, n); soft, hard = resource.getrlimit(r)
        try: resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)); raised = True
        except (ValueError, OSError): raised = False
        res[n] = [soft, hard, raised]
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    res = run["res"]
    print("P-04 rlimits inside (soft, hard, could raise):", res)
    for n in ("RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE"):
        soft, hard, raised = res[n]
        assert hard != -1 and not raised, f"{n} is not a hard limit: {res[n]}"
    assert res["RLIMIT_CORE"][:2] == [0, 0]


async def test_P05_session_leader_without_controlling_terminal(snakebox_bin, data_dir, canaries):
    body = """
    try: os.open("/dev/tty", os.O_RDWR); tty = "OPENED"
    except OSError as e: tty = e.errno
    report(sid=os.getsid(0), pid=os.getpid(), pgid=os.getpgid(0), tty=tty)
    linger()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
        me = os.getsid(0)
    # bwrap --new-session: with a PID namespace the session is led by bwrap's init (pid 1 inside),
    # not by the script (pid 2) as the catalogue's single-process picture has it; what matters is
    # that it is a new session with no controlling terminal.
    assert run["sid"] in (1, run["pid"]), (run["sid"], run["pid"])
    assert run["tty"] == errno.ENXIO
    # From outside: the sandboxed process's session and tty differ from the harness's and server's.
    assert run.watch.parents
    for snap in run.watch.parents.values():
        fields = snap["stat"].rsplit(") ", 1)[1].split()
        session, tty_nr = int(fields[3]), int(fields[4])
        assert session != me and tty_nr == 0, (session, me, tty_nr)


async def test_P06_core_dumps_are_off_and_abort_is_reported(snakebox_bin, data_dir, canaries):
    body = """
    import resource
    code = child(lambda: os.abort())
    report(core=resource.getrlimit(resource.RLIMIT_CORE), child_abort=code, cores=[f for f in os.listdir(".") if f.startswith("core")])
    os.abort()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, expect="error")
    assert run["core"] == [0, 0]
    assert run["child_abort"] == -6
    assert run["cores"] == []


async def test_P06_R22_death_by_signal_is_reported(snakebox_bin, data_dir, canaries):
    body = """
    os.abort()
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, expect="error")
    named = "SIGABRT" in run.text or "signal 6" in run.text or run.data.get("signal") in (6, "SIGABRT") or run.data.get("exit_code") in (134, -6)
    assert named, f"the result does not say the script died of SIGABRT: {run.data}"


async def test_P07_oom_score_adj_is_high_and_cannot_be_lowered(snakebox_bin, data_dir, canaries):
    body = """
    value = open("/proc/self/oom_score_adj").read().strip()
    try:
        with open("/proc/self/oom_score_adj", "w") as f: f.write("-1000")
        lowered = True
    except OSError as e: lowered = e.errno
    report(value=int(value), lowered=lowered)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["lowered"] is not True
    assert run["value"] >= 500, f"oom_score_adj {run['value']}"


@docker_ci
async def test_P08_posture_read_from_outside(snakebox_bin, data_dir, canaries):
    body = """
    import threading, time
    ts = [threading.Thread(target=time.sleep, args=(1.5,)) for _ in range(4)]; [t.start() for t in ts]
    time.sleep(0.5)
    spawn_marker(10)
    time.sleep(0.8)
    [t.join() for t in ts]
    report(done=True)
    """
    server_env = set(canaries.server_env())
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, marker=False)
    assert run["done"] is True
    snaps = list(run.watch.seen.values()) + list(run.watch.parents.values())
    assert len(snaps) >= 2, "the sandboxed processes were not seen from the host"
    mine = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup")}
    for snap in snaps:
        st = snap["status"]
        assert unprivileged_host_ids(st["Uid"]) and unprivileged_host_ids(st["Gid"]), (st["Uid"], st["Gid"])
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(st[cap], 16) == 0, f"{cap}={st[cap]}"
        assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2"
        # Native: bwrap loads two programs; docker: runc compiles the one profile into one.
        assert int(st.get("Seccomp_filters", "2")) >= (1 if docker_mode() else 2)
        for n, value in snap["ns"].items():
            if n == "user" and docker_mode():
                continue  # no user namespace under docker: P-03's GAP (docker)
            assert value != mine[n], f"{n} namespace shared"
        assert not (set(snap["environ_keys"]) & (server_env - {"HOME", "PATH"})), snap["environ_keys"]
        assert not set(snap["environ_keys"]) - ENV_ALLOWLIST, snap["environ_keys"]
        for task in snap["tasks"]:
            assert task["Seccomp"] == "2" and task["NoNewPrivs"] == "1" and int(task["CapEff"], 16) == 0, task
        core = [line.split()[4:6] for line in snap["limits"].splitlines() if line.startswith("Max core file size")]
        assert core == [["0", "0"]], snap["limits"]
    # The script process had several threads when it was read: every task has the same posture.
    assert any(len(s["tasks"]) >= 5 for s in run.watch.parents.values())


async def test_P08_sandbox_dies_with_the_supervisor(snakebox_bin, data_dir, canaries):
    from attacks_support import build_script, new_tokens

    start, mark = new_tokens()
    script = build_script("import time\ntime.sleep(30)\n", start, mark)
    client_cm = server(snakebox_bin, data_dir, canaries)
    with ProcWatch(mark) as watch:
        with contextlib.suppress(Exception):
            async with client_cm as client:
                async with anyio.create_task_group() as tg:
                    async def go() -> None:
                        with contextlib.suppress(Exception):
                            await call(client, "execute_python", script=script, timeout_seconds=30)

                    tg.start_soon(go)
                    seen = await anyio.to_thread.run_sync(watch.wait_seen, 20)
                    assert seen, "the run's marker never appeared"
                    pid = next(iter(watch.seen))
                    srv = server_ancestor(pid)
                    assert srv, "no snakebox server above the sandboxed process"
                    os.kill(srv, 9)
                    await anyio.sleep(0.2)
                    tg.cancel_scope.cancel()
    assert watch.seen
    left = wait_marker_gone(mark, 3.0)
    assert not left, f"sandboxed processes outlived the SIGKILLed supervisor: {left}"


# =============================================================================================
# 3.8 Supervisor and harness (H)
# =============================================================================================


@docker_ci
async def test_H01_argument_injection_through_parameters(snakebox_bin, data_dir, canaries, tmp_path):
    marker = tmp_path / "pwned"
    pwn = f"$(touch {marker})"
    async with server(snakebox_bin, data_dir, canaries) as client:
        for version in ["--dev-bind / /x", "3.11; touch " + str(marker), pwn, "3.11\n--share-net", "-c"]:
            data, _, is_error = await call(client, "execute_python", script="print('RAN')", python_version=version)
            assert is_error and data["status"] in ("invalid_request", "setup_failed"), (version, data["status"])
            assert "RAN" not in (data.get("stdout") or "")
        for deps in [["--index-url=http://127.0.0.1:%d/" % canaries.tcp_port], ["-e /"], [pwn], ["six; touch " + str(marker)],
                     ["--dev-bind"], ["six==1.16.0 --index-url http://127.0.0.1:%d/" % canaries.tcp_port]]:
            data, _, is_error = await call(client, "execute_python", script="print('RAN')", dependencies=deps, timeout_seconds=30)
            assert is_error and data["status"] in ("invalid_request", "setup_failed"), (deps, data["status"])
            assert "RAN" not in (data.get("stdout") or "")
        # The script text itself is never interpreted by a shell or by bwrap.
        run = await attack(client, canaries, "report(argv=sys.argv)\n# --dev-bind / /x $(touch %s) ;id\n" % marker)
    assert run["argv"] == ["/snakebox/script.py"]
    assert not marker.exists()
    assert canaries.connections() == []


async def test_H01_dependency_index_redirect_in_pep723_does_not_reach_host_loopback(snakebox_bin, data_dir, canaries):
    script = (
        "# /// script\n"
        '# dependencies = ["sbx-canary-pkg==1.0"]\n'
        "# [tool.uv]\n"
        f'# index-url = "http://127.0.0.1:{canaries.tcp_port}/simple"\n'
        f'# extra-index-url = ["http://[::1]:{canaries.tcp_port}/simple"]\n'
        "# ///\n"
        "print('RAN')\n"
    )
    async with server(snakebox_bin, data_dir, canaries) as client:
        data, _, _ = await call(client, "execute_python", script=script, timeout_seconds=60)
        await alive(client)
    print("H-01 [tool.uv] index redirect:", data["status"], data.get("error"))
    assert "RAN" not in (data.get("stdout") or "")
    assert canaries.connections() == [], f"the install phase reached a host loopback service: {canaries.connections()}"


async def test_H01_local_path_dependency_cannot_import_host_files(snakebox_bin, data_dir, canaries):
    import zipfile

    secret = canaries.file_values[".ssh/id_ed25519"]
    wheel = canaries.home / "sbx_canary_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sbx_canary_pkg/__init__.py", f"SECRET = {open(canaries.home / '.ssh/id_ed25519').read().strip()!r}\n")
        z.writestr("sbx_canary_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sbx-canary-pkg\nVersion: 1.0\n")
        z.writestr("sbx_canary_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("sbx_canary_pkg-1.0.dist-info/RECORD", "")
    script = "import sbx_canary_pkg\nprint(sbx_canary_pkg.SECRET)\n"
    try:
        async with server(snakebox_bin, data_dir, canaries) as client:
            results = []
            for dep in [f"sbx-canary-pkg @ file://{wheel}", str(wheel), f"sbx-canary-pkg @ {wheel}"]:
                data, text, _ = await call(client, "execute_python", script=script, dependencies=[dep], timeout_seconds=60)
                results.append((dep, data["status"], secret in json.dumps(data) + text))
            await alive(client)
    finally:
        wheel.unlink()
    print("H-01 local path dependencies (spec, status, leaked):", results)
    leaked = [r for r in results if r[2]]
    assert not leaked, f"a dependency specifier read a host file into the sandbox: {leaked}"


async def test_H03_terminal_escapes_and_invalid_utf8_do_not_break_the_server(snakebox_bin, data_dir, canaries):
    body = """
    print("\\x1b]52;c;ZWNobyBwd25lZA==\\x07")
    print("\\x1b[2J\\x1b[H$ sudo rm -rf ~")
    print("\\x1b]0;t\\x07\\x1b[21t")
    sys.stdout.flush()
    sys.stdout.buffer.write(b"\\xff\\xfe\\xc3\\x28 not utf-8\\n"); sys.stdout.flush()
    os.write(2, b"\\x00\\xff\\x1b[31mred\\n")
    report(done=True)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
        await alive(client)
    assert run["done"] is True
    assert "not utf-8" in run.stdout and "\ufffd" in run.stdout


async def test_H03_text_form_neutralises_escape_sequences(snakebox_bin, data_dir, canaries):
    body = """
    print("\\x1b]52;c;ZWNobyBwd25lZA==\\x07 \\x1b[2J")
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert "ZWNobyBwd25lZA" in run.text
    assert "\x1b" not in run.text, "raw ESC in the text form shown to agents and humans"


async def test_H05_long_run_is_not_bound_to_a_short_lived_thread(snakebox_bin, data_dir, canaries):
    # tokio's blocking pool retires idle threads after 10 s; if the sandbox were spawned from such
    # a thread with PR_SET_PDEATHSIG (--die-with-parent), it would die mid-run.
    body = """
    import time
    time.sleep(12)
    report(finished=True)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=30)
    assert run["finished"] is True and run.data["status"] == "ok"


# =============================================================================================
# 3.9 Sessions, REPL and multiple tenants (J): one-shot runs first, then live sessions
# =============================================================================================


async def test_J01_no_control_plane_on_sandbox_loopback(snakebox_bin, data_dir, canaries):
    body = """
    import socket
    def probe_port(fam, host, port):
        with socket.socket(fam) as s:
            s.settimeout(0.05)
            # A TCP self-connect (source port == destination port) is not a listener.
            return s.connect_ex((host, port)) == 0 and s.getsockname()[1] != port
    report(v4=[p for p in range(1, 65536) if probe_port(socket.AF_INET, "127.0.0.1", p)],
           v6=[p for p in range(1, 65536) if probe_port(socket.AF_INET6, "::1", p)])
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=60)
    assert run["v4"] == [] and run["v6"] == []


async def test_J02_no_kernel_connection_files_visible(snakebox_bin, data_dir, canaries):
    body = """
    import glob
    hits = []
    for root in ["/tmp", "/work", "/run", "/root", "/home", "/var", "/etc", "/snakebox", os.path.expanduser("~")]:
        hits += glob.glob(root + "/**/kernel-*.json", recursive=True) + glob.glob(root + "/**/jupyter/runtime/*.json", recursive=True)
    report(hits=hits)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    assert run["hits"] == []


async def test_J04_catastrophic_regex_ignoring_sigint_is_killed_one_shot(snakebox_bin, data_dir, canaries):
    body = """
    import signal, re
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report(matching=True)
    re.match(r"(a+)+$", "a" * 64 + "b")
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body, timeout=2, expect="timeout")
    assert run["matching"] is True
    within(run, 2)


@docker_ci
async def test_J05_concurrent_runs_cannot_reach_each_others_loopback(snakebox_bin, data_dir, canaries):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = """
    import socket, time
    s = socket.socket(); s.bind(("127.0.0.1", P["port"])); s.listen(); s.settimeout(5)
    s6 = socket.socket(socket.AF_INET6); s6.bind(("::1", P["port"])); s6.listen()
    report(listening=True)
    spawn_marker(10)
    try: c, peer = s.accept(); report(accepted=str(peer))
    except OSError: report(accepted=None)
    """
    dialer = """
    import socket
    res = {}
    for fam, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
        with socket.socket(fam) as c:
            c.settimeout(1); res[host] = c.connect_ex((host, P["port"]))
    report(res=res)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:

        async def dial(_watch: ProcWatch) -> Any:
            got = await attack(client, canaries, dialer, params={"port": port})
            assert marker_pids(_watch.marker), "the listener was no longer running: the dial was not concurrent"
            return got

        a, b = await run_with_probe(lambda started: attack(client, canaries, listener, timeout=15, marker=False, params={"port": port}, watch_started=started), dial)
    assert a["listening"] is True and a["accepted"] is None
    assert b["res"] == {"127.0.0.1": errno.ECONNREFUSED, "::1": errno.ECONNREFUSED}


SESSION_HOLDER = """
import socket, threading, time, ctypes.util
S = globals().setdefault("S", {"accepted": []})
def serve(sock):
    while True:
        try:
            c, peer = sock.accept(); S["accepted"].append(repr(peer)); c.close()
        except OSError:
            return
socks = []
for fam, addr in [(socket.AF_INET, ("127.0.0.1", P["port"])), (socket.AF_INET6, ("::1", P["port"])), (socket.AF_UNIX, "\\0" + P["abstract"])]:
    s = socket.socket(fam); s.bind(addr); s.listen(); socks.append(s)
    threading.Thread(target=serve, args=(s,), daemon=True).start()
S["socks"] = socks
shm = libc.shmget(P["key"], 4096, 0o1000 | 0o666)
msg = libc.msgget(P["key"], 0o1000 | 0o666)
rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
rt.shm_open.restype = ctypes.c_int
pshm = rt.shm_open(("/" + P["tag"]).encode(), os.O_CREAT | os.O_RDWR, 0o666)
open("/tmp/" + P["tag"], "w").write(P["secret"])
open("/work/" + P["tag"], "w").write(P["secret"])
open("/dev/shm/" + P["tag"] + "-file", "w").write(P["secret"])
import subprocess
S["bg"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", P["bgmark"]], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
# Proof of life: this session reaches its own objects.
own = {}
for fam, addr in [(socket.AF_INET, ("127.0.0.1", P["port"])), (socket.AF_INET6, ("::1", P["port"])), (socket.AF_UNIX, "\\0" + P["abstract"])]:
    with socket.socket(fam) as c:
        c.settimeout(2); own[str(fam)] = c.connect_ex(addr)
for _ in range(50):
    if len(S["accepted"]) >= 3:
        break
    time.sleep(0.1)
report(shm=shm, msg=msg, pshm=pshm, own=own, own_accepted=len(S["accepted"]), shm_again=libc.shmget(P["key"], 0, 0))
"""

SESSION_PROBER = """
import socket, glob, time
res = {}
for label, fam, addr in [("tcp4", socket.AF_INET, ("127.0.0.1", P["port"])), ("tcp6", socket.AF_INET6, ("::1", P["port"])),
                         ("abstract", socket.AF_UNIX, "\\0" + P["abstract"]),
                         ("host_tcp4", socket.AF_INET, ("127.0.0.1", P["host_port"])), ("host_tcp6", socket.AF_INET6, ("::1", P["host_port"])),
                         ("host_abstract", socket.AF_UNIX, "\\0" + P["host_abstract"]), ("host_pathname", socket.AF_UNIX, P["host_unix"])]:
    with socket.socket(fam) as c:
        c.settimeout(2)
        try:
            res[label] = c.connect_ex(addr)
        except OSError as e:
            res[label] = e.errno
shm = libc.shmget(P["key"], 0, 0); e1 = ctypes.get_errno()
msg = libc.msgget(P["key"], 0); e2 = ctypes.get_errno()
found = []
for pattern in ["/tmp/*", "/dev/shm/*", "/work/*", "/*/" + P["tag"] + "*", "/proc/*/cwd/" + P["tag"], "/proc/*/root/tmp/" + P["tag"],
                P["host_work"] + "/*", P["host_session"] + "/*/*"]:
    for path in glob.glob(pattern):
        try:
            found.append([path, open(path).read()[:100]])
        except OSError as e:
            found.append([path, e.errno])
procs = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    procs.append([pid, cmd.replace(b"\\0", b" ").decode(errors="replace")[:200]])
kill = {}
for pid in range(2, 400):
    try:
        os.kill(pid, 0); kill[pid] = 0
    except OSError as e:
        pass
report(res=res, shm=[shm, e1], msg=[msg, e2], found=found, procs=procs, mqueue=os.listdir("/dev/mqueue") if os.path.isdir("/dev/mqueue") else None,
       visible_pids=sorted(kill))
"""


@docker_ci
async def test_J05_U03_sessions_cannot_reach_each_other_or_the_host(snakebox_bin, data_dir, canaries):
    """J-05 and U-03 between two live sessions: A holds loopback and abstract listeners, SysV and
    POSIX IPC objects, files in /tmp, /dev/shm and /work and a background process; B, while A's
    interpreter is alive, reaches none of them, nor the host's loopback canaries."""
    import ctypes

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tag = "sbxj05" + os.urandom(5).hex()
    secret = f"j05-secret-{os.urandom(6).hex()}"
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5BC1DE00 + (os.getpid() & 0xFF)
    assert libc.shmget(key, 0, 0) == -1, "the test key already exists on the host"
    async with server(snakebox_bin, data_dir, canaries) as client:
        a = await new_session(client, name="holder")
        b = await new_session(client, name="prober")
        mark = "SBXJ05BG" + os.urandom(6).hex()
        params = {"port": port, "abstract": tag, "key": key, "tag": tag, "secret": secret, "bgmark": mark}
        held = await attack(client, canaries, SESSION_HOLDER, marker=False, session_id=a, params=params)
        assert held["shm"] >= 0 and held["msg"] >= 0 and held["pshm"] >= 0, held.results
        assert set(held["own"].values()) == {0} and held["own_accepted"] == 3 and held["shm_again"] == held["shm"], held.results
        # From outside: A's background process is alive on the host while B probes.
        assert marker_pids(mark), "A's background process is not running"
        assert (libc.shmget(key, 0, 0), libc.msgget(key, 0)) == (-1, -1), "A's SysV objects are visible on the host"
        assert not Path(f"/dev/shm/{tag}").exists() and not Path(f"/tmp/{tag}").exists()
        host_session = session_dir(data_dir, a).parent
        probe = dict(params, host_port=canaries.tcp_port, host_abstract=canaries.abstract_name, host_unix=str(canaries.unix_path),
                     host_work=str(host_session / a / "work"), host_session=str(host_session))
        got = await attack(client, canaries, SESSION_PROBER, marker=False, session_id=b, params=probe)
        assert marker_pids(mark), "A's background process ended before B's probe finished"
        blob = json.dumps(got.results)
        assert secret not in blob and mark not in blob, f"B saw A's files or processes: {blob[:2000]}"
        refused = {errno.ECONNREFUSED, errno.ENOENT}
        assert all(v in refused for v in got["res"].values()), got["res"]
        assert got["shm"] == [-1, errno.ENOENT] and got["msg"] == [-1, errno.ENOENT]
        assert not any(tag in p for p, _ in got["found"]), got["found"]
        assert len(got["procs"]) < 10, got["procs"]
        # A's own view after B's probe: its listeners accepted nothing new, its objects are still there.
        after = await attack(client, canaries, "report(accepted=S['accepted'], shm=libc.shmget(P['key'], 0, 0))\n", marker=False, session_id=a, params=params)
        assert len(after["accepted"]) == 3 and after["shm"] == held["shm"], after.results
        assert canaries.connections() == []
        # Deleting A ends its processes (marker scan) and its IPC.
        data, text, is_error = await call(client, "delete_session", session_id=a)
        assert not is_error, text
        assert wait_marker_gone(mark, 5) == [], "A's processes survived delete_session"
        again = await attack(client, canaries, "report(shm=libc.shmget(P['key'], 0, 0), tmp=os.listdir('/tmp'))\n", marker=False, session_id=b, params=params)
        assert again["shm"] == -1 and tag not in json.dumps(again["tmp"])
        await call(client, "delete_session", session_id=b)
    assert libc.shmget(key, 0, 0) == -1


async def test_J04_session_cell_ignoring_signals_is_stopped_at_its_timeout(snakebox_bin, data_dir, canaries):
    """J-04 in a session: a cell that ignores SIGINT/SIGTERM and spins in C (catastrophic regex)
    and in Python is stopped at T+1 s; no process is left (marker scan); the next call reports a
    fresh interpreter with the workspace files kept."""
    body = """
    import signal, re, subprocess
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open("kept.txt", "w").write("kept")
    spinner = subprocess.Popen([sys.executable, "-c", "import signal, sys\\nfor s in (2, 15, 1): signal.signal(s, signal.SIG_IGN)\\nwhile True: pass", MARKER])
    report(matching=True, spinner=spinner.pid)
    re.match(r"(a+)+$", "a" * 64 + "b")
    while True:
        pass
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        s = await new_session(client)
        await attack(client, canaries, "x_before = 1\nreport(ok=True)\n", marker=False, session_id=s)
        run = await attack(client, canaries, body, timeout=2, expect="timeout", session_id=s, marker_grace=3)
        assert run["matching"] is True and run.data["timed_out"] is True
        assert len(run.watch.seen) >= 2, "the marker processes were never seen from the host"
        within(run, 2, grace=2)
        nxt = await attack(client, canaries, "report(x='x_before' in globals(), kept=open('kept.txt').read())\n", marker=False, session_id=s)
        assert nxt.data["fresh_interpreter"] is True and nxt["x"] is False and nxt["kept"] == "kept", nxt.describe()
        assert any("timed out" in n for n in nxt.data["notes"]), nxt.data["notes"]
        await call(client, "delete_session", session_id=s)
        await alive(client)


async def test_J01_J02_session_pipes_and_control_plane(snakebox_bin, data_dir, canaries):
    """J-01/J-02 in a session: nothing listens on the session's loopback, no connection or
    kernel file is visible, fd 3 is closed and stdin reads end of file inside a cell, so garbage
    written there or a read of stdin changes nothing the server reports; a cell reading its own
    request pipe in the background never sees another session's request."""
    scan = """
    import socket, glob
    def probe_port(fam, host, port):
        with socket.socket(fam) as s:
            s.settimeout(0.05)
            return s.connect_ex((host, port)) == 0 and s.getsockname()[1] != port
    hits = []
    for root in ["/tmp", "/work", "/run", "/root", "/home", "/var", "/etc", "/snakebox", "/dev/shm"]:
        hits += glob.glob(root + "/**/kernel-*.json", recursive=True) + glob.glob(root + "/**/jupyter/runtime/*.json", recursive=True)
    socks = []
    for root in ["/tmp", "/run", "/work", "/snakebox", "/dev", "/var", "/home", "/root"]:
        for p in glob.glob(root + "/**", recursive=True):
            try:
                if __import__("stat").S_ISSOCK(os.lstat(p).st_mode):
                    socks.append(p)
            except OSError:
                pass
    unix = open("/proc/net/unix").read().splitlines()[1:]
    report(v4=[p for p in range(1, 65536) if probe_port(socket.AF_INET, "127.0.0.1", p)],
           v6=[p for p in range(1, 65536) if probe_port(socket.AF_INET6, "::1", p)], hits=hits, socks=socks, unix=unix)
    """
    fds = """
    import errno as E
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = [os.readlink("/proc/self/fd/" + fd), open(f"/proc/self/fdinfo/{fd}").read().split("\\n")[1]]
        except OSError:
            pass
    try:
        os.write(3, b'{"exit_code": 0, "forged": true}\\n' * 50); w3 = "written"
    except OSError as e:
        w3 = e.errno
    stdin = sys.stdin.read()
    try:
        raw = os.read(0, 100)
    except OSError as e:
        raw = e.errno
    report(fds=fds, w3=w3, stdin=stdin, raw=repr(raw))
    print("stdout-of-this-cell")
    raise SystemExit(7)
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        s = await new_session(client)
        run = await attack(client, canaries, scan, timeout=90, marker=False, session_id=s)
        assert run["v4"] == [] and run["v6"] == [] and run["hits"] == [] and run["socks"] == [], run.results
        assert run["unix"] == [], run["unix"]
        run = await attack(client, canaries, fds, expect="error", marker=False, session_id=s)
        assert run["w3"] == errno.EBADF and run["stdin"] == "" and run["raw"] == "b''", run.results
        assert run.data["exit_code"] == 7 and "stdout-of-this-cell" in run.stdout, run.describe()
        # The next call is answered with its own result, not a forged or stale one.
        data, text, _ = await call(client, "execute_python", session_id=s, script="print('next'); 6 * 7")
        assert data["status"] == "ok" and data["stdout"] == "next\n" and data["result"]["json"] == 42, text
        await call(client, "delete_session", session_id=s)


SESSION_PIPES = """
def pipe_fds(mode):
    out = []
    for f in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + f)
            flags = int(open(f"/proc/self/fdinfo/{f}").read().split("\\n")[1].split()[1], 8)
        except (OSError, ValueError, IndexError):
            continue
        if target.startswith("pipe:") and int(f) > 2 and (flags & 3) == mode:
            out.append(int(f))
    return out
"""


@native_only("the probe reads the native session's descriptors (a hidden request pipe, the control pipe); a docker session takes its requests on a FIFO of its control directory, and the docker form of this probe is not written yet")
async def test_J02_a_session_cell_never_sees_another_sessions_request(snakebox_bin, data_dir, canaries):
    """A cell of session A that reads its own (hidden) request pipe in the background, while
    session B is called, reads nothing: requests travel on per-interpreter pipes."""
    reader = SESSION_PIPES + textwrap.dedent("""
    import select, threading, time
    STOLEN = []
    READ_FDS = pipe_fds(0)
    def steal(deadline):
        while time.monotonic() < deadline:
            r, _, _ = select.select(READ_FDS, [], [], 0.1)
            for fd in r:
                STOLEN.append(os.read(fd, 65536).decode(errors="replace"))
    threading.Thread(target=steal, args=(time.monotonic() + 8,), daemon=True).start()
    report(read_fds=READ_FDS)
    """)
    token = f"J02-B-REQUEST-{os.urandom(6).hex()}"
    async with server(snakebox_bin, data_dir, canaries) as client:
        a = await new_session(client)
        b = await new_session(client)
        run = await attack(client, canaries, reader, marker=False, session_id=a)
        window = time.monotonic()
        assert run["read_fds"], "no hidden request pipe found: the probe proves nothing"
        for _ in range(3):
            data, text, _ = await call(client, "execute_python", session_id=b, script=f"print({token!r})")
            assert data["status"] == "ok" and data["stdout"] == token + "\n", text
        assert time.monotonic() - window < 7, "B's calls did not happen while A's reader was running"
        await anyio.sleep(max(0.0, 9 - (time.monotonic() - window)))
        after = await attack(client, canaries, "report(stolen=STOLEN)\n", marker=False, session_id=a)
        assert token not in json.dumps(after["stolen"]) and after["stolen"] == [], after["stolen"]
        for s in (a, b):
            await call(client, "delete_session", session_id=s)


@native_only("the probe reads the native session's descriptors (a hidden request pipe, the control pipe); a docker session takes its requests on a FIFO of its control directory, and the docker form of this probe is not written yet")
async def test_J02_a_forged_record_on_the_session_control_pipe_cannot_change_the_status(snakebox_bin, data_dir, canaries):
    """I-08 for sessions: the runner's control pipe is moved to a high descriptor before user code
    runs, but the cell can still find it in /proc/self/fd. A record forged there must not turn a
    failing cell into a success, nor desynchronise the answers of later calls."""
    forger = SESSION_PIPES + textwrap.dedent("""
    writers = pipe_fds(1)
    for fd in writers:
        os.write(fd, b'{"exit_code": 0, "forged": true}\\n')
    report(writers=writers)
    raise SystemExit(9)
    """)
    async with server(snakebox_bin, data_dir, canaries) as client:
        s = await new_session(client)
        run = await attack(client, canaries, forger, expect=None, marker=False, session_id=s)
        assert run.start in run.stdout and run["writers"], run.describe()
        nxt, text, _ = await call(client, "execute_python", session_id=s, script="raise SystemExit(5)")
        await call(client, "delete_session", session_id=s)
    assert nxt["status"] == "error" and nxt["exit_code"] == 5, text
    assert run.data["status"] == "error" and run.data["exit_code"] == 9, run.describe()


@docker_ci
async def test_I01_session_environment_and_pid1_carry_no_server_secrets(snakebox_bin, data_dir, canaries):
    """I-01..I-03 in a session: the interpreter's environment, /proc/1/environ and every visible
    process's environ and cmdline hold no server secret; run_command's shell neither."""
    body = """
    env = dict(os.environ)
    procs = {}
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        item = {}
        for name in ("environ", "cmdline"):
            try:
                item[name] = open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
            except OSError as e:
                item[name] = e.errno
        procs[pid] = item
    report(env=env, procs=procs, pid1=procs.get("1"))
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        s = await new_session(client)
        run = await attack(client, canaries, body, marker=False, session_id=s)
        assert run["pid1"] and isinstance(run["pid1"]["environ"], str), "/proc/1/environ was not read"
        assert not set(run["env"]) & set(canaries.env) - {"HOME", "PATH"}, sorted(run["env"])
        assert run["env"]["HOME"] == "/work" and "SSH_AUTH_SOCK" not in run["env"]
        for key in ("ANTHROPIC_API_KEY", "GITHUB_TOKEN", "SNAKEBOX", "XDG_RUNTIME_DIR", "PYENV_ROOT"):
            assert key not in json.dumps(run["procs"]), key
        data, text, _ = await call(client, "run_command", session_id=s, command="env; cat /proc/1/environ | tr '\\0' '\\n'; echo done")
        assert data["status"] == "ok" and "done" in data["stdout"], text
        assert_no_leak(canaries, data, text)
        assert "ANTHROPIC_API_KEY" not in data["stdout"] and "CANARY" not in data["stdout"]
        await call(client, "delete_session", session_id=s)


# =============================================================================================
# 3.10 In-language guards (L)
# =============================================================================================


@docker_ci
async def test_L01_in_language_guards_are_not_the_boundary(snakebox_bin, data_dir, canaries):
    body = """
    import io, contextlib
    w = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"][0]
    rc = w.__init__.__globals__["system"]("id -u > /work/id.txt")
    rc2 = ctypes.CDLL(None).system(b"id -u >> /work/id.txt")
    report(rc=[rc, rc2], ids=open("/work/id.txt").read().split())
    """
    async with server(snakebox_bin, data_dir, canaries) as client:
        run = await attack(client, canaries, body)
    # Arbitrary native code and shell commands run; they are still the sandbox's uid.
    assert len(run["ids"]) == 2 and all(sandbox_uid_inside(int(i)) for i in run["ids"]), run["ids"]
